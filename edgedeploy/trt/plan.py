"""The build plan: everything an engine build needs, as plain JSON-able data (``plan.json``).

One plan drives every executor: the TensorRT Python API (``edgedeploy.trt.adapter`` through the
device module), the ``trtexec`` command line (``edgedeploy.trt.trtexec``) and the device bundle.
The plan decides the precision strategy from the target and the files the precision stage wrote:

- ``fp32``: ``model.onnx`` as is;
- ``fp16-typed``: ``model.fp16.onnx`` built as a strongly typed network (TensorRT >= 10; the only
  FP16 route in TensorRT 11, which has no FP16 builder flag);
- ``fp16-flag``: ``model.onnx`` with the FP16 builder flag and FP32 pins (TensorRT 8.x);
- ``int8-qdq``: explicit quantization, the Q/DQ model ``model.int8.onnx``;
- ``int8-calib-cache``: implicit INT8, ``model.onnx`` with the INT8 flag and ``calib.cache``
  (TensorRT 8.x only: NVIDIA deprecated implicit INT8 in 10.1 and removed it in 11, so targets from
  10.1 on take the Q/DQ model or nothing, and a Q/DQ model they cannot read fails with the reason).

Nothing is ever downgraded: when no route exists the plan raises and names what is missing.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy.config import DeployConfig
from edgedeploy.errors import StageError, TargetCapabilityError
from edgedeploy.targets import TargetProfile

PLAN = "plan.json"
PLAN_SCHEMA = "edgedeploy-plan/1"
ENGINE = "model.engine"
TIMING_CACHE = "timing.cache"
ONNX_FP32 = "model.onnx"
ONNX_FP16 = "model.fp16.onnx"
ONNX_INT8 = "model.int8.onnx"
CALIB_CACHE = "calib.cache"
PRECISION_INFO = "precision.json"
DEFAULT_OPT_LEVEL = 3  # TensorRT's own default; 0..5


@dataclass(frozen=True)
class InputProfile:
    """Optimization-profile shapes of one input. ``symbolic``: the ONNX model declares a dim of this input
    without a fixed size (TensorRT's parser makes it -1), whatever the config's sizes."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]
    symbolic: bool = False

    @property
    def dynamic(self) -> bool:
        """The input needs an optimization profile: its shapes vary, or its ONNX dims are not fixed (a network
        with a -1 input dim and no profile fails TensorRT's build: "no optimization profile has been defined")."""
        return self.symbolic or not (self.min == self.opt == self.max)


@dataclass(frozen=True)
class BuildPlan:
    """How to build one engine. Paths are file names relative to the folder holding the plan."""

    target: str
    trt_version: str
    sm: str
    precision: str
    strategy: str
    onnx: str
    strongly_typed: bool
    inputs: tuple[InputProfile, ...]
    workspace_mib: int
    optimization_level: int = DEFAULT_OPT_LEVEL
    timing_cache: str = TIMING_CACHE
    engine: str = ENGINE
    calib_cache: str | None = None
    fp32_layers: tuple[str, ...] = ()
    # the pinned layers whose (single) output is float: only these get an FP32 output type pin
    fp32_output_layers: tuple[str, ...] = ()
    dla_core: int | None = None
    gpu_fallback: bool = True
    min_workspace_mib: int = 32
    # input -> (min, opt, max) values of an integer input TensorRT may take as a shape tensor (a Reshape's target
    # shape): a profile must carry them (IOptimizationProfile::setShapeValues), the engine accepts values within
    shape_values: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(default_factory=dict)
    schema: str = PLAN_SCHEMA
    notes: tuple[str, ...] = field(default=())

    @property
    def dynamic(self) -> bool:
        """True when any input needs an optimization profile (:attr:`InputProfile.dynamic`)."""
        return any(i.dynamic for i in self.inputs)

    def profiles(self) -> list[dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]]:
        """Optimization profiles in the adapter's form (one profile, min = opt = max where only the ONNX dims
        are symbolic; empty for static models)."""
        if not self.dynamic:
            return []
        return [{i.name: (i.min, i.opt, i.max) for i in self.inputs}]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["inputs"] = [dataclasses.asdict(i) for i in self.inputs]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildPlan:
        """Rebuild a plan from :meth:`to_dict` output.

        Raises:
            StageError: the data is not an edgedeploy build plan.
        """
        if data.get("schema") != PLAN_SCHEMA:
            raise StageError("plan", f"not an edgedeploy build plan (schema {data.get('schema')!r})")
        data = dict(data)
        names = {f.name for f in dataclasses.fields(cls)}
        data["inputs"] = tuple(
            InputProfile(i["name"], tuple(i["min"]), tuple(i["opt"]), tuple(i["max"]), bool(i.get("symbolic")))
            for i in data["inputs"]
        )
        for key in ("fp32_layers", "fp32_output_layers", "notes"):
            data[key] = tuple(data.get(key) or ())
        data["shape_values"] = {
            str(name): tuple(tuple(int(v) for v in values) for values in triple)
            for name, triple in (data.get("shape_values") or {}).items()
        }
        return cls(**{k: v for k, v in data.items() if k in names})


