"""Declarative per-model config: a TOML file, validated into frozen dataclasses.

Every scalar field may carry a CLI flag in its metadata (``flag``); the CLI
builds its options from these, so flags map one to one onto config fields.
Errors always name the file and the dotted key.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from edgedeploy.errors import ConfigError
from edgedeploy.policy import GatePolicy
from edgedeploy.schema import dataclass_from_dict, read_toml, resolve_path

Precision = Literal["fp32", "fp16", "int8"]
CaptureMode = Literal["auto", "trace", "script", "export"]
ExporterName = Literal["auto", "dynamo", "torchscript"]
CalibMethod = Literal["auto", "minmax", "entropy", "percentile", "mse"]
Int8Recipe = Literal["auto", "cnn", "transformer"]
DTYPES = ("float32", "float16", "int64", "int32", "bool")
# generated-input kinds (edgedeploy/modelio/generators.py); "" picks by dtype
INPUT_KINDS = ("", "float", "image", "ids", "mask")


def _flag(name: str, help: str, *, path: bool = False) -> dict[str, Any]:
    """Field metadata: the CLI flag that sets it; ``path`` flags resolve against the working directory."""
    return {"flag": name, "help": help, "path": path}


@dataclass(frozen=True)
class DimSpec:
    """A named dynamic dimension with its min / opt / max sizes."""

    min: int
    opt: int
    max: int


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, shape (ints and named dims), dtype, value range (inclusive) and kind.

    ``kind`` chooses the generator for seeded inputs: ``float`` / ``image`` uniform in ``range``,
    ``ids`` integers in ``range`` (both ends included: ``[0, vocab_size - 1]``), ``mask`` prefix
    attention masks (ones then zeros per row, never all zeros). Empty: by dtype.
    """

    name: str
    shape: tuple[int | str, ...]
    dtype: str = "float32"
    range: tuple[float, float] = (0.0, 1.0)
    kind: str = ""


@dataclass(frozen=True)
class ModelSection:
    factory: str = field(default="", metadata=_flag("--factory", "model factory as module:callable"))
    hf: str | None = field(default=None, metadata=_flag("--hf", "Hugging Face model folder", path=True))
    # an ONNX model the user already has (edgedeploy/onnxspec.py): no PyTorch; judged against its own FP32 run
    onnx: str | None = field(
        default=None,
        metadata=_flag("--onnx", "ONNX model to build from (no PyTorch: judged against its ONNX Runtime FP32 run)",
                       path=True),
    )  # fmt: skip
    task: str = field(default="", metadata=_flag("--task", "Hugging Face task (with model.hf)"))
    kwargs: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = field(
        default=None,
        metadata=_flag(
            "--checkpoint",
            "safetensors or torch state-dict checkpoint, or the folder a trainer wrote (its .meta.json describes "
            "the model)",
            path=True,
        ),
    )
    python_path: tuple[str, ...] = (".",)
    trust_sidecar_code: bool = field(
        default=False,
        metadata=_flag(
            "--trust-checkpoint-code",
            "let the checkpoint's .meta.json name the model factory (module inside model.python_path only)",
        ),
    )
    trust_remote_code: bool = field(
        default=False,
        metadata=_flag("--trust-remote-code", "let a Hugging Face folder run its own Python code (auto_map)"),
    )
    class_names: tuple[str, ...] = ()
    normalization: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportSection:
    capture: CaptureMode = field(
        default="auto", metadata=_flag("--capture", "torch capture: auto, trace, script or export")
    )
    exporter: ExporterName = field(
        default="auto", metadata=_flag("--exporter", "ONNX exporter: auto, dynamo or torchscript")
    )
    opset: int | None = field(default=None, metadata=_flag("--opset", "ONNX opset (default: target's)"))
    simplify: bool = field(default=True, metadata=_flag("--simplify", "simplify with onnxslim"))
    fail_on_tracer_warnings: bool = True
    # the probe at the inputs' range edges (onnxtools.shapes.EDGE_POINT); off where PyTorch's own answer there is
    # arbitrary (a tie broken in another order by an exported TopK)
    edge_probe: bool = True


