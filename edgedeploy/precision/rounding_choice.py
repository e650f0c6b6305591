"""Which weight rounding an INT8 model gets (``precision.weight_rounding``): round-to-nearest or AdaRound,
measured on the held-out data for ``auto``.

``auto`` learns the rounding only when round-to-nearest misses the target (learning costs minutes on a real
CNN), and then keeps the learned codes only when they score *higher* on the held-out data than nearest did.
Learning always lowers each layer's output error on the calibration batches, but that is not the held-out
agreement: on EfficientNet-Lite0 with the first three convs float, AdaRound scored 95.2 % / 93.3 % top-1
agreement on held-out photos / fresh crops against nearest's 95.6 % / 96.7 % (bench/README.md).

Owns the choice only; the learning lives in :mod:`edgedeploy.precision.adaround`. Imports the precision
package and plain data only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from edgedeploy.precision.quantize import Quantizer

Feeds = dict[str, np.ndarray]


def choose_rounding(
    setting: str,
    q: Quantizer,
    calib: Sequence[Feeds],
    judge: Sequence[Feeds],
    reference: Sequence[Feeds],
    *,
    exclude: Sequence[str],
    target: float,
    classifier_outputs: Sequence[str],
    workdir: Path,
    log: Callable[[str], None] | None = None,
    groups: Sequence[int] | None = None,
) -> tuple[dict[str, Any], Path | None]:
    """Set ``q.weight_codes`` per ``setting`` (``nearest``, ``adaround`` or ``auto``) and return the note for
    precision.json (``method``, ``why``; ``measured`` when ``auto`` scored both) and the model ``auto`` already
    quantized with the chosen rounding (``exclude`` float, the fallback search's first try), else None.

    ``calib``: the batches the rounding learns from; ``judge``: the held-out batches it is scored on, with the
    float model's outputs on them in ``reference`` (``groups``: as for the fallback search's score);
    ``exclude``: the nodes every try keeps float.

    Raises:
        StageError: onnxruntime cannot quantize or run a candidate.
    """
    from edgedeploy.precision import analysis

    if setting == "nearest":
        return {"method": "nearest", "why": "precision.weight_rounding = nearest"}, None
    models = {name: workdir / f"{name}.int8.onnx" for name in ("nearest", "learned")}

    def held_out(name: str) -> dict[str, Any]:
        model = q.quantize(models[name], calib, exclude=list(exclude))
        outputs = analysis.run_model(model, judge, qdq_as_written=q.flavour.qdq_as_written)
        return analysis.accuracy(reference, outputs, classifier_outputs, groups)

    why = "precision.weight_rounding = adaround"
    nearest: dict[str, Any] | None = None
    if setting == "auto":
        nearest = held_out("nearest")
        nearest_shifts = (q.output_shifts, q.output_shifts_for)  # the bias correction measured on that model
        figure = f"{nearest['metric']} {nearest['score']:.4f}, target {target}"
        if nearest["score"] >= target:
            return {"method": "nearest", "why": f"auto: round-to-nearest met the target ({figure})"}, models["nearest"]
        why = f"auto: round-to-nearest missed the target ({figure})"
    from edgedeploy.precision.adaround import round_weights

    note = round_weights(q, calib)  # calibration batches only, never held-out
    note["why"] = why
    if log:
        err = note["mean_output_error"]
        log(f"INT8 weight rounding: adaround on {note['layers']} layers, mean layer output error "
            f"{err['nearest']:.4g} -> {err['learned']:.4g}")  # fmt: skip
    if nearest is None:
        return note, None
    if not note["layers"]:  # e.g. a Conv1d model: nothing learned, so nothing to score against nearest
        q.weight_codes = None
        q.output_shifts, q.output_shifts_for = nearest_shifts
        return {
            "method": "nearest",
            "why": f"{why}; adaround has no layer to learn in this model (it learns 2-D Conv, Gemm and MatMul "
            "weights): nearest kept",
            "measured": {"nearest": round(nearest["score"], 6)},
        }, models["nearest"]
    learned = held_out("learned")
    note["measured"] = {"nearest": round(nearest["score"], 6), "learned": round(learned["score"], 6)}
    if learned["score"] > nearest["score"]:
        return note, models["learned"]
    # lower layer error on the calibration batches, not higher agreement on held-out data: keep nearest
    q.weight_codes = None
    q.output_shifts, q.output_shifts_for = nearest_shifts  # the rounded model's shifts do not apply
    if log:
        log(f"INT8 weight rounding: adaround scored {learned['score']:.4f} on held-out data, nearest "
            f"{nearest['score']:.4f}: kept round-to-nearest")  # fmt: skip
    kept = {
        "method": "nearest",
        "why": f"{why}; adaround learned, then scored {learned['metric']} {learned['score']:.4f} on the "
        "held-out data, not higher: nearest kept",
        "measured": note["measured"],
        "adaround": {k: note[k] for k in ("layers", "iterations", "mean_output_error")},
    }
    return kept, models["nearest"]  # bit-identical to what q quantizes now (codes and shifts restored)
