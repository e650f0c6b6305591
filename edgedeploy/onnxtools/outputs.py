"""Graph outputs after export: their names, and declared shapes that tell the truth.

Exporters name graph values after module paths, so a user output called ``embedding`` can
collide with an internal tensor of that name (an SSA violation the checker refuses). Exporting
with placeholder output names and renaming afterwards, moving any internal value of the wanted
name aside first, makes every output name safe.

Exporters also write example-based shapes into ``graph.output`` (a static ``63`` from the opt
width, or a symbolic expression such as ``32*((width//64))`` that is wrong at other widths).
:func:`fix_declared_shapes` compares each declared output dim with the sizes PyTorch produced at
the probe points: a dim that varies becomes a symbol, a wrong expression is replaced by a fresh
symbol, and stale intermediate ``value_info`` is dropped. :func:`declared_shape_problems` is the
check that remains: a static dim that contradicts the actual size at some point.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from onnx import ModelProto


PLACEHOLDER = "edgedeploy_output_{}"
_EXPR = re.compile(r"^[A-Za-z0-9_+\-*/() ]+$")


def placeholder_names(n: int) -> list[str]:
    """Output names the exporters are given, renamed to the user's names by :func:`rename_outputs`."""
    return [PLACEHOLDER.format(i) for i in range(n)]


def _graph_names(graph: Any) -> set[str]:
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {o.name for o in graph.output}
    names |= {v.name for v in graph.value_info}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        for attr in node.attribute:
            if attr.g is not None and attr.g.ByteSize():
                names |= _graph_names(attr.g)
            for g in attr.graphs:
                names |= _graph_names(g)
    return names


def _rename(graph: Any, old: str, new: str) -> None:
    """Rename value ``old`` to ``new`` everywhere in ``graph`` and its subgraphs (which may read outer values)."""
    for seq in (graph.input, graph.output, graph.value_info):
        for v in seq:
            if v.name == old:
                v.name = new
    for init in graph.initializer:
        if init.name == old:
            init.name = new
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new
        for attr in node.attribute:
            if attr.g is not None and attr.g.ByteSize():
                _rename(attr.g, old, new)
            for g in attr.graphs:
                _rename(g, old, new)


def rename_outputs(proto: ModelProto, names: list[str] | tuple[str, ...]) -> list[str]:
    """Give the graph outputs ``names`` (in order); internal values already called so are renamed first.

    Returns the internal names that were moved aside (``embedding`` → ``embedding__internal``).
    """
    graph = proto.graph
    current = [o.name for o in graph.output]
    moved = []
    taken = _graph_names(graph)
    for cur, want in zip(current, names):
        if cur == want:
            continue
        if want in taken:
            fresh = want + "__internal"
            k = 1
            while fresh in taken:
                fresh, k = f"{want}__internal{k}", k + 1
            _rename(graph, want, fresh)
            taken.add(fresh)
            moved.append(want)
        _rename(graph, cur, want)
        taken.add(want)
    return moved


def _dim_value(expr: str, dims: dict[str, int]) -> int | None:
    """Value of a symbolic dim (a dim name, or an arithmetic expression over dim names) at ``dims``."""
    if expr in dims:
        return dims[expr]
    if not _EXPR.match(expr):
        return None
    tokens = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expr)
    if any(t not in dims for t in tokens):
        return None
    try:
        # only names, integers and + - * / // ( ) reach here (checked by _EXPR and the names above)
        value = eval(expr, {"__builtins__": {}}, dict(dims))
    except Exception:  # malformed expression from the exporter: treat as unknown
        return None
    return int(value) if float(value).is_integer() else None


def fix_declared_shapes(
    proto: ModelProto, points: list[Any], references: list[dict[str, np.ndarray]]
) -> dict[str, Any]:
    """Make every output dim that varies across ``points`` symbolic, and every symbolic expression true.

    ``references[i]`` are PyTorch's outputs at ``points[i].dims``. Intermediate ``value_info``
    (exporter guesses at the example shape) is dropped; runtimes infer it again.

    Returns figures: the dims made symbolic and the expressions replaced.
    """
    made_symbolic: list[str] = []
    replaced: list[str] = []
    for out in proto.graph.output:
        if not any(out.name in r for r in references):
            continue
        sizes = [r[out.name].shape for r in references]
        shape = out.type.tensor_type.shape
        for axis, dim in enumerate(shape.dim):
            actual = [s[axis] if axis < len(s) else None for s in sizes]
            label = f"{out.name}[{axis}]"
            if dim.HasField("dim_param"):
                values = [_dim_value(dim.dim_param, p.dims) for p in points]
                if values != actual:
                    replaced.append(f"{label}: {dim.dim_param}")
                    dim.dim_param = f"{out.name}_dim{axis}"
            elif dim.HasField("dim_value") and len(set(actual)) > 1:
                made_symbolic.append(f"{label}: {dim.dim_value}")
                dim.dim_param = f"{out.name}_dim{axis}"
    if made_symbolic or replaced:
        del proto.graph.value_info[:]
    return {"made_symbolic": made_symbolic, "replaced_expressions": replaced}


def declared_shape_problems(proto: ModelProto, points: list[Any], references: list[dict[str, np.ndarray]]) -> list[str]:
    """Declared output dims that contradict the actual size at some probe point (one line each)."""
    problems = []
    for out in proto.graph.output:
        dims = out.type.tensor_type.shape.dim
        for point, ref in zip(points, references):
            if out.name not in ref:
                continue
            actual = ref[out.name].shape
            if len(dims) and len(dims) != len(actual):
                problems.append(f"output {out.name!r} declares rank {len(dims)}, actual rank {len(actual)}")
                break
            for axis, dim in enumerate(dims):
                want = dim.dim_value if dim.HasField("dim_value") else _dim_value(dim.dim_param, point.dims)
                if dim.HasField("dim_param") and want is None:
                    continue  # a free symbol: any size is consistent
                if want != actual[axis]:
                    problems.append(
                        f"output {out.name!r} dim {axis} is declared {dim.dim_value or dim.dim_param} "
                        f"but is {actual[axis]} at {point.label}"
                    )
    return problems