@dataclass(frozen=True)
class PrecisionSection:
    mode: Precision = field(default="fp32", metadata=_flag("--precision", "fp32, fp16 or int8"))
    calib: str | None = field(default=None, metadata=_flag("--calib", "calibration data (dir, .npy/.npz)", path=True))
    # auto: mse for classifier outputs (EfficientNet-Lite0: ahead of minmax in 23 of 24 measured pairs), minmax
    # otherwise (a ResNet-50 embedder's never-calibrated photos: mse clipped, min cosine 0.76 against 0.94);
    # bench/README.md, "Why `mse` ranges for classifiers"
    calib_method: CalibMethod = field(
        default="auto",
        metadata=_flag("--calib-method", "auto (mse for classifiers, else minmax)/minmax/entropy/percentile/mse"),
    )
    calib_callable: str | None = field(
        default=None, metadata=_flag("--calib-callable", "calibration batches from module:callable")
    )
    calib_resize: tuple[int, ...] = ()  # (H, W) for image folders; default: the input's spatial size
    calib_layout: Literal["NCHW", "NHWC"] = "NCHW"  # layout of image-folder tensors
    calib_samples: int = 64
    per_channel: bool = True
    # 7-bit weights for ONNX Runtime: "auto" = 8-bit on VNNI/AMX CPUs (and TensorRT), else measure both
    reduce_range: bool | Literal["auto"] = "auto"
    # cross-layer equalization + bias correction before INT8 (precision/equalize.py); auto: graphs with depthwise convs
    equalize: bool | Literal["auto"] = field(
        default="auto", metadata=_flag("--equalize", "INT8 cross-layer equalization + bias correction: auto/true/false")
    )
    # how equalize's bias correction measures the shift (precision/bias_correction.py): "outputs" matches each
    # quantized conv's output mean to the float model's, layer by layer; "weights" removes (W_q - W) E[x] only
    bias_correction: Literal["outputs", "weights"] = field(
        default="outputs",
        metadata=_flag("--bias-correction", "INT8 bias correction: outputs or weights"),
    )
    # INT8 CNN weight rounding (precision/adaround.py): "adaround" learns up/down per weight so each layer's
    # output on the calibration data stays closest to the float one; "nearest" is ORT's round-to-nearest;
    # "auto" learns only when the round-to-nearest model misses accuracy_target (learning costs minutes)
    weight_rounding: Literal["auto", "nearest", "adaround"] = field(
        default="auto",
        metadata=_flag("--weight-rounding", "INT8 CNN weight rounding: auto, adaround (learned) or nearest"),
    )
    # INT8 on onnxruntime: keep the first layers float where they measure faster than INT8 on this CPU
    # (precision/speed_probe.py; a network's 3-channel stem usually does)
    float_when_faster: bool = field(
        default=True,
        metadata=_flag("--float-when-faster", "INT8: keep early layers float where measured faster (onnxruntime)"),
    )
    # held-out score the reduced-precision model must reach; unset: top-1 agreement at the gate's
    # tolerance.<precision>.min_topk_agreement for classifier outputs, mean cosine 0.99 otherwise
    accuracy_target: float | None = None
    # quantizations the fewest-float-layers search may spend: 16 reaches k = 32 float nodes with both families
    # and bisects back (EfficientNet-Lite0 for jetson-orin passes at 17 float nodes on try 14; 8 stopped at k = 8)
    max_fallback_tries: int = 16
    # seconds the INT8 fallback search may run (None: no limit); when spent it stops, keeps the smallest passing
    # float set found so far, or fails naming the budget (precision.json: fallback_stop says why it stopped)
    time_budget_s: float | None = None
    keep_fp32: tuple[str, ...] = ()
    # transformer INT8 (edgedeploy/precision/transformer.py): recipe detection and SmoothQuant-style smoothing
    int8_recipe: Int8Recipe = field(
        default="auto", metadata=_flag("--int8-recipe", "INT8 recipe: auto (detect), cnn or transformer")
    )
    smoothquant_alpha: float = field(
        default=0.0, metadata=_flag("--smoothquant-alpha", "transformer INT8 smoothing strength 0..1 (0: off)")
    )