def write_plan(plan: BuildPlan, folder: Path) -> Path:
    """Write ``plan.json`` into ``folder``; returns its path."""
    from edgedeploy.fileio.store import atomic_write_json

    path = folder / PLAN
    atomic_write_json(path, plan.to_dict())
    return path


def read_plan(path: Path) -> BuildPlan:
    """Read a ``plan.json``.

    Raises:
        StageError: unreadable or not a plan.
    """
    try:
        return BuildPlan.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StageError("plan", f"cannot read build plan {path}: {exc}") from None


def input_profiles(cfg: DeployConfig, onnx_path: Path | None = None) -> tuple[InputProfile, ...]:
    """min / opt / max shapes of every input from the config's named dims, each marked ``symbolic`` where
    ``onnx_path`` (the model the engine is built from) declares a dim of it without a fixed size."""
    symbolic = symbolic_inputs(onnx_path) if onnx_path is not None else set()
    return tuple(
        InputProfile(
            s.name, cfg.shape_for(s, "min"), cfg.shape_for(s, "opt"), cfg.shape_for(s, "max"), s.name in symbolic
        )
        for s in cfg.inputs
    )


def symbolic_inputs(onnx_path: Path) -> set[str]:
    """Names of the graph inputs of ``onnx_path`` with a dim that has no fixed size (a name, or nothing).

    Raises:
        StageError: the model cannot be read.
    """
    import onnx

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # onnx raises several unrelated exception types on a bad file
        raise StageError("build", f"cannot read {onnx_path}: {' '.join(str(exc).split())[:200]}") from None
    weights = {i.name for i in model.graph.initializer}
    return {
        i.name
        for i in model.graph.input
        if i.name not in weights and any(not d.HasField("dim_value") for d in i.type.tensor_type.shape.dim)
    }


def fp32_pins(info: dict[str, Any] | None, key: str, *, output_type_only: bool = False) -> tuple[str, ...]:
    """Node names listed under ``key`` in ``precision.json`` (strings or ``{"node": ...}``), sorted.

    The precision stage lists FP16 overflow pins under ``fp32_layers`` and the layers its INT8
    sensitivity analysis kept in float under ``kept_float``. With ``output_type_only``, only the entries
    marked ``"pin_output_type": true`` (one float output; an output type pin on an index or shape output
    would make TensorRT fail the build).
    """
    value = (info or {}).get(key)
    if isinstance(value, dict):
        return () if output_type_only else tuple(sorted(value))
    if not isinstance(value, list):
        return ()
    if output_type_only:
        value = [v for v in value if isinstance(v, dict) and v.get("pin_output_type") is True]
    names = [v if isinstance(v, str) else str(v.get("node", "")) for v in value if isinstance(v, (str, dict))]
    return tuple(sorted(n for n in names if n))


