"""Would judging INT8 candidates on fewer views of each held-out crop be a cheaper stand-in for the full judge?

One cold EfficientNet-Lite0 ``deploy build --target cpu --precision int8 --calib photos/`` (the build_times.py
project), with the precision stage's judge (``analysis.accuracy_until_decided``) wrapped: every candidate judged
on all 512 views (16 held-out crops x 32 views) is scored again, from the same outputs, on the first 4, 8 and 16
views of each crop, with the same statistic (the lower of counted and expected top-1 agreement, less one
standard error over the crops). Nothing is run twice: the subsets are re-scored from the judged outputs. A
stand-in that fails the candidates the full judge passes would ship more float nodes, or none.

    PYTHONPATH=$PWD .venv/bin/python bench/int8_judge_views.py --json bench/int8_judge_views.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
VIEWS = (4, 8, 16)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = args.json.resolve() if args.json else None  # the build below runs in the project's folder
    sys.path.insert(0, str(BENCH))
    import build_times

    from edgedeploy.cli import main as deploy
    from edgedeploy.precision import analysis

    judge = analysis.accuracy_until_decided
    rows: list[dict] = []

    def wrapped(model, batches, reference, classifier_outputs, groups, target, outputs=None):  # type: ignore[no-untyped-def]
        sink = [] if outputs is None else outputs
        score, judged = judge(model, batches, reference, classifier_outputs, groups, target, outputs=sink)
        row: dict = {"candidate": Path(model).name, "full_judge": round(score["score"], 4), "judged": judged}
        row["meets"] = score["score"] >= target
        if judged == len(batches) and groups:
            got = sink[-len(batches) :]
            for views in VIEWS:
                index, sizes, start = [], [], 0
                for size in groups:
                    take = min(views, size)
                    index += range(start, start + take)
                    sizes.append(take)
                    start += size
                sub = analysis.accuracy(
                    [reference[i] for i in index], [got[i] for i in index], classifier_outputs, sizes
                )
                row[f"first_{views}_views"] = round(sub["score"], 4)
        rows.append(row)
        return score, judged

    analysis.accuracy_until_decided = wrapped
    with tempfile.TemporaryDirectory() as tmp:
        projects = build_times.side_by_side_projects(Path(tmp))
        config = Path(projects["efficientnet_lite0"]["config"])
        os.environ["EDGEDEPLOY_CACHE_DIR"] = str(Path(tmp) / "cache")
        os.chdir(config.parent)
        argv = ["build", "--config", str(config), "--target", "cpu", "--precision", "int8", "--calib", "photos/"]
        code = deploy([*argv, "--out", str(Path(tmp) / "out"), "-q"])
    doc = {
        "command": "PYTHONPATH=$PWD python bench/int8_judge_views.py " + " ".join(sys.argv[1:]),
        "target": 0.95,
        "exit_code": code,
        "candidates": rows,
        "note": "first_N_views: the same statistic on the first N of each held-out crop's 32 views (rows judged "
        "on every view only; a try stopped early has no subset scores)",
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if out is not None:
        out.write_text(text + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
