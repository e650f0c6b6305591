"""Operator preflight: which nodes of an ONNX model the target runtime cannot run, found on the host.

TensorRT targets are checked against op tables derived from onnx/onnx-tensorrt's
``docs/operators.md`` corrected by its importer sources (tools/gen_trt_op_tables.py) for the
TensorRT version the target ships (pure data, no TensorRT needed); the cpu target against ONNX
Runtime's CPU kernels by creating a session. Findings carry the node, its op, the PyTorch source location the exporter
recorded, a severity (error / warning / info) and a suggested fix.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgedeploy.errors import UnsupportedOpsError

if TYPE_CHECKING:
    from edgedeploy.targets import TargetProfile

SEVERITIES = ("error", "warning", "info")
_TABLE_FILE = re.compile(r"^trt-(\d+(?:\.\d+)*)\.json$")


@dataclass(frozen=True)
class Finding:
    """One preflight result for one node (or for the whole model when ``node`` is empty)."""

    node: str
    op: str
    severity: str
    message: str
    fix: str
    source: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


# ---- data ---------------------------------------------------------------------------


def _data(name: str) -> dict[str, Any]:
    return json.loads(resources.files("edgedeploy.targets").joinpath("data").joinpath(name).read_text(encoding="utf-8"))


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


@cache
def trt_table_versions() -> tuple[str, ...]:
    """TensorRT versions that have an op table, oldest first."""
    folder = resources.files("edgedeploy.targets").joinpath("data")
    found = [m.group(1) for p in folder.iterdir() if (m := _TABLE_FILE.match(p.name))]
    return tuple(sorted(found, key=_version_key))


@cache
def trt_table(version: str) -> dict[str, Any]:
    """The op table file for exactly ``version`` (e.g. ``"8.2"``)."""
    return _data(f"trt-{version}.json")


def table_for(trt_version: str) -> tuple[dict[str, Any] | None, str]:
    """The op table for a TensorRT version: the newest table not newer than it, and a note when inexact.

    Returns (None, reason) when every table is newer than ``trt_version``.
    """
    want = _version_key(trt_version)
    older = [v for v in trt_table_versions() if _version_key(v) <= want]
    if not older:
        return None, f"no op table for TensorRT {trt_version} (oldest is {trt_table_versions()[0]})"
    version = older[-1]
    note = ""
    if _version_key(version)[:1] != want[:1]:
        note = f"no op table for TensorRT {trt_version}; checked against TensorRT {version}, the newest table"
    return trt_table(version), note


# ---- source locations ------------------------------------------------------------------


def _frames(stack_trace: str) -> list[tuple[str, int]]:
    return [(f, int(n)) for f, n in re.findall(r'File "([^"]+)", line (\d+)', stack_trace)]


def node_source(node: Any, module_files: dict[str, str] | None = None) -> str:
    """Where in PyTorch code a node came from, as the exporter recorded it.

    dynamo exporter: ``pkg.torch.onnx.stack_trace`` (innermost frame outside torch, preferring the
    user's files over site-packages) plus the module path from ``namespace``. TorchScript exporter:
    the scope in the node name (``/layer1/layer1.0/conv1/Conv`` → ``layer1.0.conv1``), mapped to the
    module's defining file when ``module_files`` (module path → ``file:line``) is given.
    """
    meta = {p.key: p.value for p in node.metadata_props}
    trace = meta.get("pkg.torch.onnx.stack_trace", "")
    module = _module_from_namespace(meta.get("namespace", "")) or _module_from_scope(node.name)
    where = ""
    if trace:
        torch_dir = _torch_dir()
        frames = [(f, n) for f, n in _frames(trace) if not os.path.abspath(f).startswith(torch_dir)]
        user = [(f, n) for f, n in frames if "site-packages" not in f and "dist-packages" not in f]
        pick = (user or frames)[-1:] if (user or frames) else []
        if pick:
            where = f"{pick[0][0]}:{pick[0][1]}"
    if not where and module and module_files:
        where = module_files.get(module, "")
    if module and where:
        return f"{module} ({where})"
    return module or where


def _module_from_namespace(namespace: str) -> str:
    # ": pkg.ResNet/layer1: pkg.Sequential/layer1.0: pkg.BasicBlock/layer1.0.bn1: ...BatchNorm2d/bn: aten.bn"
    # entries after the root are "qualified module name: class"; the last one is the torch function
    parts = [p.split(":")[0].strip() for p in namespace.split("/")[1:]]
    return parts[-2] if len(parts) >= 2 else ""


def _module_from_scope(node_name: str) -> str:
    parts = [p for p in node_name.split("/") if p]
    return parts[-2] if len(parts) >= 2 else ""


def _torch_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    origin = spec.origin if spec and spec.origin else ""
    return os.path.dirname(os.path.abspath(origin)) + os.sep if origin else "\0"


def module_files(model: Any) -> dict[str, str]:
    """Module path → ``file:line`` of its class's forward (for TorchScript-exporter scope names)."""
    import inspect

    out = {}
    for name, mod in model.named_modules():
        if not name:
            continue
        try:
            fn = type(mod).forward
            out[name] = f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
        except (TypeError, OSError):
            continue
    return out


# ---- graph facts -----------------------------------------------------------------------


class _Graph:
    """Constant tensors, producers and symbolic shapes of a model's main graph."""

    def __init__(self, model: Any) -> None:
        import onnx

        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # shape inference is best effort here; the checker ran at export
            inferred = model
        g = inferred.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.constants = {i.name for i in g.initializer}
        self.constants |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
        self._constant_protos = {i.name: i for i in g.initializer}
        self._constant_protos |= {
            n.output[0]: a.t for n in g.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"
        }
        self.types: dict[str, Any] = {}
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            self.types[vi.name] = vi.type.tensor_type
        self.inputs = list(g.input)
        self.outputs = list(g.output)
        self.initializers = list(g.initializer)
        # Slice starts / ends: INT64_MAX / INT64_MIN there mean "to the end", which the parser clamps
        self.slice_bounds = {n.input[i] for n in g.node if n.op_type == "Slice" for i in (1, 2) if i < len(n.input)}

    def value(self, name: str) -> Any:
        """The numpy value of constant ``name`` (an initializer or a Constant node's tensor), None otherwise."""
        from onnx import numpy_helper

        proto = self._constant_protos.get(name)
        if proto is None:
            return None
        try:
            return numpy_helper.to_array(proto)
        except Exception:  # external data not loaded: not known here
            return None

    def is_dynamic(self, name: str) -> bool:
        t = self.types.get(name)
        if t is None or not t.HasField("shape"):
            return True
        return any(not d.HasField("dim_value") for d in t.shape.dim)


def _schema(op: str, opset: int, domain: str = "") -> Any:
    import onnx

    try:
        return onnx.defs.get_schema(op, opset, domain)
    except Exception:  # unknown op or domain
        return None


def _attr(node: Any, name: str) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return None


# ---- TensorRT --------------------------------------------------------------------------


def tensorrt_findings(
    model: Any,
    *,
    trt_version: str,
    dla: bool = False,
    precision: str = "fp32",
    module_paths: dict[str, str] | None = None,
    sm: str = "",
) -> list[Finding]:
    """Check every node against the op table of ``trt_version`` (no TensorRT needed).

    Errors: ops the table lists as unsupported or does not list, custom-domain ops, inputs
    that must be constant but are computed, attribute values outside the supported set, an
    opset above the parser's. Warnings: data-dependent output shapes, INT64 / DOUBLE tensors
    TensorRT narrows, experimental ops, and (with ``dla``) what DLA cannot run. Info: restrictions
    in the table that cannot be checked statically (one per op type).
    """
    table, note = table_for(trt_version)
    out: list[Finding] = []
    if note:
        out.append(Finding("", "", "warning", note, "add an op table for this TensorRT version (tools/)"))
    if table is None:
        return out
    rules = _data("op_rules.json")
    graph = _Graph(model)
    version = table["trt_version"]
    lo, hi = table["opset"]
    if graph.opset < lo:
        out.append(
            Finding(
                "",
                "",
                "error",
                f"model opset {graph.opset} is below what the TensorRT {version} ONNX parser reads (opset {lo}..{hi})",
                f"re-export with export.opset = {lo} or higher",
            )
        )
    if graph.opset > hi:
        out.append(
            Finding(
                "",
                "",
                "error",
                f"model opset {graph.opset} is above what the TensorRT {version} ONNX parser reads (opset {lo}..{hi})",
                f"re-export with export.opset = {hi} or lower",
            )
        )
    seen_info: set[str] = set()
    for node, nested in _all_nodes(model.graph):
        out.extend(_node_findings(node, table, rules, graph, seen_info, module_paths, nested=nested))
    out.extend(_type_findings(graph, table, rules))
    if dla:
        out.extend(dla_findings(model, graph, precision, module_paths, trt_version=version, sm=sm))
    return out


def _all_nodes(graph: Any, nested: bool = False) -> Any:
    """(node, inside a subgraph) for every node of ``graph`` and of the If / Loop / Scan bodies within, at any
    depth: the parser imports those bodies too."""
    import onnx

    for node in graph.node:
        yield node, nested
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g, True)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _all_nodes(g, True)


