"""Mixed precision on Lightning Fabric's precision plugins (autocast, loss scaling) and our safe optimizer step.

``auto`` precision means FP16 + ``GradScaler`` on CUDA and BF16 on CPU (BF16 keeps FP32's exponent
range, so it needs no loss scaling). Asking for a precision the device cannot run is an error, never a
silent downgrade.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch import nn

from edgedeploy.errors import ConfigError, TargetCapabilityError

# Modules whose maths is range-sensitive; ``keep_fp32`` runs them in FP32 by default.
FP32_SENSITIVE: tuple[type[nn.Module], ...] = (
    nn.Softmax,
    nn.LogSoftmax,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.batchnorm._BatchNorm,
)

log = logging.getLogger(__name__)


def resolve_precision(precision: str, device: torch.device) -> str:
    """Concrete precision for ``device``: ``auto`` is fp16 on CUDA and bf16 on CPU.

    Raises:
        ConfigError: unknown precision name.
        TargetCapabilityError: the device cannot run the requested precision (no silent fallback).
    """
    if precision not in ("auto", "fp32", "bf16", "fp16"):
        raise ConfigError(f"train precision {precision!r} is not allowed", hint="use auto, fp32, bf16 or fp16")
    if precision == "auto":
        return "fp16" if device.type == "cuda" else "bf16"
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise TargetCapabilityError(
            f"this GPU ({torch.cuda.get_device_name(device)}) has no bf16 support", hint="use precision = 'fp16'"
        )
    return precision


@dataclass
class MixedPrecision:
    """Fabric's precision plugin (autocast; loss scaling in ``fabric.backward``) with our fp16
    ``torch.amp.GradScaler`` and a step that refuses non-finite gradients. ``plugin`` is handed to
    ``Fabric(plugins=...)``, so the DDP model's forward and this object's autocast are one context.

    Attributes:
        device: where the model runs.
        precision: ``fp32``, ``bf16`` or ``fp16`` (resolve ``auto`` with :func:`resolve_precision`);
            fp16 scales the loss (bf16/fp32 do not underflow the same way).
        backoff: factor the scale is multiplied by when a step is skipped.
        growth_interval: finite steps in a row before the scale doubles (GradScaler's own counter,
            reset by a skipped step).
        skipped_steps: how many steps were skipped for non-finite gradients.
        steps: how many steps were attempted (taken = ``steps - skipped_steps``).
    """

    device: torch.device
    precision: str = "fp32"
    init_scale: float = 2.0**16
    backoff: float = 0.5
    growth_interval: int = 2000
    skipped_steps: int = 0
    steps: int = 0
    scaler: torch.amp.GradScaler = field(init=False)
    plugin: Any = field(init=False)

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.precision not in ("fp32", "bf16", "fp16"):
            self.precision = resolve_precision(self.precision, self.device)
        self.scaler = torch.amp.GradScaler(
            self.device.type,
            init_scale=self.init_scale,
            backoff_factor=self.backoff,
            growth_interval=self.growth_interval,
            enabled=self.precision == "fp16",
        )
        self.plugin = _fabric_precision(self.precision, self.device, self.scaler)

    @property
    def scale(self) -> float:
        """Current loss scale (1.0 when no scaler is used)."""
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Fabric's autocast for this device and dtype (a no-op context in FP32)."""
        return cast(contextlib.AbstractContextManager[Any], self.plugin.forward_context())

    def step(
        self, optimizer: torch.optim.Optimizer, clip: Callable[[Iterable[nn.Parameter]], Any] | None = None
    ) -> bool:
        """Unscale, check every gradient is finite, clip, step and update the scale (after ``fabric.backward``).

        On any non-finite gradient the step is skipped: the scale is multiplied by ``backoff``,
        gradients are zeroed and ``skipped_steps`` grows. With a scaler, the skip goes through
        ``GradScaler.update()`` itself, so its growth counter restarts exactly as GradScaler's own
        inf handling would (setting the scale by hand would leave the counter running).
        Returns whether the optimizer stepped.
        """
        self.steps += 1
        self.scaler.unscale_(optimizer)  # true gradients for the check and the clipper (no-op without a scaler)
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if not grads_are_finite(params):
            self.skipped_steps += 1
            if self.scaler.is_enabled():  # unscale_ saw the inf: GradScaler skips the step, backs off, resets growth
                self.plugin.optimizer_step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            log.warning("non-finite gradient: step %d skipped (scale now %g)", self.steps, self.scale)
            return False
        if clip is not None:
            clip(params)
        self.plugin.optimizer_step(optimizer)  # GradScaler step + update under fp16, a plain step otherwise
        return True

    def state_dict(self) -> dict[str, Any]:
        """Scaler state and counters: JSON-friendly scalars only."""
        return {"scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("scaler") and self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", 0))
        self.steps = int(state.get("steps", 0))


