"""The device check, run on an INT8 candidate before it is accepted.

The reference stage's goldens (``goldens.npz``: PyTorch outputs on spec inputs and real samples) are what
validation and the bundle's own dry run compare an artifact with, at ``tolerance.int8``. A candidate that
meets the held-out target but would fail that comparison is vetoed here, so a build never prints PASSED for
a bundle whose documented dry run then fails.

Domain layer: imports the goldens reader, the precision package's analysis and the validate package's
comparison only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig

GoldenCase = tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]  # (point, inputs, PyTorch outputs)


def golden_cases(path: Path) -> list[GoldenCase]:
    """(point, inputs, PyTorch outputs) of every golden sample in ``path``; none when the file is absent.

    Raises:
        InputError: the goldens file is unreadable (from :func:`edgedeploy.modelio.goldens.load_goldens`).
    """
    from edgedeploy.modelio.goldens import load_goldens

    if not path.is_file():
        return []
    goldens = load_goldens(path)
    return [(point, pair["in"], pair["out"]) for point, by in goldens.items() for _, pair in sorted(by.items())]


def goldens_veto(cfg: DeployConfig, model: Path, cases: list[GoldenCase]) -> str | None:
    """Why ``model`` would fail the goldens check that validation and the device step run, or None.

    The same comparison and tolerance (``tolerance.int8``) as ``complete_bundle.py``: every golden within the
    elementwise tolerance and cosine, and top-1 agreement pooled over the real-sample goldens
    (:func:`edgedeploy.validate.parity.pooled_top1`); a candidate that passes here passes the bundle's own dry
    run (ONNX Runtime stand-in) on the same goldens.
    """
    from edgedeploy.precision import analysis
    from edgedeploy.validate.parity import compare_output, pooled_top1

    tol = cfg.tolerance_for("int8")
    outputs = analysis.run_model(model, [feeds for _, feeds, _ in cases])
    rows: list[dict[str, Any]] = []
    for (point, _, ref), got in zip(cases, outputs):
        for name in cfg.outputs:
            if name not in ref or name not in got:
                continue
            row = compare_output(
                ref[name],
                got[name],
                atol=tol.atol,
                rtol=tol.rtol,
                min_cosine=tol.min_cosine,
                topk=cfg.validate.topk,
                classifier=name in cfg.validate.classifier_outputs,
            )
            row.update(shape=point, output=name)
            rows.append(row)
    for row in rows + pooled_top1(rows, tol.min_topk_agreement):
        if not row["passed"]:
            why = row.get("reason") or ", ".join(row.get("failure", []))
            return f"golden {row['shape']} {row['output']} fails tolerance.int8: {why}"[:200]
    return None
