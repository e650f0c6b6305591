"""``[run]`` options applied to a model: layer freezing, torch.compile with a fallback, the torchviz
graph dump, and exporting a learned temperature (folded into the last linear layer, or as an output).
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from edgedeploy.errors import ConfigError


def freeze(model: nn.Module, patterns: Sequence[str], where: str = "train config") -> list[str]:
    """Set ``requires_grad = False`` on parameters whose qualified names match any fnmatch pattern.

    A pattern that names a module (``encoder``) also matches its parameters (``encoder.*``).
    Returns the frozen parameter names.

    Raises:
        ConfigError: a pattern matches no parameter (a typo would otherwise train everything).
    """
    names = [n for n, _ in model.named_parameters()]
    frozen: set[str] = set()
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(n, pattern + ".*")]
        if not hits:
            example = ", ".join(names[:4])
            raise ConfigError(
                f"{where}: key 'run.freeze' pattern {pattern!r} matches no parameter",
                hint=f"use parameter names or module prefixes, e.g. {example}",
            )
        frozen.update(hits)
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    return sorted(frozen)


NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.modules.instancenorm._InstanceNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
)


def no_decay_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters that weight decay should not shrink: normalisation layers' weights and biases, every
    bias, and any other 0-d/1-d parameter (scales, gains, learned temperatures). Decaying them pulls
    normalisation gains to 0 and shifts activations without regularising capacity."""
    found: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if isinstance(module, NORM_LAYERS) or name.endswith("bias") or p.ndim <= 1:
                found[id(p)] = p
    return list(found.values())


def freeze_norm_statistics(model: nn.Module) -> list[str]:
    """Keep the running statistics of normalisation layers whose parameters are all frozen: they run in
    eval mode even while the model trains (a forward pre-hook sets it each call, so ``model.train()``
    cannot undo it). A frozen backbone's BatchNorm otherwise drifts to the new data's statistics while
    its affine parameters stay fixed. Returns the names of the layers held.
    """
    held = []
    for name, module in model.named_modules():
        params = list(module.parameters(recurse=False))
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and params and not any(p.requires_grad for p in params):
            module.register_forward_pre_hook(_hold_statistics)
            held.append(name)
    return held


def _hold_statistics(module: nn.Module, _args: Any) -> None:
    module.train(False)


def use_channels_last(model: nn.Module) -> None:
    """Put the model's 4-d weights and its 4-d inputs in ``torch.channels_last`` memory format (faster
    convolutions on tensor cores and many CPUs). Values and state-dict keys do not change; checkpoints
    are saved contiguous."""
    model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    model.register_forward_pre_hook(_channels_last_inputs)


def _channels_last_inputs(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(
        a.contiguous(memory_format=torch.channels_last) if isinstance(a, torch.Tensor) and a.ndim == 4 else a
        for a in args
    )


def compile_model(
    model: nn.Module, backend: str, trial: Callable[[Any], Any] | None, log: Callable[[str], None]
) -> tuple[Any, bool]:
    """``torch.compile(model, backend=...)``, checked by running ``trial`` once.

    When the backend is missing or compilation fails (no C++ compiler for inductor, an unsupported
    op), training goes on eagerly and says so in one line: the run is slower, never different.
    Returns the model to train and whether it is compiled.
    """
    try:
        compiled = torch.compile(model, backend=backend)
        if trial is not None:
            trial(compiled)
    except Exception as exc:  # any backend failure: fall back, loudly
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        log(
            f"warning: torch.compile (backend {backend!r}) unavailable, training eagerly: {type(exc).__name__}: {first}"
        )
        return model, False
    return compiled, True


def write_graph(model: nn.Module, batch: Any, path: Path, call: Callable[[nn.Module, Any], torch.Tensor]) -> Path:
    """The autograd graph of one forward as Graphviz source (``path``, .dot), rendered to SVG when the
    ``dot`` program is installed. Runs on a copy, so BatchNorm statistics are not touched.

    Raises:
        ConfigError: torchviz is not installed (``pip install 'edgedeploy[viz]'``).
    """
    try:
        from torchviz import make_dot
    except ImportError:
        raise ConfigError("run.graph = true needs torchviz", hint="pip install 'edgedeploy[viz]'") from None
    probe = copy.deepcopy(model)
    out = call(probe, batch)
    out = out[0] if isinstance(out, (tuple, list)) else out
    dot = make_dot(out.float().mean(), params=dict(probe.named_parameters()))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dot.source)
    if shutil.which("dot"):
        dot.render(str(path.with_suffix("")), format="svg", cleanup=True)
    return path


def last_linear(model: nn.Module) -> tuple[str, nn.Linear] | None:
    """The last ``nn.Linear`` in registration order (the usual classifier head), if any."""
    found = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            found = (name, module)
    return found


@torch.no_grad()
def fold_temperature(model: nn.Module, temperature: float, probe: Any, call: Callable[[nn.Module, Any], Any]) -> str:
    """Divide the last linear layer's weight and bias by ``temperature`` so the model outputs ``logits / T``.

    The fold is verified on ``probe`` (eval mode): if the outputs are not the old logits divided by
    ``T`` (the head is not last, or logits pass through more layers), the model is restored.
    Returns the folded layer's name.

    Raises:
        ConfigError: no linear layer, or the fold does not give ``logits / T``.
    """
    found = last_linear(model)
    hint = "set loss.export_temperature = 'output' (factory takes temperature=) or 'none'"
    if found is None:
        raise ConfigError("loss.export_temperature = 'fold': the model has no nn.Linear to fold into", hint=hint)
    name, layer = found
    was_training = model.training
    model.eval()
    try:
        before = _first(call(model, probe)).float()
        scale_linear(layer, 1.0 / temperature)
        after = _first(call(model, probe)).float()
        if not torch.allclose(after, before / temperature, rtol=1e-4, atol=1e-5):
            scale_linear(layer, temperature)
            raise ConfigError(
                f"loss.export_temperature = 'fold': scaling {name!r} does not divide the logits by T", hint=hint
            )
    finally:
        model.train(was_training)
    return name


def scale_linear(layer: nn.Linear, factor: float) -> None:
    """Multiply a linear layer's weight and bias by ``factor`` in place."""
    with torch.no_grad():
        layer.weight.mul_(factor)
        if layer.bias is not None:
            layer.bias.mul_(factor)


def accepts_temperature(factory: Callable[..., Any]) -> bool:
    """Whether a model factory takes a ``temperature`` keyword (for ``export_temperature = 'output'``)."""
    try:
        return "temperature" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out
