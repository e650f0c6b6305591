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
import ctypes.util
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # checked against tensorrt-stubs; never imported at run time here
    import tensorrt as trt

Shape = Tuple[int, ...]
# input name -> (min, opt, max) shapes; one dict per optimization profile
Profile = Dict[str, Tuple[Shape, Shape, Shape]]

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


def cuda_device(index: int = 0) -> Optional[Dict[str, str]]:
    """Name and compute capability (``{"name": "Orin", "sm": "8.7"}``) of a CUDA device, via libcudart.

    Returns None when no CUDA runtime library or no device is found. Uses ctypes only, so it
    works on Jetson (no nvidia-smi there) and on desktops alike.
    """
    lib = None
    names = [ctypes.util.find_library("cudart")] + [
        "libcudart.so",
        "libcudart.so.13",
        "libcudart.so.12",
        "libcudart.so.11.0",
        "libcudart.so.10.2",
    ]
    for name in names:
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if lib is None:
        return None
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    # cudaDevAttrComputeCapabilityMajor = 75, ...Minor = 76
    if lib.cudaDeviceGetAttribute(ctypes.byref(major), 75, index) != 0:
        return None
    if lib.cudaDeviceGetAttribute(ctypes.byref(minor), 76, index) != 0:
        return None
    props = ctypes.create_string_buffer(4096)  # cudaDeviceProp starts with char name[256]; 4 KiB covers the struct
    name = ""
    if lib.cudaGetDeviceProperties(props, index) == 0:
        name = props.raw[:256].split(b"\0", 1)[0].decode("utf-8", "replace")
    return {"name": name, "sm": f"{major.value}.{minor.value}"}


def _looks_like_oom(messages: Sequence[str]) -> bool:
    text = " ".join(messages).lower().replace(" ", "")
    return any(marker.replace(" ", "") in text for marker in _OOM_MARKERS)


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
) -> bytes:
    """Parse ``onnx_path`` and build a serialized TensorRT engine.

    Args:
        profiles: optimization profiles (input name -> min/opt/max shapes); empty for static models.
        precision: ``fp32``, ``fp16`` or ``int8``. With ``strongly_typed`` the model's own types
            decide and no precision flag is set (the only mode in TensorRT 11).
        calib_cache: calibration cache for implicit INT8 (TensorRT <= 10).
        fp32_layers: layer (ONNX node) names pinned to FP32 in weakly typed builds.
        timing_cache: file read before and written after the build (created when absent).
        dla_core: run on this DLA core, with GPU fallback when ``gpu_fallback``.

    Raises:
        TensorRTUnavailable: no TensorRT here.
        BuildOutOfMemoryError: the build ran out of memory (retry with a smaller workspace).
        EngineBuildError: parse errors, an unsupported option, or any other failed build.
    """
    import_tensorrt()
    import tensorrt as trt

    major = version_tuple(trt.__version__)[0]
    messages: List[str] = []
    say = log or (lambda line: None)

    class Recorder(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.WARNING):  # INTERNAL_ERROR=0 ... WARNING=2
                messages.append(str(msg))
                say(f"  tensorrt: {msg}")

    logger = Recorder()
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(major, strongly_typed))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx_path):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineBuildError(
            "TensorRT cannot parse {}: {}".format(onnx_path, "; ".join(errors) or "; ".join(messages))
        )
    config = builder.create_builder_config()
    _set_workspace(config, workspace_mib)
    if optimization_level is not None and hasattr(config, "builder_optimization_level"):  # 8.6+
        config.builder_optimization_level = int(optimization_level)
    if not strongly_typed:
        if precision == "fp16":
            config.set_flag(_builder_flag("FP16"))
        if precision == "int8":
            config.set_flag(_builder_flag("INT8"))
            if calib_cache:
                with open(calib_cache, "rb") as fh:
                    config.int8_calibrator = _cache_calibrator(fh.read())
        if fp32_layers:
            _pin_fp32(network, fp32_layers)
            config.set_flag(_builder_flag("OBEY_PRECISION_CONSTRAINTS"))
    for shapes in profiles:
        profile = builder.create_optimization_profile()
        for name, (lo, opt, hi) in shapes.items():
            profile.set_shape(name, trt.Dims(list(lo)), trt.Dims(list(opt)), trt.Dims(list(hi)))
        config.add_optimization_profile(profile)
    if dla_core is not None:
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
        if _looks_like_oom(messages):
            raise BuildOutOfMemoryError(f"engine build ran out of memory: {detail}")
        raise EngineBuildError(f"engine build failed: {detail}")
    if timing_cache and cache is not None:
        _write_atomic(timing_cache, bytes(config.get_timing_cache().serialize()))
    return bytes(serialized)


def _pin_fp32(network: "trt.INetworkDefinition", names: Sequence[str]) -> None:
    import tensorrt as trt

    wanted = set(names)
    found = set()
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.name in wanted:
            found.add(layer.name)
            layer.precision = trt.float32
            for j in range(layer.num_outputs):
                layer.set_output_type(j, trt.float32)
    missing = sorted(wanted - found)
    if missing:
        raise EngineBuildError(
            "FP32 pins name layers the TensorRT network does not have: {}".format(", ".join(missing[:10]))
        )


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
        except ImportError as exc:
            raise TensorRTUnavailable(f"polygraphy does not import ({exc}); pip install polygraphy") from None
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
        """Run once; returns output name -> numpy array (copied to the host)."""
        return dict(self._runner.infer(feeds))

    def close(self) -> None:
        self._runner.deactivate()