def qdq_problems(model_path: Path) -> tuple[bool, list[str]]:
    """Whether ``model_path`` is a Q/DQ model, and what in it TensorRT cannot take.

    TensorRT takes symmetric INT8 Q/DQ only: int8 zero points equal to 0 (ONNX Runtime's default
    uint8 activations are asymmetric). All offending nodes are listed at once.
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name: i for i in model.graph.initializer}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    problems = []
    for n in qdq:
        zp_name = n.input[2] if len(n.input) > 2 else ""
        if not zp_name:
            if n.op_type == "QuantizeLinear":  # ONNX's default output without a zero point is uint8
                problems.append(f"{n.name or n.op_type}: no zero point (uint8 by ONNX default), TensorRT needs int8")
            continue
        zp = inits.get(zp_name)
        if zp is None:
            problems.append(f"{n.name or n.op_type}: zero point {zp_name!r} is not a constant")
            continue
        arr = numpy_helper.to_array(zp)
        if arr.dtype == np.int32:
            problems.append(
                f"{n.name or n.op_type}: int32-quantized bias; TensorRT takes float biases "
                "(ONNX Runtime: extra_options={'QuantizeBias': False})"
            )
        elif arr.dtype != np.int8:
            problems.append(f"{n.name or n.op_type}: zero point is {arr.dtype}, TensorRT needs int8")
        elif np.any(arr != 0):
            problems.append(f"{n.name or n.op_type}: zero point is not 0 (asymmetric)")
    return bool(qdq), problems


def shape_values_from_goldens(
    cfg: DeployConfig, goldens: Path
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) values of every integer input of one fixed dim (what TensorRT may take as a shape tensor)
    from the goldens the engine is validated on: the elementwise least and greatest over every golden, and the
    opt point's first sample (its values run at the opt shape). Empty when the model has no such input.

    Raises:
        InputError: the goldens file is unreadable (from :func:`edgedeploy.modelio.goldens.load_goldens`).
    """
    candidates = [
        s.name
        for s in cfg.inputs
        if s.dtype.startswith(("int", "uint")) and len(cfg.shape_for(s, "opt")) == 1
        and cfg.shape_for(s, "min") == cfg.shape_for(s, "max")
    ]  # fmt: skip
    if not candidates or not goldens.is_file():
        return {}
    import numpy as np

    from edgedeploy.modelio.goldens import load_goldens

    cases = load_goldens(goldens)
    out = {}
    for name in candidates:
        seen = [
            np.asarray(pair["in"][name]).astype(np.int64).reshape(-1)
            for point in cases.values()
            for pair in point.values()
            if name in pair["in"]
        ]
        if not seen or len({v.size for v in seen}) != 1:
            continue
        stack = np.stack(seen)
        opt_cases = cases.get("opt") or {}
        opt = next(
            (np.asarray(p["in"][name]).astype(np.int64).reshape(-1) for p in opt_cases.values() if name in p["in"]),
            stack[0],
        )
        out[name] = (
            tuple(int(v) for v in stack.min(0)),
            tuple(int(v) for v in opt),
            tuple(int(v) for v in stack.max(0)),
        )
    return out


