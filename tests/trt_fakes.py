"""A stand-in ``tensorrt`` module per TensorRT version, and a stand-in CUDA driver library, for tests.

What it proves: that the device code calls only what each TensorRT release has, in the shape
(positional / keyword, property vs method) that release takes. Every object is strict: reading or
writing a public member its version lacks raises ``AttributeError`` the way the real bindings do.
It does not prove numerics: the "engine" is the ONNX model run by ONNX Runtime.

Where the member lists come from (``data/trt_members/members-<version>.json``, each naming its source):

- 8.2, 8.5, 10.3, 11: the pybind11 sources of NVIDIA/TensorRT at the release tags 8.2.1, 8.5.2, v10.3.0 and
  v11.1 (``python/src/infer/pyCore.cpp``, ``pyGraph.cpp``, ``pyFoundationalTypes.cpp``, ``pyInt8.cpp``,
  ``python/src/parsers/pyOnnx.cpp``, ``tensorrt/__init__.py``), read by ``generate_from_sources.py``;
  11.1 is the newest 11.x whose sources are public, and the fake stands for the ``desktop-trt11`` profile;
- 10.13: ``tensorrt-stubs`` 10.13 (generated from the real bindings; ``generate.py``). The sources at
  v10.13.0 give the same lists except three names the stubs add (``ICudaEngine.max_workspace_size``,
  ``ITensor.is_shape``, ``Runtime.path``).
"""

from __future__ import annotations

import ctypes
import functools
import json
import types
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"FAKETRT1"

# ---- member lists ---------------------------------------------------------------------------

VERSIONS = {"8.2": "8.2.1.8", "8.5": "8.5.2.2", "10.3": "10.3.0.30", "10.13": "10.13.0.35", "11": "11.5.0.4"}


@functools.cache
def _stub_members() -> dict[str, frozenset[str]]:
    return {k: frozenset(v) for k, v in _parse_stubs().items()}


def stub_members() -> dict[str, set[str]]:
    """Class -> public member names of TensorRT 10.13's bindings, plus ``module``."""
    return {k: set(v) for k, v in _stub_members().items()}


def _parse_stubs() -> dict[str, set[str]]:
    """Class -> public member names of TensorRT 10.13's bindings, plus ``module``.

    Read from the committed ``data/trt_members/members-10.13.json`` (its ``generate.py`` writes it from
    ``tensorrt-stubs``), so the tests need no stubs package installed.
    """
    data = json.loads((Path(__file__).parent / "data" / "trt_members" / "members-10.13.json").read_text())
    return {name: set(members) for name, members in data["classes"].items()}


MEMBER_FILES = {"8.2": "members-8.2.json", "8.5": "members-8.5.json", "10.3": "members-10.3.json",
                "10.13": "members-10.13.json", "11": "members-11.json"}  # fmt: skip


@functools.cache
def _members_json(version: str) -> dict[str, frozenset[str]]:
    data = json.loads((Path(__file__).parent / "data" / "trt_members" / MEMBER_FILES[version]).read_text())
    return {name: frozenset(members) for name, members in data["classes"].items()}


def members_source(version: str) -> str:
    """Where the member lists of ``version`` come from (the JSON file's ``source``)."""
    path = Path(__file__).parent / "data" / "trt_members" / MEMBER_FILES[version]
    return str(json.loads(path.read_text())["source"])


def members_for(version: str) -> dict[str, set[str]]:
    """Public members per class for ``version`` (a key of :data:`VERSIONS`)."""
    return {k: set(v) for k, v in _members_json(version).items()}


# ---- the fake CUDA driver (ctypes level) ---------------------------------------------------


