"""One deploy contract for any trainer: ``export_for_deploy`` writes what ``deploy build`` needs from a trained
model and its data, whichever loop trained it (``deploy train``, Lightning, the Hugging Face Trainer, a
hand-written loop):

- ``X.safetensors`` + ``X.meta.json``: weights and the sidecar (factory, inputs with names, shapes, dtypes
  and value ranges, dims, outputs, normalization, class names, metrics), inputs derived from an example batch;
- ``X.calib.npz``: up to ``calib_samples`` inputs from ``data`` (for ``precision.calib``);
- ``X.validate.npz``: held-out inputs from ``validation`` (for ``validate.data``), at most the batch max.

The sidecar lists the two sample files (``deploy_data``) with their sha256 (``deploy_data_sha256``), so
``deploy build --checkpoint FOLDER`` calibrates and judges on them without being told (``edgedeploy.sidecar``).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from edgedeploy.errors import ConfigError
from edgedeploy.fileio.hashing import sha256_file
from edgedeploy.train.checkpoint import checkpoint_metadata, save_checkpoint
from edgedeploy.train.splits import outward_range

LABEL_KEYS = ("labels", "label", "y", "target", "targets")


def example_inputs(batch: Any, names: Sequence[str] | None = None) -> dict[str, torch.Tensor]:
    """The model inputs of a batch, by name: a dict batch's tensors (label keys left out), the first element
    of an ``(inputs, targets)`` pair, or a tensor / tuple of tensors. Unnamed inputs are called ``names``
    (default ``input``, ``input_1``, ...).

    Raises:
        ConfigError: the batch holds no tensors, or ``names`` does not match them.
    """
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        found = {k: v for k, v in dict(batch).items() if isinstance(v, torch.Tensor) and k not in LABEL_KEYS}
        if names:
            missing = [n for n in names if n not in found]
            if missing:
                raise ConfigError(f"export_for_deploy: the batch has no {missing} (it has {sorted(found)})")
            found = {n: found[n] for n in names}
        if not found:
            raise ConfigError("export_for_deploy: the example batch holds no input tensors")
        return found
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and not isinstance(batch[0], (int, float)):
        inputs = batch[0]  # (inputs, targets)
    else:
        inputs = batch
    tensors = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise ConfigError("export_for_deploy: the example batch must be tensors, (inputs, targets) or a dict")
    chosen = list(names) if names else ["input"] + [f"input_{i}" for i in range(1, len(tensors))]
    if len(chosen) != len(tensors):
        raise ConfigError(f"export_for_deploy: {len(chosen)} input names for {len(tensors)} inputs")
    return dict(zip(chosen, tensors, strict=True))


def forward_names(model: nn.Module, count: int) -> list[str] | None:
    """The first ``count`` positional parameter names of ``model.forward`` (``x`` for ``forward(self, x)``)."""
    try:
        params = [
            p.name
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        return None
    return params[:count] if len(params) >= count else None


def run_model(model: nn.Module, inputs: dict[str, torch.Tensor], by_name: bool) -> list[torch.Tensor]:
    """The model's outputs as a list of tensors (a Hugging Face output object gives its ``logits`` first)."""
    out = model(**inputs) if by_name else model(*inputs.values())
    if isinstance(out, torch.Tensor):
        return [out]
    if hasattr(out, "logits"):
        return [out.logits]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    raise ConfigError(f"export_for_deploy: the model returns {type(out).__name__}, not tensors")


def collect_inputs(source: Any, names: Sequence[str], limit: int, by_name: bool) -> dict[str, np.ndarray]:
    """Up to ``limit`` input samples from a Dataset, a DataLoader or any iterable of batches, as arrays by name.

    Raises:
        ConfigError: a batch's inputs do not match the example batch's.
    """
    if source is None or limit <= 0:
        return {}
    if isinstance(source, torch.utils.data.Dataset) and not isinstance(source, torch.utils.data.IterableDataset):
        source = torch.utils.data.DataLoader(source, batch_size=min(limit, 64))
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    seen = 0
    for batch in source:
        inputs = example_inputs(batch, names if by_name else None)
        tensors = list(inputs.values())
        if len(tensors) != len(names):
            raise ConfigError(f"export_for_deploy: a data batch has {len(tensors)} inputs, the example {len(names)}")
        for name, t in zip(names, tensors, strict=True):
            parts[name].append(t.detach().cpu().numpy())
        seen += len(tensors[0])
        if seen >= limit:
            break
    return {n: np.concatenate(p)[:limit] for n, p in parts.items()} if seen else {}


