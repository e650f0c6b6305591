"""Gradient-flow monitoring: per-layer gradient norms recorded by hooks, with findings for
vanishing, exploding and missing gradients. Usable in our loop and, when Lightning is installed,
as a Lightning callback (imported lazily)."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GradFinding:
    """One gradient problem: ``kind`` is vanishing, exploding, non_finite or no_grad."""

    kind: str
    layer: str
    norm: float = math.nan

    def __str__(self) -> str:
        if self.kind == "no_grad":
            return f"{self.layer}: received no gradient (detached branch, unused module or no_grad?)"
        return f"{self.layer}: {self.kind.replace('_', '-')} gradient (norm {self.norm:.3e})"


@dataclass
class GradReport:
    """Per-layer gradient norms of one backward pass and the findings on them."""

    step: int
    layer_norms: dict[str, float]
    findings: list[GradFinding] = field(default_factory=list)

    def kinds(self) -> set[str]:
        return {f.kind for f in self.findings}

    def layers(self, kind: str) -> list[str]:
        return [f.layer for f in self.findings if f.kind == kind]


class GradientFlowMonitor:
    """Records each parameter's gradient norm through tensor hooks and checks them per layer.

    A layer is a module owning parameters directly (``conv1``, ``layers.3``); its norm is the L2 norm
    over its parameters' gradients. Call :meth:`check` after backward (and after unscaling, or pass
    ``grad_scale``). As a loop callback it checks every ``every`` steps.

    Args:
        vanishing: a layer below this norm is reported as vanishing.
        exploding: a layer above this norm is reported as exploding.
        every: check period in optimizer steps for :meth:`on_after_backward`.
        log: where findings are reported (default: this module's logger, as warnings).
    """

    def __init__(
        self,
        vanishing: float = 1e-7,
        exploding: float = 1e3,
        every: int = 1,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.log = log or (lambda line: logger.warning("%s", line))
        self.vanishing = vanishing
        self.exploding = exploding
        self.every = max(1, int(every))
        self._sq: dict[str, float] = {}
        self._handles: list[Any] = []
        self._params: dict[str, str] = {}  # parameter name -> layer name
        self.reports: list[GradReport] = []

    def attach(self, model: nn.Module) -> GradientFlowMonitor:
        """Hook every trainable parameter of ``model``. Returns ``self``."""
        self.detach()
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            layer = name.rpartition(".")[0] or name
            self._params[name] = layer
            self._handles.append(p.register_hook(self._recorder(name)))
        return self

    def _recorder(self, name: str) -> Any:
        def record(grad: torch.Tensor) -> None:
            self._sq[name] = float(grad.detach().float().pow(2).sum())

        return record

    def detach(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._params.clear()
        self._sq.clear()

    def check(self, step: int = 0, grad_scale: float = 1.0) -> GradReport:
        """Findings for the gradients recorded since the last check; resets the record.

        ``grad_scale`` divides the recorded norms (pass the loss scale if hooks saw scaled gradients).
        """
        per_layer: dict[str, float] = defaultdict(float)
        for name, sq in self._sq.items():
            per_layer[self._params[name]] += sq
        norms = {layer: math.sqrt(sq) / grad_scale for layer, sq in per_layer.items()}
        findings = []
        for layer, norm in norms.items():
            if not math.isfinite(norm):
                findings.append(GradFinding("non_finite", layer, norm))
            elif norm > self.exploding:
                findings.append(GradFinding("exploding", layer, norm))
            elif norm < self.vanishing:
                findings.append(GradFinding("vanishing", layer, norm))
        missing = sorted({layer for name, layer in self._params.items() if name not in self._sq})
        findings.extend(GradFinding("no_grad", layer) for layer in missing if layer not in norms)
        self._sq.clear()
        report = GradReport(step, norms, findings)
        self.reports.append(report)
        del self.reports[:-16]  # keep the recent ones only
        for f in findings:
            self.log(f"warning: step {step}: {f}")
        return report

    # ---- loop callback protocol ------------------------------------------------------------
    def on_after_backward(self, step: int, model: nn.Module, grad_scale: float = 1.0) -> GradReport | None:
        """Loop hook: check after every ``every``-th step (recorded norms are discarded in between).

        The first check comes after ``every`` steps and never at step 0 (also with ``every = 1``, and for
        every micro-batch of a first accumulation group): zero-initialised residual branches
        legitimately pass no gradient to their first layers before the first update.
        """
        if step == 0 or (step + 1) % self.every:
            self._sq.clear()
            return None
        return self.check(step, grad_scale)


def lightning_callback(monitor: GradientFlowMonitor) -> Any:
    """The monitor as a ``lightning.pytorch.Callback`` (Lightning is imported here, lazily).

    Lightning's ``on_after_backward`` sees gradients before unscaling, so the callback divides by
    the precision plugin's loss scale when it has one.

    Raises:
        ImportError: Lightning is not installed (``pip install edgedeploy[lightning]``).
    """
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback  # type: ignore[assignment]  # the older package name
        except ImportError:
            raise ImportError("the Lightning callback needs Lightning: pip install 'edgedeploy[lightning]'") from None

    class GradientFlowCallback(Callback):  # type: ignore[misc, valid-type]
        def on_fit_start(self, trainer: Any, pl_module: nn.Module) -> None:
            monitor.attach(pl_module)

        def on_after_backward(self, trainer: Any, pl_module: nn.Module) -> None:
            scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
            scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
            monitor.on_after_backward(int(trainer.global_step), pl_module, grad_scale=scale)

        def on_fit_end(self, trainer: Any, pl_module: nn.Module) -> None:
            monitor.detach()

    return GradientFlowCallback()
