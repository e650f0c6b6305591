"""Generate ``edgedeploy/targets/data/trt-*.json`` from onnx/onnx-tensorrt's docs *and* its importer sources.

``docs/operators.md`` lags the parser (8.2's marks Reciprocal unsupported though the 8.2 parser
registers an importer for it; every release's lists Resize modes nearest/linear though the importer
takes cubic from 8.5), so each table is the docs' matrix corrected by the release's importer source:
the ops registered with ``DEFINE_BUILTIN_OP_IMPORTER`` (``builtin_op_importers.cpp`` up to 8.6,
``onnxOpImporters.cpp`` from 10.0) and the attribute values in :data:`ATTRIBUTE_EVIDENCE`. Where
the two disagree the source wins and ``disagreements`` in the table records both sides.

The sources are not shipped. To regenerate, save each release's ``docs/operators.md`` into one
folder and its importer source into another (``git show 8.2-GA:builtin_op_importers.cpp >
8.2-GA.cpp`` in a clone of onnx/onnx-tensorrt; file names as listed in ``TABLES``), then run::

    python tools/gen_trt_op_tables.py --src MD_FOLDER --importers CPP_FOLDER --out edgedeploy/targets/data

Without ``--src`` the docs view is taken from the existing tables (earlier disagreements undone
first), so ``--importers`` alone re-applies the source corrections.

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
_NOT_OPS = {"FallbackPluginImporter", "LocalFunctionImporter", "op"}
_IMPORTER = re.compile(r"DEFINE_BUILTIN_OP_IMPORTER\((\w+)\)")
# attribute values the docs do not list but an importer body shows: (op, attribute, value) -> evidence regex
ATTRIBUTE_EVIDENCE = {("Resize", "mode", "cubic"): r"(?:ResizeMode|InterpolationMode)::kCUBIC"}
_IMPORTER_82 = {
    "ref": "8.2-GA",
    "commit": "f42daeee49f2517a954c5601f0f76bef9ed94b62",
    "path": "builtin_op_importers.cpp",
}
_IMPORTER_85 = {
    "ref": "8.5-GA",
    "commit": "fdeeaca87ad2eef316aafb016e1822502f383eea",
    "path": "builtin_op_importers.cpp",
}
_IMPORTER_101 = {"ref": "10.1-GA", "commit": "96e781103cfc4adf4a6bb557e94bac8e693f6f4c", "path": "onnxOpImporters.cpp"}
# importers added after 10.1 GA, per docs/Changelog.md (no pinned importer source for 10.3 .. 10.15 here)
_ADDED_AFTER_101 = {
    "BlackmanWindow": ("10.4", "10.4 GA changelog: BlackmanWindow, HammingWindow, HannWindow"),
    "HammingWindow": ("10.4", "10.4 GA changelog: BlackmanWindow, HammingWindow, HannWindow"),
    "HannWindow": ("10.4", "10.4 GA changelog: BlackmanWindow, HammingWindow, HannWindow"),
    "STFT": ("10.5", "10.5 GA changelog: real-valued STFT"),
    "Attention": ("10.14", "10.14 GA changelog: Attention"),
    "RotaryEmbedding": ("10.15", "10.15 GA changelog: RotaryEmbedding, RMSNormalization, TensorScatter"),
    "RMSNormalization": ("10.15", "10.15 GA changelog: RotaryEmbedding, RMSNormalization, TensorScatter"),
    "TensorScatter": ("10.15", "10.15 GA changelog: RotaryEmbedding, RMSNormalization, TensorScatter"),
}

TABLES: list[dict[str, Any]] = [
    {
        "id": "trt-8.2",
        "trt_version": "8.2",
        "shipped_by": ["JetPack 4.6 (TensorRT 8.2.1)"],
        "md": "trt-8.2.md",
        "source": {"ref": "8.2-GA", "commit": "f42daeee49f2517a954c5601f0f76bef9ed94b62"},
        "importer": {**_IMPORTER_82, "file": "8.2-GA.cpp"},
    },
    {
        "id": "trt-8.5",
        "trt_version": "8.5",
        "shipped_by": ["JetPack 5.1 (TensorRT 8.5.2)"],
        "md": "trt-8.5.md",
        "source": {"ref": "8.5-GA", "commit": "fdeeaca87ad2eef316aafb016e1822502f383eea"},
        "importer": {**_IMPORTER_85, "file": "8.5-GA.cpp"},
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
        "importer": {**_IMPORTER_101, "file": "10.1-GA.cpp"},
    },
    {
        "id": "trt-10.13",
        "trt_version": "10.13",
        "shipped_by": ["TensorRT 10.13 desktop/server"],
        "md": "trt-10.15.md",
        "source": {"ref": "main (file revision whose header reads 'TensorRT 10.15')", "commit": None},
        "derived_from": "operators.md of TensorRT 10.15 minus the operators the 10.14 / 10.15 GA changelog entries add",
        # 10.15's operators.md reads opset 24; no operators.md of 10.13 was available, so the ceiling is the
        # last one documented at or below 10.13 (10.9: opset 22), the desktop profile's max_opset
        "opset": [9, 22],
        "opset_source": "onnx-tensorrt operators.md of TensorRT 10.9 (opset 22); 10.15's (opset 24) is newer",
        "drop_restrictions": {},
        "unsupported_ops": {
            "Attention": "added in TensorRT 10.14 (changelog)",
            "RotaryEmbedding": "added in TensorRT 10.15 (changelog)",
            "RMSNormalization": "added in TensorRT 10.15 (changelog)",
            "TensorScatter": "added in TensorRT 10.15 (changelog)",
        },
        "importer": {**_IMPORTER_101, "file": "10.1-GA.cpp"},
    },
    {
        "id": "trt-10.15",
        "trt_version": "10.15",
        "shipped_by": ["TensorRT 10.15; also the newest table, used for TensorRT 11.x with a warning"],
        "md": "trt-10.15.md",
        "source": {"ref": "main (file revision whose header reads 'TensorRT 10.15')", "commit": None},
        "importer": {**_IMPORTER_101, "file": "10.1-GA.cpp"},
    },
]

_HEADER = re.compile(
    r"TensorRT\s+([0-9.]+)\s+supports operators\s+(?:up to Opset\s+(\d+)|in the inclusive range of opset\s+(\d+)"
    r"\s+to opset\s+(\d+))",
    re.IGNORECASE,
)
# one or several backquoted inputs ("`window` must be an initializer", "`frame_step` and `window` must be ...",
# "Inputs `a`, `b`, and `c` must be initializers") followed by a constant-ness requirement
_STATIC = re.compile(
    r"((?:`\w+`(?:,?\s+(?:and|or)\s+(?:[a-z]+\s+)?|\s*,\s*)?)+)\s*(?:inputs?\s+)?(?:must|should) be "
    r"(?:an?\s+)?(?:initializers?|initailizers?|build-time constants?|constant tensors?|resolvable to a constant)"
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
    static = sorted({name for names in _STATIC.findall(text) for name in re.findall(r"`(\w+)`", names)})
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
    if "opset" in spec:
        table["opset"], table["opset_source"] = list(spec["opset"]), spec["opset_source"]
    if "derived_from" in spec:
        table["derived_from"] = spec["derived_from"]
        table["changelog"] = {"repo": REPO, **CHANGELOG}
    return table


def rederive(table: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """An existing table with its constant-input rules read again from each row's restriction text and the
    spec's opset ceiling applied (so a parser fix reaches the tables without the operators.md copies)."""
    for entry in table["supported"].values():  # attribute values stay as the importer corrected them
        static = rules_from_restrictions(entry.get("restrictions", "")).get("static_inputs")
        if static:
            entry["static_inputs"] = static
    if "opset" in spec:
        table["opset"], table["opset_source"] = list(spec["opset"]), spec["opset_source"]
    return table


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def importer_bodies(source: str) -> dict[str, str]:
    """Op name -> its importer's source text, for every ``DEFINE_BUILTIN_OP_IMPORTER(op)``."""
    marks = list(_IMPORTER.finditer(source))
    return {m.group(1): source[m.end() : (marks[i + 1].start() if i + 1 < len(marks) else len(source))]
            for i, m in enumerate(marks)}  # fmt: skip