def make_plan(
    cfg: DeployConfig,
    target: TargetProfile,
    files: dict[str, Path],
    *,
    precision_info: dict[str, Any] | None = None,
) -> BuildPlan:
    """Choose the engine build for ``cfg`` on ``target`` from the ONNX files that exist.

    Args:
        files: artifact name -> path for the precision stage's outputs that exist
            (``model.onnx``, ``model.fp16.onnx``, ``model.int8.onnx``, ``calib.cache``).
        precision_info: ``precision.json`` contents when present (FP32 pins).

    Raises:
        TargetCapabilityError: the target cannot run the precision or DLA request, or the workspace
            does not fit its memory.
        StageError: the precision route needs a file the precision stage did not write.
    """
    precision = cfg.precision.mode
    target.require_precision(precision)
    target.require_dla(cfg.build.dla_core, precision)
    workspace = cfg.build.workspace_mib or target.workspace_mib
    if target.memory_mib and workspace > target.memory_mib:
        raise TargetCapabilityError(
            f"workspace {workspace} MiB exceeds target '{target.name}' memory ({target.memory_mib} MiB)",
            hint=f"use --workspace-mib {target.memory_mib} or less (the target's memory; without the flag it gets "
            f"{target.workspace_mib} MiB)",
        )
    notes: list[str] = []
    calib = None
    pins: tuple[str, ...] = ()
    output_pins: tuple[str, ...] = ()
    if precision == "fp32":
        strategy, onnx_name, typed = "fp32", ONNX_FP32, target.strongly_typed_only
    elif precision == "fp16":
        # the precision stage says whether model.fp16.onnx holds FP16 types or is the FP32 graph
        dtype = (precision_info or {}).get("onnx_dtype")
        if ONNX_FP16 in files and (dtype == "float16" or (dtype is None and target.strongly_typed)):
            strategy, onnx_name, typed = "fp16-typed", ONNX_FP16, True
            notes.append("FP16 from the converted model's own types (strongly typed network)")
        elif not target.strongly_typed_only:
            strategy, typed = "fp16-flag", False
            onnx_name = ONNX_FP32  # the FP32 graph: the builder flag and the pins make it FP16
            pins = fp32_pins(precision_info, "fp32_layers")
            output_pins = fp32_pins(precision_info, "fp32_layers", output_type_only=True)
            notes.append("FP16 builder flag on the FP32 graph" + (f"; {len(pins)} layers pinned FP32" if pins else ""))
        else:
            raise StageError(
                "build",
                f"target '{target.name}' (TensorRT {target.trt_version}) has no FP16 builder flag and "
                f"no FP16-typed {ONNX_FP16} was produced",
                hint="let the precision stage write model.fp16.onnx (deploy build --precision fp16)",
            )
    else:
        onnx_name = ""
        typed = False
        strategy = ""
        qdq_refusal = ""
        if ONNX_INT8 in files:
            is_qdq, problems = qdq_problems(files[ONNX_INT8])
            if is_qdq and problems:
                qdq_refusal = f"{ONNX_INT8} has Q/DQ nodes TensorRT cannot take ({len(problems)}): " + "; ".join(
                    problems[:6]
                )
            elif is_qdq:
                strategy, onnx_name, typed = "int8-qdq", ONNX_INT8, target.strongly_typed_only
                notes.append("explicit INT8 from the Q/DQ model")
        implicit = target.implicit_int8 and not target.explicit_int8_only
        if not strategy and CALIB_CACHE in files and implicit:
            strategy, onnx_name, typed, calib = "int8-calib-cache", ONNX_FP32, False, CALIB_CACHE
            pins = fp32_pins(precision_info, "kept_float")  # layers the sensitivity analysis kept in float
            output_pins = fp32_pins(precision_info, "kept_float", output_type_only=True)
            pinned = f"; {len(pins)} layers pinned FP32" if pins else ""
            notes.append("implicit INT8: FP32 model + calibration cache" + pinned)
            if qdq_refusal:
                notes.append(f"the Q/DQ model was not used: {qdq_refusal}")
        if not strategy and qdq_refusal:
            only = "" if implicit else f" (TensorRT {target.trt_version} takes explicit Q/DQ INT8 only)"
            raise StageError(
                "build",
                qdq_refusal + only,
                hint="quantize for TensorRT: symmetric int8 activations and weights (zero point 0), float biases",
            )
        if not strategy:
            need = f"a symmetric Q/DQ {ONNX_INT8}" + ("" if not implicit else f" or {CALIB_CACHE}")
            unused = ""
            if not implicit and CALIB_CACHE in files:
                unused = f" ({CALIB_CACHE} is not used: TensorRT {target.trt_version} has no implicit INT8 route)"
            raise StageError(
                "build",
                f"INT8 for target '{target.name}' needs {need}; the precision stage wrote "
                + ("neither" if implicit else "none")
                + unused,
                hint="give calibration data (--calib) so the precision stage can quantize",
            )
    return BuildPlan(
        target=target.name,
        trt_version=target.trt_version,
        sm=target.sm,
        precision=precision,
        strategy=strategy,
        onnx=onnx_name,
        strongly_typed=typed,
        inputs=input_profiles(cfg, files.get(onnx_name)),
        workspace_mib=workspace,
        calib_cache=calib,
        fp32_layers=pins,
        fp32_output_layers=output_pins,
        dla_core=cfg.build.dla_core,
        notes=tuple(notes),
    )
