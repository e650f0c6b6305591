"""Capture routes: torch.jit.trace, torch.export.export and torch.jit.script, one function each.

``capture = "auto"`` tries :data:`AUTO_ORDER` and keeps the first route whose result matches eager
PyTorch at min / opt / max and a random size of every dynamic dim. Trace goes first: it is the
cheapest (a fraction of a second on a CNN where torch.export takes seconds) and the shape probes
catch what it freezes; torch.export is next (it refuses instead of freezing, so LSTMs and
data-dependent code fail there loudly); script last (it needs type-annotatable code).
"""

from __future__ import annotations

from typing import Any

from edgedeploy.artifacts import EXPORTED_PROGRAM, TORCHSCRIPT
from edgedeploy.modelio.tracing import TracerWarnings

AUTO_ORDER = ("trace", "export", "script")
API = {"trace": "torch.jit.trace", "script": "torch.jit.script", "export": "torch.export.export"}
ARTIFACTS = {"trace": TORCHSCRIPT, "script": TORCHSCRIPT, "export": EXPORTED_PROGRAM}


def route_order(mode: str) -> tuple[str, ...]:
    """Routes to try for ``export.capture``: every route for ``auto``, else exactly the one named."""
    return AUTO_ORDER if mode == "auto" else (mode,)


def capture_route(route: str, model: Any, example: tuple[Any, ...], dynamic_shapes: Any) -> tuple[Any, Any, Any]:
    """Capture ``model`` one way; return (artifact object, callable that runs it, :class:`TracerWarnings`).

    Raises:
        Exception: whatever the capture API raises (the caller turns it into one line).
    """
    import torch

    with TracerWarnings() as tw, torch.no_grad():
        if route == "script":
            captured = torch.jit.script(model)
            return captured, captured, tw
        if route == "export":
            from edgedeploy.modelio.torchutil import quiet_torch

            with quiet_torch():
                ep = torch.export.export(model, example, dynamic_shapes=dynamic_shapes, strict=False)
            return ep, ep.module(), tw
        # strict=False: dict / list outputs (segmentation heads) are flattened onto the output names
        captured = torch.jit.trace(model, example, check_trace=False, strict=False)
        return captured, captured, tw


def save_artifact(route: str, captured: Any, path: str) -> None:
    """Write the captured program: TorchScript ``.ts`` or ``torch.export.save`` ``.pt2``."""
    import torch

    if route == "export":
        torch.export.save(captured, path)
    else:
        captured.save(path)