def _fabric_precision(precision: str, device: torch.device, scaler: torch.amp.GradScaler) -> Any:
    """Fabric's plugin for ``precision``: fp16 with our (configured) scaler, so Fabric never swaps fp16 on CPU
    for bf16 as its ``precision="16-mixed"`` string would."""
    from edgedeploy.train.distributed import lightning_fabric

    plugins = lightning_fabric().plugins.precision
    if precision == "fp32":
        return plugins.Precision()
    if precision == "bf16":
        return plugins.MixedPrecision("bf16-mixed", device.type)
    return plugins.MixedPrecision("16-mixed", device.type, scaler=scaler)


def grads_are_finite(params: Iterable[nn.Parameter]) -> bool:
    """True when every gradient of ``params`` is finite (one device sync for all of them)."""
    flags = [torch.isfinite(p.grad).all() for p in params if p.grad is not None]
    return bool(torch.stack(flags).all()) if flags else True


class _FP32Forward:
    """A module's own forward run with autocast off and floating inputs cast to FP32.

    An instance attribute ``forward`` holding this object (not a closure over a bound method) keeps
    ``copy.deepcopy`` and pickling right: it refers to its module, which deepcopy's memo maps to
    the copy and pickle restores as the same object, so a copy runs its own weights.
    """

    _edgedeploy_fp32 = True

    def __init__(self, module: nn.Module, device_type: str | None) -> None:
        self.module = module
        self.device_type = device_type

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        def up(x: Any) -> Any:
            return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        where = self.device_type or (tensors[0].device.type if tensors else "cpu")
        with torch.amp.autocast(device_type=where, enabled=False):
            args = tuple(up(a) for a in args)
            return type(self.module).forward(self.module, *args, **{k: up(v) for k, v in kwargs.items()})


def keep_fp32(
    model: nn.Module,
    types: tuple[type[nn.Module], ...] = FP32_SENSITIVE,
    names: Iterable[str] = (),
    device_type: str | None = None,
) -> list[str]:
    """Run chosen submodules in FP32 even inside autocast: inputs are cast up, autocast is off inside.

    Selected by type (default: softmax and normalisation layers) or by qualified name. Parameters and
    state-dict keys are untouched, so checkpoints stay loadable by the plain model. ``device_type``
    defaults to the device of each call's first tensor. The change survives ``copy.deepcopy`` (EMA,
    model averaging) and pickling: a copy runs its own weights. Returns the names of the modules changed.

    Raises:
        ConfigError: a name in ``names`` is not a submodule of ``model``.
    """
    modules = dict(model.named_modules())
    wanted = set(names)
    unknown = sorted(wanted - modules.keys())
    if unknown:
        raise ConfigError(f"keep_fp32: no submodule named {', '.join(unknown)}", hint="use names from named_modules()")
    changed = []
    for name, module in modules.items():
        if (name in wanted or isinstance(module, types)) and not getattr(module.forward, "_edgedeploy_fp32", False):
            module.forward = _FP32Forward(module, device_type)  # type: ignore[method-assign]
            changed.append(name)
    return changed


class FP32Softmax(nn.Module):
    """Softmax computed in FP32 whatever the surrounding autocast dtype."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.amp.autocast(device_type=x.device.type, enabled=False):
            return torch.softmax(x.float(), dim=self.dim)


@contextlib.contextmanager
def fp32_region(device_type: str = "cpu") -> Iterator[None]:
    """Turn autocast off for a block inside a forward (cast tensors with ``.float()`` yourself)."""
    with torch.amp.autocast(device_type=device_type, enabled=False):
        yield
