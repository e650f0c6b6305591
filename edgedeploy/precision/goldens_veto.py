"""The device check, run on an INT8 candidate before it is accepted.

The reference stage's goldens (``goldens.npz``: PyTorch outputs on spec inputs and real samples) are what
validation and the bundle's own dry run compare an artifact with, at ``tolerance.int8``, by the one rule of
:func:`edgedeploy.validate.parity.judge_goldens`: agreement judged on the real-sample goldens, the
spec-random ones only for non-finite values and shapes. A candidate that meets the held-out target but would
fail that comparison is vetoed here, so a build never prints PASSED for a bundle whose documented dry run then
fails, and a candidate is never vetoed for what validation would not fail.

Domain layer: imports the goldens reader, the precision package's analysis and the validate package's
comparison only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig

# (point, inputs, PyTorch outputs, sparingly stored outputs: name -> (shape, stride))
GoldenCase = tuple[str, dict[str, np.ndarray], dict[str, np.ndarray], dict[str, Any]]


def golden_cases(path: Path) -> list[GoldenCase]:
    """(point, inputs, PyTorch outputs, sparse outputs) of every golden sample in ``path``; none when absent.

    Raises:
        InputError: the goldens file is unreadable (from :func:`edgedeploy.modelio.goldens.load_goldens`).
    """
    from edgedeploy.modelio.goldens import load_goldens

    if not path.is_file():
        return []
    goldens = load_goldens(path)
    return [
        (point, pair["in"], pair["out"], pair.get("sparse", {}))
        for point, by in goldens.items()
        for _, pair in sorted(by.items())
    ]


def goldens_veto(
    cfg: DeployConfig,
    model: Path,
    cases: list[GoldenCase],
    known: dict[int, dict[str, np.ndarray]] | None = None,
    *,
    qdq_as_written: bool = False,
    precision: str = "int8",
) -> str | None:
    """Why ``model`` would fail the goldens check that validation and the device step run, or None.

    ``known``: case index -> the model's outputs on that case's inputs where a run already made them (the
    held-out judge runs the goldens' real samples among its own); the other cases are run here, as the judge
    and the dry run run them (``qdq_as_written``: :func:`edgedeploy.precision.analysis.run_model`).

    The same judge and tolerance (``tolerance.<precision>``: int8, or fp16 for the FP16 model the dry run
    runs) as validation and ``complete_bundle.py``
    (:func:`edgedeploy.validate.parity.judge_goldens`); a candidate that passes here passes the bundle's own
    dry run (ONNX Runtime stand-in) on the same goldens. The reason names the golden (``real sample
    data#3``) and the check.
    """
    from edgedeploy.precision import analysis
    from edgedeploy.validate.parity import judge_goldens, where

    tol = cfg.tolerance_for(precision)
    known = known or {}
    missing = [i for i in range(len(cases)) if i not in known]
    feeds = [cases[i][1] for i in missing]
    ran = dict(zip(missing, analysis.run_model(model, feeds, qdq_as_written=qdq_as_written))) if missing else {}
    outputs = [known[i] if i in known else ran[i] for i in range(len(cases))]
    judged = [(point, s, {"out": ref, "sparse": sparse}) for s, (point, _, ref, sparse) in enumerate(cases)]
    rows = judge_goldens(
        judged,
        outputs,
        precision,
        tol.__dict__,
        outputs=list(cfg.outputs),
        topk=cfg.validate.topk,
        classifier_outputs=list(cfg.validate.classifier_outputs),
    )
    for row in rows:
        if not row["passed"]:
            why = row.get("reason") or ", ".join(row.get("failure", []))
            return f"golden {where(row)} {row['output']} fails tolerance.{precision}: {why}"[:240]
    return None
