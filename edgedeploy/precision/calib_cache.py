"""TensorRT calibration cache files (implicit INT8), written on the host from ORT calibration ranges.

The format TensorRT's calibrators read and write is text: a header line
``TRT-<version code>-<algorithm>`` (e.g. ``TRT-8502-EntropyCalibration2`` for TensorRT 8.5.2), then one
``tensor_name: <hex>`` line per tensor, where ``<hex>`` is the big-endian IEEE float32 bit pattern of the
tensor's scale (``amax / 127``). TensorRT skips a cache whose header does not match its own version and
calibrates again, so a host-written cache is a fast path, never a silent change of numerics.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

from edgedeploy.errors import InputError
from edgedeploy.fileio.store import atomic_write_text

CALIB_CACHE = "calib.cache"
DEFAULT_ALGORITHM = "EntropyCalibration2"
INT8_MAX = 127.0


@dataclass(frozen=True)
class TrtCalibrationCache:
    """A parsed calibration cache: header parts and tensor name -> scale."""

    version_code: int
    algorithm: str
    scales: dict[str, float] = field(default_factory=dict)

    @property
    def header(self) -> str:
        return f"TRT-{self.version_code}-{self.algorithm}"

    def amax(self) -> dict[str, float]:
        """Tensor name -> absolute max the scale stands for (``scale * 127``)."""
        return {k: v * INT8_MAX for k, v in self.scales.items()}


def trt_version_code(version: str) -> int:
    """TensorRT's integer version as the cache header writes it: 8.5.2 -> 8502, 10.3.0 -> 100300.

    TensorRT 10 widened NV_TENSORRT_VERSION to ``major*10000 + minor*100 + patch``; earlier releases
    use ``major*1000 + minor*100 + patch``. Missing minor / patch parts count as 0.

    Raises:
        InputError: ``version`` is not ``major[.minor[.patch]]``.
    """
    try:
        parts = [int(p) for p in version.strip().split(".")[:3]]
    except ValueError:
        parts = []
    if not parts:
        raise InputError(f"TensorRT version {version!r} is not major.minor[.patch]")
    major, minor, patch = (parts + [0, 0])[:3]
    return major * (10000 if major >= 10 else 1000) + minor * 100 + patch


def scale_hex(scale: float) -> str:
    """Big-endian float32 bits of ``scale`` as 8 lowercase hex digits."""
    return struct.pack(">f", scale).hex()


def hex_scale(text: str) -> float:
    """Inverse of :func:`scale_hex`.

    Raises:
        ValueError: not a hex float32 pattern.
    """
    return float(struct.unpack(">f", struct.pack(">I", int(text, 16)))[0])


def scales_from_ranges(ranges: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Symmetric per-tensor scales ``max(|lo|, |hi|) / 127`` from (lo, hi) ranges; non-finite ranges dropped."""
    out = {}
    for name, (lo, hi) in ranges.items():
        amax = max(abs(float(lo)), abs(float(hi)))
        if math.isfinite(amax):
            out[name] = max(amax, 1e-12) / INT8_MAX
    return out


def write_trt_cache(
    path: str | Path, scales: dict[str, float], *, trt_version: str, algorithm: str = DEFAULT_ALGORITHM
) -> TrtCalibrationCache:
    """Write a TensorRT calibration cache (atomically) and return what was written (scales as float32).

    Raises:
        InputError: bad ``trt_version``, a tensor name with a newline, or no scales.
    """
    if not scales:
        raise InputError("no tensor scales to write into the calibration cache")
    bad = [n for n in scales if "\n" in n or not n]
    if bad:
        raise InputError(f"tensor names not writable in a calibration cache: {bad[:3]}")
    written = {name: hex_scale(scale_hex(s)) for name, s in scales.items()}  # float32, as stored
    cache = TrtCalibrationCache(trt_version_code(trt_version), algorithm, written)
    lines = [cache.header] + [f"{name}: {scale_hex(s)}" for name, s in scales.items()]
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
    return cache


def read_trt_cache(path: str | Path) -> TrtCalibrationCache:
    """Parse a TensorRT calibration cache (as TensorRT or :func:`write_trt_cache` wrote it).

    Raises:
        InputError: missing file, bad header, or a malformed line (named by number).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"calibration cache unreadable: {path} ({exc})") from None
    if not lines:
        raise InputError(f"calibration cache is empty: {path}")
    head = lines[0].strip().split("-", 2)
    if len(head) != 3 or head[0] != "TRT" or not head[1].isdigit():
        raise InputError(f"{path}: line 1 {lines[0][:60]!r} is not a TensorRT cache header (TRT-<version>-<algorithm>)")
    scales: dict[str, float] = {}
    for i, line in enumerate(lines[1:], 2):
        if not line.strip():
            continue
        name, sep, value = line.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError(line)
            scales[name.strip()] = hex_scale(value.strip())
        except (ValueError, struct.error):
            raise InputError(f"{path}: line {i} {line[:60]!r} is not 'tensor: <hex float32>'") from None
    return TrtCalibrationCache(int(head[1]), head[2], scales)
