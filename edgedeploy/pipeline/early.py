"""Refusals that depend only on the config, the target and which data files exist.

They run before any stage, so a build that cannot succeed says why in well under a second,
without importing torch or loading the model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from edgedeploy.errors import InputError

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig
    from edgedeploy.targets import TargetProfile


def refuse_early(cfg: DeployConfig, target: TargetProfile) -> None:
    """Raise the first refusal knowable from config, target and data presence alone.

    Raises:
        TargetCapabilityError: a precision, DLA core or opset the target does not support.
        InputError: INT8 without calibration data; a data file that is missing or needs a
            Hugging Face tokenizer the model source does not have; an image folder without images, or for
            a model with several inputs.
        ConfigError: an image folder for an input that is not one image, or whose height/width are dynamic
            without ``precision.calib_resize``.
    """
    from edgedeploy.onnxtools.export import choose_opset

    choose_opset(cfg, target)  # precision and DLA: targets.resolve.check_capabilities, just before this
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

            image_folder_plan(cfg, path)  # input geometry and image count: a listing, no image is read
        if path.suffix.lower() == ".txt" and not cfg.model.hf:
            raise InputError(
                f"{key}: {path} is text; text data needs a Hugging Face model folder (model.hf) to tokenize it",
                hint="use a .npz with one array per input name",
            )
