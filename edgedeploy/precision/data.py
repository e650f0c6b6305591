"""Calibration data: an image folder (with a preprocessing spec), .npy / .npz tensors, or a ``module:callable``.

Every source ends up as a :class:`CalibrationSet`: uniform batches of feed dicts checked against the
input spec, plus the hashes that go into the stage's cache key and the build's metrics (provenance).
"""

from __future__ import annotations

import hashlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.artifacts import CALIB_CODE
from edgedeploy.config import DeployConfig, InputSpec
from edgedeploy.errors import ConfigError, InputError
from edgedeploy.fileio.arrays import read_npy, read_npz
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.modelio.inputs import _NP_DTYPES, check_feeds, feeds_at
from edgedeploy.modelio.usercode import load_callable, module_source, running_user_code

# PIL's own decompression-bomb bound (Image.MAX_IMAGE_PIXELS), used when that is switched off
MAX_IMAGE_PIXELS = 89_478_485
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class CalibrationSet:
    """Calibration batches and where they came from.

    Attributes:
        batches: feed dicts (input name -> array), each a batch the model accepts.
        kind: ``images``, ``npy``, ``npz``, ``callable`` or ``random`` (spec-random, FP16 analysis only).
        location: the folder, file or ``module:callable`` the data came from.
        source_sha256: hash of the source (file bytes; sorted file list + contents for a folder;
            module source + name for a callable).
        data_sha256: hash of the arrays actually used (after preprocessing and the sample limit).
        available: samples the source held before the limit.
    """

    batches: tuple[dict[str, np.ndarray], ...]
    kind: str
    location: str
    source_sha256: str
    data_sha256: str
    available: int

    @property
    def samples(self) -> int:
        """Number of samples (rows along axis 0) over all batches."""
        return sum(next(iter(b.values())).shape[0] for b in self.batches) if self.batches else 0

    def provenance(self) -> dict[str, Any]:
        """Plain-data record for the stage metrics (and so report.json)."""
        return {
            "kind": self.kind,
            "location": self.location,
            "source_sha256": self.source_sha256,
            "data_sha256": self.data_sha256,
            "samples_used": self.samples,
            "samples_available": self.available,
            "batches": len(self.batches),
        }


