"""Run a deserialized TensorRT engine on numpy feeds without polygraphy, through the CUDA driver API.

Copied into device bundles as ``trt_runner.py``; Python 3.6 syntax and numpy 1.13 API (JetPack 4.6),
no edgedeploy imports. Why it exists: no polygraphy release supports TensorRT < 8.5 (0.48 dropped
it; its runner calls ``set_input_shape`` / ``set_tensor_address`` / ``execute_async_v3``, added in
8.5) and the polygraphy that pip picks on Python 3.6 does not even import there (SyntaxError).

Two sessions, one per TensorRT I/O API:

- :class:`BindingsSession` (TensorRT < 8.5, e.g. 8.2 on the Jetson Nano): ``num_bindings``,
  ``get_binding_name`` / ``binding_is_input`` / ``get_binding_shape`` / ``get_binding_dtype``,
  ``IExecutionContext.set_binding_shape`` and ``execute_v2`` with a list of device pointers
  (TensorRT 8.2 Python API, ``python/src/infer/pyCore.cpp`` of NVIDIA/TensorRT release/8.2);
- :class:`TensorSession` (TensorRT >= 8.5): ``num_io_tensors`` / ``get_tensor_name`` /
  ``get_tensor_mode``, ``set_input_shape``, ``set_tensor_address`` and ``execute_async_v3``
  (the only execute call left in 10.x and 11.x); used when polygraphy is absent.

Device memory goes through ``libcuda.so.1``, the driver library every CUDA install (and JetPack)
has in the loader path, unlike ``libcudart`` which pip wheels put under site-packages. The
driver's primary context is the one the CUDA runtime inside TensorRT uses, so pointers agree.
"""
# Python 3.6 syntax on purpose (copied into device bundles):
# ruff: noqa: UP006, UP035, UP045

import ctypes
from typing import Any, Dict, Optional, Sequence, Tuple

DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")
# CUdevice_attribute values from cuda.h (stable since CUDA 3.x)
ATTR_CC_MAJOR = 75
ATTR_CC_MINOR = 76


class CudaError(RuntimeError):
    """A CUDA driver call failed, or no driver library loads here."""


def load_driver(names: Sequence[str] = DRIVER_NAMES) -> Any:
    """The CUDA driver library (``ctypes.CDLL``).

    Raises:
        CudaError: none of ``names`` loads (no NVIDIA driver here).
    """
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    raise CudaError("no CUDA driver library loads ({})".format("; ".join(errors)))


class CudaDriver:
    """The few CUDA driver API calls an engine run needs, on device ``index``'s primary context.

    Raises (constructor):
        CudaError: no driver, no device, or the context cannot be made current.
    """

    def __init__(self, lib: Any = None, index: int = 0) -> None:
        self.lib = lib if lib is not None else load_driver()
        self._check(self.lib.cuInit(0), "cuInit")
        self.device = ctypes.c_int(0)
        self._check(self.lib.cuDeviceGet(ctypes.byref(self.device), int(index)), "cuDeviceGet")
        self.context = ctypes.c_void_p(0)
        self._check(
            self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device), "cuDevicePrimaryCtxRetain"
        )
        self._check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self._retained = True

    def _check(self, status: int, call: str) -> None:
        if int(status) != 0:
            raise CudaError(f"{call} failed with CUresult {int(status)}")

    def info(self) -> Dict[str, str]:
        """``{"name": ..., "sm": "major.minor"}`` of the device."""
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self._check(
            self.lib.cuDeviceGetAttribute(ctypes.byref(major), ATTR_CC_MAJOR, self.device), "cuDeviceGetAttribute"
        )
        self._check(
            self.lib.cuDeviceGetAttribute(ctypes.byref(minor), ATTR_CC_MINOR, self.device), "cuDeviceGetAttribute"
        )
        name = ctypes.create_string_buffer(256)
        self._check(self.lib.cuDeviceGetName(name, 256, self.device), "cuDeviceGetName")
        return {"name": name.value.decode("utf-8", "replace"), "sm": f"{major.value}.{minor.value}"}

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64(0)
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(int(nbytes), 1))), "cuMemAlloc")
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        self._check(self.lib.cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree")

    def to_device(self, ptr: int, array: Any) -> None:
        host = ctypes.c_void_p(array.ctypes.data)
        self._check(self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), host, ctypes.c_size_t(array.nbytes)), "cuMemcpyHtoD")

    def to_host(self, array: Any, ptr: int) -> None:
        host = ctypes.c_void_p(array.ctypes.data)
        self._check(self.lib.cuMemcpyDtoH_v2(host, ctypes.c_uint64(ptr), ctypes.c_size_t(array.nbytes)), "cuMemcpyDtoH")

    def stream(self) -> int:
        handle = ctypes.c_void_p(0)
        self._check(self.lib.cuStreamCreate(ctypes.byref(handle), 0), "cuStreamCreate")
        return int(handle.value or 0)

    def synchronize(self, stream: int) -> None:
        self._check(self.lib.cuStreamSynchronize(ctypes.c_void_p(stream)), "cuStreamSynchronize")

    def destroy_stream(self, stream: int) -> None:
        self._check(self.lib.cuStreamDestroy_v2(ctypes.c_void_p(stream)), "cuStreamDestroy")

    def close(self) -> None:
        if self._retained:
            self._retained = False
            self.lib.cuDevicePrimaryCtxRelease(self.device)


