"""Early layers kept float where that is *faster* on the CPU the INT8 model is built for: measured, not assumed.

ONNX Runtime's INT8 convolution is not faster for every layer. A network's first convolution reads the image
(3 channels): its INT8 kernel cannot use the wide dot-product instructions that make the rest fast, and the
input needs its own QuantizeLinear and an NCHW -> NHWC transpose. On EfficientNet-Lite0 (one thread) keeping the
stem and the first depthwise conv float made the whole model 2.02x FP32 instead of 1.82x all-INT8
(bench/int8_cnn_float_prefix.json). Those two layers are also the most sensitive to rounding, so the float
prefix is more accurate as well as faster.

So once the accuracy search has found the model it would ship, the precision stage quantizes that model with
its first ``k`` remaining quantized nodes also float (``k`` = 0 .. :data:`MAX_PREFIX`), times each on one
thread, the models interleaved round by round, and keeps the fastest prefix when it beats the shipped model by
at least :data:`MARGIN` in the median round; that model ships only after the same held-out judge passes it. A
model the search already ships with the first :data:`MAX_PREFIX` quantized nodes float (a float prefix, the cpu
search's usual fallback) is not probed at all. A model whose INT8 run takes under :data:`MIN_MS` is not probed
(its few percent would be timer noise). Only where the model runs on this host's kind of kernels (the
onnxruntime CPU target); a TensorRT target's kernels are not this CPU's, so nothing is measured there and
nothing is kept float for speed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy.onnxtools.ort import ort_session

if TYPE_CHECKING:
    from edgedeploy.precision.quantize import Quantizer

MAX_PREFIX = 3  # the stem and the first block: where INT8 kernels lose to float, if anywhere
MARGIN = 0.03  # a float prefix must be >= 3 % faster than all-INT8 in the median round (timing noise)
MIN_MS = 1.0  # all-INT8 faster than this: a few percent of it is timer noise, not a saving worth a float layer


@dataclass
class SpeedProbe:
    """What the probe measured and which nodes it keeps float (node -> why). ``measured`` rows carry their
    figures under timing keys (``p50_ms``, ``latency_ratio_vs_all_int8``): in the report, not in precision.json."""

    status: str  # "measured" or "skipped"
    why: str
    kept: dict[str, str] = field(default_factory=dict)
    measured: list[dict[str, Any]] = field(default_factory=list)

    def plan(self) -> dict[str, Any]:
        """The precision.json entry."""
        return {"status": self.status, "why": self.why, "kept": list(self.kept), "measured": self.measured}

    def declined(self, why: str) -> SpeedProbe:
        """This probe's measurements with nothing kept float, and why (its faster model missed the target)."""
        return dataclasses.replace(self, why=why, kept={})


def skipped(why: str) -> SpeedProbe:
    """A probe that measured nothing (the reason is reported in precision.json)."""
    return SpeedProbe(status="skipped", why=why)


