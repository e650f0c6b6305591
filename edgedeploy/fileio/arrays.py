"""Bounded reads of ``.npy`` / ``.npz`` files: headers first, then only the rows that are used.

``np.load`` allocates whatever a header declares and inflates a whole ``.npz`` member, so a 6 MB zip
of zeros becomes gigabytes and a forged ``.npy`` header asks for a petabyte. Here each array's
header (shape, dtype) is read first and checked: no Python objects, the declared bytes fit in the
file (or, in a zip, in the member's uncompressed size), one row is no larger than ``row_bound``
bytes; then only the first ``limit`` rows are read. Members nobody asked for are never inflated.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from edgedeploy.errors import InputError


def _header(fh: IO[bytes], where: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    from numpy.lib import format as npformat

    try:
        version = npformat.read_magic(fh)
        read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        shape, fortran, dtype = read(fh)
    except (ValueError, OSError, EOFError, SyntaxError) as exc:
        raise InputError(
            f"{where}: not a numpy array file ({exc})", hint="save it with numpy.save / numpy.savez"
        ) from None
    return tuple(int(d) for d in shape), bool(fortran), dtype


def array_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each array in a .npz (``arr_0`` for a .npy), from the headers alone: no data is read.

    Raises:
        InputError: the file is not a NumPy array file.
    """
    try:
        if path.suffix.lower() == ".npy":
            with path.open("rb") as single:
                return {"arr_0": _header(single, str(path))[0]}
        with zipfile.ZipFile(path) as archive:
            out = {}
            for member in archive.namelist():
                if member.endswith(".npy"):
                    with archive.open(member) as stream:
                        out[member[: -len(".npy")]] = _header(stream, f"{path}:{member}")[0]
            return out
    except (OSError, zipfile.BadZipFile, InputError) as exc:
        detail = exc.message if isinstance(exc, InputError) else str(exc)
        raise InputError(
            f"{path} is not a NumPy array file ({detail})", hint="save it with numpy.save / numpy.savez"
        ) from None


def read_rows(
    fh: IO[bytes], *, stored: int | None, limit: int | None, row_bound: int, where: str
) -> tuple[np.ndarray, int]:
    """The first ``limit`` rows (all when None) of the ``.npy`` stream ``fh``, after checking its header,
    and how many rows it holds.

    Args:
        stored: bytes the file (or zip member, uncompressed) holds after nothing else; None: unknown.
        row_bound: the most bytes one row (one sample) may take.

    Raises:
        InputError: not an array, Python objects, a header declaring more than the file holds, a row over
            ``row_bound``, fewer bytes than declared (truncated), or a Fortran-order array with more rows than
            ``limit`` (it would be read whole).
    """
    shape, fortran, dtype = _header(fh, where)
    if dtype.hasobject:
        raise InputError(f"{where}: holds Python objects (dtype {dtype}); refused, pickled data can run code")
    if not shape:
        raise InputError(f"{where}: a single value, not an array of samples")
    rows, row_bytes = shape[0], math.prod(shape[1:]) * dtype.itemsize
    total = rows * row_bytes
    if stored is not None and total > stored:
        raise InputError(
            f"{where}: header declares shape {list(shape)} {dtype} ({total:,} bytes) but the file holds "
            f"{stored:,}: truncated or forged",
            hint="save the array again with numpy.save / numpy.savez",
        )
    if row_bytes > row_bound:
        raise InputError(
            f"{where}: one sample of shape {list(shape[1:])} {dtype} takes {row_bytes:,} bytes; the model's input "
            f"takes at most {row_bound:,}",
            hint="save samples shaped like the model's input (first axis: samples)",
        )
    take = rows if limit is None else min(rows, limit)
    if fortran and take < rows:
        # column-major: the first rows are spread over the whole array, so reading them means reading all of it,
        # which a compressed member's header can declare as gigabytes of a few kilobytes on disk
        raise InputError(
            f"{where}: a Fortran-order array of {rows:,} samples of which {take:,} are used: it would be read "
            f"whole ({total:,} bytes)",
            hint="save it in C order (numpy.save(path, numpy.ascontiguousarray(a))), or only the samples used",
        )
    need = (total if fortran else take * row_bytes) if take else 0
    data = fh.read(need)
    if len(data) < need:
        raise InputError(f"{where}: truncated ({len(data):,} of {need:,} bytes)", hint="save the array again")
    arr = np.frombuffer(data, dtype=dtype).reshape(
        shape if fortran else (take, *shape[1:]), order="F" if fortran else "C"
    )
    return np.array(arr[:take]), rows  # a writable copy of the used rows only


def read_npy(path: Path, *, limit: int | None, row_bound: int) -> tuple[np.ndarray, int]:
    """The first ``limit`` rows of a ``.npy`` file, bounded (see :func:`read_rows`), and its row count.

    Raises:
        InputError: unreadable, or refused by :func:`read_rows`.
    """
    try:
        with open(path, "rb") as fh:
            size = path.stat().st_size
            return read_rows(fh, stored=size, limit=limit, row_bound=row_bound, where=str(path))
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror or exc})") from None


def read_npz(
    path: Path, names: list[str] | None, *, limit: int | None, row_bound: int
) -> tuple[dict[str, tuple[np.ndarray, int]], list[str]]:
    """Arrays of a ``.npz`` (only ``names``; all when None; the one array when there is one and it is not
    named), each bounded (see :func:`read_rows`) with its row count, and the names of every array it holds.

    A member's uncompressed size is the zip header's, which zipfile never reads past.

    Raises:
        InputError: not a zip, unreadable, or a member refused by :func:`read_rows`.
    """
    try:
        with zipfile.ZipFile(path) as zf:
            members = {i.filename.removesuffix(".npy"): i for i in zf.infolist() if i.filename.endswith(".npy")}
            wanted = [n for n in members if names is None or n in names]
            if names is not None and len(members) == 1 and not wanted:
                wanted = list(members)
            out = {}
            for name in wanted:
                info = members[name]
                with zf.open(info) as fh:
                    out[name] = read_rows(
                        fh, stored=info.file_size, limit=limit, row_bound=row_bound, where=f"{path}[{name}]"
                    )
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as exc:
        raise InputError(f"{path}: not a readable .npz ({exc})", hint="save it with numpy.savez") from None
    return out, list(members)
