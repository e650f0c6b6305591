"""INT8 for recurrent layers on ONNX Runtime: LSTM input and recurrent projections in INT8, gate arithmetic float.

The Q/DQ recipe leaves ONNX ``LSTM`` nodes float: ONNX Runtime's static quantizer has no Q/DQ form for them.
A sequence model (a voice-activity detector: Conv1d then LSTM; a speaker encoder: three LSTMs) then has little
or no INT8 compute. ONNX Runtime's ``DynamicQuantizeLSTM`` runs the two projections of each step (input x W and
hidden x R, where the time goes) as int8 matrix products with per-call activation scales and int8 weights, and
keeps the gate non-linearities and the cell state float. So after the Q/DQ search, the model's LSTMs
(``precision.keep_fp32`` excepted) are quantized that way and the result is judged like every candidate: on the
held-out real samples against the FP32 model, at the same target, and by the goldens' check. GRU and RNN have no
such kernel in ONNX Runtime and stay float.

Domain layer: onnx and onnxruntime.quantization, imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RECURRENT_OPS = ("LSTM", "GRU", "RNN")


def recurrent_nodes(model: Path) -> dict[str, str]:
    """Name -> op type of the model's LSTM / GRU / RNN nodes."""
    import onnx

    proto = onnx.load(str(model), load_external_data=False)
    return {n.name: n.op_type for n in proto.graph.node if n.op_type in RECURRENT_OPS}


def quantize_lstms(model: Path, out: Path, exclude: Sequence[str] = ()) -> list[str]:
    """Write ``model`` with its LSTMs (``exclude`` aside) as ``DynamicQuantizeLSTM`` to ``out``; return their names.

    Raises:
        StageError: ONNX Runtime's quantizer fails on the model (named).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edgedeploy.errors import StageError

    lstms = [n for n, op in recurrent_nodes(model).items() if op == "LSTM" and n not in exclude]
    if not lstms:
        return []
    try:
        quantize_dynamic(
            str(model),
            str(out),
            op_types_to_quantize=["LSTM"],
            nodes_to_quantize=lstms,
            weight_type=QuantType.QInt8,
            per_channel=False,
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise StageError("precision", f"INT8 LSTM quantization failed: {' '.join(str(exc).split())[:200]}") from None
    return lstms


def lstm_int8(
    model: Path,
    out: Path,
    *,
    eval_batches: Sequence[dict[str, np.ndarray]],
    reference: Sequence[dict[str, np.ndarray]],
    target: float,
    classifier_outputs: Sequence[str],
    exclude: Sequence[str] = (),
    veto: Callable[[Path], str | None] | None = None,
    groups: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Quantize ``model``'s LSTMs into ``out`` and judge the result on ``eval_batches`` (held-out real samples)
    against ``reference`` (the FP32 model's outputs there). ``kept`` True: ``out`` holds the accepted model.

    The plan entry says which LSTMs, the held-out score, and why it was kept or not (below the target, or
    vetoed by the goldens' check: ``veto(out)`` returns why).

    Raises:
        StageError: ONNX Runtime's quantizer or a session fails (named).
    """
    from edgedeploy.precision import analysis

    float_cells = recurrent_nodes(model)
    if not float_cells:
        return {"status": "skipped", "why": "no recurrent layer"}
    lstms = quantize_lstms(model, out, exclude)
    others = sorted(n for n, op in float_cells.items() if op != "LSTM")
    entry: dict[str, Any] = {"route": "DynamicQuantizeLSTM", "lstm": lstms, "float_recurrent": others}
    if not lstms:
        return {**entry, "status": "skipped", "kept": False, "why": "no LSTM to quantize (GRU/RNN have no INT8 kernel)"}
    score = analysis.accuracy(reference, analysis.run_model(out, eval_batches), classifier_outputs, groups)
    entry.update(status="measured", metric=score["metric"], score=score["score"], target=target)
    if score["score"] < target:
        out.unlink(missing_ok=True)
        return {**entry, "kept": False, "why": f"held-out {score['metric']} {score['score']:.4f} < {target}"}
    vetoed = veto(out) if veto is not None else None
    if vetoed:
        out.unlink(missing_ok=True)
        return {**entry, "kept": False, "why": vetoed}
    return {**entry, "kept": True, "why": f"held-out {score['metric']} {score['score']:.4f} >= {target}"}
