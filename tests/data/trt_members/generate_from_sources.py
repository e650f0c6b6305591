"""Write ``members-<version>.json``: class -> public member names of a TensorRT release's Python bindings.

Read from the pybind11 sources of NVIDIA/TensorRT at a release tag (``python/src/infer/pyCore.cpp``,
``pyGraph.cpp``, ``pyFoundationalTypes.cpp``, ``pyInt8.cpp``, ``python/src/parsers/pyOnnx.cpp`` and the
package's ``tensorrt/__init__.py``): every ``py::class_`` / ``py::enum_`` declaration opens a class, and the
``.def`` / ``.def_property*`` / ``.def_readwrite`` / ``.value`` names that follow it, up to the next
declaration, are its members. ``module`` holds what ``import tensorrt`` exposes at top level: classes and
enums declared on the module, ``m.attr`` constants (``float32`` ...), ``m.def`` functions and the functions
of ``tensorrt/__init__.py`` (``nptype``, ``volume``).

Usage (a clone of https://github.com/NVIDIA/TensorRT with its release tags)::

    python tests/data/trt_members/generate_from_sources.py /path/to/TensorRT 8.2=8.2.1 8.5=8.5.2 \\
        10.3=v10.3.0 11=v11.1
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (
    "python/src/infer/pyCore.cpp",
    "python/src/infer/pyGraph.cpp",
    "python/src/infer/pyFoundationalTypes.cpp",
    "python/src/infer/pyInt8.cpp",
    "python/src/parsers/pyOnnx.cpp",
)
PACKAGE_INIT = ("python/packaging/tensorrt/__init__.py", "python/packaging/bindings_wheel/tensorrt/__init__.py")

_DECL = re.compile(r"py::(?:class_|enum_)<[^;]*?>\s*(?:\w+\s*)?[({]\s*(\w+)\s*,\s*\"(\w+)\"", re.S)
_MEMBER = re.compile(r"\.(?:def|def_property|def_property_readonly|def_readwrite|def_readonly|def_static|value)"
                     r"\s*\(\s*\"(\w+)\"")  # fmt: skip
_MODULE_ATTR = re.compile(r"\bm\.(?:attr|def)\s*\(\s*\"(\w+)\"")


def parse_bindings(texts: list[str]) -> dict[str, set[str]]:
    """Class -> public member names declared in pybind11 source ``texts``; ``module`` for top-level names."""
    classes: dict[str, set[str]] = {"module": set()}
    for text in texts:
        text = re.sub(r"//[^\n]*", "", text)  # commented-out bindings are not bindings
        decls = list(_DECL.finditer(text))
        for i, decl in enumerate(decls):
            scope, name = decl.group(1), decl.group(2)
            end = decls[i + 1].start() if i + 1 < len(decls) else len(text)
            members = classes.setdefault(name, set())
            members |= {m for m in _MEMBER.findall(text[decl.end() : end]) if not m.startswith("_")}
            if scope == "m":
                classes["module"].add(name)
        classes["module"] |= set(_MODULE_ATTR.findall(text))
    return classes


def _git_show(repo: Path, ref: str, path: str) -> str | None:
    done = subprocess.run(["git", "-C", str(repo), "show", f"{ref}:{path}"], capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def members_at(repo: Path, ref: str) -> dict[str, list[str]]:
    """Class -> sorted public member names of the bindings at git ``ref`` of a TensorRT clone."""
    texts = [t for t in (_git_show(repo, ref, p) for p in SOURCES) if t is not None]
    classes = parse_bindings(texts)
    for path in PACKAGE_INIT:
        init = _git_show(repo, ref, path)
        if init is not None:
            classes["module"] |= {n for n in re.findall(r"^def (\w+)", init, re.M) if not n.startswith("_")}
            break
    classes["module"].add("__version__")
    return {k: sorted(v) for k, v in sorted(classes.items())}


def main(argv: list[str]) -> None:
    repo = Path(argv[0])
    for pair in argv[1:]:
        version, ref = pair.split("=", 1)
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", f"{ref}^{{commit}}"], capture_output=True,
                                text=True, check=True).stdout.strip()  # fmt: skip
        members = members_at(repo, ref)
        source = f"NVIDIA/TensorRT@{ref} ({commit}): " + ", ".join((*SOURCES, "tensorrt/__init__.py"))
        out = HERE / f"members-{version}.json"
        out.write_text(json.dumps({"source": source, "classes": members}, indent=1) + "\n")
        print(f"wrote {out} ({len(members)} classes) from {ref}")


if __name__ == "__main__":
    main(sys.argv[1:])
