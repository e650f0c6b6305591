"""How the INT8 float-fallback search reports itself while it runs: try k of N, best so far, why it goes on.

:class:`SearchProgress` is the ``on_try`` hook of :func:`edgedeploy.precision.fallback.quantize_with_fallback`.
Per try it times the try's model in ONNX Runtime when given feeds to time it on (the stage gives them where the
artifact runs on this host's kernels; a few runs: the speed axis of report.html's search plot; ``p50_ms`` in the
try's row, kept out of precision.json like every timing) and sends one status line, e.g.::

    INT8 search: try 3 of at most 12, 4 float nodes (sensitivity): top-1 0.9412, 0.81 ms;
    best so far 0.9412 with 4 float; still searching: below the target 0.95, more layers to float

Domain layer: imports the precision package's analysis only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import DeployError


class SearchProgress:
    """Status lines (and a per-try timing) for the float-fallback search."""

    def __init__(
        self,
        *,
        max_tries: int,
        target: float,
        status: Callable[[str], None],
        latency_feeds: dict[str, np.ndarray] | None = None,
        latency_iters: int = 5,
        qdq_as_written: bool = False,
    ) -> None:
        self.most = max_tries + 1  # try 0 (everything INT8) and up to max_tries fallback tries
        self.target = target
        self.status = status
        self.feeds = latency_feeds
        self.iters = latency_iters
        self.qdq_as_written = qdq_as_written  # timed as the search judges it (a stand-in's Q/DQ as written)
        self.rows: list[dict[str, Any]] = []
        self.nothing_quantized = False  # the all-INT8 try holds no INT8 compute: no node the target quantizes

    def __call__(self, row: dict[str, Any], model: Path) -> None:
        if self.feeds is not None:
            row["p50_ms"] = self._p50(model)
        if not self.rows and row.get("float_nodes") == 0 and row.get("met"):  # the only line that says "all INT8"
            from edgedeploy.precision.analysis import int8_compute_left

            self.nothing_quantized = not int8_compute_left(model)
        self.rows.append(row)
        self.status(self.line(row))

    def _p50(self, model: Path) -> float | None:
        from edgedeploy.precision.analysis import measure_latency

        try:
            row = measure_latency(
                model, self.feeds or {}, warmup=1, iters=self.iters, qdq_as_written=self.qdq_as_written
            )
            return round(row["p50_ms"], 4)
        except DeployError:  # a timing for the plot only: a model that cannot be timed is judged elsewhere
            return None

    def line(self, row: dict[str, Any]) -> str:
        """The status after ``row`` (the latest try): what it scored, the best so far, why the search goes on."""
        family = f" ({row['family']})" if row.get("family") else ""
        metric = row.get("metric", "score")
        speed = f", {row['p50_ms']:.3g} ms" if row.get("p50_ms") is not None else ""
        verdict = "meets" if row.get("met") else ("vetoed by the goldens" if row.get("vetoed") else "misses")
        from edgedeploy.precision.analysis import stopped_early

        # numbered as precision.json numbers them: try 0 is everything INT8, then up to max_tries fallback tries
        which = f"try {row['try']}" + (" (everything INT8)" if row["try"] == 0 else f" of at most {self.most - 1}")
        pinned = f" (+{row['pinned_float']} pinned)" if row.get("pinned_float") else ""
        head = (
            f"INT8 search: {which}, {row['float_nodes']} float nodes{family}{pinned}: "
            f"{metric} {row['score']:.4f}{stopped_early(row)} {verdict}{speed}"
        )
        more = len(self.rows) < self.most
        passing = [r for r in self.rows if r.get("met")]
        if passing:
            best = min(passing, key=lambda r: (r["float_nodes"], r["try"]))
            if row is best and row["float_nodes"] == 0:
                if self.nothing_quantized:  # it meets the target as the FP32 model it still is
                    return f"{head}; but nothing was quantized: no node of this model is one this target's INT8 takes"
                return f"{head}; everything INT8 meets {self.target}: done"
            why = "looking for fewer or faster float nodes" if more else "try budget spent"
            return f"{head}; best so far {best['float_nodes']} float ({best['score']:.4f}); {why}"
        best = max(self.rows, key=lambda r: r["score"])
        if not more:
            return f"{head}; best {best['score']:.4f}; try budget spent without meeting {self.target}"
        why = (
            "a golden fails tolerance.int8, more layers to float"
            if row.get("vetoed")
            else f"below {self.target}, more layers to float"
        )
        return f"{head}; best so far {best['score']:.4f} ({best['float_nodes']} float); still searching: {why}"

    def summary(self, shipped: dict[str, Any]) -> str:
        """One line for the end of the search: how many tries, how many met the target, what ships."""
        met = sum(1 for r in self.rows if r.get("met"))
        family = f" ({shipped['family']})" if shipped.get("family") else ""
        return (
            f"INT8 search: {len(self.rows)} tries, {met} meeting the target {self.target}; ships try "
            f"{shipped.get('try', 0)}: {shipped.get('float_nodes', 0)} float nodes{family}, "
            f"{shipped.get('metric', 'score')} {shipped.get('score', 0.0):.4f}"
        )
