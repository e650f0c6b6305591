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

from edgedeploy.train.checkpoint import checkpoint_metadata, save_checkpoint
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
    inputs: list[dict[str, Any]],
    outputs: list[str] = ("logits",),  # type: ignore[assignment]
    dims: dict[str, dict[str, int]] | None = None,
    normalization: dict[str, Any] | None = None,
    class_names: list[str] | None = None,
) -> Any:
    """A Lightning ``Callback`` writing ``path`` (.safetensors) + its sidecar at the end of ``fit``.

    The weights are the adapter's ``.model`` (or the LightningModule itself) with plain state-dict
    keys, so ``factory(**factory_kwargs)`` loads them; ``metrics`` are the trainer's last logged
    values. Only global rank 0 writes.

    Raises:
        ImportError: Lightning is not installed.
    """
    pl = _lightning()
    path = Path(path)

    class DeployCheckpoint(pl.Callback):  # type: ignore[misc, name-defined]
        def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
            if not trainer.is_global_zero:
                return
            model = getattr(pl_module, "model", pl_module)
            metrics = {
                k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1
            }
            metrics.update(epoch=int(trainer.current_epoch), global_step=int(trainer.global_step))
            meta = checkpoint_metadata(
                factory=factory,
                factory_kwargs=factory_kwargs,
                inputs=inputs,
                dims=dims or {"batch": {"min": 1, "opt": 8, "max": 64}},
                outputs=list(outputs),
                normalization=normalization,
                class_names=class_names,
                metrics=metrics,
                extra={"trainer": "lightning"},
            )
            save_checkpoint(path, model, meta)

    return DeployCheckpoint()