@dataclass(frozen=True)
class Tolerance:
    """Pass criteria for one precision. ``None`` disables that criterion."""

    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    min_topk_agreement: float | None = None


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(atol=1e-4, rtol=1e-3, min_cosine=0.9999),
    "fp16": Tolerance(atol=1e-2, rtol=1e-2, min_cosine=0.999),
    "int8": Tolerance(min_cosine=0.98, min_topk_agreement=0.95),
}


@dataclass(frozen=True)
class ValidateSection:
    samples: int = field(default=2, metadata=_flag("--samples", "random batches per shape"))
    seed: int = field(default=0, metadata=_flag("--seed", "seed for generated validation inputs"))
    data: str | None = field(default=None, metadata=_flag("--validation-data", "validation inputs (.npz)", path=True))
    classifier_outputs: tuple[str, ...] = ()
    topk: int = 1
    latency_iters: int = field(default=20, metadata=_flag("--latency-iters", "timed runs per backend"))
    latency_warmup: int = 3
    # goldens.npz size (it travels in device bundles): unset = the larger of 8 MB and twice the model's weights
    goldens_budget_mb: float | None = None


@dataclass(frozen=True)
class BuildSection:
    target: str = field(default="cpu", metadata=_flag("--target", "target profile (see deploy targets)"))
    jetson: str = "jetson-orin"  # what --target jetson means off a Jetson (on one: detected)
    out: str = field(default="build", metadata=_flag("--out", "output directory", path=True))
    cache: bool = field(default=True, metadata=_flag("--cache", "reuse content-keyed cached stages"))
    dla_core: int | None = field(default=None, metadata=_flag("--dla-core", "DLA core (Jetson)"))
    workspace_mib: int | None = field(default=None, metadata=_flag("--workspace-mib", "TensorRT workspace"))
    targets_file: str | None = field(default=None, metadata=_flag("--targets-file", "extra target profiles", path=True))
    gate_policy: str | None = field(
        default=None, metadata=_flag("--policy", "release-gate policy TOML (overrides [gate])", path=True)
    )