def device_info(lib: Any = None, index: int = 0) -> Optional[Dict[str, str]]:
    """Name and compute capability of CUDA device ``index`` via ``libcuda.so.1``; None without a driver or GPU."""
    try:
        driver = CudaDriver(lib, index)
    except CudaError:
        return None
    try:
        return driver.info()
    except CudaError:
        return None
    finally:
        driver.close()


class _Buffers:
    """Device buffers by name, grown when a larger shape arrives, freed on close."""

    def __init__(self, cuda: CudaDriver) -> None:
        self.cuda = cuda
        self.ptrs = {}  # type: Dict[str, Tuple[int, int]]

    def get(self, name: str, nbytes: int) -> int:
        ptr, size = self.ptrs.get(name, (0, 0))
        if size < nbytes:
            if ptr:
                self.cuda.free(ptr)
            ptr, size = self.cuda.alloc(nbytes), max(int(nbytes), 1)
            self.ptrs[name] = (ptr, size)
        return ptr

    def close(self) -> None:
        for ptr, _ in self.ptrs.values():
            self.cuda.free(ptr)
        self.ptrs = {}


# TensorRT DataType attribute of the tensorrt module -> numpy type name. Not ``trt.nptype``: in TensorRT
# 8.2.1 / 8.5.2 it builds ``{bool: np.bool}`` on every call, and ``np.bool`` is gone in numpy 1.24 - 1.26
# (the numpy pip installs on a JetPack 5 Xavier's Python 3.8), so every call raises AttributeError there.
NUMPY_OF_TRT = (
    ("float32", "float32"),
    ("float16", "float16"),
    ("int8", "int8"),
    ("int32", "int32"),
    ("bool", "bool_"),
    ("uint8", "uint8"),
    ("int64", "int64"),
)


def numpy_dtypes(trt: Any, np: Any) -> Dict[Any, Any]:
    """TensorRT DataType -> numpy dtype, for the types this TensorRT module has."""
    out = {}
    for trt_name, np_name in NUMPY_OF_TRT:
        if hasattr(trt, trt_name):
            out[getattr(trt, trt_name)] = np.dtype(getattr(np, np_name))
    return out


def numpy_dtype(mapping: Dict[Any, Any], trt_dtype: Any, tensor: str) -> Any:
    """The numpy dtype of ``tensor``'s TensorRT type.

    Raises:
        TypeError: a TensorRT type with no numpy equivalent here (e.g. BF16, FP8, INT4).
    """
    if trt_dtype in mapping:
        return mapping[trt_dtype]
    raise TypeError(f"engine tensor {tensor!r} has TensorRT type {trt_dtype}, which has no numpy type here")


class _Session:
    """Shared parts: deserialize, own the CUDA driver and buffers."""

    api = ""

    def __init__(self, engine_bytes: bytes, trt: Any, cuda: Optional[CudaDriver] = None) -> None:
        import numpy as np

        self.np = np
        self.trt = trt
        self.np_of = numpy_dtypes(trt, np)
        self.cuda = cuda if cuda is not None else CudaDriver()
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine (see its messages above)")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeError("TensorRT could not create an execution context (device memory?)")
        self.buffers = _Buffers(self.cuda)

    def input_dtypes(self) -> Dict[str, Any]:
        """Input name -> numpy dtype the engine expects."""
        raise NotImplementedError

    def close(self) -> None:
        self.buffers.close()
        self.cuda.close()


class BindingsSession(_Session):
    """TensorRT < 8.5: the bindings API and ``execute_v2``."""

    api = "bindings (execute_v2)"

    def __init__(self, engine_bytes: bytes, trt: Any, cuda: Optional[CudaDriver] = None) -> None:
        _Session.__init__(self, engine_bytes, trt, cuda)
        n = self.engine.num_bindings
        self.names = [self.engine.get_binding_name(i) for i in range(n)]
        self.is_input = [bool(self.engine.binding_is_input(i)) for i in range(n)]
        self.is_shape = [self.is_input[i] and bool(self.engine.is_shape_binding(i)) for i in range(n)]
        self.dtypes = [numpy_dtype(self.np_of, self.engine.get_binding_dtype(i), self.names[i]) for i in range(n)]

    def input_dtypes(self) -> Dict[str, Any]:
        return {self.names[i]: self.dtypes[i] for i in range(len(self.names)) if self.is_input[i]}

    def infer(self, feeds: Dict[str, Any]) -> Dict[str, Any]:
        """Run once; returns output name -> numpy array."""
        np = self.np
        bindings = [0] * len(self.names)
        for i, name in enumerate(self.names):
            if not self.is_input[i]:
                continue
            if name not in feeds:
                raise KeyError(f"engine input {name!r} not in the feeds ({sorted(feeds)})")
            host = np.ascontiguousarray(feeds[name], dtype=self.dtypes[i])
            index = self.engine.get_binding_index(name)
            if -1 in tuple(self.engine.get_binding_shape(index)):
                if not self.context.set_binding_shape(index, tuple(host.shape)):
                    raise ValueError(f"input {name!r} shape {list(host.shape)} is outside the engine's profile")
            if self.is_shape[i]:  # a shape tensor's values are given on the host before execution
                if not self.context.set_shape_input(index, [int(v) for v in host.reshape(-1)]):
                    raise ValueError(f"shape input {name!r} values {host.reshape(-1).tolist()} are outside the profile")
            bindings[i] = self.buffers.get(name, host.nbytes)
            self.cuda.to_device(bindings[i], host)
        if not self.context.all_binding_shapes_specified:
            raise ValueError("not every input shape is set")
        outputs = {}
        for i, name in enumerate(self.names):
            if self.is_input[i]:
                continue
            shape = tuple(self.context.get_binding_shape(i))
            outputs[name] = np.empty(shape, dtype=self.dtypes[i])
            bindings[i] = self.buffers.get(name, outputs[name].nbytes)
        if not self.context.execute_v2(bindings):
            raise RuntimeError("IExecutionContext.execute_v2 failed (see TensorRT's messages)")
        for i, name in enumerate(self.names):
            if not self.is_input[i]:
                self.cuda.to_host(outputs[name], bindings[i])
        return outputs


