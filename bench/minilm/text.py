"""Real English text bundled with installed libraries, split into disjoint calibration and held-out passages.

Calibration: scikit-learn's dataset descriptions (``sklearn/datasets/descr/*.rst``). Held out: the Zen of Python
(``this``) and the docstrings of standard-library modules and their public functions and classes. Passages are
1-3 consecutive sentences, so token lengths vary (most are below 128 and padded, as in fixed-shape serving). The
split is by *source*: no held-out passage shares a sentence, or even a document, with a calibration passage.
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path

STDLIB_MODULES = (
    "argparse",
    "collections",
    "csv",
    "json",
    "logging",
    "pathlib",
    "subprocess",
    "threading",
    "zipfile",
    "shutil",
    "tarfile",
    "textwrap",
    "heapq",
    "bisect",
    "datetime",
    "calendar",
    "email",
    "urllib.parse",
)


def calibration_documents() -> dict[str, str]:
    """Document name -> raw text: scikit-learn's dataset descriptions."""
    import sklearn.datasets

    return {
        rst.stem: rst.read_text(encoding="utf-8")
        for rst in sorted((Path(sklearn.datasets.__file__).parent / "descr").glob("*.rst"))
    }


def held_out_documents() -> dict[str, str]:
    """Document name -> raw text: the Zen of Python and standard-library docstrings."""
    import contextlib
    import importlib
    import inspect
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # importing ``this`` prints the Zen
        zen = importlib.import_module("this")
    docs = {"zen_of_python": codecs.decode(zen.s, "rot13")}
    for name in STDLIB_MODULES:
        mod = importlib.import_module(name)
        docs[name] = mod.__doc__ or ""
        for attr in sorted(getattr(mod, "__all__", None) or dir(mod)):
            obj = getattr(mod, attr, None)
            if not attr.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj)):
                if getattr(obj, "__module__", "") == mod.__name__:
                    docs[f"{name}.{attr}"] = inspect.getdoc(obj) or ""
    return docs


def sentences(text: str) -> list[str]:
    """Prose sentences of ``text``: reST markup, tables and reference lists dropped."""
    text = re.sub(r"\.\. .*?(\n\n|$)", "\n", text, flags=re.S)  # directives
    text = re.sub(r"[=\-~*^`|:_]{3,}", " ", text)  # rules and table borders
    text = re.sub(r"[`*|]", "", text)
    text = " ".join(text.split())
    out = []
    for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", text):
        words = s.split()
        letters = sum(c.isalpha() for c in s)
        if 6 <= len(words) <= 80 and letters > 0.6 * len(s):
            out.append(s)
    return out


def passages(doc: str, *, seed: int) -> list[str]:
    """Passages of 1-3 consecutive sentences covering ``doc``'s sentences once."""
    import random

    rng = random.Random(seed)
    sents = sentences(doc)
    out, i = [], 0
    while i < len(sents):
        n = rng.randint(1, 3)
        out.append(" ".join(sents[i : i + n]))
        i += n
    return out


def split(seed: int = 0) -> tuple[list[str], list[str]]:
    """(calibration passages, held-out passages), disjoint by source."""
    calib = [p for i, t in enumerate(calibration_documents().values()) for p in passages(t, seed=seed + i)]
    held = [p for i, t in enumerate(held_out_documents().values()) for p in passages(t, seed=seed + 1000 + i)]
    overlap = set(calib) & set(held)
    return calib, [p for p in held if p not in overlap]
