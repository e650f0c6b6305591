"""Typed generators for seeded inputs, one per ``InputSpec.kind``.

Ranges are inclusive at both ends (``ids`` in ``[0, vocab_size - 1]``). Masks are prefix masks:
each row is ones for a random length in ``[1, L]`` then zeros, and the first row is unmasked, so
no sample is fully masked (a fully masked row makes many models output a constant, and a check of
constants against constants proves nothing) and padding is exercised.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32, "bool": np.bool_}


def kind_of(spec: Any) -> str:
    """The spec's kind; an empty kind follows the dtype (bool → mask-free coin flips, ints → ids, floats → float)."""
    if spec.kind:
        return spec.kind
    if spec.dtype == "bool":
        return "bool"
    return "ids" if np.issubdtype(NP_DTYPES[spec.dtype], np.integer) else "float"


def prefix_mask(shape: tuple[int, ...], rng: np.random.Generator, dtype: Any) -> np.ndarray:
    """Ones for a random prefix of the last axis (length >= 1), zeros after.

    Row 0 is all ones in about half the draws: the full length is always exercised somewhere, and so is a batch
    whose longest row is shorter than the axis, where a model that trims padding to its longest row
    (``pack_padded_sequence`` + ``pad_packed_sequence``) returns a shorter output than the axis.
    """
    if not shape:
        return np.ones((), dtype=dtype)
    length = shape[-1]
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    lengths = rng.integers(1, length + 1, size=rows) if length else np.zeros(rows, dtype=np.int64)
    if rows and rng.random() < 0.5:
        lengths[0] = length
    mask = np.arange(length)[None, :] < lengths[:, None]
    return mask.reshape(shape).astype(dtype)


def generate(spec: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One array for ``spec`` at ``shape``, drawn by the spec's kind."""
    lo, hi = spec.range
    dtype = NP_DTYPES[spec.dtype]
    kind = kind_of(spec)
    if kind == "mask":
        return prefix_mask(shape, rng, dtype)
    if kind == "bool":
        return rng.random(shape) < 0.5
    if kind == "ids" or np.issubdtype(dtype, np.integer):
        return rng.integers(int(lo), int(hi) + 1, size=shape, dtype=np.int64).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def edge_values(spec: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """An array for ``spec`` at ``shape`` made of its range's edges, where random draws never land. Row ``r``
    (along the first axis) takes pattern ``r`` of :data:`EDGE_PATTERNS`, cycling: all zeros (the low end when 0
    is out of range), all the high end, all the low end, then each ordered pair of those alternating along the
    row. A 0/0 (``atan2(0, 0)``), a sign at zero (``atan2(0, -1)``), a tie (TopK's order), an overflow at the
    high end: where an exported op's edge cases differ from PyTorch's.

    Masks and booleans are drawn as :func:`generate` draws them (a mask of edge values would mask whole rows).
    """
    kind = kind_of(spec)
    if kind in ("mask", "bool"):
        return generate(spec, shape, rng)
    dtype = NP_DTYPES[spec.dtype]
    lo, hi = spec.range
    if np.issubdtype(dtype, np.integer):
        lo, hi = int(np.ceil(lo)), int(np.floor(hi))
    value = {"zero": 0 if lo <= 0 <= hi else lo, "hi": hi, "lo": lo}
    out: np.ndarray = np.empty(shape, dtype=dtype)
    if not out.size:
        return out
    rows = out.reshape(shape[0] if shape else 1, -1)
    for r, row in enumerate(rows):
        first, second = EDGE_PATTERNS[r % len(EDGE_PATTERNS)]
        row[0::2], row[1::2] = value[first], value[second]
    return out


# the rows of edge_values: the constant ones first (a batch of one gets zeros), then the alternating pairs
EDGE_PATTERNS = (
    ("zero", "zero"),
    ("hi", "hi"),
    ("lo", "lo"),
    ("lo", "zero"),
    ("zero", "lo"),
    ("lo", "hi"),
    ("hi", "lo"),
    ("zero", "hi"),
    ("hi", "zero"),
)