def importer_view(spec: dict[str, Any], source: str) -> dict[str, Any]:
    """What one release's importer source says: registered standard ops and evidenced attribute values."""
    bodies = importer_bodies(source)
    # not ONNX ops: TensorRT's own TRT_* ops, the plugin / local-function fallbacks, the macro's definition
    ops = {op for op in bodies if not op.startswith("TRT_") and op not in _NOT_OPS}
    after_101 = spec["importer"]["ref"] == "10.1-GA"
    version = _version_key(spec["trt_version"])
    added = {op: why for op, (since, why) in _ADDED_AFTER_101.items() if after_101 and _version_key(since) <= version}
    values = {key: bool(re.search(rx, bodies.get(key[0], ""))) for key, rx in ATTRIBUTE_EVIDENCE.items()}
    return {"ops": ops | set(added), "added_by_changelog": added, "attribute_values": values}


def docs_view(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` with earlier importer corrections undone (the operators.md view)."""
    table = json.loads(json.dumps(table))
    for d in table.pop("disagreements", []):
        op = d["op"]
        if d["kind"] == "registered importer, docs unsupported":
            table["supported"].pop(op, None)
            table["unsupported"][op] = d["docs"]
        elif d["kind"] == "registered importer, not in docs":
            table["supported"].pop(op, None)
        elif d["kind"] == "attribute value":
            attrs = table["supported"][op].setdefault("attributes", {})
            attrs[d["attribute"]] = d["docs"]
    table.pop("importer", None)
    return table


def apply_importer(table: dict[str, Any], spec: dict[str, Any], view: dict[str, Any]) -> dict[str, Any]:
    """Correct the docs' matrix with the importer source; every change is listed under ``disagreements``."""
    table = docs_view(table)
    out: list[dict[str, Any]] = []
    for op in sorted(view["ops"]):
        why = view["added_by_changelog"].get(op)
        source = why or f"DEFINE_BUILTIN_OP_IMPORTER({op}) in {spec['importer']['path']} at {spec['importer']['ref']}"
        if op in table["unsupported"]:
            out.append({"op": op, "kind": "registered importer, docs unsupported", "docs": table["unsupported"][op],
                        "importer": source, "used": "importer"})  # fmt: skip
            del table["unsupported"][op]
            table["supported"][op] = {"types": [], "restrictions": "", "from_importer": True}
        elif op not in table["supported"]:
            out.append({"op": op, "kind": "registered importer, not in docs", "docs": None, "importer": source,
                        "used": "importer"})  # fmt: skip
            table["supported"][op] = {"types": [], "restrictions": "", "from_importer": True}
    for op in sorted(set(table["supported"]) - view["ops"]):
        # kept: from 9.0 the parser also imports ONNX local functions, and a row without an importer
        # may be served that way; listed so a reader can judge
        out.append({"op": op, "kind": "documented, no importer registered", "docs": "supported", "importer": None,
                    "used": "docs"})  # fmt: skip
    for (op, attr, value), present in sorted(view["attribute_values"].items()):
        entry = table["supported"].get(op)
        allowed = (entry or {}).get("attributes", {}).get(attr)
        if entry is None or allowed is None or (value in allowed) == present:
            continue
        new = sorted(set(allowed) | {value}) if present else [v for v in allowed if v != value]
        out.append({"op": op, "kind": "attribute value", "attribute": attr, "value": value, "docs": allowed,
                    "importer": f"{'present' if present else 'absent'}: {ATTRIBUTE_EVIDENCE[(op, attr, value)]}",
                    "used": "importer"})  # fmt: skip
        entry["attributes"][attr] = new
    table["importer"] = {"repo": REPO, **{k: v for k, v in spec["importer"].items() if k != "file"}}
    if view["added_by_changelog"]:
        table["importer"]["plus_changelog"] = sorted(view["added_by_changelog"])
    table["disagreements"] = out
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", type=Path, help="folder with the operators.md copies (default: existing tables)")
    ap.add_argument("--importers", type=Path, help="folder with the importer sources (<ref>.cpp)")
    ap.add_argument("--out", required=True, type=Path, help="edgedeploy/targets/data")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in TABLES:
        path = args.out / f"{spec['id']}.json"
        table = (
            build_table(spec, args.src) if args.src else rederive(json.loads(path.read_text(encoding="utf-8")), spec)
        )
        if args.importers:
            source = (args.importers / spec["importer"]["file"]).read_text(encoding="utf-8", errors="replace")
            table = apply_importer(table, spec, importer_view(spec, source))
        path.write_text(json.dumps(table, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        n = len(table.get("disagreements", []))
        print(
            f"{path}: {len(table['supported'])} supported, {len(table['unsupported'])} unsupported, {n} disagreements"
        )


if __name__ == "__main__":
    main()
