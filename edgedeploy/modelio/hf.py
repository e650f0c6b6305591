"""A Hugging Face model folder (``save_pretrained`` output) as a model source: ``[model] hf = "path"``.

At config load (``edgedeploy.hfspec``, no transformers import, so refusals stay fast) ``config.json``
supplies what a factory config would: the input spec (``input_ids`` / ``attention_mask`` /
``token_type_ids`` with ``batch`` and ``sequence`` dims, or ``pixel_values``), the outputs, and
the factory (:func:`from_folder`, which wraps the model so it takes positional tensors and returns
the task's outputs). Values the config sets itself win. Tasks:

- ``feature-extraction`` (default): output ``embedding``; text models mean-pool the last hidden
  state over the attention mask (sentence embedders), vision models use the pooled output;
- ``sequence-classification``, ``token-classification``, ``image-classification``: ``logits``.

Text data (calibration, validation) can be a plain ``.txt`` file, one sentence a line, tokenized
with the folder's tokenizer (:func:`text_batches`).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from edgedeploy.errors import ConfigError, InputError
from edgedeploy.hfspec import read_folder_config


def wrap(model: Any, task: str, inputs: list[str]) -> Any:
    """``model`` as a module taking the named inputs positionally and returning the task's outputs (a tuple).

    torch.export maps ``dynamic_shapes`` onto named parameters (``*args`` counts as one), so the
    wrapper's ``forward`` is given exactly the input names as its parameters.

    Raises:
        ConfigError: an input name that is not a Python identifier.
    """
    import torch

    bad = [n for n in inputs if not n.isidentifier() or n in ("self", "model")]
    if bad:
        raise ConfigError(f"model.hf: input names must be Python identifiers, got {bad}")

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.task = task
            self.names = list(inputs)

        def run(self, kwargs: dict[str, Any]) -> Any:
            out = self.model(**kwargs, return_dict=True)
            if self.task != "feature-extraction":
                return (out.logits,)
            mask = kwargs.get("attention_mask")
            hidden = getattr(out, "last_hidden_state", None)
            if mask is not None and hidden is not None and hidden.dim() == 3:
                # mean over real tokens only: padding must not move a sentence embedding
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                return ((hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9),)
            pooled = getattr(out, "pooler_output", None)
            if pooled is not None:
                return (pooled.flatten(1),)
            if hidden is None:
                raise ConfigError(f"model.hf: {type(self.model).__name__} returns no hidden state to pool")
            return (hidden.flatten(2).mean(-1) if hidden.dim() == 4 else hidden.mean(1),)

    params = ", ".join(inputs)
    source = f"def forward(self, {params}):\n    return self.run({{{', '.join(f'{n!r}: {n}' for n in inputs)}}})\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<edgedeploy.modelio.hf>", "exec"), namespace)  # identifiers checked above
    Wrapped.forward = namespace["forward"]  # type: ignore[method-assign]
    return Wrapped().eval()


@contextlib.contextmanager
def no_prompt() -> Iterator[None]:
    """transformers asks "run custom code? [y/N]" on stdin when it is unsure; a build never waits on (or takes
    an answer from) stdin: it reads an empty one while transformers loads."""
    saved = sys.stdin
    with open(os.devnull) as empty:
        sys.stdin = empty
        try:
            yield
        finally:
            sys.stdin = saved


def from_folder(
    folder: str, task: str = "feature-extraction", inputs: list[str] | None = None, trust_remote_code: bool = False
) -> Any:
    """The model in ``folder`` for ``task``, wrapped to take positional tensors (the model factory).

    The folder's own code (``auto_map``) runs only with ``trust_remote_code`` (``model.trust_remote_code``).

    Raises:
        ConfigError: transformers is not installed, or the folder does not load.
    """
    try:
        import transformers
    except ImportError:
        raise ConfigError("model.hf needs the transformers package", hint="pip install 'edgedeploy[hf]'") from None
    transformers.logging.set_verbosity_error()  # load-time notices go nowhere useful in a build log
    hf_cfg = read_folder_config(Path(folder), "model.hf")
    classes = {
        "feature-extraction": "AutoModel",
        "sequence-classification": "AutoModelForSequenceClassification",
        "token-classification": "AutoModelForTokenClassification",
        "image-classification": "AutoModelForImageClassification",
    }
    name = classes[task]
    if task == "feature-extraction" and hf_cfg["model_type"] in ("t5", "mt5", "umt5"):
        name = "T5EncoderModel" if hf_cfg["model_type"] == "t5" else "UMT5EncoderModel"
    cls = getattr(transformers, name)
    try:
        # eager attention: the plainest graph for every exporter and runtime
        with no_prompt():
            model = cls.from_pretrained(folder, attn_implementation="eager", trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types for a folder that does not load
        raise ConfigError(f"model.hf {folder}: {cls.__name__}.from_pretrained failed: {exc}") from None
    model.config.use_cache = False
    return wrap(model.eval(), task, list(inputs or ["input_ids", "attention_mask"]))


def text_batches(cfg: Any, path: Path, *, limit: int | None = None) -> list[dict[str, np.ndarray]]:
    """Batches of tokenized lines of a text file (one sample a line), shaped to the input spec.

    Each batch holds up to the ``batch`` dim's max lines, padded to the longest line within the
    ``sequence`` dim's [min, max] (longer lines are truncated).

    Raises:
        InputError: no tokenizer in the model folder, an empty file, or a model without text inputs.
    """
    folder = cfg.model.kwargs.get("folder") if cfg.model.hf else None
    if not folder:
        raise InputError(f"{path}: text data needs a Hugging Face model folder (model.hf) with a tokenizer")
    names = [s.name for s in cfg.inputs]
    if "input_ids" not in names:
        raise InputError(f"{path}: text data, but the model has no input_ids input", hint="pass .npz data")
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"text data unreadable: {path} ({exc})") from None
    if limit is not None:
        lines = lines[:limit]
    if not lines:
        raise InputError(f"text data {path} has no non-empty lines")
    try:
        from transformers import AutoTokenizer

        with no_prompt():
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=cfg.model.trust_remote_code is True)
    except Exception as exc:  # no tokenizer files, or transformers missing
        raise InputError(
            f"{path}: cannot load a tokenizer from {folder} ({type(exc).__name__}: {str(exc)[:200]})",
            hint="save the tokenizer next to the model (tokenizer.save_pretrained(folder))",
        ) from None
    spec = next(s for s in cfg.inputs if s.name == "input_ids")
    seq_dim = spec.shape[1] if isinstance(spec.shape[1], str) else None
    batch_dim = spec.shape[0] if isinstance(spec.shape[0], str) else None
    lo, hi = (cfg.dims[seq_dim].min, cfg.dims[seq_dim].max) if seq_dim else (spec.shape[1], spec.shape[1])
    per = cfg.dims[batch_dim].max if batch_dim else int(spec.shape[0])
    if tokenizer.pad_token is None:  # GPT-2 style tokenizers: pad with EOS, the mask hides it
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    batches = []
    for start in range(0, len(lines), per):
        chunk = lines[start : start + per]
        if batch_dim is None and len(chunk) < per:
            chunk = chunk + [chunk[-1]] * (per - len(chunk))
        enc = tokenizer(chunk, padding="longest", truncation=True, max_length=int(hi), return_tensors="np")
        feeds = {}
        for s in cfg.inputs:
            arr = np.asarray(enc[s.name]) if s.name in enc else np.zeros_like(np.asarray(enc["input_ids"]))
            if arr.shape[1] < lo:
                pad = 0 if s.name != "input_ids" else (tokenizer.pad_token_id or 0)
                arr = np.pad(arr, ((0, 0), (0, int(lo) - arr.shape[1])), constant_values=pad)
            feeds[s.name] = arr.astype(np.int64 if s.dtype == "int64" else np.int32)
        batches.append(feeds)
    return batches


def text_arrays(cfg: Any, path: Path, *, limit: int | None = None) -> dict[str, np.ndarray]:
    """All lines of a text file tokenized into one array per input, padded to a common length.

    Raises:
        InputError: as :func:`text_batches`.
    """
    batches = text_batches(cfg, path, limit=limit)
    width = max(b["input_ids"].shape[1] for b in batches)
    out: dict[str, list[np.ndarray]] = {}
    for b in batches:
        for name, arr in b.items():
            pad = width - arr.shape[1]
            out.setdefault(name, []).append(np.pad(arr, ((0, 0), (0, pad))) if pad else arr)
    return {k: np.concatenate(v) for k, v in out.items()}