def interleaved_p50(
    runs: Mapping[str, Callable[[], Any]], *, rounds: int, iters: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Per-round p50 milliseconds of each callable, the callables taking turns round by round (so a change in
    machine load hits all of them alike)."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                run()
                times.append((time.perf_counter() - t0) * 1e3)
            per_round[name].append(float(np.median(times)))
    return per_round


def one_thread_run(model: Path, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
    """One inference of ``model`` on ``feeds`` in a one-thread ONNX Runtime session (opened now), as a callable.

    Raises:
        StageError: ONNX Runtime cannot load ``model``.
    """
    session = ort_session(model, threads=1, stage="precision")
    names = [o.name for o in session.get_outputs()]
    return lambda: session.run(names, feeds)


def probe_when_set(
    enabled: bool,
    q: Quantizer,
    batches: Sequence[dict[str, np.ndarray]],
    shipped: Sequence[str],
    order: Sequence[str],
    *,
    runtime: str,
    log: Callable[[str], None] | None = None,
) -> SpeedProbe:
    """``precision.float_when_faster``, asked of the model the accuracy search would ship (``shipped``: its float
    nodes; ``order``: the all-INT8 model's quantized nodes in graph order): the next quantized nodes that run
    faster in float on this CPU (measured), or a skipped probe saying why nothing was measured (turned off; the
    runtime's INT8 kernels are not this CPU's; the search already keeps the first :data:`MAX_PREFIX` quantized
    nodes float, so no shorter float prefix is left to time).

    Raises:
        StageError: a quantization or an ONNX Runtime session fails (named in the message).
    """
    if not enabled:
        return skipped("precision.float_when_faster = false")
    if not q.flavour.host_cpu_kernels:
        return skipped(f"{runtime}: its INT8 kernels are not this CPU's, so speed is not measured here")
    first = list(order[:MAX_PREFIX])
    if first and set(first) <= set(shipped):
        return skipped(
            f"the accuracy search already keeps the first {len(first)} quantized node(s) float: no float prefix "
            "left to time"
        )
    return probe_float_prefix(q, batches, batches[0], pinned=shipped, log=log)


def probe_float_prefix(
    q: Quantizer,
    batches: Sequence[dict[str, np.ndarray]],
    feeds: dict[str, np.ndarray],
    *,
    pinned: Sequence[str] = (),
    max_prefix: int = MAX_PREFIX,
    margin: float = MARGIN,
    rounds: int = 7,
    iters: int = 10,
    log: Callable[[str], None] | None = None,
) -> SpeedProbe:
    """Time the model with its first ``k`` quantized nodes (graph order) in float, ``k`` = 0 .. ``max_prefix``,
    and keep the fastest prefix if it beats all-INT8 by ``margin`` in the median round.

    Timing models only: they are quantized without weight rounding or bias correction (neither changes the
    graph, so neither changes speed). ``pinned`` nodes are float in every model.

    Raises:
        StageError: a quantization or an ONNX Runtime session fails (named in the message).
    """
    import onnx

    from edgedeploy.precision.analysis import QDQ_COMPUTE_OPS, quantized_nodes

    plain = dataclasses.replace(q, bias_means=None, output_bias_correction=False, weight_codes=None)
    models: dict[int, Path] = {0: plain.quantize(q.workdir / "speed0.int8.onnx", batches, exclude=list(pinned))}
    proto = onnx.load(str(models[0]))
    order = quantized_nodes(proto)
    if not order:
        return skipped("no quantized node to time")
    # a prefix may not reach the last INT8 compute node: all of them float is an FP32 model, not a faster INT8 one
    ops = {n.name: n.op_type for n in proto.graph.node}
    computing = [i for i, name in enumerate(order) if ops.get(name) in QDQ_COMPUTE_OPS]
    if not computing or computing[-1] == 0:
        return skipped("keeping the first quantized node float would leave no INT8 compute")
    runs = {"0": one_thread_run(models[0], feeds)}
    all_int8_ms = interleaved_p50(runs, rounds=1, iters=iters)["0"][0]
    if all_int8_ms < MIN_MS:
        probe = skipped(f"all-INT8 runs under {MIN_MS:g} ms: too short for a float prefix to save measurable time")
        probe.measured = [{"float_nodes": 0, "nodes": [], "p50_ms": round(all_int8_ms, 3)}]
        return probe
    for k in range(1, min(max_prefix, computing[-1]) + 1):
        models[k] = plain.quantize(q.workdir / f"speed{k}.int8.onnx", batches, exclude=[*pinned, *order[:k]])
        runs[str(k)] = one_thread_run(models[k], feeds)
    per_round = interleaved_p50(runs, rounds=rounds, iters=iters)
    measured: list[dict[str, Any]] = []
    for k in models:
        ratios = [a / b for a, b in zip(per_round["0"], per_round[str(k)])]
        measured.append(
            {
                "float_nodes": k,
                "nodes": list(order[:k]),
                "p50_ms": round(float(np.median(per_round[str(k)])), 3),
                "latency_ratio_vs_all_int8": round(float(np.median(ratios)), 3),
            }
        )
    best = max(measured, key=lambda row: (row["latency_ratio_vs_all_int8"], -row["float_nodes"]))
    if log:
        log("INT8 speed probe (one thread): " + ", ".join(
            f"{row['float_nodes']} float {row['p50_ms']:.2f} ms" for row in measured))  # fmt: skip
    if best["float_nodes"] == 0 or best["latency_ratio_vs_all_int8"] < 1 + margin:
        return SpeedProbe(
            status="measured",
            why=f"no float prefix of up to {len(models) - 1} nodes is {margin:.0%} faster than all-INT8 here",
            measured=measured,
        )
    # no figures in the reasons: precision.json is hashed into the bundle and keeps no timings (stable_json
    # drops the *_ms / latency* keys); the report keeps them in ``measured``
    why = (
        f"faster in float on this CPU: the first {best['float_nodes']} quantized node(s) float beat all-INT8 by "
        f">= {margin:.0%} (measured, one thread)"
    )
    return SpeedProbe(status="measured", why=why, kept={n: why for n in best["nodes"]}, measured=measured)


def side_by_side_timer(
    feeds: dict[str, np.ndarray], *, rounds: int = 7, iters: int = 10
) -> Callable[[Sequence[Path]], list[float]]:
    """A timer for :func:`edgedeploy.precision.fallback.quantize_with_fallback`: the median over ``rounds`` of
    each model's p50 milliseconds on ``feeds``, one thread, the models taking turns round by round.

    Raises:
        StageError: a model cannot be loaded by ONNX Runtime (from the timer, when called).
    """

    def timer(models: Sequence[Path]) -> list[float]:
        runs = {str(i): one_thread_run(m, feeds) for i, m in enumerate(models)}
        per_round = interleaved_p50(runs, rounds=rounds, iters=iters)
        return [float(np.median(per_round[str(i)])) for i in range(len(models))]

    return timer


# a bisection's stop rule (:func:`undecided_too_small`) times FP32 against all-INT8 this often (one thread)
SPEEDUP_ROUNDS = 3
SPEEDUP_ITERS = 5


def undecided_too_small(
    float_model: Path, feeds: dict[str, np.ndarray], *, margin: float = MARGIN
) -> Callable[[Sequence[str], Path], str | None]:
    """A stop rule for the fallback search's bisection where the artifact runs on this CPU: ``rule(undecided,
    int8_model)`` says why bisecting on cannot change the shipped model's speed measurably, or None.

    The nodes still undecided (in the smallest passing float set, not in the largest failing one) are the most
    a further try could give back to INT8. Their share of the model's multiply-adds times ``(s - 1)``, ``s``
    the measured FP32 / all-INT8 speed-up (``int8_model``, one thread, timed once), bounds what that would save
    relative to the all-INT8 model; under ``margin`` (the timing-noise margin) no try can ship a measurably
    faster model. No rule where the shares are unknown, or the model runs under :data:`MIN_MS` (timer noise).

    Raises:
        StageError: ONNX Runtime cannot load a model (from the rule, when first called).
    """
    from edgedeploy.onnxtools.macs import multiply_add_shares

    known: dict[str, Any] = {}

    def rule(undecided: Sequence[str], int8_model: Path) -> str | None:
        if "shares" not in known:
            known["shares"] = multiply_add_shares(float_model)
        shares: dict[str, float] = known["shares"]
        if not shares:
            return None
        if "speedup" not in known:
            fp32_ms, int8_ms = side_by_side_timer(feeds, rounds=SPEEDUP_ROUNDS, iters=SPEEDUP_ITERS)(
                [float_model, int8_model]
            )
            known["speedup"] = fp32_ms / int8_ms if int8_ms >= MIN_MS else None
        speedup = known["speedup"]
        share = sum(shares.get(node, 0.0) for node in undecided)
        if speedup is None or share * max(speedup - 1.0, 0.0) >= margin:
            return None
        # no measured figure in the reason: precision.json, where it lands, is hashed and keeps no timings
        return (
            f"the {len(undecided)} node(s) still undecided hold {share:.1%} of the multiply-adds: in INT8 they "
            f"could not make the model {margin:.0%} faster here (the timing margin), at its measured INT8 speed-up"
        )

    return rule
