"""Divergence localization: the first layer where an ONNX candidate departs from the PyTorch model.

How it works:

1. The PyTorch model runs once on the failing inputs with forward pre-/post-hooks on every module,
   which record each call (module name, parent call, n-th call under that parent) and its output.
2. Every ONNX node is mapped to the module call that made it from the scope the exporter recorded
   in the node name (``/layer1/layer1.0/conv1/Conv`` -> ``layer1.0.conv1``; a second call of a
   shared module appears as ``relu_1``).
3. A module call's *boundary* is the one tensor its nodes produce that leaves its scope. Modules that
   left no node (BatchNorm folded into the Conv before it, Dropout, Identity) are aliases of the
   boundary before them: the boundary matches whichever of those outputs it is closest to.
4. The boundary tensors, in topological order, are exposed as extra graph outputs of the candidate
   model and run in ONNX Runtime, in bisecting chunks (first half, then half of the rest, ...), until a
   chunk holds a departed tensor: relative L2 error above the precision's threshold, or NaN / Inf.
   The first departed boundary is reported as ``ONNX node -> PyTorch module`` with its error, next to
   the last boundary before it that still agreed.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Relative L2 error (||cand - ref|| / ||ref||) above which a tensor has departed from the reference.
DEPARTURE_REL_L2: dict[str, float] = {"fp32": 1e-3, "fp16": 3e-2, "int8": 0.25}
_SHARED_CALL = re.compile(r"^(.+)_(\d+)$")
_DYNAMO_SCOPES = "pkg.torch.onnx.name_scopes"
_PASS_THROUGH = ("QuantizeLinear", "DequantizeLinear", "Cast")


@dataclass
class CallRecord:
    """One call of one module during the reference forward pass."""

    index: int
    module: str
    parent: int | None
    local: int  # n-th call of this module under the same parent call
    depth: int
    output: np.ndarray | None = None
    done: int = -1  # completion order
    leaf: bool = True


@dataclass
class Boundary:
    tensor: str
    node: str
    op: str
    position: int
    record: CallRecord
    aliases: list[CallRecord] = field(default_factory=list)  # outputs folded into this tensor (BatchNorm ...)
    before: list[CallRecord] = field(default_factory=list)  # modules fused into this node from before it
    owner: str | None = None  # module whose parameters the node's initializers are named after

    @property
    def module(self) -> str:
        """The module to blame: the one owning the node's weights, else the one whose scope made it."""
        return self.owner or self.record.module

    @property
    def fused(self) -> list[str]:
        names = [r.module for r in [*self.before, self.record, *self.aliases]]
        return [n for n in dict.fromkeys(names) if n != self.module]


def record_calls(model: Any, cfg: Any, feeds: dict[str, np.ndarray]) -> list[CallRecord]:
    """Run ``model`` on ``feeds`` with hooks on every module; one record per module call, in call order."""
    import torch

    from edgedeploy.modelio.torchutil import flatten as _flatten

    records: list[CallRecord] = []
    stack: list[int] = []
    counts: dict[tuple[int | None, str], int] = {}
    completed = [0]
    leaves = {name for name, m in model.named_modules() if not any(True for _ in m.children())}

    def pre(name: str) -> Any:
        def hook(_module: Any, _args: Any) -> None:
            parent = stack[-1] if stack else None
            key = (parent, name)
            local = counts.get(key, 0)
            counts[key] = local + 1
            depth = records[parent].depth + 1 if parent is not None else 0
            records.append(CallRecord(len(records), name, parent, local, depth, leaf=name in leaves))
            stack.append(len(records) - 1)

        return hook

    def post(name: str) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            rec = records[stack.pop()]
            flat = _flatten(output)
            if len(flat) == 1 and isinstance(flat[0], torch.Tensor) and flat[0].is_floating_point():
                rec.output = flat[0].detach().float().cpu().numpy().copy()
            rec.done = completed[0]
            completed[0] += 1

        return hook

    handles = []
    try:
        for name, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(pre(name)))
            handles.append(module.register_forward_hook(post(name)))
        from edgedeploy.modelio.torchutil import torch_args

        with torch.inference_mode():
            model(*torch_args(cfg, feeds))
    finally:
        for h in handles:
            h.remove()
    return records