def _node_findings(
    node: Any,
    table: dict[str, Any],
    rules: dict[str, Any],
    graph: _Graph,
    seen_info: set[str],
    module_paths: dict[str, str] | None,
    *,
    nested: bool = False,
) -> list[Finding]:
    """What TensorRT's table says of ``node``. A ``nested`` node (in an If / Loop body) is checked by op and
    attributes; which of its inputs are constants or dynamic is the main graph's knowledge only."""
    version = table["trt_version"]
    src = node_source(node, module_paths)
    name, op = node.name, node.op_type

    def finding(severity: str, message: str, fix: str) -> Finding:
        return Finding(name, op, severity, message, fix, src)

    if node.domain not in ("", "ai.onnx"):
        return [
            finding(
                "error",
                f"custom-domain op {node.domain}::{op}: the TensorRT {version} ONNX parser needs a plugin for it",
                "write it with standard ONNX ops or register a TensorRT plugin",
            )
        ]
    if op in table["unsupported"]:
        return [
            finding(
                "error",
                f"TensorRT {version} cannot parse {op} ({table['unsupported'][op]})",
                _fix_for_missing(op, version),
            )
        ]
    entry = table["supported"].get(op)
    if entry is None:
        return [finding("error", f"{op} is not in the TensorRT {version} op table", _fix_for_missing(op, version))]
    out = []
    schema = _schema(op, graph.opset)
    input_names = [i.name for i in schema.inputs] if schema is not None else []
    attr_names = set(schema.attributes) if schema is not None else set()
    for wanted in [] if nested else entry.get("static_inputs", []):
        if wanted in input_names:
            idx = input_names.index(wanted)
            if idx < len(node.input) and node.input[idx] and node.input[idx] not in graph.constants:
                out.append(
                    finding(
                        "error",
                        f"TensorRT {version} needs input `{wanted}` of {op} to be a constant; here it is computed",
                        "make it a constant in the model (a Python int / fixed tensor) or fold it (export.simplify)",
                    )
                )
    for attr, allowed in entry.get("attributes", {}).items():
        if attr not in attr_names:
            continue
        value = _attr(node, attr)
        if value is not None and value not in allowed:
            out.append(
                finding(
                    "error",
                    f"TensorRT {version} supports {op} {attr} in {allowed}, this node has {value!r}",
                    f"change the PyTorch call so {attr} is one of {', '.join(map(str, allowed))}",
                )
            )
    if entry.get("dilations_all_ones"):
        dil = _attr(node, "dilations")
        if dil and any(d != 1 for d in dil):
            out.append(finding("error", f"TensorRT {version} needs {op} dilations of 1, got {list(dil)}", "use 1"))
    if not nested and entry.get("static_shapes") and any(graph.is_dynamic(i) for i in node.input if i):
        out.append(
            finding(
                "error",
                f"TensorRT {version} supports {op} only with static input shapes; this node's inputs are dynamic",
                "fix the dims of this op's inputs (min = opt = max) or use a newer TensorRT",
            )
        )
    if entry.get("experimental"):
        out.append(finding("warning", f"{op} support is experimental in TensorRT {version}", "test it on the device"))
    if op in rules["data_dependent_shape_ops"]:
        out.append(
            finding(
                "warning",
                f"data-dependent output shape: {rules['data_dependent_shape_ops'][op]}; TensorRT needs an output "
                "allocator and the engine cannot be fully static",
                "pad to a fixed size (e.g. top-k with a mask) if the runtime needs static shapes",
            )
        )
    restrictions = entry.get("restrictions", "")
    out += [finding("error", why, fix) for why, fix in _restriction_errors(node, op, restrictions, graph, nested)]
    if restrictions and op not in seen_info:  # what no rule checks is still said, once per op type
        seen_info.add(op)
        out.append(finding("info", f"TensorRT {version} restriction for {op}: {restrictions}", "check this holds"))
    return out


