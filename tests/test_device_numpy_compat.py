"""Device-side code keeps to numpy 1.13 (JetPack 4.6 ships numpy 1.13.3 with Python 3.6).

vermin checks the Python syntax (``.ci/checks``); this parses the same modules with ``ast`` and
refuses numpy functions and keyword arguments added after 1.13. Versions come from numpy's own
"New in version" notes in its reference documentation. ``np.isin`` is allowed: it is new in 1.13.0.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DEVICE_MODULES = sorted(
    [
        *(ROOT / "edgedeploy" / "device").glob("*.py"),
        ROOT / "edgedeploy/trt/adapter.py",
        ROOT / "edgedeploy/validate/parity.py",
    ]
)

# module-level numpy functions (np.X / np.random.X / np.lib.X) newer than 1.13 -> first version
NEWER_FUNCTIONS = {
    "quantile": "1.15",
    "nanquantile": "1.15",
    "take_along_axis": "1.15",
    "put_along_axis": "1.15",
    "gcd": "1.15",
    "lcm": "1.15",
    "histogram_bin_edges": "1.15",
    "printoptions": "1.15",
    "default_rng": "1.17",
    "Generator": "1.17",
    "PCG64": "1.17",
    "SeedSequence": "1.17",
    "sliding_window_view": "1.20",
}
# keyword arguments newer than 1.13, per function or method name (np.f(...) and arr.f(...))
NEWER_KEYWORDS = {
    "nan_to_num": {"nan": "1.17", "posinf": "1.17", "neginf": "1.17", "copy": "1.13"},
    "percentile": {"method": "1.22"},
    "nanpercentile": {"method": "1.22"},
    "linspace": {"axis": "1.16"},
    "logspace": {"axis": "1.16"},
    "geomspace": {"axis": "1.16"},
    "argmax": {"keepdims": "1.22"},
    "argmin": {"keepdims": "1.22"},
    "unique": {"equal_nan": "1.24"},
    "concatenate": {"dtype": "1.20", "casting": "1.20"},
    "histogram": {"normed": "removed in 1.24"},
    "load": {"max_header_size": "1.24"},
    "sum": {"initial": "1.15", "where": "1.17"},
    "prod": {"initial": "1.15", "where": "1.17"},
    "max": {"initial": "1.15", "where": "1.17"},
    "min": {"initial": "1.15", "where": "1.17"},
    "amax": {"initial": "1.15", "where": "1.17"},
    "amin": {"initial": "1.15", "where": "1.17"},
    "mean": {"where": "1.20"},
    "std": {"where": "1.20"},
    "var": {"where": "1.20"},
    "all": {"where": "1.20"},
    "any": {"where": "1.20"},
    "array": {"like": "1.20"},
    "asarray": {"like": "1.20"},
    "zeros": {"like": "1.20"},
    "ones": {"like": "1.20"},
    "empty": {"like": "1.20"},
    "full": {"like": "1.20"},
    "arange": {"like": "1.20"},
}


def _numpy_names(tree: ast.AST) -> set[str]:
    names = {"numpy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname or a.name for a in node.names if a.name == "numpy"}
    return names


def _attr_chain(node: ast.AST) -> list[str]:
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        out.append(node.id)
    return out[::-1]


def numpy_violations(source: str, filename: str = "<src>") -> list[str]:
    """Every numpy call or keyword in ``source`` newer than numpy 1.13, as ``file:line: what``."""
    tree = ast.parse(source, filename)
    np_names = _numpy_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "numpy":
            for alias in node.names:
                if alias.name in NEWER_FUNCTIONS:
                    found.append(
                        f"{filename}:{node.lineno}: from numpy import {alias.name} "
                        f"(numpy {NEWER_FUNCTIONS[alias.name]})"
                    )
        if isinstance(node, ast.Attribute):
            chain = _attr_chain(node)
            if chain and chain[0] in np_names and chain[-1] in NEWER_FUNCTIONS:
                found.append(f"{filename}:{node.lineno}: {'.'.join(chain)} (numpy {NEWER_FUNCTIONS[chain[-1]]})")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            chain = _attr_chain(node.func)
            is_numpy_fn = bool(chain) and chain[0] in np_names
            # methods (arr.sum(where=...)) share numpy's keywords; dict.get etc. never use these names
            if name in NEWER_KEYWORDS and (
                is_numpy_fn
                or name in {"sum", "prod", "max", "min", "mean", "std", "var", "all", "any", "argmax", "argmin"}
            ):
                for kw in node.keywords:
                    if kw.arg in NEWER_KEYWORDS[name]:
                        found.append(
                            f"{filename}:{node.lineno}: {name}({kw.arg}=...) (numpy {NEWER_KEYWORDS[name][kw.arg]})"
                        )
    return found


def test_the_checker_refuses_what_numpy_1_13_lacks():
    old_parity_line = "import numpy as np\ncand = np.argsort(-np.nan_to_num(c, nan=-np.inf), axis=-1)\n"
    assert numpy_violations(old_parity_line) == ["<src>:2: nan_to_num(nan=...) (numpy 1.17)"]
    newer = "import numpy\nq = numpy.quantile(x, 0.5)\nr = numpy.random.default_rng(0)\ns = x.sum(where=m)\n"
    assert len(numpy_violations(newer)) == 3
    fine = "import numpy as np\nok = np.isin(a, b)\nv = np.percentile(d, 99)\nw = np.where(np.isnan(c), -np.inf, c)\n"
    assert numpy_violations(fine) == []


@pytest.mark.parametrize("path", DEVICE_MODULES, ids=lambda p: p.name)
def test_device_side_modules_use_only_numpy_1_13_api(path):
    assert numpy_violations(path.read_text(), str(path.relative_to(ROOT))) == []


def test_classifier_ranking_puts_nan_last_without_the_newer_keywords():
    from edgedeploy.validate import parity

    ref = np.array([[0.1, 0.9, 0.0]], dtype=np.float32)
    cand = np.array([[np.nan, 0.8, 0.1]], dtype=np.float32)
    row = parity.compare_output(ref, cand, classifier=True, topk=2)
    assert row["top1_agreement"] == 1.0 and row["topk_overlap"] == 0.5
    assert row["failure"] == [parity.NON_FINITE]
