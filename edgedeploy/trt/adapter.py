"""The one module that calls TensorRT: build a serialized engine from an ONNX file, run an engine.

Works with TensorRT 8.2 ... 11.x. Version differences handled here:

- workspace: ``IBuilderConfig.set_memory_pool_limit`` (8.4+) vs ``max_workspace_size`` (older);
- networks: ``EXPLICIT_BATCH`` creation flag before 10.0 (deprecated and ignored from 10.0);
  ``STRONGLY_TYPED`` from 9.x; 11.x builds strongly typed networks only;
- precision: ``BuilderFlag.FP16`` / ``INT8`` and calibrators exist up to 10.x and are gone in 11.x;
- ``builder_optimization_level`` exists from 8.6.

This file is copied verbatim into device bundles (as ``trt_adapter.py``) and runs on the
device's Python (3.6 on JetPack 4.6 and up), so it imports nothing from edgedeploy and keeps to
3.6 syntax (checked by vermin in CI). TensorRT and polygraphy are imported inside functions.
"""
# Python 3.6 syntax on purpose (no `from __future__ import annotations`, typing generics):
# ruff: noqa: UP006, UP035, UP045

import ctypes
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # checked against tensorrt-stubs; never imported at run time here
    import tensorrt as trt

Shape = Tuple[int, ...]
# input name -> (min, opt, max) shapes; one dict per optimization profile
Profile = Dict[str, Tuple[Shape, Shape, Shape]]

_DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")
_OOM_MARKERS = ("out of memory", "outofmemory", "insufficient memory", "cudaerrormemoryallocation", "requested amount")


class TensorRTUnavailable(RuntimeError):
    """TensorRT's Python bindings do not import here."""


class EngineBuildError(RuntimeError):
    """TensorRT could not parse the model or build the engine; the message carries TensorRT's errors."""


class BuildOutOfMemoryError(EngineBuildError):
    """The engine build ran out of (device or workspace) memory; a smaller workspace may succeed."""


def import_tensorrt() -> Any:
    """The ``tensorrt`` module.

    Raises:
        TensorRTUnavailable: the bindings are not installed or their libraries do not load.
    """
    try:
        import tensorrt
    except Exception as exc:  # ImportError, or OSError from missing libnvinfer
        raise TensorRTUnavailable(f"TensorRT Python bindings do not import ({type(exc).__name__}: {exc})") from None
    if not hasattr(tensorrt, "Builder"):  # e.g. only tensorrt-stubs installed: an empty namespace package
        raise TensorRTUnavailable("TensorRT Python bindings are not installed (a `tensorrt` folder without bindings)")
    return tensorrt


def tensorrt_version() -> Optional[str]:
    """Installed TensorRT version (``"10.3.0.30"``), or None when it does not import."""
    try:
        return str(import_tensorrt().__version__)
    except TensorRTUnavailable:
        return None


def version_tuple(version: str) -> Tuple[int, ...]:
    """``"10.3.0.30"`` -> ``(10, 3, 0, 30)``; non-numeric parts end the tuple."""
    out: List[int] = []
    for part in version.split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _load_driver() -> Any:
    """``libcuda.so.1`` through ctypes, or None where no NVIDIA driver is installed."""
    for name in _DRIVER_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def cuda_device(index: int = 0, lib: Any = None) -> Optional[Dict[str, str]]:
    """Name and compute capability (``{"name": "Orin", "sm": "8.7"}``) of a CUDA device, via the driver API.

    Uses ``libcuda.so.1`` (the driver library, in the loader path wherever an NVIDIA driver is
    installed, JetPack included) rather than ``libcudart``, which pip wheels keep under
    site-packages where ``ctypes`` does not look. ``lib`` replaces the loaded library (tests).
    Returns None when no driver library or no device is found.
    """
    lib = lib if lib is not None else _load_driver()
    if lib is None:
        return None
    device = ctypes.c_int(0)
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    name = ctypes.create_string_buffer(256)
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, ..._MINOR = 76 (cuda.h)
    if (
        lib.cuInit(0) != 0
        or lib.cuDeviceGet(ctypes.byref(device), int(index)) != 0
        or lib.cuDeviceGetAttribute(ctypes.byref(major), 75, device) != 0
        or lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, device) != 0
    ):
        return None
    text = name.value.decode("utf-8", "replace") if lib.cuDeviceGetName(name, 256, device) == 0 else ""
    return {"name": text, "sm": f"{major.value}.{minor.value}"}


