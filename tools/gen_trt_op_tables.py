"""Generate ``edgedeploy/targets/data/trt-*.json`` from onnx/onnx-tensorrt ``docs/operators.md`` files.

The markdown sources are not shipped. To regenerate, save each release's
``docs/operators.md`` (``git show <ref>:docs/operators.md`` in a clone of
onnx/onnx-tensorrt) into one folder under the file names listed in ``TABLES``, then run::

    python tools/gen_trt_op_tables.py --src /path/to/folder --out edgedeploy/targets/data

Each table records the source branch and commit. Where no operators.md exists for the
exact TensorRT version a device ships, the table is derived from the nearest release's
file plus the operator changes that docs/Changelog.md lists for the releases in between;
``derived_from`` says so.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

REPO = "onnx/onnx-tensorrt"
CHANGELOG = {"path": "docs/Changelog.md", "note": "onnx-tensorrt changelog entries for TensorRT 10.2-10.15 GA"}

TABLES: list[dict[str, Any]] = [
    {
        "id": "trt-8.2",
        "trt_version": "8.2",
        "shipped_by": ["JetPack 4.6 (TensorRT 8.2.1)"],
        "md": "trt-8.2.md",
        "source": {"ref": "8.2-GA", "commit": "f42daeee49f2517a954c5601f0f76bef9ed94b62"},
    },
    {
        "id": "trt-8.5",
        "trt_version": "8.5",
        "shipped_by": ["JetPack 5.1 (TensorRT 8.5.2)"],
        "md": "trt-8.5.md",
        "source": {"ref": "8.5-GA", "commit": "fdeeaca87ad2eef316aafb016e1822502f383eea"},
    },
    {
        "id": "trt-10.3",
        "trt_version": "10.3",
        "shipped_by": ["JetPack 6.x (TensorRT 10.3)"],
        "md": "trt-10.1.md",
        "source": {"ref": "10.1-GA", "commit": "96e781103cfc4adf4a6bb557e94bac8e693f6f4c"},
        # Changelog 10.2: no operator added. 10.3: "Added support for tensor `axes` inputs for `Slice` nodes".
        "derived_from": "operators.md of 10.1-GA plus the 10.2 and 10.3 GA changelog entries",
        "drop_restrictions": {"Slice": "10.3 GA changelog: tensor `axes` inputs for Slice are supported"},
        "unsupported_ops": {},
    },
    {
        "id": "trt-10.13",
        "trt_version": "10.13",
        "shipped_by": ["TensorRT 10.13 desktop/server"],
        "md": "trt-10.15.md",
        "source": {"ref": "main (file revision whose header reads 'TensorRT 10.15')", "commit": None},
        "derived_from": "operators.md of TensorRT 10.15 minus the operators the 10.14 / 10.15 GA changelog entries add",
        "drop_restrictions": {},
        "unsupported_ops": {
            "Attention": "added in TensorRT 10.14 (changelog)",
            "RotaryEmbedding": "added in TensorRT 10.15 (changelog)",
            "RMSNormalization": "added in TensorRT 10.15 (changelog)",
            "TensorScatter": "added in TensorRT 10.15 (changelog)",
        },
    },
    {
        "id": "trt-10.15",
        "trt_version": "10.15",
        "shipped_by": ["TensorRT 10.15; also the newest table, used for TensorRT 11.x with a warning"],
        "md": "trt-10.15.md",
        "source": {"ref": "main (file revision whose header reads 'TensorRT 10.15')", "commit": None},
    },
]

_HEADER = re.compile(
    r"TensorRT\s+([0-9.]+)\s+supports operators\s+(?:up to Opset\s+(\d+)|in the inclusive range of opset\s+(\d+)"
    r"\s+to opset\s+(\d+))",
    re.IGNORECASE,
)
_STATIC = re.compile(
    r"`(\w+)`\s+(?:input\s+)?must be "
    r"(?:an initializer|an initailizer|a build-time constant|a constant tensor|resolvable to a constant)"
)
_ATTR_INT = re.compile(r"`(\w+)`\s+(?:attribute\s+)?must be (-?\d+)\b")
_ATTR_LIST = {
    "mode": re.compile(r"Supported resize modes:\s*([^.]+)"),
    "coordinate_transformation_mode": re.compile(r"Supported resize transformation modes:\s*([^.]+)"),
    "nearest_mode": re.compile(r"Supported nearest modes:\s*([^.]+)"),
}


def parse_operators_md(text: str) -> dict[str, Any]:
    """Rows of the support matrix → ops, plus the header's opset range and the type notes."""
    header = _HEADER.search(text)
    if header is None:
        raise ValueError("no 'TensorRT X supports operators ...' header")
    doc_version = header.group(1)
    opset = [1, int(header.group(2))] if header.group(2) else [int(header.group(3)), int(header.group(4))]
    notes = [
        line.strip().lstrip(">").strip()
        for line in text.splitlines()
        if line.strip().startswith("> Note") or line.startswith("TensorRT supports the following ONNX data types")
    ]
    ops: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("|--") or "Operator" in line.split("|")[1]:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0]:
            continue
        name, flag = cells[0], cells[1]
        types = [t.strip() for t in cells[2].split(",") if t.strip()] if len(cells) > 2 else []
        restrictions = cells[3].replace("<br />", " ").replace("\\.", ".").strip() if len(cells) > 3 else ""
        if flag.upper().startswith("N") and types and not types[0].isupper():
            restrictions, types = ", ".join(types), []  # "N | Not supported. ..." rows put text in the types column
        ops[name] = {
            "supported": flag.upper().startswith("Y"),
            "experimental": "EXPERIMENTAL" in flag.upper(),
            "types": types,
            "restrictions": " ".join(restrictions.split()),
        }
    return {"doc_version": doc_version, "opset": opset, "notes": notes, "ops": ops}


