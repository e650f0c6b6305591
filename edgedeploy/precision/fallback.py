"""The INT8 float-fallback search: which nodes stay float so the quantized model meets the accuracy target.

Two families of float sets are searched, each for its fewest nodes that meet the target:

- ``sensitivity``: the ``k`` nodes whose quantization alone costs the most at the model outputs;
- ``prefix``: the first ``k`` quantized nodes in graph order.

Each scattered float node costs a float <-> INT8 boundary at run time (in ONNX Runtime a re-layout and a
re-quantization); a prefix costs one. So fewer float nodes is not the same as faster: on EfficientNet-Lite0
(ONNX Runtime, one thread) 8 sensitive convs float ran 3.42 ms and the first 12 float 2.95 ms (FP32 5.38 ms).
Where the artifact runs on this host's kernels the quick search (``prefix_first``) tries the prefix family
alone first, with no ranking, and the wide search finds both families' smallest passing sets and ships the
faster, measured; elsewhere (TensorRT targets) the first family to pass ships.

Domain layer: imports the precision package's quantizer and analysis only.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.precision import analysis
from edgedeploy.precision.quantize import Quantizer
from edgedeploy.precision.speed_probe import MARGIN, MIN_MS, SpeedProbe

# A float set is shipped for speed only when it is this much faster than the one that passed first (median of
# interleaved rounds): the speed probe's timing-noise margin
SPEED_MARGIN = MARGIN

# the first float prefix a prefix-first search tries (then doubled until one passes, then bisected)
PREFIX_FIRST_SIZE = 4

Timer = Callable[[Sequence[Path]], list[float]]  # models -> median milliseconds, measured side by side


@dataclass
class FallbackResult:
    """The outcome of INT8 quantization with fallback (all plain data for precision.json)."""

    model: Path
    excluded: dict[str, str]  # node -> why it stayed in float
    tries: list[dict[str, Any]]
    sensitivity: list[dict[str, Any]]
    met: bool
    target: float
    latency: dict[str, Any]
    final: dict[str, Any] = field(default_factory=dict)  # the chosen try's row
    candidates: int = 0  # nodes the naive model quantized (beyond keep_fp32)
    # how the shipped float set was chosen among passing ones (rule, and each passing family's timing)
    choice: dict[str, Any] = field(default_factory=dict)
    stop: str = ""  # why the search stopped where it did
    # the speed probe asked of the model the search would ship (``speed_probe``); None when it was not asked
    probe: SpeedProbe | None = None
    # where the ranked search started (:func:`predicted_first_size`); empty when it did not rank
    start: dict[str, Any] = field(default_factory=dict)


def layer_sensitivity(
    q: Quantizer,
    batches: Sequence[dict[str, np.ndarray]],
    reference: Sequence[dict[str, np.ndarray]],
    candidates: Sequence[str],
) -> list[dict[str, Any]]:
    """Per-layer INT8 sensitivity: the model's output error when only that node is quantized (most sensitive first).

    Quantizing one node at a time isolates what its input / weight / output quantization alone costs at the
    model outputs, so an outlier-dominated tensor that looks harmless in a norm shows up where it hurts.
    """
    import onnx

    ops = {n.name: n.op_type for n in onnx.load(str(q.float_model)).graph.node}
    rows = []
    for i, node in enumerate(candidates):
        model = q.quantize(q.workdir / f"only{i}.int8.onnx", batches, only=[node])
        outputs = analysis.run_model(model, batches, qdq_as_written=q.flavour.qdq_as_written)
        err = analysis.output_error(reference, outputs)
        rows.append({"node": node, "op": ops.get(node, ""), "output_error": err})
        model.unlink(missing_ok=True)
    rows.sort(key=lambda r: r["output_error"], reverse=True)
    return rows


def quantize_with_fallback(
    q: Quantizer,
    *,
    out: Path,
    batches: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str],
    accuracy_target: float,
    max_tries: int,
    eval_batches: Sequence[dict[str, np.ndarray]] | None = None,
    keep_fp32: Sequence[str] | Mapping[str, str] = (),
    first_try: Path | None = None,
    reference: Sequence[dict[str, np.ndarray]] | None = None,
    extra_check: Callable[[Path, Sequence[dict[str, np.ndarray]]], str | None] | None = None,
    latency_feeds: dict[str, np.ndarray] | None = None,
    latency_iters: int = 10,
    log: Callable[[str], None] | None = None,
    groups: Sequence[int] | None = None,
    timer: Timer | None = None,
    on_try: Callable[[dict[str, Any], Path], None] | None = None,
    deadline: float | None = None,
    budget_name: str = "precision.time_budget_s",
    ranking: Callable[[Path, list[str]], list[dict[str, Any]]] | None = None,
    families: Sequence[str] = ("sensitivity", "prefix"),
    prefix_first: bool = False,
    settled: Callable[[Sequence[str], Path], str | None] | None = None,
    speed_probe: Callable[[Sequence[str], Sequence[str]], SpeedProbe] | None = None,
) -> FallbackResult:
    """Quantize everything, then keep the fewest nodes in float that meet ``accuracy_target``.

    Calibration uses ``batches``; every candidate is scored on ``eval_batches`` (held-out samples never used
    for calibration; default ``batches``): top-1 agreement (classifier outputs) or cosine similarity against
    the FP32 ONNX model. ``extra_check(model, outputs)`` may veto a candidate that meets the score (returns
    why); ``outputs`` are the model's on ``eval_batches``, as judged.
    Sensitivity (:func:`layer_sensitivity`: one node quantized at a time, not greedily) ranks the nodes the
    naive model quantized. Then, at ``k`` doubling from where the ranking says the miss is removed
    (:func:`predicted_first_size`; 1 where it says nothing), the ``k`` most sensitive nodes and the first ``k``
    quantized nodes (graph order) are tried float, in that order, until one passes; bisection between the last
    failing (or zero) and the first passing ``k`` finds that family's smallest set, within ``max_tries``
    quantizations.

    ``timer`` (given where the artifact runs on this host's kernels): when the sensitivity family passed
    first, the prefix family is searched on to its own smallest passing set, both are timed side by side, and
    the prefix ships when it is :data:`SPEED_MARGIN` faster (both under
    :data:`edgedeploy.precision.speed_probe.MIN_MS`: timer noise, not timed apart). Without it the first family
    to pass ships.

    ``keep_fp32``: nodes float in every try; a mapping gives each one's reason (default: listed in
    precision.keep_fp32). ``first_try``: a model ``q`` already quantized with exactly ``keep_fp32`` float (the
    weight rounding choice's), scored as try 0 instead of quantizing it again. ``reference``: the float model's
    outputs on the scored batches, when the caller already ran it (else run here). ``groups``: batches per
    independent source in ``eval_batches`` (:func:`edgedeploy.precision.analysis.accuracy`). Latency of the
    naive and the final model is measured in ONNX Runtime when ``latency_feeds`` is given. ``deadline``
    (``time.monotonic()`` seconds): no new try starts after it (``budget_name`` names the setting in the
    stop reason). The result's ``stop`` says why the search ended where it did.

    ``ranking(naive_model, candidates)``, when given, ranks the candidates instead of
    :func:`layer_sensitivity` (e.g. :func:`edgedeploy.precision.layer_error.layer_errors`: one pass, not one
    quantization per node). ``families``: the float-set families searched (``sensitivity``, ``prefix``).
    ``prefix_first`` (where the artifact runs on this host's kernels and the search should be quick): the
    prefix family alone first, up to half the candidates, and bisected when one passes, with no ranking at
    all (``PREFIX_FIRST_SIZE`` nodes first, then doubled); only when no prefix that long passes are the nodes
    ranked and both families searched.

    ``settled(undecided, all_int8_model)``, when given, is asked before each bisection step with the nodes still
    undecided (float in the smallest passing set, not in the largest failing one): a reason means no further
    try can ship a measurably faster model (:func:`edgedeploy.precision.speed_probe.undecided_too_small`), and
    the smallest passing set found ships.

    ``speed_probe(float_nodes, order)``, when given, is asked once the search has a model meeting the target,
    with that model's float nodes and the all-INT8 model's quantized nodes in graph order
    (:func:`edgedeploy.precision.speed_probe.probe_when_set`): nodes it keeps float for speed make one more try
    (family ``speed``), judged like every other, which ships only if it meets the target too.

    Returns the result whether or not the target was met (``met``); the caller decides to fail.
    ``log`` gets one progress line per step (sensitivity over many nodes takes a while). ``on_try(row, model)``,
    when given, is called after each try with its row (it may add figures to it, e.g. a timing) and its model,
    instead of logging the try's line.

    Raises:
        StageError: a quantization or an ONNX Runtime session fails (from the quantizer and analysis).
    """
    say = log or (lambda _line: None)
    evals = list(eval_batches) if eval_batches else list(batches)
    reference = list(reference) if reference is not None else analysis.run_model(q.float_model, evals)
    pinned = (
        dict(keep_fp32) if isinstance(keep_fp32, Mapping) else {n: "listed in precision.keep_fp32" for n in keep_fp32}
    )
    tries: list[dict[str, Any]] = []
    judged_models: list[Path] = []  # each try's model, by try

    def attempt(k: int, excl: dict[str, str], family: str = "", done: Path | None = None) -> tuple[bool, Path]:
        model = done or q.quantize(q.workdir / f"try{len(tries)}.int8.onnx", batches, exclude=list(excl))
        # judged until the verdict is certain: a try that can no longer meet the target stops early
        outputs: list[dict[str, np.ndarray]] = []
        score, judged = analysis.accuracy_until_decided(
            model,
            evals,
            reference,
            classifier_outputs,
            groups,
            accuracy_target,
            outputs=outputs,
            qdq_as_written=q.flavour.qdq_as_written,
        )
        meets = score["score"] >= accuracy_target
        veto = extra_check(model, outputs) if extra_check is not None and meets else None
        row = {"try": len(tries), "float_nodes": k, "excluded": list(excl), "score": score["score"]}
        if pinned:  # float in every try besides the k the search chose (precision.keep_fp32, a runtime's pins)
            row["pinned_float"] = len(pinned)
        if judged < len(evals):
            row["judged_samples"] = _samples(evals[:judged])
            row["samples"] = _samples(evals)
        worst = min(score["outputs"].values(), key=lambda r: r["value"])
        row.update({key: round(worst[key], 6) for key in ("observed", "expected", "standard_error") if key in worst})
        if family:
            row["family"] = family
        row.update(metric=score["metric"], met=score["score"] >= accuracy_target and veto is None)
        if not row["met"]:  # whether a lower target would ship INT8 from this try (the refusal's fixes ask)
            row["int8_compute"] = analysis.int8_compute_left(model)
        if veto:
            row["vetoed"] = veto
        tries.append(row)
        judged_models.append(model)
        if on_try is not None:
            on_try(row, model)
        else:
            say(_try_line(row))
        return row["met"], model

    met, naive = attempt(0, pinned, done=first_try)
    chosen, excluded, sensitivity = naive, dict(pinned), []
    candidates: list[str] = []
    choice: dict[str, Any] = {}
    stop = "the all-INT8 candidate met the target: nothing to search" if met else ""
    start: dict[str, Any] = {}

    order: list[str] = []

    def naive_order() -> list[str]:
        """The all-INT8 model's quantized nodes in graph order (read once: the search and the probe both ask)."""
        if not order:
            import onnx

            order.extend(analysis.quantized_nodes(onnx.load(str(naive), load_external_data=False)))
        return order

    def out_of_time() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def budget_left() -> bool:
        return len(tries) <= max_tries and not out_of_time()

    if not met and max_tries == 0:
        stop = "precision.max_fallback_tries = 0: no float fallback tried"
    elif not met and out_of_time():
        stop = f"{budget_name} spent before the fallback search (the first candidate misses the target)"
    if not met and max_tries > 0 and not out_of_time():
        candidates = [n for n in naive_order() if n not in pinned]
        search = FamilySearch(attempt, pinned, [], candidates, budget_left, tuple(families))
        if settled is not None:
            search.settled = lambda undecided: settled(undecided, naive)
        won = None
        if prefix_first and "prefix" in families:
            say(
                f"INT8 {tries[0]['metric']} {tries[0]['score']:.4f} misses target {accuracy_target}: keeping the "
                "first quantized nodes float (one float -> INT8 boundary, the fastest fallback on this CPU)"
            )
            # from PREFIX_FIRST_SIZE: one or two float nodes rarely decide a CNN, and a passing size is narrowed
            # down anyway
            search.grow("prefix", limit=max(1, len(candidates) // 2), first=PREFIX_FIRST_SIZE)
            won = "prefix" if "prefix" in search.passed else None
        if won is None and budget_left():  # a spent budget ranks nothing it could not try
            say(
                f"INT8 {tries[0]['metric']} {tries[0]['score']:.4f}"
                + (f" ({tries[0]['vetoed']})" if "vetoed" in tries[0] else "")
                + f" misses target {accuracy_target}: measuring the sensitivity of {len(candidates)} quantized nodes"
            )
            if ranking is not None:
                sensitivity = ranking(naive, candidates)
            else:
                calib_ref = analysis.run_model(q.float_model, batches[:4])
                sensitivity = layer_sensitivity(q, batches[:4], calib_ref, candidates)
            search.sensitivity = sensitivity
            start.update(predicted_first_size(sensitivity, tries[0], accuracy_target))
            if start["size"] > 1:
                say(f"INT8 fallback: {start['why']}")
            won = search.grow_both(first=start["size"])
        if won is not None:
            search.bisect(won)
            if won == "sensitivity" and timer is not None and "prefix" in families and not prefix_first:
                # a longer float prefix may still run faster than scattered sensitive nodes: find it and time both
                search.grow("prefix")
                search.bisect("prefix")
            family, k, choice = search.choose(won, timer)
            if prefix_first and won == "prefix":
                choice["rule"] = "prefix first on this CPU's kernels (one float -> INT8 boundary): its smallest set"
            chosen, excluded = search.models[(family, k)], search.float_set(family, k)
            gap = search.passed[won] - search.failed[won]
            stop = (
                f"smallest passing float set found ({won}: {search.passed[won]} float, {search.failed[won]} failed)"
                if gap <= 1
                else f"a passing float set found ({won}: {search.passed[won]} float, {search.failed[won]} failed); "
                f"bisection stopped: {search.settled_why[won]}"
                if won in search.settled_why
                else f"a passing float set found; bisection cut short by the budget ({_budget_word(out_of_time())})"
            )
        elif search.models:  # nothing met the target: report the largest try of the sensitivity family
            key = max(search.models, key=lambda fk: (fk[1], fk[0] == "sensitivity"))
            chosen, excluded = search.models[key], search.float_set(*key)
        if won is None:
            stop = (
                f"{budget_name} spent after {len(tries) - 1} fallback tries"
                if out_of_time()
                else f"precision.max_fallback_tries = {max_tries} spent"
                if len(tries) > max_tries
                else f"every ranked node float ({len(candidates)}) still misses: more float nodes cannot change "
                "the outcome"
            )
        say(f"INT8 fallback search stopped: {stop}")
    final = next((t for t in tries if set(t["excluded"]) == set(excluded)), tries[-1])
    probe = None
    if speed_probe is not None and final["met"]:
        probe = speed_probe(list(excluded), naive_order())
        if probe.kept:
            faster = {**excluded, **probe.kept}
            passes, model = attempt(len(faster) - len(pinned), faster, "speed")
            if passes:
                chosen, excluded, final = model, faster, tries[-1]
            else:
                probe = probe.declined(
                    f"the {len(probe.kept)} node(s) measured faster in float missed the accuracy target with the "
                    "search's float nodes (a float node can move the rounding downstream): kept INT8"
                )
    if not final["met"] or not analysis.int8_compute_left(chosen):
        # refused: the refusal names the best score a lower target would ship, a whole judge's figure
        _judge_best_in_full(
            tries, judged_models, evals, reference, classifier_outputs, groups, q.flavour.qdq_as_written
        )
    shutil.copyfile(chosen, out)
    lat: dict[str, Any] = {"status": "skipped", "reason": "no latency feeds"}
    if latency_feeds is not None:
        as_written = q.flavour.qdq_as_written
        lat = {
            "fp32": analysis.measure_latency(q.float_model, latency_feeds, warmup=2, iters=latency_iters),
            "int8_naive": analysis.measure_latency(
                naive, latency_feeds, warmup=2, iters=latency_iters, qdq_as_written=as_written
            ),
        }
        if chosen != naive:
            lat["int8_final"] = analysis.measure_latency(
                chosen, latency_feeds, warmup=2, iters=latency_iters, qdq_as_written=as_written
            )
        else:
            lat["int8_final"] = lat["int8_naive"]
        lat["fallback_cost"] = lat["int8_final"]["p50_ms"] / max(lat["int8_naive"]["p50_ms"], 1e-9)
    return FallbackResult(
        model=out,
        excluded=excluded,
        tries=tries,
        sensitivity=sensitivity[:20],
        met=bool(final["met"]),
        target=accuracy_target,
        latency=lat,
        final=final,
        candidates=len(candidates),
        choice=choice,
        stop=stop,
        probe=probe,
        start=start,
    )


class FamilySearch:
    """Both families' tries, shared budget: which sizes failed, which passed, and the models made."""

    def __init__(
        self,
        attempt: Callable[..., tuple[bool, Path]],
        pinned: dict[str, str],
        sensitivity: list[dict[str, Any]],
        candidates: list[str],
        budget_left: Callable[[], bool],
        families: tuple[str, ...] = ("sensitivity", "prefix"),
    ) -> None:
        self.attempt, self.pinned, self.sensitivity, self.candidates = attempt, pinned, sensitivity, candidates
        self.budget_left = budget_left
        self.families = families
        self.models: dict[tuple[str, int], Path] = {}
        self.failed: dict[str, int] = {"sensitivity": 0, "prefix": 0}  # the largest k that failed
        self.passed: dict[str, int] = {}  # the smallest k that passed
        self.results: dict[tuple[str, int], bool] = {}  # (family, k) -> passed, for the sizes tried
        # undecided nodes -> why bisecting on cannot pay (quantize_with_fallback's ``settled``); per family, why it did
        self.settled: Callable[[list[str]], str | None] | None = None
        self.settled_why: dict[str, str] = {}

    def float_set(self, family: str, k: int) -> dict[str, str]:
        """Node -> why, for the ``k`` nodes of ``family`` kept float (on top of the pinned ones)."""
        if family == "prefix":
            why = f"INT8 float prefix: the first {k} quantized nodes stay float (one float -> INT8 boundary)"
            return {**self.pinned, **{n: why for n in self.candidates[:k]}}
        return {**self.pinned, **{r["node"]: sensitive_why(r) for r in self.sensitivity[:k]}}

    def _same(self, k: int) -> bool:
        return set(self.float_set("prefix", k)) == set(self.float_set("sensitivity", k))

    def _try(self, family: str, k: int) -> bool:
        twin = ("sensitivity", k)
        if (family, k) in self.results:  # tried before (a prefix-first search, then both families)
            return self.results[(family, k)]
        if family == "prefix" and twin in self.results and self._same(k):
            ok = self.results[twin]  # the same float set was tried as the sensitivity family's: no new try
            self.models[(family, k)] = self.models[twin]
        else:
            ok, self.models[(family, k)] = self.attempt(k, self.float_set(family, k), family)
            self.results[(family, k)] = ok
        if ok:
            self.passed[family] = min(k, self.passed.get(family, k))
        else:
            self.failed[family] = max(k, self.failed[family])
        return ok

    def grow_both(self, first: int = 1) -> str | None:
        """k = ``first``, doubled: both families at each size (sensitivity first) until one passes; which did.
        A passing ``first`` is narrowed down by :meth:`bisect` from zero, as a passing 1 would be from zero."""
        last = len(self.sensitivity)
        k = max(1, min(first, last))
        while self.budget_left() and k <= last:
            for family in self.families:
                if k <= self.failed[family]:  # a larger set of this family failed already (prefix first)
                    continue
                if self.budget_left() and self._try(family, k):
                    return family
            if k == last:
                return None
            k = min(2 * k, last)
        return None

    def grow(self, family: str, limit: int | None = None, first: int = 1) -> None:
        """Double ``family``'s size from its largest failing one (or from ``first``) until it passes, the budget
        ends, or (with ``limit``) that many nodes failed."""
        last = len(self.candidates) if limit is None else min(limit, len(self.candidates))
        k = max(first, 2 * self.failed[family])
        while family not in self.passed and self.budget_left() and self.failed[family] < last:
            k = min(k, last)
            self._try(family, k)
            k *= 2

    def bisect(self, family: str) -> None:
        """Between ``family``'s largest failing and smallest passing size, within the budget, until
        :attr:`settled` says the nodes still undecided cannot pay for another try."""
        while family in self.passed and self.passed[family] - self.failed[family] > 1 and self.budget_left():
            if self.settled is not None:
                failing = self.float_set(family, self.failed[family])
                why = self.settled([n for n in self.float_set(family, self.passed[family]) if n not in failing])
                if why:
                    self.settled_why[family] = why
                    return
            self._try(family, (self.failed[family] + self.passed[family]) // 2)

    def choose(self, won: str, timer: Timer | None) -> tuple[str, int, dict[str, Any]]:
        """The (family, k) to ship and a note of why: the first family to pass, unless the other passed too and
        ``timer`` measured it faster by :data:`SPEED_MARGIN`."""
        first = (won, self.passed[won])
        other = [(f, k) for f, k in self.passed.items() if f != won and self.models[(f, k)] != self.models[first]]
        if timer is None or not other:
            return first[0], first[1], {"rule": "first family to pass", "family": won, "float_nodes": first[1]}
        pair = [first, other[0]]
        ms = timer([self.models[fk] for fk in pair])
        rows = [{"family": f, "float_nodes": k, "p50_ms": round(t, 3)} for (f, k), t in zip(pair, ms)]
        if max(ms) < MIN_MS:
            why = f"both families passed; both run under {MIN_MS:g} ms, too short to tell apart: the first to pass"
            return first[0], first[1], {"rule": why, "family": won, "float_nodes": first[1], "measured": rows}
        faster = ms[1] * (1 + SPEED_MARGIN) <= ms[0]
        pick = pair[1] if faster else pair[0]
        why = (
            f"both families passed; the {pick[0]} set ran faster on this CPU (measured side by side, one thread)"
            if faster
            else f"both families passed; the {pick[0]} set passed first and the other was not >= {SPEED_MARGIN:.0%} "
            "faster (measured side by side, one thread)"
        )
        return pick[0], pick[1], {"rule": why, "family": pick[0], "float_nodes": pick[1], "measured": rows}


def predicted_first_size(ranked: Sequence[dict[str, Any]], all_int8: dict[str, Any], target: float) -> dict[str, Any]:
    """The float-set size the ranked search starts at: the largest power of two at or under the size the ranking
    predicts will pass (1 where it predicts nothing). Returns ``{"size", "predicted", "why"}``.

    Each ranked row's ``output_error`` is the relative error at the model outputs with that node alone quantized
    (:func:`layer_sensitivity`). Independent errors add in variance, so keeping the ``k`` worst float leaves the
    share ``R_k`` of the summed squared errors; a top-1 disagreement grows in proportion to the output error (a
    cosine's ``1 - cos`` with its square). The all-INT8 try's miss ``1 - score`` must shrink to ``1 - target``:
    ``R_k <= ((1 - target) / (1 - score)) ** 2`` (top-1) or ``(1 - target) / (1 - score)`` (cosine). Starting
    there, on the doubling ladder's sizes, skips only sizes the ranking says hold too little of the error; a
    start that passes is bisected down as before, so a wrong prediction costs tries, never the smallest set.
    A one-pass ranking (``sqnr_db``: each node's own output error, not the model's) predicts nothing.
    """
    none = {"size": 1, "predicted": None, "why": ""}
    errors = [row.get("output_error") for row in ranked]
    if not ranked or "sqnr_db" in ranked[0] or not all(isinstance(e, float) and math.isfinite(e) for e in errors):
        return none
    miss, allowed = 1.0 - float(all_int8["score"]), 1.0 - target
    squares = np.square(np.asarray(errors, dtype=np.float64))
    total = float(squares.sum())
    if miss <= allowed or total <= 0.0 or allowed <= 0.0:
        return none
    ratio = allowed / miss
    left = ratio**2 if all_int8.get("metric") == "top1_agreement" else ratio  # R_k allowed
    share = np.cumsum(squares) / total
    predicted = int(np.searchsorted(share, 1.0 - left - 1e-12)) + 1  # the fewest nodes holding 1 - left of it
    predicted = min(predicted, len(ranked))
    size = 1 << (predicted.bit_length() - 1)
    why = (
        f"the {predicted} most sensitive nodes hold {share[predicted - 1]:.0%} of the summed squared single-node "
        f"output error, the share the all-INT8 miss ({all_int8['metric']} {all_int8['score']:.4f} against "
        f"{target}) asks to remove: sizes start at {size}"
    )
    return {"size": size, "predicted": predicted, "why": why}


def _judge_best_in_full(
    tries: list[dict[str, Any]],
    models: Sequence[Path],
    evals: Sequence[dict[str, np.ndarray]],
    reference: Sequence[dict[str, np.ndarray]],
    classifier_outputs: Sequence[str],
    groups: Sequence[int] | None,
    qdq_as_written: bool,
) -> None:
    """For a search whose model is refused (no try met the target, or the one that did kept no INT8 compute):
    where every try that missed the target with INT8 compute left (and no veto) was stopped early, judge the best
    of them on every sample, in place. A score from part of the samples is no target a rebuild could meet, and
    the refusal offers a lower target only from a whole judge's score.

    Raises:
        StageError: ONNX Runtime cannot run the model.
    """
    int8 = [i for i, t in enumerate(tries) if not t["met"] and t.get("int8_compute") and "vetoed" not in t]
    if not int8 or any("judged_samples" not in tries[i] for i in int8):
        return
    best = max(int8, key=lambda i: tries[i]["score"])
    outputs = analysis.run_model(models[best], evals, qdq_as_written=qdq_as_written)
    score = analysis.accuracy(reference, outputs, classifier_outputs, groups)
    row = tries[best]
    row.pop("judged_samples")
    row.pop("samples", None)  # as a row judged whole the first time
    row.update(score=score["score"], judged_in_full="after the search: the best try stopped early, for the refusal")


def sensitive_why(row: dict[str, Any]) -> str:
    """Why a ranked node stays float: what its quantization cost where it was ranked."""
    err = row.get("output_error")
    if "sqnr_db" in row:  # ranked in one pass (precision/layer_error.py): the node's own output error
        figure = "not measurable" if err is None else f"{err:.3g} relative error (SQNR {row['sqnr_db']} dB)"
        return f"INT8 sensitive: this {row['op']}'s own output on the calibration batches: {figure}"
    return f"INT8 sensitive: quantizing this {row['op']} alone gives {err:.3g} relative output error"


def _samples(batches: Sequence[dict[str, np.ndarray]]) -> int:
    return sum(len(next(iter(b.values()))) if b else 0 for b in batches)


def _budget_word(out_of_time: bool) -> str:
    return "time" if out_of_time else "tries"


def _try_line(row: dict[str, Any]) -> str:
    veto = f" ({row['vetoed']})" if "vetoed" in row else ""
    score = f"{row['metric']} {row['score']:.4f}{veto}{analysis.stopped_early(row)}"
    which = f" ({row['family']})" if row.get("family") else ""
    return f"INT8 fallback try {row['try']}: {row['float_nodes']} node(s) in float{which}, {score}"
