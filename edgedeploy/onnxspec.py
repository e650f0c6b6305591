"""An ONNX model's input / output spec, read from its graph (plain data; no torch, no ONNX Runtime).

``[model] onnx = "model.onnx"`` (``deploy build --onnx model.onnx``) builds from an ONNX model the user
already has: the inputs (names, dtypes, sizes; a ``dim_param`` is a named dynamic dim), the outputs and
the dims are filled in at config load from here, so refusals stay fast. Values the config (or ``--input``
/ ``--dim`` / ``--output``) sets itself win. A dynamic leading (batch) dim without sizes is validated at 1;
any other dynamic dim needs its sizes (``--dim NAME=MIN:OPT:MAX``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from edgedeploy.errors import ConfigError, InputError

# ONNX TensorProto element types the input generators can make
DTYPES = {1: "float32", 10: "float16", 7: "int64", 6: "int32", 9: "bool"}
BATCH_DIM = {"min": 1, "opt": 1, "max": 1}


def onnx_path(raw: dict[str, Any], base_dir: Path) -> Path:
    path = Path(raw["model"]["onnx"]).expanduser()
    return path if path.is_absolute() else base_dir / path


def read_graph(path: Path, where: str) -> Any:
    """The ONNX graph of ``path`` (weights in external data are not read).

    Raises:
        InputError: the file is missing, empty or not an ONNX model.
    """
    if not path.is_file():
        raise InputError(f"{where}: key 'model.onnx': file not found: {path}", hint="fix model.onnx or --onnx PATH")
    if path.stat().st_size == 0:  # protobuf parses zero bytes as an empty model
        raise InputError(f"{path} is empty (0 bytes), not an ONNX model", hint="export the model again")
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # DecodeError and friends: not an ONNX file
        raise InputError(f"{path} is not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.graph.output or not model.graph.input:
        raise InputError(f"{path} has no graph inputs or outputs: not an exported ONNX model", hint="export it again")
    _check_external_data(model, path)
    return model.graph


def _check_external_data(model: Any, path: Path) -> None:
    """Every tensor kept in external data names a plain relative file beside the model: a location that leaves
    the model's folder (``../../etc/passwd``, an absolute path, a link out of it) is refused before anything
    reads it.

    Raises:
        InputError: a tensor's external data location leaves the model's folder.
    """
    import os

    folder = path.resolve().parent
    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node for a in n.attribute if a.HasField("t")]
    for tensor in tensors:
        if tensor.data_location != 1:  # onnx.TensorProto.EXTERNAL
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()
        if not location or os.path.isabs(location) or folder not in target.parents:
            raise InputError(
                f"{path}: tensor {tensor.name!r} keeps its data at {location!r}, outside the model's folder "
                f"{folder}: refused, nothing read from it",
                hint="export the model again with its external data file beside it (a plain file name)",
            )


def _dim_name(text: str, fallback: str) -> str:
    name = re.sub(r"\W+", "_", text).strip("_")
    return name or fallback


def spec_from_graph(graph: Any, where: str) -> tuple[list[dict[str, Any]], list[str], list[tuple[str, int]]]:
    """(inputs, outputs, named dims with the axis they first appear on) of an ONNX graph.

    Raises:
        ConfigError: an input of a dtype the tool cannot generate.
    """
    initializers = {t.name for t in graph.initializer}
    inputs: list[dict[str, Any]] = []
    dims: list[tuple[str, int]] = []
    for value in graph.input:
        if value.name in initializers:  # old exporters list weights as graph inputs
            continue
        tensor = value.type.tensor_type
        dtype = DTYPES.get(tensor.elem_type)
        if dtype is None:
            raise ConfigError(
                f"{where}: ONNX input {value.name!r} has element type {tensor.elem_type}, which edgedeploy cannot "
                f"generate inputs for",
                hint=f"inputs of {', '.join(DTYPES.values())} only",
            )
        shape: list[int | str] = []
        for axis, d in enumerate(tensor.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(int(d.dim_value))
                continue
            name = _dim_name(d.dim_param, f"{value.name}_{axis}")
            shape.append(name)
            if name not in [n for n, _ in dims]:
                dims.append((name, axis))
        inputs.append({"name": value.name, "shape": shape, "dtype": dtype})
    return inputs, [o.name for o in graph.output], dims


def fill_from_onnx(raw: dict[str, Any], base_dir: Path, where: str) -> None:
    """Fill inputs, outputs and dims of a raw config from its ``model.onnx`` graph (in place).

    Raises:
        ConfigError: a factory or Hugging Face folder set as well, an input dtype that cannot be generated,
            or a dynamic dim other than a leading batch dim without sizes.
        InputError: the file is missing or not an ONNX model.
    """
    model = raw["model"]
    if model.get("factory") or model.get("hf"):
        raise ConfigError(f"{where}: set one of model.onnx, model.factory and model.hf, not several")
    if model.get("checkpoint"):
        raise ConfigError(
            f"{where}: model.checkpoint does not apply to model.onnx (the ONNX file holds the weights)",
            hint="drop --checkpoint / model.checkpoint",
        )
    ignored = [f"export.{k}" for k in ("capture", "exporter", "opset") if k in (raw.get("export") or {})]
    ignored += ["model.kwargs"] if model.get("kwargs") else []
    if ignored:  # nothing exports or constructs a model given as ONNX: these would be ignored without a word
        raise ConfigError(
            f"{where}: {', '.join(ignored)} do(es) not apply to model.onnx (the model is already exported)",
            hint="drop them, or build from the PyTorch model (model.factory) to export it here",
        )
    path = onnx_path(raw, base_dir)
    inputs, outputs, dims = spec_from_graph(read_graph(path, where), where)
    raw.setdefault("inputs", inputs)
    given_outputs = raw.setdefault("outputs", outputs)
    if isinstance(given_outputs, list) and len(given_outputs) != len(outputs):
        raise ConfigError(
            f"{where}: {path.name} has {len(outputs)} output(s) ({', '.join(outputs)}), the config names "
            f"{len(given_outputs)} ({', '.join(map(str, given_outputs))})",
            hint="name each graph output once, in order (--output NAME per output), or leave them out",
        )
    given = raw.setdefault("dims", {})
    used = {d for spec in raw["inputs"] for d in spec.get("shape", []) if isinstance(d, str)}
    for name, axis in dims:
        if name in given or name not in used:
            continue
        if axis != 0:
            raise ConfigError(
                f"{where}: {path.name} has dynamic dim {name!r} (axis {axis}) and no sizes for it",
                hint=f"pass --dim {name}=MIN:OPT:MAX (or add [dims.{name}])",
            )
        given[name] = dict(BATCH_DIM)