class FakeLibCuda:
    """Stands in for ``ctypes.CDLL("libcuda.so.1")``: same function names and argument kinds, host memory."""

    def __init__(self, name: str = "Fake Orin", sm: str = "8.7") -> None:
        self.name, self.sm = name, sm
        self.memory: dict[int, Any] = {}
        self.next = 0x10000
        self.calls: list[str] = []
        self.initialized = False
        self.context_current = False

    def _rec(self, name: str) -> None:
        self.calls.append(name)

    def cuInit(self, flags: int) -> int:
        self._rec("cuInit")
        self.initialized = True
        return 0

    def cuDeviceGet(self, ref: Any, index: int) -> int:
        self._rec("cuDeviceGet")
        assert self.initialized and isinstance(ref._obj, ctypes.c_int)
        ref._obj.value = int(index)
        return 0 if index == 0 else 101  # CUDA_ERROR_INVALID_DEVICE

    def cuDeviceGetAttribute(self, ref: Any, attr: int, device: Any) -> int:
        self._rec("cuDeviceGetAttribute")
        major, minor = (int(p) for p in self.sm.split("."))
        ref._obj.value = {75: major, 76: minor}[attr]
        return 0

    def cuDeviceGetName(self, buf: Any, length: int, device: Any) -> int:
        self._rec("cuDeviceGetName")
        buf.value = self.name.encode()[: length - 1]
        return 0

    def cuDevicePrimaryCtxRetain(self, ref: Any, device: Any) -> int:
        self._rec("cuDevicePrimaryCtxRetain")
        assert isinstance(ref._obj, ctypes.c_void_p)
        ref._obj.value = 0xC0
        return 0

    def cuCtxSetCurrent(self, ctx: Any) -> int:
        self._rec("cuCtxSetCurrent")
        self.context_current = isinstance(ctx, ctypes.c_void_p) and ctx.value == 0xC0
        return 0

    def cuDevicePrimaryCtxRelease(self, device: Any) -> int:
        self._rec("cuDevicePrimaryCtxRelease")
        return 0

    def cuMemAlloc_v2(self, ref: Any, size: ctypes.c_size_t) -> int:
        self._rec("cuMemAlloc_v2")
        assert self.context_current, "cuMemAlloc without a current context"
        assert isinstance(ref._obj, ctypes.c_uint64) and isinstance(size, ctypes.c_size_t)
        ptr, self.next = self.next, self.next + size.value + 256
        self.memory[ptr] = ctypes.create_string_buffer(size.value)
        ref._obj.value = ptr
        return 0

    def cuMemFree_v2(self, ptr: ctypes.c_uint64) -> int:
        self._rec("cuMemFree_v2")
        del self.memory[ptr.value]
        return 0

    def cuMemcpyHtoD_v2(self, dst: ctypes.c_uint64, src: ctypes.c_void_p, n: ctypes.c_size_t) -> int:
        self._rec("cuMemcpyHtoD_v2")
        buf = self.memory[dst.value]
        assert n.value <= len(buf), "copy larger than the allocation"
        ctypes.memmove(buf, src.value, n.value)
        return 0

    def cuMemcpyDtoH_v2(self, dst: ctypes.c_void_p, src: ctypes.c_uint64, n: ctypes.c_size_t) -> int:
        self._rec("cuMemcpyDtoH_v2")
        buf = self.memory[src.value]
        assert n.value <= len(buf), "copy larger than the allocation"
        ctypes.memmove(dst.value, buf, n.value)
        return 0

    def cuStreamCreate(self, ref: Any, flags: int) -> int:
        self._rec("cuStreamCreate")
        ref._obj.value = 0x5000
        return 0

    def cuStreamSynchronize(self, stream: ctypes.c_void_p) -> int:
        self._rec("cuStreamSynchronize")
        return 0

    def cuStreamDestroy_v2(self, stream: ctypes.c_void_p) -> int:
        self._rec("cuStreamDestroy_v2")
        return 0

    def read(self, ptr: int, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape)) if shape else 1
        return np.frombuffer(self.memory[ptr], dtype=dtype, count=count).reshape(shape).copy()

    def write(self, ptr: int, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).tobytes()
        ctypes.memmove(self.memory[ptr], data, len(data))


# ---- the fake tensorrt module -----------------------------------------------------------------


class _Value(int):
    """An enum member: an int with a name (what pybind11 enums give)."""

    def __new__(cls, value: int, name: str, kind: str) -> _Value:
        obj = int.__new__(cls, value)
        obj.name, obj.kind = name, kind
        return obj

    def __repr__(self) -> str:
        return f"<{self.kind}.{self.name}: {int(self)}>"


