"""Version shims: the package runs on Python 3.10 (JetPack 6) as well as newer Pythons."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = ["tomllib"]
