"""goldens.npz's layout, read the same on the host and on the device (numpy only, Python 3.6, numpy 1.13).

Copied into device bundles beside ``complete_bundle.py``. Keys are ``point/sample/kind/name``. Kinds:
``in`` and ``out`` (arrays as they are); ``half`` (a float32 input every value of which is a float16 value,
stored as float16 in half the bytes and read back as float32, exactly); ``gen`` (a spec-random float input
stored as its seed, JSON {"seed", "shape", "low", "high", "dtype"}, regenerated with numpy's legacy
``RandomState`` stream, the same on every numpy release since before 1.13); ``sparse`` (an output stored as
every ``stride``-th element of its flat array) with ``sparsemeta`` (JSON {"shape", "stride"}).
"""

# ruff: noqa: UP006, UP035, UP032  (Python 3.6 syntax on purpose: copied into device bundles)
import json
from typing import Any, Dict, List

import numpy as np

GOLDEN_KINDS = ("in", "out", "half", "gen", "sparse", "sparsemeta")
# the most values one golden array may declare (1 GiB of float32): far above any model input or output, far
# below what a forged shape would make this process allocate
MAX_GOLDEN_VALUES = 1 << 28


def checked_shape(shape: Any) -> List[int]:
    """``shape`` as a list of whole non-negative sizes declaring at most :data:`MAX_GOLDEN_VALUES` values.

    Raises:
        ValueError: not such a list.
    """
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError("shape {!r} is not a list of sizes".format(shape))
    total = 1
    for d in shape:
        total *= d
    if total > MAX_GOLDEN_VALUES:
        raise ValueError("shape {} declares {} values, more than a golden may hold".format(shape, total))
    return shape


def seeded_uniform(seed: int, shape: List[int], low: float, high: float, dtype: str) -> np.ndarray:
    """A spec-random float input drawn from numpy's legacy RandomState stream (the same on every numpy)."""
    return np.random.RandomState(int(seed)).uniform(low, high, size=tuple(shape)).astype(dtype)


def goldens_from_arrays(arrays: Dict[str, np.ndarray]) -> Dict[str, Dict[int, Dict[str, Any]]]:
    """{point: {sample: {"in": {...}, "out": {...}, "sparse": {name: (shape, stride)}}}} from goldens.npz's arrays:
    seeded inputs regenerated, sparingly stored outputs kept as their stored elements.

    Raises:
        ValueError: an entry that is not part of an edgedeploy goldens file (its key named).
    """
    out = {}  # type: Dict[str, Dict[int, Dict[str, Any]]]
    for key in sorted(arrays):
        parts = key.split("/", 3)
        if len(parts) != 4 or parts[2] not in GOLDEN_KINDS or not parts[1].isdigit():
            raise ValueError("unexpected entry {!r} (not an edgedeploy goldens file)".format(key))
        point, sample, kind, name = parts
        pair = out.setdefault(point, {}).setdefault(int(sample), {"in": {}, "out": {}, "sparse": {}})
        arr = arrays[key]
        try:
            if kind == "gen":
                g = json.loads(str(arr[()]))
                shape = checked_shape(g["shape"])
                pair["in"][name] = seeded_uniform(g["seed"], shape, g["low"], g["high"], g["dtype"])
            elif kind == "half":
                if arr.dtype != np.float16:
                    raise TypeError("not float16")
                pair["in"][name] = arr.astype(np.float32)
            elif kind == "sparsemeta":
                m = json.loads(str(arr[()]))
                stride = int(m["stride"])
                if stride < 1:
                    raise ValueError("stride {} is not a positive step".format(stride))
                pair["sparse"][name] = (checked_shape(m["shape"]), stride)
            else:
                pair["out" if kind == "sparse" else kind][name] = arr
        except (ValueError, KeyError, TypeError, MemoryError):
            raise ValueError("unreadable entry {!r}".format(key)) from None
    for by_sample in out.values():
        for entry in by_sample.values():
            if set(entry["sparse"]) - set(entry["out"]):
                raise ValueError("sparse output without values: {}".format(sorted(entry["sparse"])))
    return out


def gen_entry(seed: int, shape: List[int], low: float, high: float, dtype: str) -> np.ndarray:
    """The ``gen`` entry that stands for :func:`seeded_uniform`'s array with these arguments."""
    spec = {"seed": int(seed), "shape": [int(d) for d in shape], "low": float(low), "high": float(high)}
    spec["dtype"] = str(dtype)
    return np.array(json.dumps(spec, sort_keys=True))


def half_exact(arr: np.ndarray) -> bool:
    """``arr`` is float32 and every value of it is a float16 value (stored as ``half``, it reads back equal)."""
    if arr.dtype != np.float32 or arr.size == 0:
        return False
    with np.errstate(over="ignore"):
        back = arr.astype(np.float16).astype(np.float32)
    # NaN payloads aside, equal bit for bit (so -0.0 stays -0.0)
    return bool(np.array_equal(back.view(np.uint32), arr.view(np.uint32)))


def sparing_stride(size: int, keep: int) -> int:
    """The stride that keeps at most ``keep`` of ``size`` elements (at least every second one)."""
    return max(2, -(-int(size) // max(1, int(keep))))


def fit_budget(arrays: Dict[str, np.ndarray], budget: int, protect: List[str], keep: int = 4096) -> Dict[str, Any]:
    """Store the largest outputs of ``arrays`` (a goldens dict, changed in place) sparingly until their bytes
    fit ``budget``: every ``stride``-th element, at most ``keep`` of them, with a ``sparsemeta`` entry.

    Outputs of points listed in ``protect`` (real samples) go last. Returns what was done: ``bytes`` before and
    after, ``sparse`` (key -> stride) and ``within_budget``.
    """
    before = sum(int(a.nbytes) for a in arrays.values())
    total = before
    outs = [k for k in arrays if k.split("/")[2] == "out" and arrays[k].size > keep]
    outs.sort(key=lambda k: (k.split("/")[0] in protect, -arrays[k].nbytes))
    sparse = {}  # type: Dict[str, int]
    for key in outs:
        if total <= budget:
            break
        point, sample, _, name = key.split("/", 3)
        full = arrays.pop(key)
        stride = sparing_stride(full.size, keep)
        values = np.ascontiguousarray(full.reshape(-1)[::stride])
        meta = np.array(json.dumps({"shape": [int(d) for d in full.shape], "stride": stride}))
        arrays["{}/{}/sparse/{}".format(point, sample, name)] = values
        arrays["{}/{}/sparsemeta/{}".format(point, sample, name)] = meta
        total += int(values.nbytes) + int(meta.nbytes) - int(full.nbytes)
        sparse[key] = stride
    return {"bytes_full": before, "bytes": total, "sparse": sparse, "within_budget": total <= budget}
