"""Which of cross-layer equalization and bias correction an INT8 CNN gets (``precision.equalize``,
``precision.bias_correction``), measured on the held-out data for ``auto``.

Owns the choice only; the transforms live in :mod:`equalize` (CLE, bias correction from float input means) and
:mod:`bias_correction` (layer-by-layer output means). Imports the precision package and plain data only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from edgedeploy.config import PrecisionSection
    from edgedeploy.precision.quantize import QdqFlavour, Quantizer

Feeds = dict[str, np.ndarray]


@dataclass
class BiasSetup:
    """The bias correction chosen for the INT8 quantizers: float input means ("weights"), or layer-by-layer
    output means ("outputs"; the shifts measured on the naive model are reused by the final quantizer's naive try)."""

    means: dict[str, np.ndarray] | None = None
    outputs: bool = False
    shifts: dict[str, np.ndarray] | None = None
    shifts_for: tuple[str, ...] | None = None
    calibrated: Path | None = None  # the folder whose quantizer calibrated the chosen model (ranges to reuse)

    def configure(self, q: Quantizer, *, fresh: bool = False) -> None:
        q.bias_means = self.means
        q.output_bias_correction = self.outputs
        q.output_shifts = None if fresh else self.shifts
        q.output_shifts_for = None if fresh else self.shifts_for


def choose_equalization(
    setting: bool | str,
    float_model: Path,
    calib: Sequence[Feeds],
    evals: Sequence[Feeds],
    tmp: Path,
    flavour: QdqFlavour,
    p: PrecisionSection,
    classes: Sequence[str],
    target: float | None = None,
    measure: bool = True,
) -> tuple[Path, dict[str, Any], BiasSetup]:
    """Cross-layer equalization + bias correction per ``precision.equalize`` and ``precision.bias_correction``.

    Raises:
        StageError: onnxruntime cannot quantize or run a candidate.

    ``auto``: only for graphs with depthwise convs, and measured, cheapest accurate candidate first: the
    all-INT8 model with bias correction (per-channel weights) is scored on the held-out data and kept when it
    meets ``target``; otherwise it is also scored plain and with CLE + bias correction and the best kept (on
    EfficientNet-Lite0 with per-channel weights CLE scored *worse* and ran slower, see bench/README.md).
    Plain and bias-corrected quantize the same float model from one calibration. ``measure`` False (the INT8
    ladder's first rung): ``auto`` takes bias correction on the unmodified model unmeasured (the candidate the
    held-out judge scores first anyway); CLE is measured only in a later rung, when that one misses.
    Returns the model to quantize, the note for precision.json and the bias correction to apply.
    """
    import onnx

    from edgedeploy.precision import analysis
    from edgedeploy.precision import equalize as eq
    from edgedeploy.precision.quantize import Quantizer

    if setting == "auto":
        on = eq.has_depthwise_conv(onnx.load(str(float_model), load_external_data=False))
        why = "auto: depthwise convs found, measured" if on else "auto: no depthwise convs"
    else:
        on, why = bool(setting), f"precision.equalize = {str(setting).lower()}"
    if not on:
        return float_model, {"applied": False, "why": why}, BiasSetup()
    outputs = p.bias_correction == "outputs"

    def setup(model: Path) -> BiasSetup:
        return BiasSetup(outputs=True) if outputs else BiasSetup(means=eq.conv_input_means(model, calib))

    if setting == "auto" and not measure:  # CLE not applied: measured only when this candidate misses
        return (
            float_model,
            {
                "applied": False,
                "why": f"{why}: bias correction first (the cheapest rung); CLE measured only if the cheaper rungs "
                "miss the target",
                "chosen": "bias_corrected",
                "bias_correction": {"applied": True, "method": p.bias_correction},
            },
            setup(float_model),
        )
    out = tmp / "float.equalized.onnx"
    report = eq.equalize(float_model, out)

    method = {"method": p.bias_correction}
    note: dict[str, Any] = {
        "applied": True,
        "why": why,
        **report.as_dict(),
        "bias_correction": {"applied": True, **method},
    }
    if setting != "auto":
        return out, note, setup(out)

    # measured, not assumed: the naive all-INT8 model each way on the held-out data
    reference = analysis.run_model(float_model, evals)
    ways = {  # the cheapest accurate candidate first
        "bias_corrected": (float_model, setup(float_model)),
        "plain": (float_model, BiasSetup()),
        "equalized": (out, setup(out)),
    }
    scores = {}
    for name, (model, bias) in ways.items():
        # plain and bias-corrected share the float model, so its one calibration (tmp / "eq_float")
        folder = tmp / ("eq_float" if model == float_model else f"eq_{name}")
        folder.mkdir(exist_ok=True)
        q = Quantizer(model, folder, flavour, method=p.calib_method, per_channel=p.per_channel)
        bias.configure(q)
        m = q.quantize(tmp / f"eq_{name}.int8.onnx", calib, exclude=list(p.keep_fp32))
        bias.shifts, bias.shifts_for = q.output_shifts, q.output_shifts_for  # the final naive try reuses them
        bias.calibrated = folder
        judged = analysis.run_model(m, evals, qdq_as_written=flavour.qdq_as_written)
        scores[name] = analysis.accuracy(reference, judged, classes)["score"]
        if name == "bias_corrected" and target is not None and scores[name] >= target:
            note["why"] = f"{why}; bias correction alone met the target ({scores[name]:.4f} >= {target}): kept"
            break
    note["measured"] = scores
    best = max(scores, key=lambda k: (scores[k], k == "plain"))  # ties: the unmodified model
    note["chosen"] = best
    if best != "equalized":
        note["applied"] = False  # CLE
        note["bias_correction"] = {"applied": best == "bias_corrected", **method}
    return ways[best][0], note, ways[best][1]