class _Enum:
    def __init__(self, kind: str, names: list[str], allowed: set[str], version: str) -> None:
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_members", {n: _Value(i, n, kind) for i, n in enumerate(names)})
        object.__setattr__(self, "_allowed", allowed)
        object.__setattr__(self, "_version", version)

    def __getattr__(self, name: str) -> Any:
        if name in self._allowed and name in self._members:
            return self._members[name]
        raise AttributeError(f"TensorRT {self._version} has no {self._kind}.{name}")


class FakeState:
    """What a fake module records and how it behaves (failures to inject)."""

    def __init__(self, version: str, cuda: FakeLibCuda) -> None:
        self.key = version
        self.version = VERSIONS[version]
        self.allowed = members_for(version)
        self.cuda = cuda
        self.calls: list[str] = []
        self.build_failure: list[tuple[int, str]] | None = None  # (severity, message) lines, then None
        self.configs: list[Any] = []
        self.shape_inputs: set[str] = set()  # engine inputs that are shape tensors (values read on the host)
        self.dla_cores = 0  # IBuilder.num_DLA_cores: a desktop GPU has none


def _strict(state: FakeState, api: str) -> type:
    class Strict:
        _api = api

        def __getattribute__(self, name: str) -> Any:
            if not name.startswith("_"):
                if name not in state.allowed.get(api, set()):
                    raise AttributeError(f"TensorRT {state.version} has no {api}.{name}")
                state.calls.append(f"{api}.{name}")
            return object.__getattribute__(self, name)

        def __setattr__(self, name: str, value: Any) -> None:
            if not name.startswith("_"):
                if name not in state.allowed.get(api, set()):
                    raise AttributeError(f"TensorRT {state.version} has no {api}.{name}")
                state.calls.append(f"{api}.{name}=")
            object.__setattr__(self, name, value)

    return Strict