def _looks_like_oom(errors: Sequence[str]) -> bool:
    """Whether TensorRT's ERROR-level messages say the build ran out of memory.

    Only errors count: TensorRT logs routine warnings such as "Skipping tactic ... due to
    insufficient memory" during every large build, which are not why a build failed.
    """
    text = " ".join(errors).lower().replace(" ", "")
    return any(marker.replace(" ", "") in text for marker in _OOM_MARKERS)


def trt_version_code(version: str) -> int:
    """TensorRT's NV_TENSORRT_VERSION for ``version``: 8.5.2 -> 8502, 10.3.0 -> 100300 (10.x widened it)."""
    parts = list(version_tuple(version)[:3]) + [0, 0, 0]
    major, minor, patch = parts[0], parts[1], parts[2]
    return major * (10000 if major >= 10 else 1000) + minor * 100 + patch


def retarget_calib_cache(data: bytes, version: str) -> bytes:
    """``data`` with its ``TRT-<code>-<algorithm>`` header rewritten to the running TensorRT's code.

    The host writes the cache for the profile's version (``8.5`` -> ``TRT-8500-...``) while the
    device runs e.g. 8.5.2 (``8502``); TensorRT ignores a cache whose header code differs and
    calibrates again with no data here. The scales do not depend on the patch release.
    """
    head, sep, rest = data.partition(b"\n")
    parts = head.decode("ascii", "replace").strip().split("-", 2)
    if len(parts) != 3 or parts[0] != "TRT" or not parts[1].isdigit():
        return data
    return f"TRT-{trt_version_code(version)}-{parts[2]}".encode("ascii") + sep + rest


def _set_workspace(config: "trt.IBuilderConfig", workspace_mib: int) -> None:
    import tensorrt as trt

    size = int(workspace_mib) << 20
    if hasattr(config, "set_memory_pool_limit"):  # TensorRT >= 8.4
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, size)
    else:  # TensorRT 8.2: attribute removed in 10.0
        setattr(config, "max_workspace_size", size)  # noqa: B010 (absent from the 10.x stubs)


def _network_flags(major: int, strongly_typed: bool) -> int:
    import tensorrt as trt

    flags = 0
    creation = trt.NetworkDefinitionCreationFlag
    if major < 10:  # explicit batch is the only mode from 10.0 on; the flag is deprecated there
        flags |= 1 << int(creation.EXPLICIT_BATCH)
    if strongly_typed:
        if not hasattr(creation, "STRONGLY_TYPED"):
            raise EngineBuildError(f"this TensorRT ({trt.__version__}) has no strongly typed networks")
        flags |= 1 << int(creation.STRONGLY_TYPED)
    return flags


def _builder_flag(name: str) -> "trt.BuilderFlag":
    import tensorrt as trt

    flag = getattr(trt.BuilderFlag, name, None)
    if flag is None:
        raise EngineBuildError(
            f"TensorRT {trt.__version__} has no BuilderFlag.{name} "
            "(removed in 11.x: build a strongly typed model instead)"
        )
    return flag


def _cache_calibrator(cache_bytes: bytes) -> "trt.IInt8Calibrator":
    """An entropy calibrator that only replays a calibration cache (no data on the device)."""
    import tensorrt as trt

    class CacheCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)

        def get_batch_size(self) -> int:
            return 1

        # TensorRT documents None as "no more data"; the stubs type the return as list[int]
        def get_batch(self, names: List[str]) -> Optional[List[int]]:  # type: ignore[override]
            return None  # the cache covers every tensor; TensorRT never asks for data

        def read_calibration_cache(self) -> bytes:
            return cache_bytes

        def write_calibration_cache(self, cache: Any) -> None:
            return None

    return CacheCalibrator()