def scope_of(node: Any) -> list[str]:
    """The module scope path the TorchScript exporter recorded in ``node``'s name (empty for top-level ops)."""
    name = node.name or ""
    if not name.startswith("/"):
        return []
    return [p for p in name.split("/")[1:-1] if p]


def dynamo_scopes(node: Any) -> list[str] | None:
    """Qualified module names the dynamo exporter recorded for ``node`` (None when it recorded none)."""
    for prop in node.metadata_props:
        if prop.key == _DYNAMO_SCOPES:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return None
            return [str(s) for s in scopes[1:-1]]  # drop the root ('') and the fx node's own name
    return None


def _child(prefix: str, component: str, modules: set[str]) -> tuple[str, int] | None:
    """Qualified module name and call index for one scope component under ``prefix``."""
    options = [(component, 0)]
    shared = _SHARED_CALL.match(component)
    if shared:
        options.append((shared.group(1), int(shared.group(2))))
    for name, call in options:
        # the exporter writes numbered children with their parent's name: layer1.0, downsample.0
        for attr in (name, name.rsplit(".", 1)[-1]):
            qualified = f"{prefix}.{attr}" if prefix else attr
            if qualified in modules:
                return qualified, call
    return None


class _CallTree:
    def __init__(self, records: list[CallRecord], modules: set[str]) -> None:
        self.records = records
        self.modules = modules
        self.children: dict[tuple[int, str], list[CallRecord]] = {}
        self.runs: dict[tuple[int, str], int] = {}
        for rec in records:
            if rec.parent is not None:
                self.children.setdefault((rec.parent, rec.module), []).append(rec)

    def resolve(self, scope: list[str]) -> CallRecord:
        """The deepest module call the scope path resolves to (the root call when none does)."""
        current = self.records[0]
        for component in scope:
            found = _child(current.module, component, self.modules)
            if found is None:
                break
            calls = self.children.get((current.index, found[0]), [])
            if found[1] >= len(calls):
                break
            current = calls[found[1]]
        return current

    def resolve_qualified(self, names: list[str], previous: list[CallRecord]) -> list[CallRecord]:
        """Record path for a dynamo scope list; consecutive nodes in one module scope share its call.

        The dynamo exporter records no call index, so a module's n-th run of consecutive nodes
        (in topological order, which follows execution order) is taken as its n-th call.
        """
        path: list[CallRecord] = []
        parent = self.records[0]
        for depth, name in enumerate(n for n in names if n in self.modules):
            prev = previous[depth] if depth < len(previous) else None
            if prev is not None and prev.module == name and prev.parent == parent.index:
                rec = prev
            else:
                key = (parent.index, name)
                run = self.runs.get(key, 0)
                self.runs[key] = run + 1
                calls = self.children.get(key, [])
                if run >= len(calls):
                    break
                rec = calls[run]
            path.append(rec)
            parent = rec
        return path


