"""What a model must satisfy before a build spends time on it: checkpoint dtypes, and a dry forward.

A checkpoint of int8, bool or complex tensors loads into float parameters without a word from
``load_state_dict`` (it casts), and so does one whose header lies about the dtype (float weights of
~1e9); an input spec with the wrong dtype, channels, rank or an extra input otherwise surfaces as a
traceback deep inside tracing. Both are checked here, every problem collected, one error raised.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from edgedeploy.errors import CheckpointError, ConfigError
from edgedeploy.modelio.generators import generate

# a trained float parameter beyond this magnitude is not a weight: most likely integer bits read as float
ABSURD_WEIGHT = 1e6


def checkpoint_dtype_problems(state: dict[str, Any], model: Any) -> list[str]:
    """Tensors in ``state`` whose dtype or values cannot be the model's parameters and buffers."""
    import torch

    problems = []
    params = {name for name, _ in model.named_parameters()}
    for name, want in model.state_dict().items():
        got = state.get(name)
        if not isinstance(got, torch.Tensor):
            continue
        if want.is_floating_point():
            if not got.is_floating_point():
                problems.append(f"{name} is {str(got.dtype).removeprefix('torch.')}, the model's is float")
                continue
            if got.numel() and name in params:
                values = got.detach().float()
                values = values[torch.isfinite(values)]  # NaN/Inf: the reference stage names the outputs they spoil
                peak = values.abs().max().item() if values.numel() else 0.0
                if peak > ABSURD_WEIGHT:
                    problems.append(
                        f"{name} holds values up to {peak:.3g}, absurd for float weights "
                        "(a header whose dtype does not match its bytes?)"
                    )
        elif got.is_complex() or got.is_floating_point() or (got.dtype == torch.bool) != (want.dtype == torch.bool):
            problems.append(
                f"{name} is {str(got.dtype).removeprefix('torch.')}, the model's is "
                f"{str(want.dtype).removeprefix('torch.')}"
            )
    return problems


def check_checkpoint_dtypes(state: dict[str, Any], model: Any, checkpoint: Any) -> None:
    """Raises:
    CheckpointError: any tensor's dtype or values do not fit the model (all named, up to five).
    """
    problems = checkpoint_dtype_problems(state, model)
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckpointError(
            f"checkpoint {checkpoint} does not hold float weights for this model: " + "; ".join(problems[:5]) + more,
            hint="use the float checkpoint the model was trained to (quantize with --precision int8, not by hand)",
        )


def forward_arity_problem(model: Any, cfg: Any) -> str | None:
    """Why the config's inputs cannot be passed to ``model.forward`` positionally (None: they can)."""
    try:
        sig = inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    names = [s.name for s in cfg.inputs]
    if len(names) > len(positional):
        return (
            f"the config has {len(names)} inputs ({', '.join(names)}) but {type(model).__name__}.forward takes "
            f"{len(positional)} ({', '.join(p.name for p in positional) or 'none'})"
        )
    if len(names) < len(required):
        return (
            f"{type(model).__name__}.forward needs {len(required)} inputs ({', '.join(p.name for p in required)}), "
            f"the config has {len(names)} ({', '.join(names)})"
        )
    return None


def dry_forward(model: Any, cfg: Any) -> None:
    """Run the model once at the min shape of every input, before anything else runs it, on inputs drawn as
    every stage draws them (:func:`edgedeploy.modelio.generators.generate`: a mask keeps a token in every row,
    ids stay in their range), so a model that refuses a fully masked row is not refused for it.

    Raises:
        ConfigError: the input spec does not fit ``forward`` (count), or the model rejects the
            min-shape inputs (wrong dtype, channels or rank); the spec and the model's message named.
    """
    import torch

    where = f"{cfg.source}: key 'inputs'"
    arity = forward_arity_problem(model, cfg)
    if arity:
        raise ConfigError(f"{where}: {arity}", hint="list one [[inputs]] table per forward() argument, in order")
    specs = [(s, cfg.shape_for(s, "min")) for s in cfg.inputs]
    rng = np.random.default_rng(0)
    args = [torch.from_numpy(np.ascontiguousarray(generate(s, shape, rng))) for s, shape in specs]
    try:
        with torch.inference_mode():
            model(*args)
    except Exception as exc:  # the user's model refusing our inputs: say which spec, and the model's words
        spec_text = ", ".join(f"{s.name} {list(shape)} {s.dtype}" for s, shape in specs)
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise ConfigError(
            f"{where}: the model rejects the inputs at their min shape ({spec_text}): {type(exc).__name__}: "
            f"{' '.join(first.split())[:300]}",
            hint="fix [[inputs]] shape / dtype (channels, rank) or [dims.*] min to what the model takes",
        ) from None
