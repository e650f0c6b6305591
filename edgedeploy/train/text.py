"""Text helpers for ``data.dataset = "hf_text"``: a WordPiece tokenizer trained offline into a folder
``transformers.AutoTokenizer`` loads, and a small real-text corpus from documentation that ships
with scikit-learn (no downloads). ``tokenizers`` / ``transformers`` are imported lazily.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from edgedeploy.errors import ConfigError, InputError

SKLEARN_DESCR = ("breast_cancer", "california_housing", "digits", "iris", "wine_data", "covtype")


def build_wordpiece_tokenizer(texts: Iterable[str], folder: str | Path, vocab_size: int = 2000) -> Path:
    """Train a lower-casing BERT-style WordPiece tokenizer on ``texts`` and save it to ``folder``.

    The folder holds ``tokenizer.json`` + ``tokenizer_config.json`` (a ``BertTokenizerFast``), which
    ``AutoTokenizer.from_pretrained(folder, local_files_only=True)`` loads.

    Raises:
        ConfigError: ``tokenizers`` / ``transformers`` are not installed.
    """
    try:
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise ConfigError("building a tokenizer needs transformers", hint="pip install 'edgedeploy[hf]'") from None
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(list(texts), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )
    folder = Path(folder)
    fast.save_pretrained(str(folder))
    return folder


def sklearn_descr_corpus(words_per_sample: int = 12, names: Sequence[str] = SKLEARN_DESCR) -> list[tuple[str, str]]:
    """``(text, label)`` snippets of the dataset descriptions bundled with scikit-learn.

    Each description (``sklearn/datasets/descr/<name>.rst``) is cut into non-overlapping snippets
    of ``words_per_sample`` words; the label is the dataset's name. Real English prose, offline: a
    small topic-classification set ("which dataset is this sentence about?").

    Raises:
        InputError: scikit-learn or a description file is missing.
    """
    try:
        import sklearn.datasets
    except ImportError:
        raise InputError("the sklearn text corpus needs scikit-learn", hint="pip install 'edgedeploy[data]'") from None
    root = Path(sklearn.datasets.__file__).parent / "descr"
    rows: list[tuple[str, str]] = []
    for name in names:
        path = root / f"{name}.rst"
        if not path.is_file():
            raise InputError(f"scikit-learn description {path} not found")
        words = re.findall(r"[A-Za-z][A-Za-z'\-]*|\d+(?:\.\d+)?", path.read_text(encoding="utf-8"))
        for start in range(0, len(words) - words_per_sample + 1, words_per_sample):
            rows.append((" ".join(words[start : start + words_per_sample]), name))
    return rows


def write_csv(rows: Iterable[tuple[str, str]], path: str | Path) -> Path:
    """Write ``(text, label)`` rows as a CSV with a ``text,label`` header (the hf_text default columns)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path