def build_serialized_engine(
    onnx_path: str,
    *,
    profiles: Sequence[Profile],
    precision: str,
    strongly_typed: bool,
    workspace_mib: int,
    calib_cache: Optional[str] = None,
    fp32_layers: Sequence[str] = (),
    optimization_level: Optional[int] = None,
    timing_cache: Optional[str] = None,
    dla_core: Optional[int] = None,
    gpu_fallback: bool = True,
    log: Optional[Callable[[str], None]] = None,
    warn: Optional[Callable[[str], None]] = None,
    shape_values: Optional[Dict[str, Sequence[Sequence[int]]]] = None,
) -> bytes:
    """Parse ``onnx_path`` and build a serialized TensorRT engine.

    Args:
        profiles: optimization profiles (input name -> min/opt/max shapes); empty for static models.
        precision: ``fp32``, ``fp16`` or ``int8``. With ``strongly_typed`` the model's own types
            decide and no precision flag is set (the only mode in TensorRT 11).
        calib_cache: calibration cache for implicit INT8 (TensorRT <= 10).
        fp32_layers: layer (ONNX node) names pinned to FP32 in weakly typed builds; names with
            no TensorRT layer are skipped with a warning (as trtexec does).
        timing_cache: file read before and written after the build (created when absent).
        dla_core: run on this DLA core, with GPU fallback when ``gpu_fallback``.
        shape_values: input -> (min, opt, max) values for each input TensorRT takes as a shape tensor; every
            optimization profile must carry them (``IOptimizationProfile::setShapeValues``: "must be called three
            times for every input tensor t that is a shape tensor"), and a network with one needs a profile.
        log: receives every TensorRT warning and error (verbose output).
        warn: receives edgedeploy's own warnings (skipped pins); defaults to ``log``.

    Raises:
        TensorRTUnavailable: no TensorRT here.
        BuildOutOfMemoryError: the build ran out of memory (retry with a smaller workspace).
        EngineBuildError: parse errors, an unsupported option, or any other failed build.
    """
    import_tensorrt()
    import tensorrt as trt

    major = version_tuple(trt.__version__)[0]
    messages: List[str] = []
    errors: List[str] = []
    say = log or (lambda line: None)

    class Recorder(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.WARNING):  # INTERNAL_ERROR=0 ... WARNING=2
                messages.append(str(msg))
                say(f"  tensorrt: {msg}")
            if int(severity) <= int(trt.ILogger.Severity.ERROR):
                errors.append(str(msg))

    logger = Recorder()
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(major, strongly_typed))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx_path):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineBuildError(
            "TensorRT cannot parse {}: {}".format(onnx_path, "; ".join(errors) or "; ".join(messages))
        )
    shape_inputs = [
        network.get_input(i).name for i in range(network.num_inputs) if network.get_input(i).is_shape_tensor
    ]
    values = shape_values or {}
    missing = [name for name in shape_inputs if name not in values]
    if missing:
        raise EngineBuildError(
            "input(s) {} are shape tensors to TensorRT: an engine needs the range of their values, and the plan "
            "gives none (integer inputs of one fixed dim get theirs from the goldens: rebuild the bundle with "
            "edgedeploy, whose goldens hold their values)".format(", ".join(missing))
        )
    if shape_inputs and not profiles:
        profiles = [{}]  # NvInfer.h: a network with shape input tensors needs at least one profile
    config = builder.create_builder_config()
    _set_workspace(config, workspace_mib)
    if optimization_level is not None and hasattr(config, "builder_optimization_level"):  # 8.6+
        config.builder_optimization_level = int(optimization_level)
    if precision == "fp32" and hasattr(trt.BuilderFlag, "TF32"):
        # TF32 is on by default (TensorRT >= 7.1): FP32 layers on Ampere / Orin would run TF32
        # math (10-bit mantissa) and miss FP32 tolerances. trtexec's FP32 line says --noTF32.
        config.clear_flag(trt.BuilderFlag.TF32)
    if not strongly_typed:
        if precision == "fp16":
            config.set_flag(_builder_flag("FP16"))
        if precision == "int8":
            config.set_flag(_builder_flag("INT8"))
            # INT8 alone leaves every layer without an INT8 kernel (and DLA's unquantized layers)
            # in FP32; TensorRT's guide enables FP16 alongside INT8 ("mixed precision").
            config.set_flag(_builder_flag("FP16"))
            if calib_cache:
                with open(calib_cache, "rb") as fh:
                    cache_bytes = retarget_calib_cache(fh.read(), str(trt.__version__))
                config.int8_calibrator = _cache_calibrator(cache_bytes)
        if fp32_layers and _pin_fp32(network, fp32_layers, warn or say):
            config.set_flag(_builder_flag("OBEY_PRECISION_CONSTRAINTS"))
    calib_profile = None
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, trt.Dims(list(lo)), trt.Dims(list(opt)), trt.Dims(list(hi)))
        for name in shape_inputs:
            least, usual, most = ([int(v) for v in vals] for vals in values[name])
            profile.set_shape_input(name, least, usual, most)
        config.add_optimization_profile(profile)
        calib_profile = calib_profile or profile
    if calib_profile is not None and major < 10 and calib_cache and precision == "int8" and not strongly_typed:
        # NvInfer.h (8.x): the calibration profile must be set when INT8 calibration runs on a network
        # with runtime dimensions (as polygraphy does: the first profile); its opt shapes are used
        config.set_calibration_profile(calib_profile)
    if dla_core is not None:
        cores = int(getattr(builder, "num_DLA_cores", 0) or 0)
        if int(dla_core) >= cores:  # TensorRT would fail the build later, naming no fix
            raise EngineBuildError(
                "DLA core {} asked for, but this device has {} DLA core(s) (an Orin NX 8GB has 1, an Orin Nano "
                "none): build the bundle with --dla-core 0{}".format(
                    dla_core, cores, "" if cores else " on a device with DLA, or without --dla-core"
                )
            )
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(dla_core)
        if gpu_fallback:
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
    cache = None
    if timing_cache:
        data = b""
        if os.path.isfile(timing_cache):
            with open(timing_cache, "rb") as fh:
                data = fh.read()
        cache = config.create_timing_cache(data)
        config.set_timing_cache(cache, False)
    try:
        serialized = builder.build_serialized_network(network, config)
    except MemoryError as exc:
        raise BuildOutOfMemoryError(f"host out of memory during the engine build ({exc})") from None
    if serialized is None:
        detail = "; ".join(messages[-5:]) or "no message from TensorRT"
        if _looks_like_oom(errors):
            raise BuildOutOfMemoryError(f"engine build ran out of memory: {detail}")
        raise EngineBuildError(f"engine build failed: {detail}")
    if timing_cache and cache is not None:
        _write_atomic(timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(serialized)


def _pin_fp32(network: "trt.INetworkDefinition", names: Sequence[str], say: Callable[[str], None]) -> int:
    """Pin the named layers to FP32; returns how many were found.

    Only float outputs get an output type: ``set_output_type(float32)`` on an INT32 / BOOL output
    (shape arithmetic, comparisons) makes the build fail. A name with no TensorRT layer (a
    Constant folded into weights, a node the parser renamed or fused) is skipped with a warning,
    as trtexec's ``--layerPrecisions`` does, instead of aborting the build.
    """
    import tensorrt as trt

    floats = (trt.float32, trt.float16)
    wanted = set(names)
    found = set()
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.name in wanted:
            found.add(layer.name)
            layer.precision = trt.float32
            for j in range(layer.num_outputs):
                if layer.get_output(j).dtype in floats:
                    layer.set_output_type(j, trt.float32)
    missing = sorted(wanted - found)
    if missing:
        say(
            "warning: {} FP32 pin(s) name no TensorRT layer and are skipped (folded or renamed by the parser): "
            "{}".format(len(missing), ", ".join(missing[:10]))
        )
    return len(found)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


class EngineSession:
    """A deserialized engine ready for inference on numpy feeds (buffers managed by polygraphy).

    Raises (constructor):
        TensorRTUnavailable: no TensorRT or polygraphy here.
        EngineBuildError: TensorRT refuses to deserialize the engine.
    """

    def __init__(self, engine_bytes: bytes) -> None:
        import_tensorrt()
        try:
            from polygraphy.backend.trt import EngineFromBytes, TrtRunner
        except Exception as exc:  # ImportError, or SyntaxError from a polygraphy newer than this Python
            raise TensorRTUnavailable(
                f"polygraphy does not import ({type(exc).__name__}: {exc}); pip install polygraphy"
            ) from None
        try:
            self._runner = TrtRunner(EngineFromBytes(engine_bytes))
            self._runner.activate()
        except Exception as exc:  # polygraphy raises PolygraphyException with TensorRT's message
            raise EngineBuildError(
                "TensorRT cannot load the engine: {}".format(" ".join(str(exc).split())[:400])
            ) from None

    def input_metadata(self) -> Any:
        """polygraphy's TensorMetadata of the engine's inputs (name -> dtype, shape)."""
        return self._runner.get_input_metadata()

    def input_dtypes(self) -> Dict[str, Any]:
        """Input name -> numpy dtype the engine expects."""
        meta = self._runner.get_input_metadata()
        return {name: meta[name].dtype for name in meta.keys()}

    def infer(self, feeds: Dict[str, Any]) -> Dict[str, Any]:
        """Run once; returns output name -> numpy array, a copy of its own.

        polygraphy's runners reuse their host output buffers across calls (its ``BaseRunner.infer``: "make a
        copy ... if you need to retain outputs"): without the copy, every output kept from an earlier call would
        hold the last call's values.

        Raises:
            RuntimeError: polygraphy or TensorRT failed the run (polygraphy's own exception class is not one).
        """
        import numpy as np

        try:
            outputs = self._runner.infer(feeds)
        except Exception as exc:  # PolygraphyException derives from Exception only
            raise RuntimeError("{}: {}".format(type(exc).__name__, " ".join(str(exc).split())[:400])) from None
        return {name: np.array(value, copy=True) for name, value in outputs.items()}

    def close(self) -> None:
        self._runner.deactivate()
