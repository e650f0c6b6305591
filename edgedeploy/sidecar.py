"""A checkpoint's sidecar (``<name>.meta.json``) as the deploy side reads it (plain data; nothing imported).

``model.checkpoint`` may name the folder a trainer wrote rather than the file: the folder's one
``<name>.safetensors`` with a ``<name>.meta.json`` next to it is the checkpoint. The calibration and
held-out samples an exporter (``edgedeploy.train.export_for_deploy`` and the trainer bridges built on it)
lists under the sidecar's ``deploy_data`` become the default ``precision.calib`` (INT8) and
``validate.data``; the config's or the flags' own values win. The sidecar is data: it names sample files
by bare file name next to the checkpoint (never a path elsewhere) and records their sha256, which the
build checks before reading them (``edgedeploy.pipeline.early.check_exported_file``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgedeploy.errors import ConfigError

META_SUFFIX = ".meta.json"
WEIGHTS_SUFFIX = ".safetensors"
# deploy_data role -> the config key it fills and what the report calls it
DATA_ROLES = {"calib": ("precision.calib", "calibration"), "validate": ("validate.data", "validation")}
DATA_SUFFIXES = (".npz", ".npy")


def checkpoints_in_folder(folder: Path) -> list[Path]:
    """The ``.safetensors`` files of ``folder`` that have a ``.meta.json`` next to them, sorted."""
    weights = (
        meta.with_name(meta.name[: -len(META_SUFFIX)] + WEIGHTS_SUFFIX) for meta in folder.glob("*" + META_SUFFIX)
    )
    return sorted(w for w in weights if w.is_file())


def checkpoint_in_folder(folder: Path, where: str) -> Path:
    """The one checkpoint of ``folder``: the ``.safetensors`` file that has a ``.meta.json`` next to it.

    Raises:
        ConfigError: the folder holds no such pair, or several.
    """
    found = checkpoints_in_folder(folder)
    if not found:
        raise ConfigError(
            f"{where}: model.checkpoint {folder} is a folder without a checkpoint "
            f"(a <name>{WEIGHTS_SUFFIX} with its <name>{META_SUFFIX})",
            hint="point --checkpoint at the folder export_for_deploy or deploy train wrote, or at the weights file",
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ConfigError(
            f"{where}: model.checkpoint {folder} holds {len(found)} checkpoints ({names})",
            hint=f"name one: --checkpoint {found[0]}",
        )
    return found[0]


def has_sidecar(checkpoint: str | Path | None) -> bool:
    """Whether ``checkpoint`` (a file or a trainer's folder) has a sidecar describing the model."""
    if not checkpoint:
        return False
    path = Path(checkpoint).expanduser()
    if path.is_dir():
        return bool(checkpoints_in_folder(path))
    return path.with_suffix(META_SUFFIX).is_file()


def exported_data(meta: dict[str, Any], meta_path: Path) -> dict[str, dict[str, str]]:
    """The sample files the sidecar's ``deploy_data`` lists, by config key (``precision.calib``,
    ``validate.data``): each one's ``path`` (next to the checkpoint), report ``role``, ``writer``,
    ``trainer``, ``sidecar`` and recorded ``sha256`` ("" when the sidecar records none).

    Raises:
        ConfigError: ``deploy_data`` is not an object of bare ``.npz`` / ``.npy`` file names.
    """
    listed = meta.get("deploy_data")
    if not listed:
        return {}
    fix = "write the checkpoint again with export_for_deploy, or pass --calib / --validation-data yourself"
    if not isinstance(listed, dict):
        raise ConfigError(f"{meta_path}: key 'deploy_data' must be a JSON object of file names", hint=fix)
    hashes = meta.get("deploy_data_sha256") or {}
    if not isinstance(hashes, dict):
        raise ConfigError(f"{meta_path}: key 'deploy_data_sha256' must be a JSON object", hint=fix)
    trainer = meta.get("trainer")
    out: dict[str, dict[str, str]] = {}
    for role, (key, report_role) in DATA_ROLES.items():
        name = listed.get(role)
        if name is None:
            continue
        if (
            not isinstance(name, str)
            or name in ("", ".", "..")
            or "/" in name
            or "\\" in name
            or not name.lower().endswith(DATA_SUFFIXES)
        ):
            raise ConfigError(
                f"{meta_path}: deploy_data.{role} = {name!r} must be a .npz / .npy file name next to the checkpoint",
                hint=fix,
            )
        out[key] = {
            "path": str(meta_path.absolute().with_name(name)),
            "role": report_role,
            "writer": "export_for_deploy",
            "trainer": trainer if isinstance(trainer, str) else "",
            "sidecar": str(meta_path),
            "sha256": str(hashes.get(role) or ""),
        }
    return out


def fill_exported_data(raw: dict[str, Any], meta: dict[str, Any], meta_path: Path) -> dict[str, dict[str, str]]:
    """Set ``precision.calib`` (for INT8) and ``validate.data`` in ``raw`` to the exported samples where the
    config leaves them unset; judged on real held-out samples, ``validate.samples`` defaults to 0 (no
    generated batches). Returns the entries of :func:`exported_data` that were used, by config key.

    Raises:
        ConfigError: a malformed ``deploy_data`` (see :func:`exported_data`).
    """
    exported = exported_data(meta, meta_path)
    precision = raw.setdefault("precision", {})
    validate = raw.setdefault("validate", {})
    used: dict[str, dict[str, str]] = {}
    calib = exported.get("precision.calib")
    wants_calib = precision.get("mode") == "int8" and not precision.get("calib") and not precision.get("calib_callable")
    if calib and wants_calib:
        precision["calib"] = calib["path"]
        used["precision.calib"] = calib
    held = exported.get("validate.data")
    if held and not validate.get("data"):
        validate["data"] = held["path"]
        validate.setdefault("samples", 0)
        used["validate.data"] = held
    return used


def origin_text(origin: dict[str, str]) -> str:
    """``written by export_for_deploy (lightning) at /run/model.calib.npz``."""
    by = origin.get("writer", "export_for_deploy")
    trainer = origin.get("trainer")
    return f"written by {by}{f' ({trainer})' if trainer else ''} at {origin.get('path', '?')}"