def make_tensorrt(version: str, cuda: FakeLibCuda | None = None) -> types.ModuleType:
    """A fake ``tensorrt`` module for ``version`` (``"8.2"``, ``"8.5"``, ``"10.3"``, ``"10.13"``, ``"11"``)."""
    import onnx
    import onnxruntime as ort

    state = FakeState(version, cuda or FakeLibCuda())
    allowed = state.allowed
    major = int(version.split(".")[0])
    mod = types.ModuleType("tensorrt")
    dtype_names = ["float32", "float16", "int8", "int32", "bool", "uint8", "int64"]
    dtypes = {n: _Value(i, n, "DataType") for i, n in enumerate(dtype_names)}
    np_of = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "int32": np.int32, "bool": np.bool_,
             "uint8": np.uint8, "int64": np.int64}  # fmt: skip
    onnx_to_trt = {1: "float32", 10: "float16", 3: "int8", 6: "int32", 9: "bool", 2: "uint8"}
    onnx_to_trt[7] = "int64" if major >= 10 else "int32"  # INT64 narrowed before TensorRT 9
    severity = {"INTERNAL_ERROR": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "VERBOSE": 4}

    def enum(kind: str, names: list[str]) -> _Enum:
        return _Enum(kind, names, allowed.get(kind, set()), state.version)

    flag_names = sorted(
        set().union(*(members_for(v).get("BuilderFlag", set()) for v in VERSIONS)) - {"Members", "name", "value"}
    )
    BuilderFlag = enum("BuilderFlag", flag_names)
    CreationFlag = enum("NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED", "EXPLICIT_PRECISION"])
    MemoryPoolType = enum("MemoryPoolType", ["WORKSPACE", "DLA_MANAGED_SRAM", "DLA_LOCAL_DRAM", "DLA_GLOBAL_DRAM"])
    TensorIOMode = enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    DeviceType = enum("DeviceType", ["GPU", "DLA"])

    class Severity:
        pass

    for name, value in severity.items():
        setattr(Severity, name, _Value(value, name, "Severity"))

    class ILogger:
        def __init__(self) -> None:
            pass

    ILogger.Severity = Severity
    for name in severity:
        setattr(ILogger, name, getattr(Severity, name))

    class Logger(ILogger):
        def __init__(self, min_severity: Any = None) -> None:
            ILogger.__init__(self)
            self.min_severity = min_severity

        def log(self, sev: Any, msg: str) -> None:
            return None

    class Dims(tuple):
        pass

    class IInt8Calibrator:
        def __init__(self) -> None:
            pass

    class IInt8EntropyCalibrator2(IInt8Calibrator):
        pass

    def log(logger: Any, sev: str, msg: str) -> None:
        logger.log(getattr(Severity, sev), msg)

    class ITensor(_strict(state, "ITensor")):
        def __init__(self, name: str, dtype: Any, shape: tuple[int, ...] = ()) -> None:
            self.name, self.dtype, self.shape = name, dtype, shape

        @property
        def is_shape_tensor(self) -> bool:
            return self.name in state.shape_inputs

    class ILayer(_strict(state, "ILayer")):
        def __init__(self, name: str, outputs: list[ITensor], failures: list[str]) -> None:
            self.name = name
            self._outputs = outputs
            self._failures = failures

        @property
        def num_outputs(self) -> int:
            return len(self._outputs)

        def get_output(self, index: int) -> ITensor:
            return self._outputs[index]

        def set_output_type(self, index: int, dtype: Any) -> None:
            have = self._outputs[index].dtype
            if have.name in ("int32", "int64", "bool", "int8", "uint8") and dtype.name in ("float32", "float16"):
                self._failures.append(f"{self.name}: setOutputType({dtype.name}) on a {have.name} output")

    class INetworkDefinition(_strict(state, "INetworkDefinition")):
        def __init__(self, flags: int) -> None:
            self._flags = flags
            self._layers: list[ILayer] = []
            self._inputs: list[ITensor] = []
            self._failures: list[str] = []
            self._onnx = b""

        @property
        def num_layers(self) -> int:
            return len(self._layers)

        @property
        def num_inputs(self) -> int:
            return len(self._inputs)

        def get_input(self, index: int) -> ITensor:
            return self._inputs[index]

        def get_layer(self, index: int) -> ILayer:
            return self._layers[index]

    class OnnxParser(_strict(state, "OnnxParser")):
        def __init__(self, network: INetworkDefinition, logger: Any) -> None:
            self._network, self._logger, self._errors = network, logger, []

        def parse_from_file(self, path: str) -> bool:
            model = onnx.load(path)
            inferred = onnx.shape_inference.infer_shapes(model)
            g = inferred.graph
            types_ = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.value_info, *g.input, *g.output]}
            inits = {i.name for i in g.initializer}
            self._network._inputs = [
                ITensor(i.name, dtypes[onnx_to_trt.get(types_.get(i.name, 1), "float32")])
                for i in g.input
                if i.name not in inits
            ]
            for i, node in enumerate(model.graph.node):
                if node.op_type == "Constant":  # the parser turns Constant nodes into weights, not layers
                    continue
                outs = [ITensor(o, dtypes[onnx_to_trt.get(types_.get(o, 1), "float32")]) for o in node.output]
                self._network._layers.append(ILayer(node.name or f"node_{i}", outs, self._network._failures))
            self._network._onnx = model.SerializeToString()
            return True

        @property
        def num_errors(self) -> int:
            return len(self._errors)

        def get_error(self, index: int) -> str:
            return self._errors[index]

    class IOptimizationProfile(_strict(state, "IOptimizationProfile")):
        def __init__(self) -> None:
            self._shapes: dict[str, tuple[Any, Any, Any]] = {}
            self._values: dict[str, tuple[Any, Any, Any]] = {}

        def set_shape(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
            assert all(isinstance(d, Dims) for d in (lo, opt, hi)), "set_shape takes Dims"
            self._shapes[name] = (tuple(lo), tuple(opt), tuple(hi))

        def set_shape_input(self, name: str, lo: Any, opt: Any, hi: Any) -> None:
            assert all(a <= b <= c for a, b, c in zip(lo, opt, hi)), "min <= opt <= max, value by value"
            self._values[name] = (tuple(lo), tuple(opt), tuple(hi))

    class ITimingCache(_strict(state, "ITimingCache")):
        def __init__(self, data: bytes) -> None:
            self._data = bytes(data)

        def serialize(self) -> bytes:
            return b"fake-timing-cache"

    class IHostMemory(_strict(state, "IHostMemory")):
        def __init__(self, data: bytes) -> None:
            self._data = data

        def __bytes__(self) -> bytes:
            return self._data

        @property
        def nbytes(self) -> int:
            return len(self._data)

    class IBuilderConfig(_strict(state, "IBuilderConfig")):
        def __init__(self) -> None:
            self._flags = {"TF32"}  # TensorRT's default: TF32 on
            self._profiles: list[IOptimizationProfile] = []
            self._workspace = None
            self._calibrator = None
            self._cache = None
            self._calib_profile = None
            state.configs.append(self)

        def set_flag(self, flag: Any) -> None:
            self._flags.add(flag.name)

        def clear_flag(self, flag: Any) -> None:
            self._flags.discard(flag.name)

        def get_flag(self, flag: Any) -> bool:
            return flag.name in self._flags

        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            assert pool.name == "WORKSPACE"
            self._workspace = int(size)

        def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
            self._profiles.append(profile)
            return len(self._profiles) - 1

        def set_calibration_profile(self, profile: IOptimizationProfile) -> bool:
            assert profile in self._profiles, "the calibration profile must be one added to the config"
            self._calib_profile = profile
            return True

        def create_timing_cache(self, data: bytes) -> ITimingCache:
            return ITimingCache(data)

        def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
            self._cache = cache
            return True

        def get_timing_cache(self) -> ITimingCache:
            return self._cache

        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if name == "max_workspace_size":
                object.__setattr__(self, "_workspace", int(value))
            if name == "int8_calibrator":
                object.__setattr__(self, "_calibrator", value)

    class Builder(_strict(state, "Builder")):
        def __init__(self, logger: Any) -> None:
            self._logger = logger

        @property
        def num_DLA_cores(self) -> int:
            return state.dla_cores

        def create_network(self, flags: int = 0) -> INetworkDefinition:
            return INetworkDefinition(int(flags))

        def create_builder_config(self) -> IBuilderConfig:
            return IBuilderConfig()

        def create_optimization_profile(self) -> IOptimizationProfile:
            return IOptimizationProfile()

        def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> Any:
            if state.build_failure is not None:
                for sev, msg in state.build_failure:
                    self._logger.log(_Value(sev, "", "Severity"), msg)
                return None
            if network._failures:
                for msg in network._failures:
                    log(self._logger, "ERROR", msg)
                return None
            # NvInferRuntime.h: setShapeValues "must be called three times for every input tensor t that is a
            # shape tensor"; NvInfer.h: a network with shape input tensors needs a profile
            for name in sorted(state.shape_inputs & {t.name for t in network._inputs}):
                if not config._profiles or any(name not in p._values for p in config._profiles):
                    log(self._logger, "ERROR", f"{name}: shape tensor input has no values in the optimization profile")
                    return None
            core = config.__dict__.get("DLA_core")
            if core is not None and int(core) >= state.dla_cores:  # sampleEngines.cpp: "Cannot create DLA engine"
                log(self._logger, "ERROR", f"Cannot create DLA engine, {core} not available")
                return None
            dynamic = any(lo != hi for p in config._profiles for lo, _, hi in p._shapes.values())
            if "INT8" in config._flags and config._calibrator is not None and dynamic and major < 10:
                if config._calib_profile is None:  # NvInfer.h 8.x: required with runtime dimensions
                    log(self._logger, "ERROR", "Calibration profile must be set for networks with dynamic shapes")
                    return None
            if "INT8" in config._flags and config._calibrator is not None:
                cache = bytes(config._calibrator.read_calibration_cache() or b"")
                want = f"TRT-{_version_code(state.version)}-"
                if not cache.decode("ascii", "replace").startswith(want):
                    # TensorRT ignores a cache from another version and calibrates: get_batch gives no data
                    log(self._logger, "WARNING", f"Calibration cache header mismatch (want {want}); recalibrating")
                    if config._calibrator.get_batch(["x"]) is None:
                        log(self._logger, "ERROR", "Calibration failure occurred with no scaling factors detected.")
                        return None
            header = {
                "version": state.version,
                "flags": sorted(config._flags),
                "workspace": config._workspace,
                "profiles": [{k: list(map(list, v)) for k, v in p._shapes.items()} for p in config._profiles],
            }
            return IHostMemory(MAGIC + json.dumps(header).encode() + b"\n" + network._onnx)

    class IExecutionContext(_strict(state, "IExecutionContext")):
        def __init__(self, engine: ICudaEngine) -> None:
            self._engine = engine
            self._shapes: dict[str, tuple[int, ...]] = {}
            self._addresses: dict[str, int] = {}
            self._shape_values_set: dict[str, list[int]] = {}

        def _out_shapes(self) -> dict[str, tuple[int, ...]]:
            e = self._engine
            feeds = {n: np.zeros(self._shape(n), dtype=e._ort_in_types[n]) for n in e._inputs}
            for n in state.shape_inputs & set(e._inputs):
                feeds[n] = self._shape_values(n, self._addresses).astype(e._ort_in_types[n])
            return {n: tuple(a.shape) for n, a in zip(e._outputs, e._session.run(e._outputs, feeds))}

        def _run(self, addresses: dict[str, int]) -> bool:
            e = self._engine
            feeds = {}
            for n in e._inputs:
                if n in state.shape_inputs:
                    feeds[n] = self._shape_values(n, addresses).astype(e._ort_in_types[n])
                    continue
                host = state.cuda.read(addresses[n], np_of[e._dtypes[n].name], self._shape(n))
                feeds[n] = host.astype(e._ort_in_types[n])
            for n, arr in zip(e._outputs, e._session.run(e._outputs, feeds)):
                state.cuda.write(addresses[n], arr.astype(np_of[e._dtypes[n].name]))
            return True

        def _shape(self, name: str) -> tuple[int, ...]:
            return self._shapes.get(name, self._engine._declared[name])

        def _shape_values(self, name: str, addresses: dict[str, int]) -> np.ndarray:
            """A shape tensor's values: set_shape_input's (bindings API) or read from its host address."""
            if name in self._shape_values_set:
                return np.array(self._shape_values_set[name]).reshape(self._shape(name))
            ptr = addresses[name]
            assert ptr not in state.cuda.memory, f"shape tensor {name!r} given a device address (must be host)"
            dtype = np_of[self._engine._dtypes[name].name]
            count = int(np.prod(self._shape(name)))
            return np.frombuffer((ctypes.c_char * (count * np.dtype(dtype).itemsize)).from_address(ptr), dtype).copy()

        # bindings API (TensorRT < 10)
        def set_shape_input(self, index: int, values: Any) -> bool:
            assert isinstance(values, list) and all(isinstance(v, int) for v in values)
            self._shape_values_set[self._engine._names[index]] = list(values)
            return True

        def set_binding_shape(self, index: int, shape: Any) -> bool:
            self._shapes[self._engine._names[index]] = tuple(shape)
            return True

        def get_binding_shape(self, index: int) -> Dims:
            name = self._engine._names[index]
            if name in self._engine._inputs:
                return Dims(self._shapes.get(name, self._engine._declared[name]))
            return Dims(self._out_shapes()[name])

        @property
        def all_binding_shapes_specified(self) -> bool:
            e = self._engine
            return all(n in self._shapes or -1 not in e._declared[n] for n in e._inputs)

        def execute_v2(self, bindings: list[int]) -> bool:
            assert isinstance(bindings, list) and all(isinstance(b, int) for b in bindings)
            return self._run(dict(zip(self._engine._names, bindings)))

        # named tensors (TensorRT >= 8.5)
        def set_input_shape(self, name: str, shape: Any) -> bool:
            self._shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name: str) -> Dims:
            if name in self._engine._inputs:
                return Dims(self._shapes.get(name, self._engine._declared[name]))
            return Dims(self._out_shapes()[name])

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            assert isinstance(ptr, int) and (ptr in state.cuda.memory or name in state.shape_inputs)
            self._addresses[name] = ptr
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            assert isinstance(stream_handle, int)
            return self._run(self._addresses)

    class ICudaEngine(_strict(state, "ICudaEngine")):
        def __init__(self, onnx_bytes: bytes) -> None:
            self._session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
            ort_np = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32,
                      "tensor(float16)": np.float16, "tensor(bool)": np.bool_}  # fmt: skip
            ins, outs = self._session.get_inputs(), self._session.get_outputs()
            self._inputs = [i.name for i in ins]
            self._outputs = [o.name for o in outs]
            self._names = self._inputs + self._outputs
            self._ort_in_types = {i.name: ort_np[i.type] for i in ins}
            trt_of = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bool)": "bool",
                      "tensor(int32)": "int32", "tensor(int64)": "int64" if major >= 10 else "int32"}  # fmt: skip
            self._dtypes = {t.name: dtypes[trt_of[t.type]] for t in list(ins) + list(outs)}
            self._declared = {i.name: tuple(d if isinstance(d, int) else -1 for d in i.shape) for i in ins}

        def create_execution_context(self) -> IExecutionContext:
            return IExecutionContext(self)

        @property
        def num_bindings(self) -> int:
            return len(self._names)

        def get_binding_name(self, index: int) -> str:
            return self._names[index]

        def get_binding_index(self, name: str) -> int:
            return self._names.index(name)

        def binding_is_input(self, index: Any) -> bool:
            return self._names[index] in self._inputs

        def get_binding_shape(self, index: int) -> Dims:
            return Dims(self._declared.get(self._names[index], ()))

        def is_shape_binding(self, index: int) -> bool:
            return self._names[index] in state.shape_inputs

        def is_shape_inference_io(self, name: str) -> bool:
            return name in state.shape_inputs

        def get_binding_dtype(self, index: int) -> Any:
            return self._dtypes[self._names[index]]

        @property
        def num_io_tensors(self) -> int:
            return len(self._names)

        def get_tensor_name(self, index: int) -> str:
            return self._names[index]

        def get_tensor_mode(self, name: str) -> Any:
            return TensorIOMode.INPUT if name in self._inputs else TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            return self._dtypes[name]

    class Runtime(_strict(state, "Runtime")):
        def __init__(self, logger: Any) -> None:
            self._logger = logger

        def deserialize_cuda_engine(self, data: bytes) -> ICudaEngine | None:
            if not bytes(data).startswith(MAGIC):
                log(self._logger, "ERROR", "The engine plan file is not compatible with this version of TensorRT")
                return None
            header, _, onnx_bytes = bytes(data)[len(MAGIC) :].partition(b"\n")
            if json.loads(header)["version"] != state.version:
                log(self._logger, "ERROR", "The engine plan file is generated on an incompatible TensorRT version")
                return None
            return ICudaEngine(onnx_bytes)

    def nptype(dtype: Any) -> Any:
        if major < 10:
            # TensorRT 8.2.1 / 8.5.2's tensorrt/__init__.py builds {bool: np.bool} on every call; np.bool is
            # gone in numpy 1.24 - 1.26, the numpy pip gives a JetPack 5 Python 3.8: every call fails there
            raise AttributeError("module 'numpy' has no attribute 'bool'")
        return np_of[dtype.name]

    def volume(shape: Any) -> int:
        return int(np.prod(list(shape)))

    everything = {
        "Builder": Builder, "Runtime": Runtime, "Logger": Logger, "ILogger": ILogger, "OnnxParser": OnnxParser,
        "BuilderFlag": BuilderFlag, "NetworkDefinitionCreationFlag": CreationFlag, "MemoryPoolType": MemoryPoolType,
        "TensorIOMode": TensorIOMode, "DeviceType": DeviceType, "Dims": Dims, "IInt8Calibrator": IInt8Calibrator,
        "IInt8EntropyCalibrator2": IInt8EntropyCalibrator2, "nptype": nptype, "volume": volume,
        "__version__": state.version, **dtypes,
    }  # fmt: skip
    for name, value in everything.items():
        if name in allowed["module"]:
            setattr(mod, name, value)
    mod._state = state
    mod._implemented = {  # the members this fake implements, per class (checked against the stubs)
        cls._api: {n for n in vars(cls) if not n.startswith("_")}
        for cls in (ITensor, ILayer, INetworkDefinition, OnnxParser, IOptimizationProfile, ITimingCache,
                    IHostMemory, IBuilderConfig, Builder, IExecutionContext, ICudaEngine, Runtime)
    }  # fmt: skip
    return mod


def _version_code(version: str) -> int:
    parts = [int(p) for p in version.split(".")[:3]] + [0, 0, 0]
    return parts[0] * (10000 if parts[0] >= 10 else 1000) + parts[1] * 100 + parts[2]