class OrtCalibrationReader:
    """onnxruntime.quantization's CalibrationDataReader protocol (``get_next`` / ``rewind``) over batches."""

    def __init__(self, batches: Sequence[dict[str, np.ndarray]]) -> None:
        self._batches = list(batches)
        self._it: Iterator[dict[str, np.ndarray]] = iter(self._batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = iter(self._batches)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


def image_files(folder: Path) -> list[Path]:
    """The image files of a calibration folder, in the order calibration reads them (sorted paths)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def hash_directory(folder: Path, limit: int | None = None) -> str:
    """sha256 over the image files an image-folder calibration reads (the first ``limit`` of them, sorted, as
    :func:`image_folder_plan` lists them): each one's relative name and contents (mtimes never enter).

    Only those files are read: the other files of a folder given as calibration data (a 200 GB sparse file, a
    link to a device) are never opened.
    """
    h = hashlib.sha256()
    for p in image_files(folder)[:limit]:
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + sha256_file(p).encode() + b"\n")
    return h.hexdigest()


def calibration_fingerprint(cfg: DeployConfig) -> dict[str, str]:
    """What the calibration data is, hashed, for cache keys: ``{"kind", "location", "sha256"}``.

    Raises:
        InputError: the configured path does not exist.
        ConfigError: the callable's module cannot be found.
    """
    p = cfg.precision
    if p.calib_callable:
        if ":" not in p.calib_callable:
            raise ConfigError(
                f"{cfg.source}: key 'precision.calib_callable' = {p.calib_callable!r} must be 'module:callable'"
            )
        src = module_source(cfg, p.calib_callable, "precision.calib_callable")
        sha = hashlib.sha256(
            p.calib_callable.encode() + b"\0" + (sha256_file(src).encode() if src else b"")
        ).hexdigest()
        return {"kind": "callable", "location": p.calib_callable, "sha256": sha}
    path = cfg.path(p.calib)
    if path is None:
        return {"kind": "random", "location": "", "sha256": ""}
    if path.is_dir():
        return {"kind": "images", "location": str(path), "sha256": hash_directory(path, max(1, p.calib_samples))}
    if path.is_file():
        return {"kind": path.suffix.lstrip(".").lower(), "location": str(path), "sha256": sha256_file(path)}
    raise InputError(f"calibration data not found: {path}", hint="fix precision.calib or --calib")


def load_calibration(cfg: DeployConfig, *, allow_random: bool = False) -> CalibrationSet:
    """Read the configured calibration data into uniform batches (at most ``precision.calib_samples`` samples).

    Args:
        cfg: the build config (``precision.calib`` / ``calib_callable``, inputs, dims, normalization).
        allow_random: with no calibration data configured, use seeded spec-random inputs instead of failing
            (FP16 range analysis only; INT8 always needs real data).

    Raises:
        InputError: no data configured (and ``allow_random`` is false), unreadable files, no images in a
            folder, arrays that do not fit the input spec, a callable that fails or yields nothing.
        ConfigError: an image folder for a model whose input is not one image tensor, or no spatial size.
    """
    fp = calibration_fingerprint(cfg)
    kind = fp["kind"]
    if kind == "random":
        if not allow_random:
            raise InputError(
                "INT8 needs calibration data and none was given",
                hint="pass --calib DIR (images) or a .npy/.npz file, or set precision.calib_callable",
            )
        return _random_set(cfg)
    location = fp["location"]
    available = None  # samples in the source, when it is read only up to calib_samples
    if kind == "callable":
        arrays = _from_callable(cfg, location)
    elif kind == "images":
        arrays = _from_images(cfg, Path(location))
    elif kind == "npy":
        arrays, available = _from_npy(cfg, Path(location))
    elif kind == "npz":
        arrays, available = _from_npz(cfg, Path(location))
    elif kind == "txt":  # one sentence a line, tokenized by the model.hf folder's tokenizer
        from edgedeploy.modelio.hf import text_arrays

        arrays = text_arrays(cfg, Path(location), limit=max(1, cfg.precision.calib_samples))
    else:
        raise InputError(
            f"calibration data {location}: unsupported file type '.{kind}'",
            hint="use an image folder, a .npy (one input), a .npz (one array per input name) or .txt (model.hf)",
        )
    counted = _count(arrays, location)
    available = counted if available is None else available
    limit = max(1, cfg.precision.calib_samples)
    arrays = {k: v[:limit] for k, v in arrays.items()}
    batches = _rebatch(cfg, arrays, location)
    return CalibrationSet(
        batches=batches,
        kind=kind,
        location=location,
        source_sha256=fp["sha256"],
        data_sha256=_arrays_sha(batches),
        available=available,
    )


# ---- sources ------------------------------------------------------------------------------


def _count(arrays: dict[str, np.ndarray], where: str) -> int:
    counts = {k: int(v.shape[0]) if v.ndim else 0 for k, v in arrays.items()}
    if len(set(counts.values())) != 1:
        raise InputError(f"calibration data {where}: inputs hold different sample counts {counts}")
    n = next(iter(counts.values()))
    if n == 0:
        raise InputError(f"calibration data {where}: holds no samples")
    return n


def _single_input(cfg: DeployConfig, where: str) -> InputSpec:
    if len(cfg.inputs) != 1:
        raise InputError(
            f"calibration data {where}: the model has {len(cfg.inputs)} inputs, a single array cannot feed them",
            hint="use a .npz with one array per input name, or precision.calib_callable",
        )
    return cfg.inputs[0]


def _cast(spec: InputSpec, arr: np.ndarray, where: str) -> np.ndarray:
    want = _NP_DTYPES[spec.dtype]
    if arr.dtype.kind not in "biuf":
        raise InputError(f"calibration data {where}: array for {spec.name!r} has dtype {arr.dtype}, not numeric")
    return np.ascontiguousarray(arr.astype(want, copy=False))


# a stored value may be wider than the input's (float64 data for a float32 input)
_WIDEST_VALUE = 8


def sample_bytes_bound(cfg: DeployConfig) -> int:
    """The most bytes one stored sample of any input may take: the input at its max shape, 8-byte values."""
    most = 1
    for spec in cfg.inputs:
        shape = cfg.shape_for(spec, "max")
        most = max(most, math.prod(shape[1:]) if len(shape) > 1 else 1)
    return most * _WIDEST_VALUE


def _from_npy(cfg: DeployConfig, path: Path) -> tuple[dict[str, np.ndarray], int]:
    """The first ``precision.calib_samples`` samples of a .npy file, read after its header is checked, and
    how many it holds."""
    spec = _single_input(cfg, str(path))
    arr, rows = read_npy(path, limit=max(1, cfg.precision.calib_samples), row_bound=sample_bytes_bound(cfg))
    return {spec.name: _cast(spec, arr, str(path))}, rows


def _from_npz(cfg: DeployConfig, path: Path) -> tuple[dict[str, np.ndarray], int]:
    """The first ``precision.calib_samples`` samples of each input's array in a .npz (other arrays are not read),
    and how many samples it holds."""
    names = [s.name for s in cfg.inputs]
    read, held = read_npz(path, names, limit=max(1, cfg.precision.calib_samples), row_bound=sample_bytes_bound(cfg))
    arrays = {k: v[0] for k, v in read.items()}
    counts = {k: v[1] for k, v in read.items()}
    if len(set(counts.values())) > 1:
        raise InputError(f"calibration data {path}: inputs hold different sample counts {counts}")
    if len(arrays) == 1 and len(names) == 1 and names[0] not in arrays:
        arrays = {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(
            f"calibration data {path}: no array for input(s) {', '.join(missing)} (has {', '.join(held)})",
            hint="save one array per input name: numpy.savez(f, **{name: array})",
        )
    return {s.name: _cast(s, arrays[s.name], str(path)) for s in cfg.inputs}, max(counts.values())


def _from_callable(cfg: DeployConfig, spec: str) -> dict[str, np.ndarray]:
    fn = load_callable(cfg, spec, "precision.calib_callable")
    names = [s.name for s in cfg.inputs]
    chunks: dict[str, list[np.ndarray]] = {n: [] for n in names}
    try:
        with running_user_code(cfg, CALIB_CODE):  # what it imports late comes from the project on disk
            batches = list(fn())
        for i, batch in enumerate(batches):
            if not isinstance(batch, dict):
                if len(names) != 1:
                    raise InputError(f"calibration callable {spec}: batch {i} is not a dict of input name -> array")
                batch = {names[0]: batch}
            for s in cfg.inputs:
                if s.name not in batch:
                    raise InputError(f"calibration callable {spec}: batch {i} has no array for input {s.name!r}")
                chunks[s.name].append(_cast(s, np.asarray(batch[s.name]), f"{spec} batch {i}"))
    except InputError:
        raise
    except Exception as exc:  # user code
        raise InputError(f"calibration callable {spec} raised {type(exc).__name__}: {exc}") from None
    if not chunks[names[0]]:
        raise InputError(f"calibration callable {spec} yielded no batches")
    try:
        return {n: np.concatenate(v, axis=0) for n, v in chunks.items()}
    except ValueError as exc:
        raise InputError(f"calibration callable {spec}: batches do not stack along axis 0 ({exc})") from None


def _file_sets(source: str, table: str, key: str, value: Any) -> bool:
    """Whether the config file ``source`` itself sets ``[table] key`` to ``value``: an error about a value it does
    not hold names the flag (or keyword) that set it, not the file."""
    from edgedeploy.schema import read_toml

    try:
        raw = read_toml(source, what="config file")
    except ConfigError:  # no file (a build from flags alone, a dict): the value came from a flag or keyword
        return False
    section = raw.get(table)
    return isinstance(section, dict) and section.get(key) == value


def _image_geometry(cfg: DeployConfig, spec: InputSpec, where: str) -> tuple[int, int, int]:
    """(height, width, channels) the image-folder preprocessing produces for ``spec``."""
    if len(spec.shape) != 4:
        raise ConfigError(
            f"{cfg.source}: an image folder ({where}) needs a 4-D image input, "
            f"{spec.name!r} has shape {list(spec.shape)}",
            hint="use a .npy/.npz file or precision.calib_callable",
        )
    layout = cfg.precision.calib_layout
    c_axis, hw = (1, (2, 3)) if layout == "NCHW" else (3, (1, 2))
    channels = spec.shape[c_axis]
    if channels not in (1, 3):
        other, other_axis = ("NHWC", 3) if layout == "NCHW" else ("NCHW", 1)
        from_file = _file_sets(cfg.source, "precision", "calib_layout", layout)
        if spec.shape[other_axis] in (1, 3):  # the input's own layout: the one that puts 1 or 3 on its channel axis
            use = f'set precision.calib_layout = "{other}"' if from_file else f"use --calib-layout {other}"
            hint = f"{use} (the layout of input {spec.name!r}: {spec.shape[other_axis]} channels on axis {other_axis})"
        else:
            hint = (
                f"input {spec.name!r} is no 1- or 3-channel image: calibrate with a .npy/.npz file or "
                "precision.calib_callable"
            )
        where = (
            f"{cfg.source}: key 'precision.calib_layout'" if from_file else "--calib-layout (precision.calib_layout)"
        )
        raise ConfigError(
            f"{where} = {layout!r} puts {channels} channels on axis {c_axis} of input {spec.name!r}; "
            "images give 1 or 3",
            hint=hint,
        )
    if cfg.precision.calib_resize:
        if len(cfg.precision.calib_resize) != 2:
            raise ConfigError(
                f"{cfg.source}: key 'precision.calib_resize' must be [height, width]",
                hint="e.g. --calib-resize 224,224",
            )
        return cfg.precision.calib_resize[0], cfg.precision.calib_resize[1], int(channels)
    h, w = spec.shape[hw[0]], spec.shape[hw[1]]
    if not (isinstance(h, int) and isinstance(w, int)):
        raise ConfigError(
            f"{cfg.source}: input {spec.name!r} has dynamic height/width ({h} x {w}), so the size to resize "
            f"calibration images ({where}) to is unknown",
            hint="pass --calib-resize HEIGHT,WIDTH (e.g. 224,224) or set precision.calib_resize = [height, width]",
        )
    return h, w, int(channels)


def preprocess_image(
    path: Path, *, size: tuple[int, int], channels: int, mean: Any, std: Any, layout: str
) -> np.ndarray:
    """One image file as a float32 CHW / HWC array: resized (bilinear), scaled, normalized.

    Pixels are scaled to [0, 1] unless ``mean`` is given in 0..255 units (any value > 1); then
    ``(x - mean) / std`` per channel.

    Raises:
        InputError: the file is not a readable image.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise InputError(
            "reading an image folder needs Pillow", hint="pip install 'edgedeploy[data]' or pass .npy/.npz"
        ) from None
    limit = Image.MAX_IMAGE_PIXELS or MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # the header's size is checked below
            with Image.open(path) as img:  # reads the header only
                if img.width * img.height > limit:
                    raise InputError(
                        f"calibration image {path} is {img.width}x{img.height} ({img.width * img.height / 1e6:.0f} "
                        f"Mpixel), over the {limit / 1e6:.0f} Mpixel a decoded image may take; not decoded",
                        hint="resize it (the model takes " + f"{size[1]}x{size[0]}) or remove it",
                    )
                img = img.convert("L" if channels == 1 else "RGB").resize((size[1], size[0]), Image.Resampling.BILINEAR)
                arr = np.asarray(img, dtype=np.float32)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:  # PIL's header check
        raise InputError(
            f"calibration image {path}: {exc}; not decoded", hint=f"resize it (the model takes {size[1]}x{size[0]})"
        ) from None
    except (OSError, UnidentifiedImageError) as exc:
        raise InputError(f"calibration image unreadable: {path} ({exc})", hint="remove or replace the file") from None
    if arr.ndim == 2:
        arr = arr[:, :, None]
    m = np.asarray(mean if mean is not None else [0.0] * channels, dtype=np.float32)
    s = np.asarray(std if std is not None else [1.0] * channels, dtype=np.float32)
    if not (m.size and float(m.max()) > 1.0):
        arr = arr / 255.0
    arr = (arr - m.reshape(1, 1, -1)) / s.reshape(1, 1, -1)
    return arr.transpose(2, 0, 1) if layout == "NCHW" else arr


def image_folder_plan(cfg: DeployConfig, folder: Path) -> tuple[int, int, int, list[Path]]:
    """(height, width, channels, image files) an image folder calibrates with; no image is read.

    Cheap enough to run before any stage (a directory listing), so every problem the config and the
    folder reveal is reported in the first second of a build.

    Raises:
        InputError: the model has several inputs, or the folder holds no images.
        ConfigError: the input is not a 4-D 1- or 3-channel image, or its height/width are dynamic
            and ``precision.calib_resize`` is not set.
    """
    spec = _single_input(cfg, str(folder))
    h, w, c = _image_geometry(cfg, spec, str(folder))
    files = image_files(folder)
    if not files:
        raise InputError(
            f"calibration folder {folder} holds no images ({', '.join(IMAGE_SUFFIXES)})",
            hint="put image files in it, or pass a .npy/.npz file",
        )
    return h, w, c, files


def _from_images(cfg: DeployConfig, folder: Path) -> dict[str, np.ndarray]:
    h, w, c, files = image_folder_plan(cfg, folder)
    norm = cfg.model.normalization or {}
    files = files[: max(1, cfg.precision.calib_samples)]
    arr = np.stack(
        [
            preprocess_image(
                f,
                size=(h, w),
                channels=c,
                mean=norm.get("mean"),
                std=norm.get("std"),
                layout=cfg.precision.calib_layout,
            )
            for f in files
        ]
    )
    spec = cfg.inputs[0]  # the one input (image_folder_plan checked)
    return {spec.name: _cast(spec, arr, str(folder))}


def _batch_size(cfg: DeployConfig) -> tuple[int, int]:
    """(batch size, smallest batch accepted) for axis 0 of the first input."""
    lead = cfg.inputs[0].shape[0] if cfg.inputs[0].shape else 1
    if isinstance(lead, int):
        return lead, lead
    d = cfg.dims[lead]
    return d.opt, d.min


def _rebatch(cfg: DeployConfig, arrays: dict[str, np.ndarray], where: str) -> tuple[dict[str, np.ndarray], ...]:
    size, smallest = _batch_size(cfg)
    n = _count(arrays, where)
    if n > 1 and all(a.ndim and np.all(a == a[:1]) for a in arrays.values()):
        # ranges from one sample, and held-out "real" samples that are that sample again: nothing is judged
        raise InputError(
            f"calibration data {where}: all {n} samples are the same",
            hint="give varied real samples (the inputs the model sees in use)",
        )
    batches = []
    for start in range(0, n, size):
        batch = {k: v[start : start + size] for k, v in arrays.items()}
        if next(iter(batch.values())).shape[0] < smallest:
            break  # a short last batch the model does not accept
        batches.append(batch)
    if not batches:
        raise InputError(f"calibration data {where}: {n} samples, the model needs batches of at least {smallest}")
    check_feeds(cfg, batches[0], f"calibration data {where}")
    # every batch: the slices share their shapes and dtypes, not their values (a NaN in sample 3 of 64 would
    # calibrate ranges to NaN, and write NaN into precision.json)
    for i, batch in enumerate(batches[1:], start=1):
        rows = next(iter(batch.values())).shape[0] if batch else 0
        check_feeds(cfg, batch, f"calibration data {where}, samples {i * size}-{i * size + rows - 1}")
    return tuple(batches)


def _random_set(cfg: DeployConfig) -> CalibrationSet:
    rng = np.random.default_rng(cfg.validate.seed + 7)
    size, _ = _batch_size(cfg)
    count = max(1, -(-min(cfg.precision.calib_samples, 16) // size))
    batches = tuple(feeds_at(cfg, "opt", rng) for _ in range(count))
    return CalibrationSet(
        batches=batches, kind="random", location="", source_sha256="", data_sha256=_arrays_sha(batches), available=0
    )


def _arrays_sha(batches: tuple[dict[str, np.ndarray], ...]) -> str:
    h = hashlib.sha256()
    for b in batches:
        for k in sorted(b):
            a = np.ascontiguousarray(b[k])
            h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


HELDOUT_FRACTION = 0.25
# goldens point of the calibration samples held out of calibration (in validate.parity.REAL_DATA_POINTS)
HELDOUT_POINT = "calib-heldout"


def require_heldout(calib: CalibrationSet, *, judged_elsewhere: bool) -> None:
    """Refuse INT8 calibration data that leaves nothing to judge on: one batch cannot be split
    (:func:`split_heldout`), and a model judged on the samples its ranges came from scores what it memorized.

    ``judged_elsewhere``: ``validate.data`` is configured, and the candidates are judged on it instead.

    Raises:
        InputError: one calibration batch and no ``validate.data``.
    """
    if len(calib.batches) >= 2 or judged_elsewhere:
        return
    rows = next(iter(calib.batches[0].values())).shape[0] if calib.batches and calib.batches[0] else 0
    raise one_batch_error(calib.location, calib.samples, rows)


def calibration_batch_count(cfg: DeployConfig, samples: int) -> tuple[int, int]:
    """(batches, samples per batch) that ``samples`` calibration samples make (at most
    ``precision.calib_samples`` are used; a short last batch counts when the model accepts it), as
    :func:`load_calibration` batches them: known from a folder listing or an array header before any is read."""
    size, smallest = _batch_size(cfg)
    full, rest = divmod(min(samples, max(1, cfg.precision.calib_samples)), size)
    return full + (1 if rest and rest >= smallest else 0), size


def one_batch_error(location: str, samples: int, rows: int) -> InputError:
    """The refusal of INT8 calibration data that makes a single batch (see :func:`require_heldout`)."""
    return InputError(
        f"INT8 calibration data {location} makes one batch ({samples} sample(s), {rows} per batch): "
        "nothing can be held out, so INT8 would be judged on the very samples it was calibrated on",
        hint=f"give at least {2 * max(rows, 1)} samples (a quarter of the batches is held out for judging; "
        "more judge better: precision.calib_samples), or set validate.data to real samples to judge on",
    )


def split_heldout(
    batches: Sequence[dict[str, np.ndarray]], fraction: float = HELDOUT_FRACTION
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """(calibration, held-out) batches: the last ``fraction`` of the batches (at least one) is held out.

    INT8 builds calibrate on the first part and are judged on the held-out part, never on the samples they
    calibrated on. With a single batch nothing can be held out: ``([batch], [])``. The reference stage uses the
    same split to put the held-out samples into the goldens, so the device check sees real data too.
    """
    n = len(batches)
    if n < 2:
        return list(batches), []
    k = max(1, round(n * fraction))
    return list(batches[: n - k]), list(batches[n - k :])


def split_for_judging(
    batches: Sequence[dict[str, np.ndarray]], kind: str, layout: str, *, wide: bool = False, half_grid: bool = False
) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """(calibration, judged) batches: ``split_heldout``, then for an image folder the held-out photos' views
    (``precision.heldout.heldout_views``). The reference stage puts these into the goldens, so the bundle's
    own check sees real samples the precision stage judged on; ``wide``: the precision stage's judge, up to
    ``JUDGE_VIEWS`` views per photo within ``MAX_JUDGED_SAMPLES``, whose first views are the goldens' ones;
    ``half_grid`` (INT8 builds): the views rounded to float16 values (``precision.heldout.on_half_grid``).
    """
    calib, held = split_heldout(batches)
    if kind == "images" and held:
        from edgedeploy.precision import heldout

        if wide:
            held = heldout.heldout_views(
                held, layout, heldout.MAX_JUDGED_SAMPLES, heldout.JUDGE_VIEWS, half_grid=half_grid
            )
        else:
            held = heldout.heldout_views(held, layout, half_grid=half_grid)
    return calib, held