def find_normalization(source: Any) -> dict[str, Any]:
    """Mean and std of a torchvision ``Normalize`` in a dataset's (or a loader's dataset's) transforms."""
    dataset = getattr(source, "dataset", source)
    for _ in range(4):  # Subset / wrappers: look inside
        if hasattr(dataset, "dataset") and not hasattr(dataset, "transform"):
            dataset = dataset.dataset
    stack = [getattr(dataset, "transform", None)]
    while stack:
        t = stack.pop()
        if t is None:
            continue
        if type(t).__name__ == "Normalize" and hasattr(t, "mean") and hasattr(t, "std"):
            return {"mean": [float(v) for v in t.mean], "std": [float(v) for v in t.std]}
        stack.extend(getattr(t, "transforms", []) or [])
    return {}


def find_class_names(model: nn.Module, source: Any) -> list[str]:
    """Class names from a dataset's ``classes`` (torchvision folders) or a HF config's ``id2label``."""
    dataset = getattr(source, "dataset", source)
    classes = getattr(dataset, "classes", None)
    if isinstance(classes, (list, tuple)) and classes:
        return [str(c) for c in classes]
    id2label = getattr(_config(model), "id2label", None)
    if isinstance(id2label, dict) and id2label:
        return [str(id2label[k]) for k in sorted(id2label, key=int)]
    return []


def _config(model: nn.Module) -> Any:
    """A Hugging Face config on the model or on the model it wraps (``.model``)."""
    return getattr(model, "config", None) or getattr(getattr(model, "model", None), "config", None)


def _spec(name: str, example: torch.Tensor, arrays: Iterable[np.ndarray], model: nn.Module) -> dict[str, Any]:
    values = [a for a in arrays if a.size]
    lo = min([float(example.min())] + [float(a.min()) for a in values])
    hi = max([float(example.max())] + [float(a.max()) for a in values])
    dtype = str(example.dtype).replace("torch.", "")
    rng: list[float]
    if not example.is_floating_point():
        vocab = getattr(_config(model), "vocab_size", None)
        rng = [0, int(vocab) - 1] if name == "input_ids" and isinstance(vocab, int) else [int(lo), int(hi)]
    else:
        rng = list(outward_range(lo, hi))
        dtype = "float32"
    return {"name": name, "shape": ["batch", *[int(d) for d in example.shape[1:]]], "dtype": dtype, "range": rng}


