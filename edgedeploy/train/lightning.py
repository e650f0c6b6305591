"""Lightning path: a LightningModule adapter around any ``nn.Module`` and a callback that writes the
same checkpoint ``deploy train`` writes (safetensors + ``.meta.json`` sidecar), so a model trained
with ``Trainer.fit`` deploys with ``deploy build`` unchanged.

Lightning is imported when these functions are called (``pip install 'edgedeploy[lightning]'``).
The seeds' ``Trainer(amp_backend="native", precision=16)`` is today ``Trainer(precision="16-mixed")``
(``"bf16-mixed"`` on CPU); ``accumulate_grad_batches``, ``gradient_clip_algorithm`` and
``DDPStrategy(find_unused_parameters=..., static_graph=...)`` keep their names.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgedeploy.train.loop import call_model


def _lightning() -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:
        try:
            import pytorch_lightning as pl  # type: ignore[no-redef]  # the older package name
        except ImportError:
            raise ImportError("the Lightning adapter needs Lightning: pip install 'edgedeploy[lightning]'") from None
    return pl


def lightning_module(
    model: nn.Module,
    *,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
) -> Any:
    """A ``LightningModule`` that trains ``model`` (kept as ``.model``) on ``(inputs, target)`` batches.

    ``loss_fn`` defaults to cross-entropy; ``optimizer`` is a function of the parameters (default
    AdamW with ``lr`` / ``weight_decay``) over the trainable parameters only. Logs ``train_loss``,
    ``val_loss`` and ``val_accuracy``. Tuple/list inputs are passed positionally, dicts as keywords.

    Raises:
        ImportError: Lightning is not installed.
    """
    pl = _lightning()
    criterion = loss_fn or nn.functional.cross_entropy

    class EdgeLightningModule(pl.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any) -> Any:
            return call_model(self.model, x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = criterion(_logits(self(x)), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True, batch_size=len(y))
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            logits = _logits(self(x))
            self.log("val_loss", criterion(logits, y), batch_size=len(y))
            self.log("val_accuracy", (logits.argmax(-1) == y).float().mean(), batch_size=len(y))

        def configure_optimizers(self) -> torch.optim.Optimizer:
            params = [p for p in self.model.parameters() if p.requires_grad]
            if optimizer is not None:
                return optimizer(params)
            return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)

    return EdgeLightningModule()


def _logits(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def deploy_checkpoint_callback(
    path: str | Path,
    *,
    factory: str,
    factory_kwargs: dict[str, Any],
    inputs: list[dict[str, Any]] | None = None,
    outputs: list[str] | None = None,
    dims: dict[str, dict[str, int]] | None = None,
    normalization: dict[str, Any] | None = None,
    class_names: list[str] | None = None,
    data: Any = None,
    validation: Any = None,
    batch: tuple[int, int, int] = (1, 8, 64),
) -> Any:
    """A Lightning ``Callback`` writing ``path`` (.safetensors), its sidecar and calibration / validation data
    at the end of ``fit`` through :func:`edgedeploy.train.export_for_deploy`.

    The weights are those of the module ``factory(**factory_kwargs)`` rebuilds (:func:`deployed_module`: the
    adapter's ``.model``, your LightningModule or its network attribute such as ``self.net``), with plain
    state-dict keys; a factory that rebuilds none of them is refused when ``fit`` ends. Inputs are derived
    from the first training batch unless ``inputs`` (sidecar specs) are given; calibration samples come from
    ``data`` (default: the trainer's train dataloader), validation samples from ``validation`` (default: its
    val dataloaders).
    ``metrics`` are the trainer's last logged values. Only global rank 0 writes.

    Raises:
        ImportError: Lightning is not installed.
        ConfigError: (when ``fit`` ends) the factory does not import or rebuilds none of the modules.
    """
    pl = _lightning()
    path = Path(path)

    class DeployCheckpoint(pl.Callback):  # type: ignore[misc, name-defined]
        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.is_global_zero:
                return
            from edgedeploy.train.export import export_for_deploy

            model = deployed_module(pl_module, factory, factory_kwargs)
            metrics = {
                k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1
            }
            metrics.update(epoch=int(trainer.current_epoch), global_step=int(trainer.global_step))
            train = data if data is not None else trainer.train_dataloader
            held = validation if validation is not None else _first_loader(trainer.val_dataloaders)
            example = next(iter(train if train is not None else held))
            example = _to(example, next(model.parameters()).device)
            bounds = batch
            if dims:
                b = dims["batch"]
                bounds = (b["min"], b["opt"], b["max"])
            export_for_deploy(
                model,
                example,
                path,
                factory=factory,
                factory_kwargs=factory_kwargs,
                data=train,
                validation=held,
                input_names=[spec["name"] for spec in inputs] if inputs else None,
                outputs=outputs,
                normalization=normalization,
                class_names=class_names,
                batch=bounds,
                metrics=metrics,
                trainer="lightning",
                extra={"inputs": inputs} if inputs else None,
            )

    return DeployCheckpoint()


def deployed_module(pl_module: nn.Module, factory: str, factory_kwargs: dict[str, Any]) -> nn.Module:
    """The module ``factory(**factory_kwargs)`` rebuilds: the LightningModule's ``.model``, the LightningModule
    itself or one of its direct children (``self.net``), matched by state-dict keys and shapes; ``.model`` (or
    the LightningModule) when none matches, for :func:`~edgedeploy.train.export.export_for_deploy` to refuse.

    Raises:
        ConfigError: the factory does not import.
    """
    from edgedeploy.train.export import rebuilt_state_keys

    rebuilt = rebuilt_state_keys(factory, factory_kwargs)
    candidates = [getattr(pl_module, "model", None), pl_module, *pl_module.children()]
    for candidate in candidates:
        if isinstance(candidate, nn.Module):
            state = {k: tuple(v.shape) for k, v in candidate.state_dict().items()}
            if state == rebuilt:
                return candidate
    return getattr(pl_module, "model", pl_module)


def _first_loader(loaders: Any) -> Any:
    if isinstance(loaders, (list, tuple)):
        return loaders[0] if loaders else None
    return loaders


def _to(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to(v, device) for v in batch)
    return batch
