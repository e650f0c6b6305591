"""BundleFromOnnx: the TensorRT targets' artifact, a device bundle from which the engine is built where it runs.

TensorRT engines are specific to the TensorRT release and GPU that build them, and Jetson engines
cannot be built on an x86 host, so this stage never builds an engine. It writes ``bundle/``:
the ONNX model the plan builds from (and ``model.onnx``), the calibration cache, the goldens from
the PyTorch reference, ``plan.json``, the equivalent ``trtexec.sh``, the device script
``complete_bundle.py`` with its helpers, and ``bundle.json`` listing every file's sha256.
On the device, ``python3 -I complete_bundle.py .`` verifies, builds and validates the engine.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from edgedeploy import stagenames as names
from edgedeploy.artifacts import FP16_SIMULATED, GOLDENS, ONNX_DATA
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.store import atomic_write_json, atomic_write_text
from edgedeploy.stages.base import BuildContext, Stage, StageResult
from edgedeploy.trt.plan import (
    CALIB_CACHE,
    ONNX_FP16,
    ONNX_FP32,
    ONNX_INT8,
    PLAN,
    PRECISION_INFO,
    BuildPlan,
    make_plan,
    shape_values_from_goldens,
    write_plan,
)
from edgedeploy.trt.trtexec import TRTEXEC_SCRIPT, trtexec_script

BUNDLE_DIR = "bundle"
BUNDLE_MANIFEST = "bundle.json"
BUNDLE_SCHEMA = "edgedeploy-bundle/1"
BUNDLE_README = "README.txt"
_PKG = Path(__file__).resolve().parent.parent
# bundle file name -> source file in this package (the device step runs from these copies)
DEVICE_CODE = {
    "complete_bundle.py": _PKG / "device" / "complete_bundle.py",
    "trt_adapter.py": _PKG / "trt" / "adapter.py",
    "trt_runner.py": _PKG / "device" / "trt_runner.py",
    "parity.py": _PKG / "validate" / "parity.py",
    "goldens_format.py": _PKG / "device" / "goldens_format.py",
}


# what ``complete_bundle.py --runner onnxruntime`` proves, by plan strategy (said in its output and validation.json)
DRY_RUN_PROVES = {
    "fp32": "fp32: the FP32 model in ONNX Runtime",
    "fp16-typed": "fp16: the FP16 model in ONNX Runtime (the engine's kernels differ)",
    "fp16-flag": "fp16 (simulated): the FP32 graph rounding weights and layer outputs to FP16, as the build judged it",
    "int8-qdq": "int8: the Q/DQ model run as written in ONNX Runtime, as the build judged it (the engine's kernels "
    "differ)",
    "int8-calib-cache": "fp32 only: implicit INT8 exists only in the engine; the run on the device proves int8",
}


def dry_run_model(plan: BuildPlan, simulated: bool) -> tuple[str, str]:
    """(ONNX file the bundle's dry run runs, what that proves): the FP16 simulation for a builder-flag FP16 plan
    when the precision stage wrote it (``simulated``), else the plan's own ONNX model."""
    if plan.strategy == "fp16-flag" and simulated:
        return FP16_SIMULATED, DRY_RUN_PROVES["fp16-flag"]
    if plan.strategy == "fp16-flag":
        return plan.onnx, "fp32 only: no FP16 simulation in this bundle; the run on the device proves fp16"
    return plan.onnx, DRY_RUN_PROVES.get(plan.strategy, f"{plan.precision}: the plan's ONNX model in ONNX Runtime")


def bundle_files(
    plan: BuildPlan, *, precision_info: bool, external_data: tuple[str, ...] = (), dry_run: str | None = None
) -> list[str]:
    """Names of every file in a bundle for ``plan`` (relative to the bundle folder), manifest last.

    One ONNX graph: the one the plan builds from, and ``dry_run``, the model the ONNX Runtime dry run runs in
    its place when that differs (the FP16 simulation). ``external_data``: the FP32 model's external-data
    companions (``model.onnx.data``), which travel with it when the plan builds from ``model.onnx``.
    """
    names = [plan.onnx, *(external_data if plan.onnx == ONNX_FP32 else ())]
    if dry_run and dry_run != plan.onnx:
        names.append(dry_run)
    if plan.calib_cache:
        names.append(plan.calib_cache)
    if precision_info:
        names.append(PRECISION_INFO)
    names += [GOLDENS, PLAN, TRTEXEC_SCRIPT, *DEVICE_CODE, BUNDLE_README, BUNDLE_MANIFEST]
    return names


def _readme(plan: BuildPlan, device_python: str) -> str:
    return (
        f"edgedeploy device bundle: target {plan.target} (TensorRT {plan.trt_version}), {plan.precision}.\n"
        "The engine is built on the device, where TensorRT runs. Copy this folder there, then:\n\n"
        f"    python3 -I complete_bundle.py .      # verify hashes, build {plan.engine}, validate against goldens\n"
        f"    python3 -I complete_bundle.py . --verify-only && sh {TRTEXEC_SCRIPT}   # or trtexec (no validation)\n\n"
        f"Needs Python {device_python} or newer, TensorRT's Python bindings (JetPack ships them) and numpy;"
        " polygraphy runs the engine where it imports (TensorRT >= 8.5), else the bundled trt_runner.py does.\n"
        "Dry run anywhere without TensorRT: python3 -I complete_bundle.py . --runner onnxruntime\n"
    )


class BundleFromOnnx(Stage):
    name = names.BUILD
    # 5: the bundle note names no output folder (it was replayed into others from the cache)
    # 6: the note's command checks complete_bundle.py's sha256 before running it (complete_bundle_sha256)
    version = "6"
    consumes = (ONNX_FP32, GOLDENS)
    # what the precision stage wrote for this precision and target; the plan decides which it needs
    optional = (ONNX_DATA, ONNX_FP16, ONNX_INT8, CALIB_CACHE, PRECISION_INFO, FP16_SIMULATED)

    def __init__(self) -> None:
        self._plans: dict[str, BuildPlan] = {}

    def plan(self, ctx: BuildContext) -> BuildPlan:
        """The build plan for this build (decided once from the files earlier stages wrote).

        Raises:
            TargetCapabilityError: precision, DLA or workspace the target cannot do.
            StageError: the precision route needs a file that was not produced.
        """
        key = str(ctx.staging)
        if key not in self._plans:
            files = {n: ctx.path(n) for n in (ONNX_FP32, ONNX_FP16, ONNX_INT8, CALIB_CACHE) if ctx.path(n).is_file()}
            plan = make_plan(ctx.cfg, ctx.target, files, precision_info=_precision_info(ctx))
            # a shape tensor's profile values: the ones the goldens validate the engine on
            values = shape_values_from_goldens(ctx.cfg, ctx.path(GOLDENS))
            self._plans[key] = dataclasses.replace(plan, shape_values=values) if values else plan
        return self._plans[key]

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        plan = self.plan(ctx)
        names = bundle_files(
            plan,
            precision_info=ctx.path(PRECISION_INFO).is_file(),
            external_data=_companions(ctx),
            dry_run=dry_run_model(plan, ctx.path(FP16_SIMULATED).is_file())[0],
        )
        return tuple(f"{BUNDLE_DIR}/{n}" for n in names)

    def config_key(self, ctx: BuildContext) -> Any:
        return {
            "plan": self.plan(ctx).to_dict(),
            "target": ctx.target.capabilities(),
            "validation": _validation_spec(ctx),
            "device_code": {name: sha256_file(src) for name, src in DEVICE_CODE.items()},
        }

    def run(self, ctx: BuildContext) -> StageResult:
        plan = self.plan(ctx)
        folder = ctx.staging / BUNDLE_DIR
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        has_info = ctx.path(PRECISION_INFO).is_file()
        companions = _companions(ctx) if plan.onnx == ONNX_FP32 else ()
        dry_run, proves = dry_run_model(plan, ctx.path(FP16_SIMULATED).is_file())
        copies = [plan.onnx, *companions, dry_run, plan.calib_cache, PRECISION_INFO if has_info else None]
        for name in dict.fromkeys(c for c in [*copies, GOLDENS] if c):
            _link_or_copy(ctx.path(name), folder / name)  # hard links: no second copy of the model in OUT
        for name, src in DEVICE_CODE.items():
            shutil.copyfile(src, folder / name)
        write_plan(plan, folder)
        atomic_write_text(folder / TRTEXEC_SCRIPT, trtexec_script(plan))
        (folder / TRTEXEC_SCRIPT).chmod(0o755)
        atomic_write_text(folder / BUNDLE_README, _readme(plan, ctx.target.device_python or "3.6"))
        listed = [
            n
            for n in bundle_files(plan, precision_info=has_info, external_data=_companions(ctx), dry_run=dry_run)
            if n != BUNDLE_MANIFEST
        ]
        manifest = {
            "schema": BUNDLE_SCHEMA,
            "target": ctx.target.capabilities(),
            "precision": plan.precision,
            "plan": PLAN,
            "goldens": GOLDENS,
            "engine": plan.engine,
            "validation": _validation_spec(ctx),
            "dry_run": {"onnx": dry_run, "proves": proves},
            "files": {n: sha256_file(folder / n) for n in listed},
        }
        atomic_write_json(folder / BUNDLE_MANIFEST, manifest)
        bundle_sha = sha256_file(folder / BUNDLE_MANIFEST)
        # no output path in the note: a cached stage replays it into whichever OUT the next build names. The script
        # that checks the pin is a file of the bundle too: whoever could change the bundle could change the check,
        # so the command checks the script's own hash (printed here, from outside the bundle) before running it
        script_sha = sha256_file(folder / "complete_bundle.py")
        notes = [
            f"engine not built here: TensorRT engines are built on the device ({ctx.target.name}, "
            f"TensorRT {ctx.target.trt_version}). Copy this build's {BUNDLE_DIR}/ folder there and run: "
            f"{pinned_command(script_sha, bundle_sha)}",
        ]
        warnings = [note for note in plan.notes if note.startswith("the Q/DQ model was not used")]
        # the notes reach the user once: in the report, and printed at the end of deploy build
        metrics = {
            "artifact": f"{BUNDLE_DIR}/",
            "engine": "not built here (built on the device by complete_bundle.py)",
            "bundle_sha256": bundle_sha,
            "complete_bundle_sha256": script_sha,
            "plan": {
                "strategy": plan.strategy,
                "onnx": plan.onnx,
                "strongly_typed": plan.strongly_typed,
                "workspace_mib": plan.workspace_mib,
                "dla_core": plan.dla_core,
                "fp32_layers": len(plan.fp32_layers),
                "dynamic": plan.dynamic,
                "notes": list(plan.notes),
            },
        }
        return StageResult(metrics, warnings=warnings, notes=notes)


def _precision_info(ctx: BuildContext) -> dict[str, Any] | None:
    path = ctx.path(PRECISION_INFO)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _validation_spec(ctx: BuildContext) -> dict[str, Any]:
    """What the device step compares and how strictly (the same tolerance the host would use)."""
    cfg = ctx.cfg
    tol = cfg.tolerance_for(ctx.precision)
    return {
        "tolerance": {k: getattr(tol, k) for k in ("atol", "rtol", "min_cosine", "min_topk_agreement")},
        "outputs": list(cfg.outputs),
        "classifier_outputs": list(cfg.validate.classifier_outputs),
        "topk": cfg.validate.topk,
    }


def _companions(ctx: BuildContext) -> tuple[str, ...]:
    """External-data files of the FP32 model (``model.onnx.data``) present in staging."""
    name = ONNX_FP32 + ".data"
    return (name,) if ctx.path(name).is_file() else ()


def _link_or_copy(src: Path, dst: Path) -> None:
    import os

    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def pinned_command(script_sha256: str, bundle_sha256: str) -> str:
    """The device command that trusts nothing in the bundle folder before checking it: the script's sha256 (from
    this build, outside the bundle) first, then the script checks ``bundle.json`` against its pinned sha256 and
    every file against ``bundle.json``."""
    return (
        f'echo "{script_sha256}  complete_bundle.py" | sha256sum -c - && '
        f"python3 -I complete_bundle.py . --bundle-sha256 {bundle_sha256}"
    )
