"""A Hugging Face model folder's spec, from its ``config.json`` alone (plain data; no torch, no transformers).

``[model] hf = "path"`` is filled in at config load from here, so refusals stay fast: the input
spec (``input_ids`` / ``attention_mask`` / ``token_type_ids`` with ``batch`` and ``sequence`` dims,
or ``pixel_values``), the outputs, and the factory (``edgedeploy.modelio.hf:from_folder``).
Values the config sets itself win. See docs/huggingface.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgedeploy.errors import ConfigError
from edgedeploy.jsonread import read_json

FACTORY = "edgedeploy.modelio.hf:from_folder"
TASKS = ("feature-extraction", "sequence-classification", "token-classification", "image-classification")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# model types whose forward takes token_type_ids (segment ids); other text models get ids + mask
SEGMENT_TYPES = ("bert", "albert", "electra", "mpnet", "xlm", "layoutlm", "megatron-bert", "ernie", "convbert")
VISION_KEYS = ("image_size", "num_channels")
TEXT_DIMS = {"batch": {"min": 1, "opt": 2, "max": 4}, "sequence": {"min": 1, "opt": 16, "max": 64}}


def read_folder_config(folder: Path, where: str) -> dict[str, Any]:
    """The folder's ``config.json``.

    Raises:
        ConfigError: the folder or its config.json is missing or unreadable.
    """
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(
            f"{where}: key 'model.hf' = {str(folder)!r} has no config.json",
            hint="point model.hf at a folder written by save_pretrained()",
        )
    try:
        data = read_json(path, follow_links=True)  # a hub snapshot links its files into the blob store
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{path}: no 'model_type'; not a Hugging Face model config")
    return data


def remote_code(folder: Path, hf_cfg: dict[str, Any]) -> str:
    """What code the folder asks transformers to run (``auto_map`` in config.json or tokenizer_config.json),
    as ``file: Class, ...``; empty when none."""
    named = []
    sources = [("config.json", hf_cfg)]
    tok_path = folder / "tokenizer_config.json"
    if tok_path.exists():
        try:  # a FIFO or a device here would block or flood a plain read: one line instead
            tok = read_json(tok_path, follow_links=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{tok_path}: unreadable ({exc})", hint="replace it with the tokenizer's file") from None
        sources.append(("tokenizer_config.json", tok if isinstance(tok, dict) else {}))
    for name, data in sources:
        auto_map = data.get("auto_map")
        if not auto_map:
            continue
        refs = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
        flat = [r for ref in refs for r in (ref if isinstance(ref, list) else [ref]) if r]
        named.append(f"{name} auto_map: {', '.join(str(r) for r in flat[:3]) or '?'}")
    return "; ".join(named)


def weights_file(folder: Path) -> Path | None:
    """The folder's weights file (safetensors preferred), if any."""
    return next((folder / n for n in WEIGHT_FILES if (folder / n).is_file()), None)


def is_vision(hf_cfg: dict[str, Any]) -> bool:
    return "image_size" in hf_cfg and "vocab_size" not in hf_cfg


def _whole(hf_cfg: dict[str, Any], key: str, default: int, least: int = 1) -> int:
    """``config.json``'s ``key`` as a whole number of at least ``least`` (``default`` when absent or null).

    Raises:
        ConfigError: any other value (a string, a list, a bool, a fraction, one below ``least``).
    """
    value = hf_cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < least:
        raise ConfigError(
            f"config.json: key {key!r} = {value!r} must be a whole number of at least {least}",
            hint="fix the folder's config.json (as save_pretrained() writes it)",
        )
    return int(value)


def _image_size(hf_cfg: dict[str, Any]) -> int:
    size = hf_cfg.get("image_size")
    if isinstance(size, (list, tuple)) and size:
        return _whole({"image_size": size[0]}, "image_size", 224)
    return _whole(hf_cfg, "image_size", 224)


