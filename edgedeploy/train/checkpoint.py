"""Training checkpoints that ``deploy build`` reads directly, and resumable training state.

For ``X.safetensors`` (weights only) the stage writes:

- ``X.meta.json``: the deploy contract (format ``edgedeploy-checkpoint/1``: factory, inputs, dims,
  outputs, normalization, class names, metrics, code version), read by ``edgedeploy.config``;
- ``X.resume.safetensors``: training weights, optimizer and other state tensors, and everything else
  (param groups, scheduler, scaler, RNG, counters) as JSON in its header; ``X.resume.json`` is a
  readable copy of that JSON. Nothing is ever unpickled.

The metadata is written last, so a checkpoint with metadata is complete.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from edgedeploy._version import __version__
from edgedeploy.config import SIDECAR_FORMAT, checkpoint_metadata_path
from edgedeploy.errors import CheckpointError
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.fileio.store import atomic_write_bytes, atomic_write_json
from edgedeploy.modelio.checkpoint import read_state_dict

FORMAT = SIDECAR_FORMAT
RESUME_FORMAT = "edgedeploy-train-state/1"
_DOC_KEY = "edgedeploy_train_state"  # the resume document in X.resume.safetensors' header


def resume_paths(checkpoint: Path) -> tuple[Path, Path]:
    """The tensor and JSON files holding the resumable state of ``checkpoint``."""
    stem = checkpoint.with_suffix("")
    return stem.with_name(stem.name + ".resume.safetensors"), stem.with_name(stem.name + ".resume.json")


def code_version(source: Path | None) -> dict[str, Any]:
    """Package version, ``git describe`` of the model source's repository (if any) and its sha256."""
    info: dict[str, Any] = {"package": f"edgedeploy {__version__}", "git": None, "model_source_sha256": None}
    if source is not None and source.is_file():
        info["model_source"] = source.name
        info["model_source_sha256"] = sha256_file(source)
        try:
            run = subprocess.run(
                ["git", "-C", str(source.parent), "describe", "--always", "--dirty", "--tags"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if run.returncode == 0:
                info["git"] = run.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass  # no git: the source hash still identifies the code
    return info


def checkpoint_metadata(
    *,
    factory: str,
    factory_kwargs: dict[str, Any],
    inputs: list[dict[str, Any]],
    dims: dict[str, dict[str, int]],
    outputs: list[str],
    normalization: dict[str, Any] | None = None,
    class_names: list[str] | None = None,
    metrics: dict[str, Any] | None = None,
    code: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The sidecar document of the deploy contract (see module docstring)."""
    meta = {
        "format": FORMAT,
        "factory": factory,
        "factory_kwargs": factory_kwargs,
        "inputs": inputs,
        "dims": dims,
        "outputs": outputs,
        "normalization": normalization or {},
        "class_names": class_names or [],
        "metrics": metrics or {},
        "code_version": code or code_version(None),
    }
    meta.update(extra or {})
    return meta


def _flatten_optimizer(state: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, entry in state["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{pid}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(pid), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], doc: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = value
    for pid, entry in doc.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(entry)
    return {"state": state, "param_groups": doc["param_groups"]}


def save_checkpoint(
    path: str | Path,
    model: nn.Module,
    meta: dict[str, Any],
    *,
    optimizer: torch.optim.Optimizer | None = None,
    train_state: dict[str, Any] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    state_tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the resumable state (when ``optimizer`` is given), the weights and the metadata sidecar, each
    atomically (see the module docstring). Call on one rank only.

    ``X.resume.safetensors`` is self-contained: the training weights (``model.*``, whatever ``weights``
    deploys), optimizer tensors, ``state_tensors`` (e.g. ``ema.*``) and the JSON document (param groups,
    ``train_state``), so a kill between two of the files never pairs a state with other weights.
    ``weights`` replaces ``model.state_dict()`` in ``X.safetensors`` (a gathered FSDP state, EMA or
    folded weights).

    Raises:
        CheckpointError: the state holds something that is neither a tensor nor JSON data.
    """
    path = Path(path)
    source = model.state_dict() if weights is None else weights
    weights = {k: v.detach().cpu().contiguous() for k, v in source.items()}
    blob = st_save(weights)
    weights_sha = hashlib.sha256(blob).hexdigest()
    if optimizer is not None:
        tensors, doc = _flatten_optimizer(optimizer.state_dict())
        tensors.update({f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()})
        tensors.update({k: v.detach().cpu().contiguous() for k, v in (state_tensors or {}).items()})
        doc.update(format=RESUME_FORMAT, weights_sha256=weights_sha, train_state=train_state or {})
        try:
            text = json.dumps(doc, indent=1, allow_nan=True)
        except TypeError as exc:
            raise CheckpointError(f"training state for {path} is not tensors + JSON data ({exc})") from None
        st_path, json_path = resume_paths(path)
        atomic_write_bytes(st_path, st_save(tensors, metadata={_DOC_KEY: json.dumps(doc, allow_nan=True)}))
        atomic_write_bytes(json_path, text.encode())
    atomic_write_bytes(path, blob)
    atomic_write_json(checkpoint_metadata_path(path), {**meta, "weights_sha256": weights_sha})
    return path


def load_resume_state(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, Any]:
    """Load the training weights into ``model`` and optimizer state into ``optimizer``; return the saved
    ``train_state``, with the file's other tensors (``ema.*`` ...) under ``"tensors"``.

    Reads only ``X.resume.safetensors`` (weights, optimizer and state in one file). A state written before
    the weights moved into it pairs with ``X.safetensors`` by its sha256.

    Raises:
        CheckpointError: files missing or corrupt, the state was saved with other weights, or it does
            not fit the model / optimizer.
    """
    path = Path(path)
    st_path, json_path = resume_paths(path)
    if not st_path.is_file():
        what = "checkpoint" if not path.is_file() else "resumable state"
        raise CheckpointError(
            f"{what} not found: {st_path if path.is_file() else path}",
            hint="train without --resume, or point at a checkpoint written by deploy train",
        )
    try:
        raw = st_path.read_bytes()
        tensors = st_load(raw)
        header = _header(raw)
        doc = json.loads(header[_DOC_KEY]) if _DOC_KEY in header else json.loads(json_path.read_text())
    except Exception as exc:  # safetensors raises several types for corrupt files
        raise CheckpointError(f"resumable state of {path} is corrupt ({type(exc).__name__}: {exc})") from None
    if doc.get("format") != RESUME_FORMAT:
        raise CheckpointError(f"{st_path.name}: format {doc.get('format')!r} is not {RESUME_FORMAT!r}")
    weights = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    if not weights:  # older layout: the weights are X.safetensors, tied to the state by their hash
        weights = read_state_dict(path)
        if doc.get("weights_sha256") != sha256_file(path):
            raise CheckpointError(
                f"{json_path} was saved with other weights than {path.name}", hint="the pair is from different runs"
            )
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        differs = state_dict_mismatch(model, weights) or str(exc).splitlines()[0]
        raise CheckpointError(
            f"checkpoint {path} does not fit the model: {differs}",
            hint="resume with the model.factory and model.kwargs the run started with, or train a new run (--out)",
        ) from None
    if optimizer is not None:
        try:
            optimizer.load_state_dict(_unflatten_optimizer(tensors, doc))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"optimizer state in {st_path.name} does not fit ({exc})") from None
    state = dict(doc.get("train_state", {}))
    state["tensors"] = {k: v for k, v in tensors.items() if not k.startswith(("model.", "optimizer.", "_empty"))}
    return state


def state_dict_mismatch(model: nn.Module, weights: dict[str, torch.Tensor]) -> str:
    """The first difference between ``model``'s tensors and ``weights`` in words (a shape, a missing or an
    unexpected tensor, and how many more), or "" when none is found."""
    have = model.state_dict()
    shapes = [
        f"{k} is {tuple(weights[k].shape)} in the checkpoint, {tuple(v.shape)} in the model"
        for k, v in have.items()
        if k in weights and tuple(weights[k].shape) != tuple(v.shape)
    ]
    missing = [f"the model's {k} is not in the checkpoint" for k in have if k not in weights]
    unexpected = [f"the checkpoint's {k} is not in the model" for k in weights if k not in have]
    found = shapes + missing + unexpected
    if not found:
        return ""
    return found[0] + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")


def _header(raw: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file's JSON header."""
    size = int.from_bytes(raw[:8], "little")
    return dict(json.loads(raw[8 : 8 + size]).get("__metadata__") or {})
