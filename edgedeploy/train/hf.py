"""Hugging Face Trainer bridge: a ``TrainerCallback`` that writes the ``deploy build`` contract at the end of
``Trainer.train`` through :func:`edgedeploy.train.export_for_deploy` (transformers imported on call).

A sequence classifier is exported as ``edgedeploy.train.models:hf_sequence_classifier`` with the model's
own config, so the deploy side rebuilds it from the package zoo; pass ``factory`` / ``factory_kwargs`` /
``wrap`` for other models.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")  # HFSequenceClassifier.forward's order


def deploy_callback(
    path: str | Path,
    *,
    factory: str | None = None,
    factory_kwargs: dict[str, Any] | None = None,
    wrap: Callable[[nn.Module], nn.Module] | None = None,
    input_names: list[str] | None = None,
    class_names: list[str] | None = None,
    batch: tuple[int, int, int] = (1, 8, 64),
    calib_samples: int = 128,
    validation: Any = None,
) -> Any:
    """A ``transformers.TrainerCallback`` writing ``path`` (.safetensors), its sidecar and calibration
    (training batches) / validation samples when training ends, on the main process.

    The validation samples are ``validation`` (a Dataset, DataLoader or iterable of batches), else the
    evaluation batches of the Trainer's last evaluation: the Trainer builds its eval dataloader only when it
    evaluates (``eval_strategy``), so without one and without ``validation`` no validation file is written
    and ``deploy build`` judges on calibration samples it holds out and generated inputs.

    Raises:
        ImportError: transformers is not installed (``pip install 'edgedeploy[hf]'``).
    """
    try:
        from transformers import TrainerCallback
    except ImportError:
        raise ImportError("the Hugging Face bridge needs transformers: pip install 'edgedeploy[hf]'") from None
    path = Path(path)

    class DeployCallback(TrainerCallback):  # type: ignore[misc]
        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not state.is_world_process_zero:
                return
            from edgedeploy.train.export import export_for_deploy
            from edgedeploy.train.models import HFSequenceClassifier

            model = kw["model"]
            train = kw.get("train_dataloader")
            held = validation if validation is not None else kw.get("eval_dataloader")
            source: Any = train if train is not None else held
            example = next(iter(source))
            names = input_names or [n for n in INPUT_ORDER if n in example]
            exported = wrap(model) if wrap is not None else HFSequenceClassifier(model)
            kwargs = factory_kwargs
            if factory is None and kwargs is None:
                config = model.config.to_diff_dict()
                kwargs = {"model_type": model.config.model_type, "config": _plain(config)}
            metrics: dict[str, Any] = {}
            for entry in state.log_history:  # the latest value of every logged metric (train and eval)
                metrics.update({k: float(v) for k, v in entry.items() if isinstance(v, (int, float))})
            export_for_deploy(
                exported,
                example,
                path,
                factory=factory or "edgedeploy.train.models:hf_sequence_classifier",
                factory_kwargs=kwargs,
                data=train,
                validation=held,
                input_names=names,
                class_names=class_names,
                batch=batch,
                metrics={**metrics, "global_step": int(state.global_step)},
                trainer="hf_trainer",
                calib_samples=calib_samples,
            )

    return DeployCallback()


def _plain(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict with JSON keys only (``id2label``'s int keys become strings, as in config.json)."""
    import json

    return dict(json.loads(json.dumps(config, default=str)))