def find_boundaries(graph: Any, records: list[CallRecord], modules: set[str]) -> list[Boundary]:
    """Module-call boundaries of ``graph`` in topological order (one per tensor, deepest module wins)."""
    tree = _CallTree(records, modules)
    by_index = {r.index: r for r in records}
    members: dict[int, list[int]] = {}
    previous: list[CallRecord] = []
    for i, node in enumerate(graph.node):
        names = dynamo_scopes(node)
        if names is not None:
            previous = tree.resolve_qualified(names, previous)
            rec = previous[-1] if previous else records[0]
        else:
            rec = tree.resolve(scope_of(node))
        while rec.parent is not None:  # the node belongs to its call and every enclosing call
            members.setdefault(rec.index, []).append(i)
            rec = by_index[rec.parent]
    consumers: dict[str, set[int]] = {}
    producer = {t: i for i, node in enumerate(graph.node) for t in node.output}
    for i, node in enumerate(graph.node):
        for t in node.input:
            consumers.setdefault(t, set()).add(i)
    graph_outputs = {o.name for o in graph.output}
    weights = _weight_inputs(graph)
    chosen: dict[str, Boundary] = {}
    for rec_index, nodes in members.items():
        rec = by_index[rec_index]
        if rec.output is None:
            continue
        inside = set(nodes)
        leaving = [
            (i, t)
            for i in nodes
            for t in graph.node[i].output
            if t and (t in graph_outputs or consumers.get(t, set()) - inside)
        ]
        if len(leaving) != 1:
            continue
        i, tensor = leaving[0]
        old = chosen.get(tensor)
        if old is None or rec.depth > old.record.depth:
            node = graph.node[i]
            # name the compute node, not the Quantize/Dequantize/Cast pair a converter put after it
            while node.op_type in _PASS_THROUGH and node.input and node.input[0] in producer:
                node = graph.node[producer[node.input[0]]]
            owners = [w.rsplit(".", 1)[0] for n in node.input for w in weights.get(n, ())]
            owner = next((o for o in owners if o in modules), None)
            chosen[tensor] = Boundary(tensor, node.name, node.op_type, i, rec, owner=owner)
    order = sorted(records, key=lambda r: r.done)
    # leaves with no node of their own and no weights in the graph were folded into a neighbour
    owned = {w.rsplit(".", 1)[0] for node in graph.node for n in node.input for w in weights.get(n, ())}
    vanished = {r.index for r in records if r.index not in members and r.leaf and r.module not in owned}
    for b in chosen.values():
        for r in order[b.record.done + 1 :]:
            if r.index not in vanished:
                break
            if r.output is not None:
                b.aliases.append(r)
        for r in reversed(order[: b.record.done]):
            if r.index not in vanished:
                break
            b.before.insert(0, r)
    return sorted(chosen.values(), key=lambda b: b.position)


def _weight_inputs(graph: Any) -> dict[str, tuple[str, ...]]:
    """Tensor name -> the initializer(s) it is made of: itself, or those behind a DequantizeLinear / Cast.

    Lets ``layer1.0.conv1.weight_quantized -> DequantizeLinear -> Conv`` (INT8 QDQ) name its module
    like a plain ``layer1.0.conv1.weight`` initializer does.
    """
    out: dict[str, tuple[str, ...]] = {t.name: (t.name,) for t in graph.initializer}
    for node in graph.node:
        if node.op_type in ("DequantizeLinear", "Cast") and node.input and node.input[0] in out:
            out.update({o: out[node.input[0]] for o in node.output})
    return out


def tensor_error(ref: np.ndarray, cand: np.ndarray) -> dict[str, Any]:
    """Relative L2 error, max abs error, cosine and non-finite count of ``cand`` against ``ref``."""
    c = cand.astype(np.float64)
    r = ref.astype(np.float64)
    bad = int((~np.isfinite(c)).sum())
    finite = np.isfinite(c)
    d = np.where(finite, c - r, 0.0)
    ref_norm = float(np.linalg.norm(r))
    cand_norm = float(np.linalg.norm(np.where(finite, c, 0.0)))
    rel = float(np.linalg.norm(d)) / max(ref_norm, 1e-12)
    cos = float((r.ravel() @ np.where(finite, c, 0.0).ravel()) / max(ref_norm * cand_norm, 1e-30))
    return {"rel_l2": rel, "max_abs": float(np.abs(d).max()) if d.size else 0.0, "cosine": cos, "non_finite": bad}


def _best_error(boundary: Boundary, cand: np.ndarray) -> tuple[dict[str, Any] | None, str]:
    """Error against the closest of the boundary's reference outputs (its own or a folded module's)."""
    best: tuple[dict[str, Any] | None, str] = (None, "")
    for rec in [boundary.record, *boundary.aliases]:
        if rec.output is None or rec.output.shape != cand.shape:
            continue
        err = tensor_error(rec.output, cand)
        if best[0] is None or err["rel_l2"] < best[0]["rel_l2"]:
            best = (err, rec.module)
    return best


def _probe_session(model: Any, names: list[str]) -> Any:
    import onnx
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(probe.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])