TOPK_MAX_K = 3840  # onnx-tensorrt docs/operators.md (release/10.1-GA): "`K` input must be less than 3840"


def _restriction_errors(node: Any, op: str, restrictions: str, graph: _Graph, nested: bool) -> list[tuple[str, str]]:
    """Restrictions of the op table (onnx-tensorrt's docs/operators.md) that the parser enforces, checked on the
    node: (why, fix) per violation. Where TensorRT ignores an attribute instead (ScatterND's ``reduction`` up to
    8.x), the result would be silently wrong, so that is an error too."""
    out = []
    value = None if nested else graph.value
    if "less than 3840" in restrictions and len(node.input) > 1 and value is not None:
        k = value(node.input[1])
        if k is not None and k.size and int(k.reshape(-1)[0]) >= TOPK_MAX_K:
            out.append((f"TopK K = {int(k.reshape(-1)[0])}: TensorRT needs K < {TOPK_MAX_K}", "take fewer than 3840"))
    if "`Indices` output tensor unsupported" in restrictions and len(node.output) > 1 and node.output[1]:
        out.append((f"{op} with its indices output: TensorRT does not produce it", "drop return_indices=True"))
    if op == "Resize" and _attr(node, "antialias") and "ntialias" in restrictions:
        out.append(("Resize with antialias = 1: TensorRT does not antialias", "interpolate with antialias=False"))
    if (
        op in ("QuantizeLinear", "DequantizeLinear")
        and "zero" in restrictions
        and len(node.input) > 2
        and node.input[2]
    ):
        zero = value(node.input[2]) if value is not None else None
        if zero is None and not nested and node.input[2] not in graph.constants:
            out.append((f"{op} zero point is computed: TensorRT needs a constant 0", "quantize symmetrically"))
        elif zero is not None and zero.size and bool((zero != 0).any()):
            out.append((f"{op} zero point {zero.reshape(-1)[:4].tolist()}: TensorRT needs 0", "quantize symmetrically"))
    if op == "ScatterND" and _attr(node, "reduction") not in (None, "none"):
        out.append(
            (
                f"ScatterND reduction = {_attr(node, 'reduction')!r}: TensorRT scatters without it (an error from "
                "10.x, wrong values before)",
                "write the update without accumulate=True (index_put / scatter_add)",
            )
        )
    if "Floating point inputs are only supported if" in restrictions and not nested:
        computed = [i for i in node.input[:3] if i and i not in graph.constants]
        floating = graph.types.get(node.output[0]) if node.output else None
        if computed and floating is not None and floating.elem_type in (1, 10, 11, 16):  # float, half, double, bf16
            out.append(
                (
                    f"Range with computed float inputs ({', '.join(computed)}): TensorRT takes only constant ones",
                    "compute the range in int64 (torch.arange(n)) and cast after",
                )
            )
    return out