class TensorSession(_Session):
    """TensorRT >= 8.5: named I/O tensors and ``execute_async_v3`` on a driver stream."""

    api = "named tensors (execute_async_v3)"

    def __init__(self, engine_bytes: bytes, trt: Any, cuda: Optional[CudaDriver] = None) -> None:
        _Session.__init__(self, engine_bytes, trt, cuda)
        n = self.engine.num_io_tensors
        self.names = [self.engine.get_tensor_name(i) for i in range(n)]
        self.is_input = [self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT for name in self.names]
        # shape-tensor inputs are read by TensorRT on the host: their address must be host memory (8.5+)
        self.is_shape = [
            self.is_input[i] and bool(self.engine.is_shape_inference_io(n)) for i, n in enumerate(self.names)
        ]
        self._host = {}  # type: Dict[str, Any]
        self.dtypes = [numpy_dtype(self.np_of, self.engine.get_tensor_dtype(name), name) for name in self.names]
        self.stream_handle = self.cuda.stream()

    def input_dtypes(self) -> Dict[str, Any]:
        return {self.names[i]: self.dtypes[i] for i in range(len(self.names)) if self.is_input[i]}

    def infer(self, feeds: Dict[str, Any]) -> Dict[str, Any]:
        """Run once; returns output name -> numpy array."""
        np = self.np
        for i, name in enumerate(self.names):
            if not self.is_input[i]:
                continue
            if name not in feeds:
                raise KeyError(f"engine input {name!r} not in the feeds ({sorted(feeds)})")
            host = np.ascontiguousarray(feeds[name], dtype=self.dtypes[i])
            if not self.context.set_input_shape(name, tuple(host.shape)):
                raise ValueError(f"input {name!r} shape {list(host.shape)} is outside the engine's profile")
            if self.is_shape[i]:
                self._host[name] = host  # kept alive until the next run: TensorRT holds its address
                self.context.set_tensor_address(name, int(host.ctypes.data))
                continue
            ptr = self.buffers.get(name, host.nbytes)
            self.cuda.to_device(ptr, host)
            self.context.set_tensor_address(name, ptr)
        outputs = {}
        for i, name in enumerate(self.names):
            if self.is_input[i]:
                continue
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise ValueError(
                    f"output {name!r} has a data-dependent shape {list(shape)}; this runner needs static outputs"
                )
            outputs[name] = np.empty(shape, dtype=self.dtypes[i])
            self.context.set_tensor_address(name, self.buffers.get(name, outputs[name].nbytes))
        if not self.context.execute_async_v3(self.stream_handle):
            raise RuntimeError("IExecutionContext.execute_async_v3 failed (see TensorRT's messages)")
        self.cuda.synchronize(self.stream_handle)
        for name, arr in outputs.items():
            self.cuda.to_host(arr, self.buffers.ptrs[name][0])
        return outputs

    def close(self) -> None:
        self.cuda.destroy_stream(self.stream_handle)
        _Session.close(self)


def version_tuple(version: str) -> Tuple[int, ...]:
    out = []
    for part in str(version).split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def session_class(trt_version: str) -> Any:
    """The session for a TensorRT version: bindings before 8.5, named tensors from 8.5 on."""
    return BindingsSession if version_tuple(trt_version)[:2] < (8, 5) else TensorSession


def open_session(engine_bytes: bytes, trt: Any = None, cuda: Optional[CudaDriver] = None) -> Any:
    """Deserialize ``engine_bytes`` with the installed TensorRT and return a session for its API.

    Raises:
        CudaError: no CUDA driver or device.
        RuntimeError: TensorRT refuses the engine.
    """
    if trt is None:
        import importlib

        trt = importlib.import_module("tensorrt")
    return session_class(str(trt.__version__))(engine_bytes, trt, cuda)
