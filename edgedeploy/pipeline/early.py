"""Refusals that depend only on the config, the target and which data files exist.

They run before any stage, so a build that cannot succeed says why in well under a second,
without importing torch or loading the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from edgedeploy.errors import InputError

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig
    from edgedeploy.targets import TargetProfile


def refuse_early(cfg: DeployConfig, target: TargetProfile) -> None:
    """Raise the first refusal knowable from config, target and data presence alone.

    Raises:
        TargetCapabilityError: a precision, DLA core or opset the target does not support, or a TensorRT
            workspace larger than the target's memory.
        InputError: INT8 without calibration data; a data file that is missing or needs a
            Hugging Face tokenizer the model source does not have; an image folder without images, or for
            a model with several inputs; .npy / .npz data without an array per input, or validation
            arrays whose shapes do not fit the spec (read from the files' headers).
        ConfigError: an image folder for an input that is not one image, or whose height/width are dynamic
            without ``precision.calib_resize``.
    """
    from edgedeploy.onnxtools.export import choose_opset

    choose_opset(cfg, target)  # precision and DLA: targets.resolve.check_capabilities, just before this
    _refuse_workspace(cfg, target)
    p = cfg.precision
    calib = cfg.path(p.calib)
    if p.mode == "int8" and calib is None and not p.calib_callable:
        raise InputError(
            "INT8 needs calibration data and none was given",
            hint="pass --calib DIR (images), a .npy/.npz file (or .txt with model.hf), or set precision.calib_callable",
        )
    for key, path in (
        ("precision.calib", calib if p.mode != "fp32" else None),
        ("validate.data", cfg.path(cfg.validate.data)),
    ):
        if path is None:
            continue
        if not path.exists():
            raise InputError(f"{key}: file not found: {path}", hint=f"fix {key} in the config or its flag")
        if key == "precision.calib" and path.is_dir():
            from edgedeploy.precision.data import image_folder_plan

            files = image_folder_plan(cfg, path)[3]  # input geometry and image count: a listing, no image is read
            _refuse_one_batch(cfg, str(path), len(files))
        if path.suffix.lower() == ".txt" and not cfg.model.hf:
            raise InputError(
                f"{key}: {path} is text; text data needs a Hugging Face model folder (model.hf) to tokenize it",
                hint="use a .npz with one array per input name",
            )
        if path.is_file() and path.suffix.lower() in (".npz", ".npy"):
            rows = _check_array_names(cfg, key, path)
            if key == "precision.calib" and rows is not None:
                _refuse_one_batch(cfg, str(path), rows)


def _refuse_workspace(cfg: DeployConfig, target: TargetProfile) -> None:
    """A builder workspace larger than the device's memory (shared with the CPU on a Jetson) can never be
    granted: refused here, not after every stage ran and the engine plan is written.

    Raises:
        TargetCapabilityError: ``build.workspace_mib`` exceeds the target's ``memory_mib``.
    """
    from edgedeploy.errors import TargetCapabilityError

    asked = cfg.build.workspace_mib
    if asked is None or not target.memory_mib or asked <= target.memory_mib:
        return
    raise TargetCapabilityError(
        f"build.workspace_mib (--workspace-mib) {asked} MiB exceeds target '{target.name}' memory "
        f"({target.memory_mib} MiB)",
        hint=f"use --workspace-mib {target.memory_mib} or less (the target's memory; without the flag it gets "
        f"{target.workspace_mib} MiB)",
    )


def check_exported_file(key: str, path: Path, origin: dict[str, str]) -> None:
    """A sample file the checkpoint's sidecar lists (``deploy_data``): present and, when the sidecar records
    its sha256, unchanged since the export wrote it.

    Raises:
        InputError: the file is missing or its bytes are not the ones the export wrote.
    """
    from edgedeploy.fileio.hashing import sha256_file

    flag = "--calib" if key == "precision.calib" else "--validation-data"
    sidecar = origin.get("sidecar", "the checkpoint's .meta.json")
    if not path.is_file():
        raise InputError(
            f"{key}: {path} not found; {sidecar} lists it as the {origin.get('role', 'sample')} data "
            "export_for_deploy wrote next to the checkpoint",
            hint=f"copy it back next to the checkpoint, run the training export again, or pass {flag} FILE",
        )
    expected = origin.get("sha256")
    if expected and sha256_file(path) != expected:
        raise InputError(
            f"{key}: {path} changed after export_for_deploy wrote it (its sha256 is not the one {sidecar} records)",
            hint=f"run the training export again to rewrite it, or pass {flag} FILE to use other data",
        )


class _Header:
    """An array's shape as its file header states it (``np.shape`` reads ``.shape``); no data is read."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape


def array_headers(path: Path) -> dict[str, _Header]:
    """Name -> shape of each array in a .npz (``arr_0`` for a .npy), from the headers alone.

    Raises:
        InputError: the file is not a NumPy array file.
    """
    from edgedeploy.fileio.arrays import array_shapes

    return {name: _Header(shape) for name, shape in array_shapes(path).items()}


def _refuse_one_batch(cfg: DeployConfig, location: str, samples: int) -> None:
    """INT8 calibration data of one batch, and no validate.data to judge on: refused before any stage
    (the precision stage's :func:`edgedeploy.precision.data.require_heldout`, known here from a listing or a
    header)."""
    from edgedeploy.precision.data import calibration_batch_count, one_batch_error

    if cfg.precision.mode != "int8" or cfg.validate.data:
        return
    batches, size = calibration_batch_count(cfg, samples)
    if batches == 1:
        raise one_batch_error(location, min(samples, cfg.precision.calib_samples), size)


def _check_array_names(cfg: DeployConfig, key: str, path: Path) -> int | None:
    """Array names (and for ``validate.data`` shapes) against the input spec, from the file's headers; the
    first input's row count (samples), when its array has a leading axis.

    Raises:
        InputError: a .npy for a model with several inputs, a .npz without an array per input, or
            ``validate.data`` arrays whose shapes do not fit the spec.
    """
    from edgedeploy.modelio.inputs import check_feeds

    arrays = array_headers(path)
    names = [s.name for s in cfg.inputs]
    if path.suffix.lower() == ".npy" or (len(arrays) == 1 and len(names) == 1):
        if len(names) != 1:
            raise InputError(
                f"{key}: {path} holds one array and the model has {len(names)} inputs ({', '.join(names)})",
                hint="use a .npz with one array per input name",
            )
        arrays = {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(
            f"{key}: {path} has no array for input(s) {', '.join(missing)} (has {', '.join(arrays) or 'none'})",
            hint="save one array per input name: numpy.savez(f, **{name: array})",
        )
    if key == "validate.data":
        check_feeds(cfg, {n: arrays[n] for n in names}, str(path))
    shape = arrays[names[0]].shape
    return int(shape[0]) if shape else None