def _fix_for_missing(op: str, version: str) -> str:
    """The fix for an op TensorRT ``version`` cannot parse: the newer TensorRT whose table has it, if one does."""
    newer = [v for v in trt_table_versions() if _version_key(v) > _version_key(version)]
    parses = next((v for v in newer if op in trt_table(v)["supported"]), None)
    if parses is not None:
        return (
            f"replace the PyTorch call that produces {op}, or target a device with TensorRT {parses} or newer, "
            "which parses it; run 'deploy check --target NAME' per target to compare"
        )
    newest = trt_table_versions()[-1]
    return (
        f"replace the PyTorch call that produces {op} with standard ops TensorRT parses (no TensorRT up to "
        f"{newest} does), or build for the cpu target (ONNX Runtime)"
    )


def _type_findings(graph: _Graph, table: dict[str, Any], rules: dict[str, Any]) -> list[Finding]:
    import onnx

    version = table["trt_version"]
    narrowed = rules["narrowed_types"] if table.get("int64_native") else rules["narrowed_types_before_trt9"]
    names = {onnx.TensorProto.INT64: "INT64", onnx.TensorProto.DOUBLE: "DOUBLE"}
    io_hits: dict[str, list[str]] = {}
    for vi in graph.inputs + graph.outputs:
        kind = names.get(vi.type.tensor_type.elem_type)
        if kind is not None and kind in narrowed:
            io_hits.setdefault(kind, []).append(vi.name)
    const_hits: dict[str, list[str]] = {}
    for init in graph.initializers:
        kind = names.get(init.data_type)
        if kind is None:
            continue
        wide = kind == "INT64" and kind in narrowed and _int64_out_of_range(init, init.name in graph.slice_bounds)
        if kind == "DOUBLE" or wide:
            const_hits.setdefault(kind, []).append(init.name)
    out = []
    for kind, tensors in io_hits.items():
        out.append(
            Finding(
                ", ".join(tensors[:4]),
                "",
                "warning",
                f"model inputs/outputs of type {kind} on TensorRT {version}: {narrowed[kind]}",
                "use float32 / int32 model inputs and outputs",
            )
        )
    for kind, tensors in const_hits.items():
        out.append(
            Finding(
                ", ".join(tensors[:4]) + (f" (+{len(tensors) - 4} more)" if len(tensors) > 4 else ""),
                "",
                "warning",
                f"{len(tensors)} {kind} constant(s) that TensorRT {version} narrows: {narrowed[kind]}",
                "keep constants within float32 / int32 range",
            )
        )
    return out


