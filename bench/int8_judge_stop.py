"""The INT8 search's held-out judge stopping once a cosine target is out of reach, against judging every sample.

A try that can no longer meet the target, whatever the held-out samples not yet judged show, is judged no
further: for a cosine output the rest at best lines up exactly with the float model's (the CNN recipe's one
cosine over every value, ``edgedeploy.precision.analysis.CosineBound``; the transformer recipe's mean of each
sample's cosine, ``edgedeploy.precision.heldout.ReachableScore``). A try that can still pass is judged on every
sample, so the verdicts, the float set shipped and its score are the same either way. Each model is built twice,
each build in its own process with an empty stage cache, one after the other:

- ``shipped``: as ``deploy build`` runs it;
- ``judged_whole``: the cosine bound turned off: every try judged on every held-out sample (a classifier's top-1
  bound, older, is not touched; neither model here has one).

Models (real weights, the ``bench`` extra): the ResNet-50 embedder of ``bench/int8_resnet.py`` for jetson-orin at
``precision.accuracy_target = 0.998`` (host stages: the search judges the Q/DQ graph as written), and
all-MiniLM-L6-v2 of ``bench/int8_transformer_search.py`` at 0.998 for cpu and jetson-orin. Recorded per build:
wall seconds (process start included), the tries (size, score, verdict, samples judged when stopped early), the
float set shipped and its score.

About 10 minutes on 2 cores.

    PYTHONPATH=$PWD .venv/bin/python bench/int8_judge_stop.py [--json bench/int8_judge_stop.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH / "minilm"))

ACCURACY_TARGET = 0.998
MODES = ("shipped", "judged_whole")
# (name, model, target): the builds compared
CASES = (
    ("resnet50_embedding jetson-orin", "resnet50_embedding", "jetson-orin"),
    ("minilm cpu", "minilm", "cpu"),
    ("minilm jetson-orin", "minilm", "jetson-orin"),
)


def judge_whole() -> None:
    """Every try judged on every held-out sample: the cosine bounds never bound (this process only)."""
    import edgedeploy.precision.analysis as analysis
    import edgedeploy.precision.heldout as heldout

    class Unbounded(analysis.CosineBound):
        def __init__(self, reference: Any, name: str) -> None:
            super().__init__(reference, name)
            self.bounds = False

    analysis.CosineBound = Unbounded  # type: ignore[misc]
    heldout.JUDGED_STEPS = 1  # the transformer judge: one step, the whole held-out set


def child(model: str, work: Path, out: Path, target: str, mode: str) -> int:
    """One build in this process."""
    from edgedeploy.api import build
    from edgedeploy.errors import DeployError

    if mode == "judged_whole":
        judge_whole()
    try:
        if model == "minilm":
            from int8_transformer import _config

            samples = json.loads((work / "minilm" / "passages.json").read_text())
            cfg = _config(work / "minilm", work / "minilm" / "calib.npz", samples, out.name, mode="int8",
                          accuracy_target=ACCURACY_TARGET)  # fmt: skip
            cfg["build"].update(target=target, out=str(out))
            build(cfg)
        else:
            cfg_path = work / "projects" / model / "deploy.toml"
            sys.path.insert(0, str(cfg_path.parent))
            photos = str(cfg_path.parent / "photos")
            build(cfg_path, build__target=target, build__out=str(out), precision__mode="int8",
                  precision__calib=photos, precision__accuracy_target=ACCURACY_TARGET)  # fmt: skip
    except DeployError as exc:
        print(exc.one_line(), file=sys.stderr)
        return 1
    return 0


def write_projects(work: Path) -> None:
    """The ResNet-50 embedder's project and MiniLM's checkpoint and passages under ``work``."""
    import int8_search_start
    import int8_transformer_search

    cfg = int8_search_start.write_project("resnet50_embedding", work / "projects")
    assert cfg == work / "projects" / "resnet50_embedding" / "deploy.toml", cfg
    _, passages = int8_transformer_search.write_project(work / "minilm")
    (work / "minilm" / "passages.json").write_text(json.dumps(passages))


def one_build(work: Path, model: str, target: str, mode: str) -> dict[str, Any]:
    from int8_search_start import run_child, search_summary

    out = work / f"out-{model}-{target}-{mode}"
    env = {**os.environ, "EDGEDEPLOY_CACHE_DIR": str(work / f"cache-{model}-{target}-{mode}")}
    env.setdefault("HF_HUB_OFFLINE", "1")
    argv = [sys.executable, __file__, "--child", model, str(work), str(out), target, mode]
    row: dict[str, Any] = {"mode": mode}
    plan = run_child(argv, env, out, row)
    if plan is None:
        return row
    size = "float_nodes" if model != "minilm" else "float_matmuls"
    summary = search_summary(plan, (size,))
    for row_try, plan_try in zip(summary["tries"], plan["fallback_tries"]):
        if "judged_samples" in plan_try:
            row_try["judged_samples"] = f"{plan_try['judged_samples']} of {plan_try['samples']}"
    row.update(summary)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", nargs=5, metavar=("MODEL", "WORK", "OUT", "TARGET", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        model, work, out, target, mode = args.child
        return child(model, Path(work), Path(out), target, mode)
    from int8_search_start import finish, print_case

    work = Path(tempfile.mkdtemp(prefix="int8-judge-stop-"))
    write_projects(work)
    rows: dict[str, Any] = {}
    for label, model, target in CASES:
        builds = [one_build(work, model, target, mode) for mode in MODES]
        new, old = builds
        rows[label] = {
            "builds": builds,
            "same_tries_verdicts_and_shipped": all(k in new and k in old for k in ("shipped", "tries"))
            and new["shipped"] == old["shipped"]
            and [t["met"] for t in new["tries"]] == [t["met"] for t in old["tries"]],
            "seconds_ratio_shipped_over_judged_whole": round(new["seconds"] / old["seconds"], 2),
        }
        print_case(label, rows[label])
    command = "PYTHONPATH=$PWD python bench/int8_judge_stop.py --json bench/int8_judge_stop.json"
    return finish({"accuracy_target": ACCURACY_TARGET, "cores": os.cpu_count(), "cases": rows, "command": command},
                  args.json, rows)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