def rules_from_restrictions(text: str) -> dict[str, Any]:
    """Machine-checkable parts of a restriction: inputs that must be constant, attribute values allowed."""
    rules: dict[str, Any] = {}
    static = sorted(set(_STATIC.findall(text)))
    if static:
        rules["static_inputs"] = static
    attrs: dict[str, list[Any]] = {}
    for name, value in _ATTR_INT.findall(text):
        attrs[name] = [int(value)]
    for attr, pattern in _ATTR_LIST.items():
        m = pattern.search(text)
        if m:
            attrs[attr] = re.findall(r"`(\w+)`", m.group(1))
    if attrs:
        rules["attributes"] = attrs
    if "`dilations` must be empty or all ones" in text:
        rules["dilations_all_ones"] = True
    if "Dynamic input shapes are unsupported" in text:
        rules["static_shapes"] = True
    return rules


def build_table(spec: dict[str, Any], src: Path) -> dict[str, Any]:
    parsed = parse_operators_md((src / spec["md"]).read_text(encoding="utf-8"))
    supported: dict[str, Any] = {}
    unsupported: dict[str, str] = {}
    for name, row in sorted(parsed["ops"].items()):
        if name in spec.get("unsupported_ops", {}):
            unsupported[name] = spec["unsupported_ops"][name]
            continue
        if not row["supported"]:
            unsupported[name] = row["restrictions"] or "not supported"
            continue
        restrictions = row["restrictions"]
        if name in spec.get("drop_restrictions", {}):
            restrictions = ""
        entry: dict[str, Any] = {"types": row["types"], "restrictions": restrictions}
        if row["experimental"]:
            entry["experimental"] = True
        entry.update(rules_from_restrictions(restrictions))
        supported[name] = entry
    table: dict[str, Any] = {
        "schema": "edgedeploy-op-table/1",
        "id": spec["id"],
        "runtime": "tensorrt",
        "trt_version": spec["trt_version"],
        "shipped_by": spec["shipped_by"],
        "source": {"repo": REPO, "path": "docs/operators.md", **spec["source"], "doc_version": parsed["doc_version"]},
        "opset": parsed["opset"],
        "int64_native": int(spec["trt_version"].split(".")[0]) >= 9,
        "notes": parsed["notes"],
        "supported": supported,
        "unsupported": unsupported,
    }
    if "derived_from" in spec:
        table["derived_from"] = spec["derived_from"]
        table["changelog"] = {"repo": REPO, **CHANGELOG}
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True, type=Path, help="folder with the operators.md copies")
    ap.add_argument("--out", required=True, type=Path, help="edgedeploy/targets/data")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in TABLES:
        table = build_table(spec, args.src)
        path = args.out / f"{spec['id']}.json"
        path.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"{path}: {len(table['supported'])} supported, {len(table['unsupported'])} unsupported")


if __name__ == "__main__":
    main()