def _int64_out_of_range(init: Any, sentinels_allowed: bool = False) -> bool:
    """Whether a value of ``init`` lies outside the int32 range (False when its values are not readable here:
    external data). ``sentinels_allowed`` (a Slice's starts / ends): values within 2**62 of the int64 limits, its
    "to the end" sentinels, which the parser clamps, do not count."""
    from onnx import numpy_helper

    try:
        values = numpy_helper.to_array(init)
    except Exception:  # external data not loaded: cannot tell
        return False
    outside = (values > 2**31 - 1) | (values < -(2**31))
    if sentinels_allowed:
        outside &= abs(values.astype("float64")) < 2**62
    return bool(outside.any())


def dla_findings(
    model: Any,
    graph: _Graph,
    precision: str,
    module_paths: dict[str, str] | None,
    *,
    trt_version: str = "",
    sm: str = "",
) -> list[Finding]:
    """What DLA cannot run: ops outside its layer list (per TensorRT version and DLA generation), dynamic dims, FP32.

    ``version_limited`` ops count from their ``min_trt``; ``orin_only`` ops need the Orin DLA (SM 8.7).
    An unknown version or SM accepts them (nothing to warn about).
    """
    dla = _data("dla.json")
    runs = set(dla["ops"])
    runs |= {
        op
        for op, v in dla.get("version_limited", {}).items()
        if not trt_version or _version_key(trt_version) >= _version_key(v["min_trt"])
    }
    runs |= {op for op in dla.get("orin_only", {}) if not sm or sm == "8.7"}
    out = []
    if precision == "fp32":
        out.append(
            Finding("", "", "warning", "DLA runs FP16 and INT8 only; FP32 layers run on the GPU", "use fp16 or int8")
        )
    dynamic = [i.name for i in graph.inputs if graph.is_dynamic(i.name) and i.name not in graph.constants]
    if dynamic:
        out.append(
            Finding(
                ", ".join(dynamic),
                "",
                "warning",
                "DLA does not support dynamic dims (profile min, opt and max must be equal)",
                "set min = opt = max for the dims of a DLA build",
            )
        )
    by_op: dict[str, list[Any]] = {}
    for node in model.graph.node:
        if node.op_type not in runs:
            by_op.setdefault(node.op_type, []).append(node)
    for op, nodes in sorted(by_op.items()):
        more = f" (+{len(nodes) - 1} more)" if len(nodes) > 1 else ""
        out.append(
            Finding(
                nodes[0].name + more,
                op,
                "warning",
                f"DLA cannot run {op}; {len(nodes)} node(s) fall back to the GPU (build fails without GPU fallback)",
                "allow GPU fallback or replace the op with a DLA-supported layer",
                node_source(nodes[0], module_paths),
            )
        )
    return out


# ---- ONNX Runtime ----------------------------------------------------------------------