def default_spec(hf_cfg: dict[str, Any], task: str) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """(inputs, dims, outputs) for a folder's config and task."""
    outputs = ["embedding"] if task == "feature-extraction" else ["logits"]
    if is_vision(hf_cfg):
        size = _image_size(hf_cfg)
        channels = _whole(hf_cfg, "num_channels", 3)
        inputs = [
            {"name": "pixel_values", "shape": ["batch", channels, size, size], "range": [-1.0, 1.0], "kind": "image"}
        ]
        return inputs, {"batch": dict(TEXT_DIMS["batch"])}, outputs
    vocab = _whole(hf_cfg, "vocab_size", 2)
    max_len = _whole(hf_cfg, "max_position_embeddings", 0) or _whole(hf_cfg, "n_positions", 512)
    seq = dict(TEXT_DIMS["sequence"])
    seq["max"] = min(seq["max"], max_len)
    seq["opt"] = min(seq["opt"], seq["max"])
    inputs = [
        {"name": "input_ids", "shape": ["batch", "sequence"], "dtype": "int64", "range": [0, vocab - 1], "kind": "ids"},
        {"name": "attention_mask", "shape": ["batch", "sequence"], "dtype": "int64", "range": [0, 1], "kind": "mask"},
    ]
    if hf_cfg["model_type"] in SEGMENT_TYPES:
        types = max(1, _whole(hf_cfg, "type_vocab_size", 2, least=0))
        inputs.append(
            {
                "name": "token_type_ids",
                "shape": ["batch", "sequence"],
                "dtype": "int64",
                "range": [0, types - 1],
                "kind": "ids",
            }
        )
    return inputs, {"batch": dict(TEXT_DIMS["batch"]), "sequence": seq}, outputs


def fill_from_folder(raw: dict[str, Any], base_dir: Path, where: str) -> None:
    """Fill factory, kwargs, inputs, dims and outputs of a raw config from its ``model.hf`` folder (in place).

    Raises:
        ConfigError: missing folder / config.json / weights, an unknown task, or a factory set as well.
    """
    model = raw["model"]
    folder = Path(model["hf"]).expanduser()
    folder = folder if folder.is_absolute() else base_dir / folder
    if not folder.is_dir():
        raise ConfigError(f"{where}: key 'model.hf': folder not found: {folder}", hint="fix model.hf or --hf")
    if model.get("factory") and model["factory"] != FACTORY:
        raise ConfigError(f"{where}: set either model.hf or model.factory, not both")
    hf_cfg = read_folder_config(folder, where)
    trusted = model.get("trust_remote_code") is True
    remote = remote_code(folder, hf_cfg)
    if remote and not trusted:
        raise ConfigError(
            f"{where}: model.hf folder {folder} asks to run its own Python code ({remote}); "
            "a model folder is data, its code is not run",
            hint="set model.trust_remote_code = true (--trust-remote-code) only if you trust the folder's code, "
            "or remove auto_map to use transformers' own class",
        )
    task = model.get("task") or "feature-extraction"
    if task not in TASKS:
        raise ConfigError(
            f"{where}: key 'model.task' = {task!r} is not supported", hint=f"use one of {', '.join(TASKS)}"
        )
    if weights_file(folder) is None:
        raise ConfigError(
            f"{where}: model.hf folder {folder} has no weights ({' or '.join(WEIGHT_FILES)})",
            hint="save the model with save_pretrained()",
        )
    inputs, dims, outputs = default_spec(hf_cfg, task)
    raw.setdefault("inputs", inputs)
    raw.setdefault("outputs", outputs)
    given = raw.setdefault("dims", {})
    for name, d in dims.items():
        given.setdefault(name, d)
    model["factory"] = FACTORY
    model["task"] = task
    kwargs = model.setdefault("kwargs", {})
    kwargs.update({"folder": str(folder.resolve()), "task": task, "inputs": [i["name"] for i in raw["inputs"]]})
    if trusted:
        kwargs["trust_remote_code"] = True
    model.setdefault("python_path", ["."])
