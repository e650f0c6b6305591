"""The Python environment a build runs in, as one digest: the stage cache keys every entry with it.

A stage's artifact depends on more than its inputs and config: the exporter, the quantizer, ONNX Runtime and
any library the model's code imports made it. A cached entry made under other versions would replay an old
export or an old parity verdict, so the key holds the interpreter's version and every distribution installed
on ``sys.path`` (each ``*.dist-info`` / ``*.egg-info`` folder's name carries the name and version), folder by
folder in import order. Installing, removing or upgrading any package, or another interpreter, makes every
stage run again once.

The names are read from the folders' listings: nothing is imported (a fully cached build never imports torch)
and it costs milliseconds.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Sequence

from edgedeploy.fileio.hashing import sha256_json

_METADATA_SUFFIXES = (".dist-info", ".egg-info")


def installed_distributions(paths: Sequence[str] | None = None) -> list[tuple[str, list[str]]]:
    """(folder, sorted ``name-version.dist-info`` / ``.egg-info`` entries) for every folder on ``paths``
    (default ``sys.path``) that holds any, in import order: where two folders hold one package, the first wins.

    An entry that is not a readable folder (a zip archive, a folder since removed) holds nothing to list.
    """
    found: list[tuple[str, list[str]]] = []
    for entry in sys.path if paths is None else paths:
        folder = os.path.abspath(entry or os.curdir)  # "" is the working directory
        try:
            with os.scandir(folder) as listing:
                names = sorted(e.name for e in listing if e.name.endswith(_METADATA_SUFFIXES))
        except OSError:
            continue
        if names:
            found.append((folder, names))
    return found


def environment_key() -> str:
    """sha256 of the interpreter (version, build, machine) and :func:`installed_distributions`."""
    return sha256_json(
        {
            "python": sys.version,
            "implementation": sys.implementation.cache_tag,
            "machine": platform.machine(),
            "distributions": installed_distributions(),
        }
    )
