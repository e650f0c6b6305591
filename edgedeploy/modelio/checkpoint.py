"""Load a model from its factory and a checkpoint, without ever unpickling code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgedeploy.artifacts import MODEL_CODE
from edgedeploy.config import DeployConfig
from edgedeploy.errors import CheckpointError, ConfigError
from edgedeploy.modelio.usercode import import_factory, running_user_code

_NESTED_KEYS = ("state_dict", "model_state_dict", "model", "weights")
SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def read_state_dict(path: str | Path) -> dict[str, Any]:
    """Read tensors from a safetensors file or a torch state dict (``weights_only=True``).

    Raises:
        CheckpointError: missing, empty, truncated or corrupt file; a pickle carrying
            code or non-tensor objects (refused without executing anything); no tensors.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}", hint="fix model.checkpoint or pass --checkpoint")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint is empty (0 bytes): {path}", hint="re-export or re-download it")
    if path.suffix in SAFETENSORS_SUFFIXES:
        state = _read_safetensors(path)
    else:
        state = _read_torch(path)
    if not state:
        raise CheckpointError(f"checkpoint holds no tensors: {path}")
    return state


def _read_safetensors(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return dict(load_file(str(path)))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"checkpoint is truncated or corrupt: {path} ({_short(exc)})",
            hint="re-create the file; safetensors headers and sizes must match",
        ) from None


def _read_torch(path: Path) -> dict[str, Any]:
    import pickle

    import torch

    with open(path, "rb") as fh:
        head = fh.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # torch.save's zip, or a legacy pickle
        raise CheckpointError(
            f"{path} is not a checkpoint (neither a torch.save file nor safetensors: starts with {head!r})",
            hint="point model.checkpoint / --checkpoint at a .safetensors or torch.save(state_dict) file",
        )
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"checkpoint {path} carries pickled code or objects, refused without loading them ({_pickled(exc)})",
            hint="save plain tensors: torch.save(model.state_dict(), f) or use safetensors",
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"checkpoint is truncated or corrupt: {path} ({_short(exc)})",
            hint="re-create the file with torch.save(model.state_dict(), f)",
        ) from None
    if isinstance(obj, dict):
        for key in _NESTED_KEYS:
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(
            f"checkpoint {path} is not a state dict of tensors",
            hint="save model.state_dict(), not the module or a training state",
        )
    return obj


def _pickled(exc: BaseException) -> str:
    """What torch's weights-only refusal names (the global it met), without its advice on how to load the file
    anyway and without its terminal colour codes."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return f"it names {found.group(1)}"
    return _short(Exception(text.split("This file can still be loaded")[0].strip() or text))


def _raised_at(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback outside the standard library, site-packages
    and edgedeploy (the user's line that raised), or ""."""
    import sysconfig
    import traceback

    skip = [sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")] + [str(Path(__file__).parents[1])]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(f.filename.startswith(d) for d in skip)]
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] + ("..." if len(text) > 200 else "")


FACTORY_SEED = 0  # torch's seed while the factory runs (its random initial weights)


def build_model(cfg: DeployConfig, factory: Any = None) -> Any:
    """Call the configured factory (or ``factory``, already loaded) with its kwargs.

    Raises:
        ConfigError: the factory does not import, raises, or does not return an nn.Module.
    """
    import torch

    factory = factory or import_factory(cfg)
    try:
        # the same initial weights in every call: without a checkpoint they are the model's weights, and a stage
        # restored from the cache must have seen the same model as a stage that runs again (forked: the
        # caller's own random stream is left as it was)
        with running_user_code(cfg, MODEL_CODE), torch.random.fork_rng(devices=[]):
            torch.manual_seed(FACTORY_SEED)
            model = factory(**cfg.model.kwargs)
    except Exception as exc:  # user code: report it as a config problem with the cause
        where = _raised_at(exc)
        kwargs_at_fault = isinstance(exc, TypeError) and "argument" in str(exc)  # a keyword it does not take
        raise ConfigError(
            f"{cfg.source}: model.factory {cfg.model.factory!r} raised {type(exc).__name__}: {exc}"
            + (f" (at {where})" if where else ""),
            hint="check model.kwargs against the factory's parameters"
            if kwargs_at_fault
            else f"fix the factory{' at ' + where if where else ''}: it raised when called with model.kwargs",
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"{cfg.source}: model.factory {cfg.model.factory!r} returned {type(model).__name__}, not a torch.nn.Module",
            hint="return the model (an nn.Module instance) from the factory",
        )
    return model


def verify_sidecar_hash(checkpoint: Path) -> None:
    """Check the weights against the ``weights_sha256`` their ``.meta.json`` sidecar records.

    Raises:
        CheckpointError: the sidecar records a hash and the weights do not match it.
    """
    import json

    from edgedeploy.config import checkpoint_metadata_path
    from edgedeploy.fileio.hashing import sha256_file

    meta_path = checkpoint_metadata_path(Path(checkpoint))
    if not meta_path.is_file():
        return
    try:
        recorded = json.loads(meta_path.read_text()).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return  # config loading already reported an unreadable sidecar
    if recorded is not None and recorded != sha256_file(checkpoint):
        raise CheckpointError(
            f"checkpoint {checkpoint} does not match the weights_sha256 in {meta_path.name}: "
            "the weights were replaced or corrupted after training",
            hint="use the checkpoint the sidecar was written for, or re-create the sidecar with deploy train",
        )


def load_model(cfg: DeployConfig, checkpoint: Path | None, factory: Any = None) -> Any:
    """The model from its factory with checkpoint weights loaded, in eval mode.

    Raises:
        ConfigError: factory problems.
        CheckpointError: unreadable checkpoint, or keys / shapes that do not fit the model.
    """
    if checkpoint is not None:
        verify_sidecar_hash(checkpoint)
    model = build_model(cfg, factory)
    if checkpoint is not None:
        state = read_state_dict(checkpoint)
        expected = model.state_dict()
        missing = [k for k in expected if k not in state]
        unexpected = [k for k in state if k not in expected]
        shapes = [
            f"{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}"
            for k, v in expected.items()
            if k in state and tuple(state[k].shape) != tuple(v.shape)
        ]
        if missing or unexpected or shapes:
            parts = []
            if missing:
                parts.append(f"{len(missing)} missing keys (e.g. {', '.join(missing[:3])})")
            if unexpected:
                parts.append(f"{len(unexpected)} unexpected keys (e.g. {', '.join(unexpected[:3])})")
            if shapes:
                parts.append(f"{len(shapes)} shape mismatches (e.g. {'; '.join(shapes[:2])})")
            raise CheckpointError(
                f"checkpoint {checkpoint} does not fit model {cfg.model.factory}: " + ", ".join(parts),
                hint="check model.kwargs and that the checkpoint is for this model",
            )
        from edgedeploy.modelio.admission import check_checkpoint_dtypes

        check_checkpoint_dtypes(state, model, checkpoint)  # load_state_dict would cast int8/bool silently
        model.load_state_dict(state, strict=True)
    return model.eval()
