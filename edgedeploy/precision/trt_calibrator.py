"""Implicit INT8 calibration for TensorRT releases that still have it (JetPack 4.6 / 5.x / 6, TensorRT <= 10).

``make_trt_calibrator`` returns a ``tensorrt.IInt8EntropyCalibrator2`` subclass instance fed by the same
batches the host-side quantizer used. The class is built inside the function (Polygraphy's ``Calibrator``
factory, which handles device buffers and the cache file) so importing this module never needs TensorRT.
If ``cache_path`` already holds a cache (e.g. the one ``deploy build`` wrote from the host's ranges),
TensorRT reads it and skips calibration; TensorRT ignores a cache from another version and calibrates.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import InputError, TargetCapabilityError


class CalibrationBatches:
    """A re-iterable, checked source of feed dicts for a TensorRT calibrator.

    Every batch must name the same inputs with the same dtypes and per-sample shapes; checked up front,
    so a bad batch fails on the host before an engine build starts on the device.
    """

    def __init__(self, batches: Iterable[dict[str, np.ndarray]]) -> None:
        self._batches = [{k: np.ascontiguousarray(v) for k, v in b.items()} for b in batches]
        if not self._batches:
            raise InputError("no calibration batches for the TensorRT calibrator")
        first = self._batches[0]
        for i, b in enumerate(self._batches[1:], 1):
            if set(b) != set(first):
                raise InputError(f"calibration batch {i} has inputs {sorted(b)}, batch 0 has {sorted(first)}")
            for k, v in b.items():
                if v.dtype != first[k].dtype or v.shape[1:] != first[k].shape[1:]:
                    raise InputError(
                        f"calibration batch {i} input {k!r} is {v.dtype}{list(v.shape)}, "
                        f"batch 0 is {first[k].dtype}{list(first[k].shape)}"
                    )

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def batch_size(self) -> int:
        return int(next(iter(self._batches[0].values())).shape[0])


def make_trt_calibrator(batches: Iterable[dict[str, np.ndarray]], cache_path: str | Path) -> Any:
    """An ``IInt8EntropyCalibrator2`` instance for ``config.int8_calibrator`` (TensorRT with implicit INT8).

    Args:
        batches: feed dicts (input name -> numpy array), e.g. ``load_calibration(cfg).batches``.
        cache_path: calibration cache file read if present (skips calibration) and written after calibration.

    Raises:
        TargetCapabilityError: TensorRT is not installed here, or this
            TensorRT release has no implicit INT8 calibrators (TensorRT >= 11: use the QDQ model).
        InputError: the batches are empty or inconsistent.
    """
    data = CalibrationBatches(batches)
    try:
        import tensorrt as trt
    except ImportError:
        trt = None
    if trt is None or not hasattr(trt, "Builder"):  # a stubs-only install imports as an empty namespace
        raise TargetCapabilityError(
            "implicit INT8 calibration needs TensorRT, which is not installed here",
            hint="run it on the device, or ship the host-written calib.cache / the QDQ model.int8.onnx",
        )
    base = getattr(trt, "IInt8EntropyCalibrator2", None)
    if base is None:
        raise TargetCapabilityError(
            f"TensorRT {getattr(trt, '__version__', '?')} has no implicit INT8 calibrators",
            hint="build the explicit-quantization model.int8.onnx (QDQ) instead",
        )
    from polygraphy.backend.trt import Calibrator

    return Calibrator(data_loader=data, cache=str(cache_path), BaseClass=base)