# the shapes of ONNX Runtime's session errors that name a node or an op
_ORT_NODE = (re.compile(r"node with name '([^']*)'"), re.compile(r"in node \(([^)]*)\)"))
_ORT_OP = (re.compile(r"implementation for (\w+)\(\d+\)"), re.compile(r"[\w.]+:(\w+)\(-?\d+\) is not a registered"))


def onnxruntime_findings(model_path: str | Path, *, max_opset: int | None = None) -> list[Finding]:
    """Create a CPU ONNX Runtime session (the real check); a refusal becomes a finding naming the node."""
    import onnx
    import onnxruntime as ort

    out = []
    proto = onnx.load(str(model_path), load_external_data=False)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if max_opset is not None and opset > max_opset:
        out.append(
            Finding("", "", "error", f"model opset {opset} is above the target's {max_opset}", "re-export lower")
        )
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # NOT_IMPLEMENTED / INVALID_GRAPH from the runtime
        text = " ".join(str(exc).split())
        node_name = next((m.group(1) for p in _ORT_NODE if (m := p.search(text))), "")
        op = next((m.group(1) for p in _ORT_OP if (m := p.search(text))), "")
        node = next((n for n in proto.graph.node if (n.name == node_name if node_name else n.op_type == op)), None)
        out.append(
            Finding(
                node.name if node is not None else node_name,
                node.op_type if node is not None else op,
                "error",
                f"ONNX Runtime {ort.__version__} (CPU) refuses the model: {text[:300]}",
                "change the op in the model or pick another opset",
                node_source(node) if node is not None else "",
            )
        )
    return out


def check_model(
    model_path: str | Path,
    target: Any,
    *,
    dla_core: int | None = None,
    precision: str = "fp32",
    module_paths: dict[str, str] | None = None,
) -> list[Finding]:
    """All preflight findings for ``model_path`` on ``target`` (the target runtime's registered preflight)."""
    from edgedeploy import runtimes

    preflight = runtimes.load(runtimes.get(target.runtime).preflight)
    findings: list[Finding] = preflight(
        model_path, target, dla_core=dla_core, precision=precision, module_paths=module_paths
    )
    return findings


def onnxruntime_preflight(model_path: str | Path, target: TargetProfile, **_: Any) -> list[Finding]:
    """The onnxruntime runtime's preflight: a real CPU session, and the target's opset ceiling."""
    return onnxruntime_findings(model_path, max_opset=target.max_opset)


def tensorrt_preflight(
    model_path: str | Path,
    target: Any,
    *,
    dla_core: int | None = None,
    precision: str = "fp32",
    module_paths: dict[str, str] | None = None,
) -> list[Finding]:
    """The tensorrt runtime's preflight: every node against the op table of the target's TensorRT version."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return tensorrt_findings(
        model,
        trt_version=target.trt_version,
        dla=dla_core is not None,
        precision=precision,
        module_paths=module_paths,
        sm=target.sm,
    )


def findings_table(findings: list[Finding] | list[dict[str, str]]) -> str:
    """Plain-text table of findings, errors first."""
    rows = [f if isinstance(f, dict) else f.to_dict() for f in findings]
    if not rows:
        return "no findings: every node is supported"
    rows.sort(key=lambda r: SEVERITIES.index(r["severity"]) if r["severity"] in SEVERITIES else 9)
    lines = [f"{'severity':<8} {'op':<18} {'node':<32} message / source / fix", "-" * 100]
    for r in rows:
        lines.append(f"{r['severity']:<8} {r['op'] or '-':<18} {(r['node'] or '-')[:32]:<32} {r['message']}")
        if r.get("source"):
            lines.append(f"{'':<60} at {r['source']}")
        lines.append(f"{'':<60} fix: {r['fix']}")
    counts = {s: sum(r["severity"] == s for r in rows) for s in SEVERITIES}
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} note(s)")
    return "\n".join(lines)


def raise_on_errors(findings: list[Finding], target_name: str) -> None:
    """Raise once for all error findings.

    Raises:
        UnsupportedOpsError: at least one finding has severity ``error`` (all findings attached).
    """
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        return
    listed = "; ".join(f"{f.node or '<model>'} ({f.op or '-'}): {f.message}" for f in errors[:5])
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    raise UnsupportedOpsError(
        f"{len(errors)} operator problem(s) for target '{target_name}': {listed}{more}",
        findings=[f.to_dict() for f in findings],
        hint=errors[0].fix,
    )