def localize(
    onnx_path: str | Path,
    model: Any,
    cfg: Any,
    feeds: dict[str, np.ndarray],
    *,
    precision: str = "fp32",
    threshold: float | None = None,
) -> dict[str, Any]:
    """Find the first module boundary where the ONNX model at ``onnx_path`` departs from ``model``.

    Args:
        onnx_path: the candidate ONNX model (FP32, FP16 or QDQ INT8) exported from ``model``.
        model: the PyTorch reference module (eval mode, weights loaded).
        cfg: the DeployConfig (input order and names).
        feeds: the inputs on which the candidate failed.
        precision: selects the departure threshold (:data:`DEPARTURE_REL_L2`).
        threshold: relative L2 error above which a tensor departs (overrides the precision's).

    Returns a JSON-able dict: ``status`` (``localized`` or ``not localized``), ``onnx_node``,
    ``onnx_tensor``, ``op``, ``module`` (with ``call`` index and ``folded`` modules), ``error``,
    ``previous`` (the last boundary that still agreed), ``boundaries`` and ``probes`` counts.
    """
    import onnx

    limit = threshold if threshold is not None else DEPARTURE_REL_L2[precision]
    proto = onnx.load(str(onnx_path))
    records = record_calls(model, cfg, feeds)
    modules = {name for name, _ in model.named_modules()}
    boundaries = find_boundaries(proto.graph, records, modules)
    base = {"threshold_rel_l2": limit, "boundaries": len(boundaries)}
    if not boundaries:
        return {
            **base,
            "status": "not localized",
            "probes": 0,
            "reason": "no ONNX node could be mapped to a PyTorch module (node names carry no module scopes)",
        }
    inputs = {i.name for i in proto.graph.input}
    run_feeds = {k: v for k, v in feeds.items() if k in inputs}
    errors: dict[int, tuple[dict[str, Any] | None, str]] = {}
    probes = 0
    lo, hi = 0, len(boundaries)
    found: int | None = None
    while lo < hi and found is None:
        mid = hi if hi - lo <= 2 else (lo + hi + 1) // 2
        names = [b.tensor for b in boundaries[lo:mid]]
        values = _probe_session(proto, names).run(names, run_feeds)
        probes += 1
        for i, value in zip(range(lo, mid), values):
            errors[i] = _best_error(boundaries[i], np.asarray(value))
        for i in range(lo, mid):
            err = errors[i][0]
            if err is not None and (err["non_finite"] or err["rel_l2"] > limit):
                found = i
                break
        lo = mid
    if found is None:
        return {
            **base,
            "status": "not localized",
            "probes": probes,
            "reason": f"no module boundary departs from PyTorch by more than rel L2 {limit:g} ({precision} threshold): "
            "the error builds up across layers or arises in ops outside any module",
        }
    b = boundaries[found]
    err, matched = errors[found]
    result = {
        **base,
        "status": "localized",
        "probes": probes,
        "onnx_node": b.node,
        "op": b.op,
        "onnx_tensor": b.tensor,
        "module": b.module,
        "call": b.record.local,
        "scope_module": b.record.module,
        "fused": b.fused,
        "compared_with": matched,
        "error": err,
    }
    prev = next((i for i in range(found - 1, -1, -1) if errors.get(i, (None, ""))[0] is not None), None)
    if prev is not None:
        result["previous"] = {
            "onnx_node": boundaries[prev].node,
            "module": boundaries[prev].module,
            "error": errors[prev][0],
        }
    return result


def describe(result: dict[str, Any]) -> str:
    """One line for messages: ``first divergence at ONNX node X -> module Y (rel L2 e)``."""
    if result.get("status") != "localized":
        return f"divergence not localized: {result.get('reason', 'unknown')}"
    err = result["error"]
    what = f"{err['non_finite']} non-finite values" if err["non_finite"] else f"rel L2 error {err['rel_l2']:.3g}"
    call = f" (call {result['call']})" if result.get("call") else ""
    fused = f" (fused with {', '.join(result['fused'])})" if result.get("fused") else ""
    return (
        f"first divergence at ONNX node {result['onnx_node']} -> PyTorch module "
        f"'{result['module']}'{call}{fused}: {what}, max abs {err['max_abs']:.3g}"
    )