def rebuilt_state_keys(factory: str, factory_kwargs: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """State-dict key -> shape of ``factory(**factory_kwargs)``, imported as the deploy side imports it.

    Raises:
        ConfigError: the factory does not import here or does not return an ``nn.Module``.
    """
    import importlib

    module_name, _, attr = factory.partition(":")
    try:
        build = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigError(
            f"export_for_deploy: factory {factory!r} does not import ({exc})",
            hint="name a 'module:callable' importable from an installed package or your project's code",
        ) from None
    rebuilt = build(**factory_kwargs)
    if not isinstance(rebuilt, nn.Module):
        raise ConfigError(f"export_for_deploy: factory {factory!r} returned {type(rebuilt).__name__}, not a module")
    return {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()}


def check_factory_rebuilds(factory: str, factory_kwargs: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """Refuse at export time, where the training code is at hand, a factory whose model cannot take ``state``
    (``deploy build`` would fail loading the checkpoint much later).

    Raises:
        ConfigError: the keys or shapes differ (the first few of each are named).
    """
    rebuilt = rebuilt_state_keys(factory, factory_kwargs)
    missing = sorted(set(rebuilt) - set(state))
    unexpected = sorted(set(state) - set(rebuilt))
    shapes = sorted(k for k in set(rebuilt) & set(state) if rebuilt[k] != tuple(state[k].shape))
    if missing or unexpected or shapes:
        found = [
            f"{what} {keys[:3]}"
            for what, keys in (("not in the weights:", missing), ("not in its model:", unexpected),
                               ("other shapes:", shapes))
            if keys
        ]  # fmt: skip
        raise ConfigError(
            f"export_for_deploy: {factory}(**{factory_kwargs}) does not rebuild the model being exported "
            f"({'; '.join(found)})",
            hint="pass the factory and kwargs that build exactly this module (with Lightning, the network the "
            "LightningModule holds, e.g. self.model)",
        )


def export_for_deploy(
    model: nn.Module,
    example_batch: Any,
    path: str | Path,
    *,
    factory: str,
    factory_kwargs: dict[str, Any] | None = None,
    data: Any = None,
    validation: Any = None,
    input_names: Sequence[str] | None = None,
    outputs: Sequence[str] | None = None,
    normalization: dict[str, Any] | None = None,
    class_names: Sequence[str] | None = None,
    batch: tuple[int, int, int] = (1, 8, 64),
    metrics: dict[str, Any] | None = None,
    trainer: str = "custom",
    calib_samples: int = 128,
    weights: dict[str, torch.Tensor] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``path`` (.safetensors), its sidecar, ``.calib.npz`` and ``.validate.npz`` for ``deploy build``.

    ``factory(**factory_kwargs)`` must rebuild ``model``'s architecture (state-dict keys included);
    ``deploy build`` imports it from the package zoo ``edgedeploy.train.models`` (or trusted user code).
    Inputs come from ``example_batch`` (names from a dict batch, ``input_names``, or ``forward``'s
    parameters); their value ranges cover the example and the data written. ``data`` (training data
    without augmentation) gives the calibration set, ``validation`` (held out) the judging set; each may be
    a Dataset, a DataLoader or an iterable of batches. ``normalization`` and ``class_names`` default to a
    torchvision ``Normalize`` / ``classes`` found in ``data`` (or a HF config's ``id2label``).
    ``weights`` replaces ``model.state_dict()`` (e.g. EMA weights). Call on one process (rank 0).

    Raises:
        ConfigError: the batch, names or outputs do not fit the model, or ``factory(**factory_kwargs)`` does not
            import or does not rebuild it (checked here, before anything is written).
        CheckpointError: the weights are not plain tensors.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ConfigError(f"export_for_deploy: {path} must end in .safetensors")
    check_factory_rebuilds(factory, dict(factory_kwargs or {}), weights if weights is not None else model.state_dict())
    by_name = isinstance(example_batch, dict) or hasattr(example_batch, "keys")
    inputs = example_inputs(example_batch, input_names)
    if not by_name and not input_names:
        named = forward_names(model, len(inputs))
        if named:
            inputs = dict(zip(named, inputs.values(), strict=True))
    names = list(inputs)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            few = {k: v[:2] for k, v in inputs.items()}
            results = run_model(model, few, by_name)
    finally:
        model.train(was_training)
    out_names = list(outputs) if outputs else ["logits"] + [f"output_{i}" for i in range(1, len(results))]
    if len(out_names) != len(results):
        raise ConfigError(f"export_for_deploy: {len(out_names)} output names for {len(results)} model outputs")
    bmin, bopt, bmax = batch
    calib = collect_inputs(data, names, calib_samples, by_name)
    held = collect_inputs(validation, names, bmax, by_name)
    specs = [_spec(n, inputs[n], [calib.get(n, np.zeros(0)), held.get(n, np.zeros(0))], model) for n in names]
    written: dict[str, str] = {}
    hashes: dict[str, str] = {}
    stem = path.with_suffix("")
    path.parent.mkdir(parents=True, exist_ok=True)
    for role, arrays in (("calib", calib), ("validate", held)):
        if arrays:
            name = f"{stem.name}.{role}.npz"
            np.savez(path.parent / name, **arrays)  # type: ignore[arg-type]
            written[role] = name
            hashes[role] = sha256_file(path.parent / name)  # deploy build refuses a file changed since
    meta = checkpoint_metadata(
        factory=factory,
        factory_kwargs=dict(factory_kwargs or {}),
        inputs=specs,
        dims={"batch": {"min": bmin, "opt": bopt, "max": bmax}},
        outputs=out_names,
        normalization=normalization if normalization is not None else find_normalization(data),
        class_names=list(class_names) if class_names else find_class_names(model, data),
        metrics=metrics,
        extra={"trainer": trainer, "deploy_data": written, "deploy_data_sha256": hashes, **(extra or {})},
    )
    return save_checkpoint(path, model, meta, weights=weights)