@dataclass(frozen=True)
class DeployConfig:
    """The whole validated config. Paths in it are resolved against ``base_dir``."""

    model: ModelSection
    inputs: tuple[InputSpec, ...]
    outputs: tuple[str, ...]
    dims: dict[str, DimSpec] = field(default_factory=dict)
    export: ExportSection = field(default_factory=ExportSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    tolerance: dict[str, Tolerance] = field(default_factory=dict)
    validate: ValidateSection = field(default_factory=ValidateSection)
    gate: GatePolicy | None = None  # [gate]: release gate run at the end of the build (edgedeploy/validate/gate.py)
    build: BuildSection = field(default_factory=BuildSection)
    source: str = "<dict>"
    base_dir: str = "."
    factory_origin: str = "config"  # "config" | "sidecar" | "package": where model.factory came from
    # config key (precision.calib, validate.data) -> the exporter's sample file it was filled with
    # (edgedeploy.sidecar.exported_data): checked against its recorded sha256 and named in the report
    data_origins: dict[str, dict[str, str]] = field(default_factory=dict)

    # ---- derived views -------------------------------------------------
    def path(self, value: str | None) -> Path | None:
        """Resolve a path from the config relative to the config file's folder."""
        return resolve_path(self.base_dir, value)

    def tolerance_for(self, precision: str) -> Tolerance:
        """Configured tolerance for ``precision``, defaults filled in per field."""
        base = DEFAULT_TOLERANCES[precision]
        user = self.tolerance.get(precision)
        if user is None:
            return base
        return Tolerance(
            **{
                f.name: getattr(user, f.name) if getattr(user, f.name) is not None else getattr(base, f.name)
                for f in dataclasses.fields(Tolerance)
            }
        )

    def shape_for(self, spec: InputSpec, which: str) -> tuple[int, ...]:
        """Concrete shape of ``spec`` with every named dim at ``which`` (min/opt/max)."""
        return tuple(d if isinstance(d, int) else getattr(self.dims[d], which) for d in spec.shape)

    def dynamic_dims(self, spec: InputSpec) -> dict[int, str]:
        """Axis index → dim name for the named (dynamic) axes of ``spec``."""
        return {i: d for i, d in enumerate(spec.shape) if isinstance(d, str)}

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (for hashing and the manifest)."""
        return _plain(self)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# ---- loading ------------------------------------------------------------------------


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def checkpoint_metadata_path(checkpoint: Path) -> Path:
    """Sidecar JSON written by ``deploy train`` next to a safetensors checkpoint."""
    return checkpoint.with_suffix(".meta.json")


SIDECAR_FORMAT = "edgedeploy-checkpoint/1"
# Modules whose factories a sidecar may name without model.trust_sidecar_code: the package's own
# model zoo. Anything else a sidecar names is code chosen by whoever wrote the sidecar.
PACKAGE_FACTORY_MODULES = ("edgedeploy.train.models",)


def module_file_in_roots(module_name: str, roots: list[Path]) -> Path | None:
    """The source file of ``module_name`` under one of ``roots``, found without importing anything."""
    rel = Path(*module_name.split("."))
    for root in roots:
        for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
            if candidate.is_file():
                return candidate.resolve()
    return None


# Top-level DeployConfig fields set by code, never by a file, a flag or a keyword.
INTERNAL_FIELDS = ("source", "base_dir", "factory_origin", "data_origins")


def _merge_checkpoint_metadata(
    raw: dict[str, Any], base_dir: Path, where: str
) -> tuple[str, dict[str, dict[str, str]]]:
    """Fill model factory, inputs, dims and outputs from a train-stage checkpoint's metadata, and
    ``precision.calib`` / ``validate.data`` from the samples an exporter wrote next to it.

    ``model.checkpoint`` may be the folder a trainer wrote (its one checkpoint is used,
    :func:`edgedeploy.sidecar.checkpoint_in_folder`). The config's own values win; metadata only fills
    what the config leaves out. A sidecar is
    untrusted data: the factory it names is taken only from the package's own model zoo, or,
    with ``model.trust_sidecar_code = true``, from a module file inside ``model.python_path``.
    Nothing is imported here.

    Returns:
        Where ``model.factory`` comes from (``config``, ``package`` or ``sidecar``), and the exported sample
        files used as data, by config key (:func:`edgedeploy.sidecar.fill_exported_data`).

    Raises:
        ConfigError: unreadable sidecar, wrong format, a factory the sidecar may not name, a checkpoint
            folder without exactly one checkpoint, or a malformed ``deploy_data``.
    """
    from edgedeploy.sidecar import checkpoint_in_folder, fill_exported_data

    model = raw.get("model") or {}
    ckpt = model.get("checkpoint")
    if not ckpt:
        return "config", {}
    path = resolve_path(base_dir, ckpt) or Path(ckpt)
    if path.is_dir():
        path = checkpoint_in_folder(path, where)
        model["checkpoint"] = str(path)
    meta_path = checkpoint_metadata_path(path)
    if not meta_path.is_file():
        return "config", {}
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{meta_path}: checkpoint metadata is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ConfigError(f"{meta_path}: checkpoint metadata must be a JSON object, got {type(meta).__name__}")
    if "format" in meta and meta["format"] != SIDECAR_FORMAT:
        raise ConfigError(
            f"{meta_path}: checkpoint metadata format {meta['format']!r} is not {SIDECAR_FORMAT!r}",
            hint="re-create it with deploy train, or delete it and set model.* in the config",
        )
    model = raw.setdefault("model", {})
    origin = "config"
    side_factory = meta.get("factory") or ""
    if not isinstance(side_factory, str):
        raise ConfigError(f"{meta_path}: key 'factory' must be a 'module:callable' string")
    if not model.get("factory") and side_factory:
        origin = _sidecar_factory_origin(side_factory, model, base_dir, meta_path)
        model["factory"] = side_factory
    if "factory_kwargs" in meta and model.get("factory") == side_factory:
        if not isinstance(meta["factory_kwargs"], dict):
            raise ConfigError(f"{meta_path}: key 'factory_kwargs' must be a JSON object")
        model.setdefault("kwargs", meta["factory_kwargs"])
    for key in ("class_names", "normalization"):
        if meta.get(key):
            model.setdefault(key, meta[key])
    for key in ("inputs", "outputs", "dims"):
        if key in meta:
            raw.setdefault(key, meta[key])
    return origin, fill_exported_data(raw, meta, meta_path)


def _sidecar_factory_origin(factory: str, model: dict[str, Any], base_dir: Path, meta_path: Path) -> str:
    module_name = factory.partition(":")[0]
    if module_name in PACKAGE_FACTORY_MODULES:
        return "package"
    trust = model.get("trust_sidecar_code", False)
    if trust is not True:
        raise ConfigError(
            f"{meta_path}: names model factory {factory!r}; "
            "a checkpoint sidecar is data and may not choose code to run",
            hint=f"if you trust it, name it yourself: --factory {factory} (model.factory in a config), "
            "or --trust-checkpoint-code (model.trust_sidecar_code = true) for a factory inside model.python_path",
        )
    roots = [resolve_path(str(base_dir), p) for p in (model.get("python_path") or ["."])]
    if module_file_in_roots(module_name, [r for r in roots if r is not None]) is None:
        raise ConfigError(
            f"{meta_path}: factory {factory!r} does not resolve to a module file inside model.python_path "
            f"({', '.join(str(r) for r in roots)}); sidecar factories may only name the project's own code",
            hint="set model.factory in the config to use a library or system module",
        )
    return "sidecar"


def config_from_dict(
    raw: dict[str, Any], *, source: str = "<dict>", base_dir: str | Path = ".", overrides: dict[str, Any] | None = None
) -> DeployConfig:
    """Validate a plain dict (as read from TOML) into a :class:`DeployConfig`.

    Args:
        raw: the parsed TOML document.
        source: file name used in error messages.
        base_dir: folder that relative paths are resolved against.
        overrides: dotted key → value (from CLI flags), applied before validation.

    Raises:
        ConfigError: unknown or misspelled key, wrong type, inconsistent dims or inputs.
    """
    try:
        return _validated(raw, source=source, base_dir=base_dir, overrides=overrides)
    except ConfigError as exc:
        raise _blame_overrides(exc, str(source), overrides or {}) from None


def _blame_overrides(exc: ConfigError, source: str, overrides: dict[str, Any]) -> ConfigError:
    """``exc`` with its where naming the override (a flag or an API keyword) that set the key it is about, not
    only the config file, which may not hold that key at all; ``exc`` itself when no override set it."""
    import re

    named = re.findall(r"key '([^']+)'", exc.message)
    for key in overrides:
        hit = next((n for n in named if n == key or n.startswith(key + ".") or key.startswith(n + ".")), None)
        if hit is not None:
            if exc.message.startswith(f"{source}: "):
                setter = hit if hit.startswith(key + ".") else key  # --dim sets all of 'dims': name the one at fault
                message = f"{source}, as overridden by {setter}: " + exc.message[len(source) + 2 :]
                return ConfigError(message, hint=exc.hint)
    return exc


def _validated(
    raw: dict[str, Any], *, source: str, base_dir: str | Path, overrides: dict[str, Any] | None
) -> DeployConfig:
    """:func:`config_from_dict`'s work, its errors naming the config file."""
    raw = json.loads(json.dumps(raw))  # deep copy; TOML data is JSON-compatible
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    if (raw.get("model") or {}).get("hf"):
        from edgedeploy.hfspec import fill_from_folder  # reads config.json only; no transformers import

        fill_from_folder(raw, Path(base_dir), str(source))
    if (raw.get("model") or {}).get("onnx"):
        from edgedeploy.onnxspec import fill_from_onnx  # reads the graph only; no onnxruntime import

        fill_from_onnx(raw, Path(base_dir), str(source))
    origin, data_origins = _merge_checkpoint_metadata(raw, Path(base_dir), source)
    cfg: DeployConfig = dataclass_from_dict(DeployConfig, raw, source, internal=INTERNAL_FIELDS)
    cfg = dataclasses.replace(
        cfg, source=str(source), base_dir=str(base_dir), factory_origin=origin, data_origins=data_origins
    )
    _check_consistency(cfg)
    return cfg


NORMALIZATION_KEYS = ("mean", "std")


def _check_normalization(where: str, norm: dict[str, Any]) -> None:
    """``model.normalization`` holds ``mean`` and ``std`` only, each a list of numbers per channel (std > 0):
    a misspelled key would leave the calibration images unnormalized without a word."""
    import difflib

    for key, value in norm.items():
        if key not in NORMALIZATION_KEYS:
            close = difflib.get_close_matches(key, NORMALIZATION_KEYS, n=1, cutoff=0.4)
            raise ConfigError(
                f"{where}: unknown key 'model.normalization.{key}'",
                hint=f"did you mean 'model.normalization.{close[0]}'?" if close else "use mean and std",
            )
        numbers = (
            isinstance(value, (list, tuple))
            and value
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        )
        if not numbers or (key == "std" and min(value) <= 0):
            raise ConfigError(
                f"{where}: key 'model.normalization.{key}' = {value!r} must be a list of "
                + ("positive numbers" if key == "std" else "numbers")
                + ", one per channel",
                hint=f"e.g. {key} = " + ("[0.229, 0.224, 0.225]" if key == "std" else "[0.485, 0.456, 0.406]"),
            )
    if len(norm.get("mean") or []) and len(norm.get("std") or []) and len(norm["mean"]) != len(norm["std"]):
        raise ConfigError(
            f"{where}: keys 'model.normalization.mean' ({len(norm['mean'])} values) and 'std' "
            f"({len(norm['std'])}) must give one value per channel each"
        )


def _check_dims_used(cfg: DeployConfig) -> None:
    """Every [dims.*] table sizes a dim some input names: a mistyped or stale one would leave the model validated
    at sizes nobody asked for (a given ONNX model's 'batch' at 1 while [dims.bach] holds 1:4:8).

    Raises:
        ConfigError: naming the unused table, the dims the inputs use, and the closest one.
    """
    import difflib

    used = [size for spec in cfg.inputs for size in spec.shape if isinstance(size, str)]
    for name, d in cfg.dims.items():
        if name not in used:
            close = difflib.get_close_matches(name, used, n=1)
            names = ", ".join(dict.fromkeys(used)) or "none: every input shape is static"
            raise ConfigError(
                f"{cfg.source}: key 'dims.{name}' sizes a dim no input names (the inputs' dims: {names})",
                hint=f"did you mean '{close[0]}'? give those sizes to [dims.{close[0]}] and drop [dims.{name}] "
                f"(--dim {close[0]}={d.min}:{d.opt}:{d.max})"
                if close
                else f"remove [dims.{name}], or name it in an input's shape",
            )


def _check_consistency(cfg: DeployConfig) -> None:
    where = cfg.source
    if not cfg.model.factory and not cfg.model.onnx:
        raise ConfigError(
            f"{where}: missing required key 'model.factory'",
            hint="set it to 'module:callable', e.g. 'model:build' (or model.onnx to build from an ONNX model)",
        )
    if cfg.model.factory and ":" not in cfg.model.factory:
        raise ConfigError(f"{where}: key 'model.factory' = {cfg.model.factory!r} must be 'module:callable'")
    if not cfg.inputs:
        raise ConfigError(f"{where}: at least one [[inputs]] table is required")
    if not cfg.outputs:
        raise ConfigError(f"{where}: key 'outputs' must name at least one output")
    for name, d in cfg.dims.items():
        if not (1 <= d.min <= d.opt <= d.max):
            low, mid, high = sorted(max(1, v) for v in (d.min, d.opt, d.max))
            raise ConfigError(
                f"{where}: key 'dims.{name}' needs 1 <= min <= opt <= max, got min={d.min} opt={d.opt} max={d.max}",
                hint=f"order them: [dims.{name}] min = {low}, opt = {mid}, max = {high} "
                f"(--dim {name}={low}:{mid}:{high})",
            )
    seen = set()
    for i, spec in enumerate(cfg.inputs):
        if spec.name in seen:
            raise ConfigError(f"{where}: duplicate input name {spec.name!r} in inputs[{i}]")
        seen.add(spec.name)
        if spec.kind not in INPUT_KINDS:
            raise ConfigError(
                f"{where}: key 'inputs[{i}].kind' = {spec.kind!r} is not allowed",
                hint=f"use one of {', '.join(k for k in INPUT_KINDS if k)}",
            )
        if spec.dtype not in DTYPES:
            raise ConfigError(
                f"{where}: key 'inputs[{i}].dtype' = {spec.dtype!r} is not allowed",
                hint=f"use one of {', '.join(DTYPES)}",
            )
        for size in spec.shape:
            if isinstance(size, str) and size not in cfg.dims:
                raise ConfigError(
                    f"{where}: inputs[{i}] ({spec.name}) uses dim {size!r} that has no [dims.{size}] table",
                    hint=f"add [dims.{size}] with min, opt and max",
                )
            if isinstance(size, int) and size < 1:
                raise ConfigError(f"{where}: inputs[{i}] ({spec.name}) has non-positive size {size}")
        lo, hi = spec.range
        if lo > hi:
            raise ConfigError(f"{where}: key 'inputs[{i}].range' must be [low, high] with low <= high")
    _check_dims_used(cfg)
    _check_normalization(where, cfg.model.normalization)
    for name in cfg.tolerance:
        if name not in DEFAULT_TOLERANCES:
            raise ConfigError(
                f"{where}: unknown key 'tolerance.{name}'", hint=f"use one of {', '.join(DEFAULT_TOLERANCES)}"
            )
    for name in cfg.validate.classifier_outputs:
        if name not in cfg.outputs:
            raise ConfigError(f"{where}: key 'validate.classifier_outputs' names unknown output {name!r}")
    if not 0.0 <= cfg.precision.smoothquant_alpha <= 1.0:
        raise ConfigError(
            f"{where}: key 'precision.smoothquant_alpha' = {cfg.precision.smoothquant_alpha} must be in [0, 1]",
            hint="0 turns smoothing off; 0.5 is SmoothQuant's usual strength",
        )
    if len(set(cfg.outputs)) != len(cfg.outputs):
        dupes = sorted({n for n in cfg.outputs if cfg.outputs.count(n) > 1})
        raise ConfigError(f"{where}: key 'outputs' names {dupes} more than once", hint="each output once")
    from edgedeploy.config_ranges import config_problems, raise_if_problems

    raise_if_problems(config_problems(cfg), where)


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> DeployConfig:
    """Read and validate a ``deploy.toml``.

    Raises:
        ConfigError: the file is missing, is not valid TOML, or fails validation.
    """
    path = Path(path)
    raw = read_toml(path, what="config file", hint="pass --config PATH to a deploy.toml")
    return config_from_dict(raw, source=str(path), base_dir=path.resolve().parent, overrides=overrides)
