"""``deploy cache prune``: bound the stage cache (least recently used entries go first)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="manage the stage cache (prune it to a size)")
    csub = p.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    pr = csub.add_parser("prune", help="delete least recently used cache entries beyond --max-size")
    where = pr.add_mutually_exclusive_group()
    where.add_argument(
        "--dir",
        default=None,
        help="cache folder (default $EDGEDEPLOY_CACHE_DIR, else $XDG_CACHE_HOME/edgedeploy or ~/.cache/edgedeploy)",
    )
    where.add_argument("--out", default=None, help="an output folder of an earlier version; prunes <out>/.cache")
    pr.add_argument(
        "--max-size", default=None, help="bound, e.g. 500M or 10G (default $EDGEDEPLOY_CACHE_MAX_SIZE, else 10G)"
    )
    pr.set_defaults(handler=run_prune)


def run_prune(args: argparse.Namespace) -> int:
    """Prune the named or default cache folder to its size bound.

    Raises:
        ConfigError: ``--max-size`` is not a size.
        InputError: the folder named by ``--dir``, ``--out`` or ``$EDGEDEPLOY_CACHE_DIR`` does not exist (a
            mistyped path would otherwise read as an empty cache), or is a link or not this user's.
    """
    import os
    from pathlib import Path

    from edgedeploy.errors import ConfigError, InputError
    from edgedeploy.pipeline.cache import CACHE_ENV, StageCache, default_cache_dir, max_cache_bytes, parse_size

    root = args.dir or (str(Path(args.out) / ".cache") if args.out else str(default_cache_dir()))
    try:
        limit = parse_size(args.max_size) if args.max_size is not None else max_cache_bytes()
    except ValueError:
        raise ConfigError(f"--max-size {args.max_size!r} is not a size", hint="e.g. 500M, 10G") from None
    if not os.path.lexists(root):
        # a named folder that is missing is a mistyped path, not an empty cache; the default folder before the
        # first build made it is an empty cache, and says so below
        if args.dir or args.out:
            flag = "--dir" if args.dir else "--out"
            raise InputError(
                f"cache folder not found: {root} ({flag})",
                hint=f"check the path, or leave out {flag} to prune the cache deploy build uses "
                f"({default_cache_dir()})",
            )
        if os.environ.get(CACHE_ENV):
            raise InputError(
                f"cache folder not found: {root} (${CACHE_ENV})",
                hint=f"set {CACHE_ENV} to the folder deploy build caches in, or unset it for the default",
            )
    cache = StageCache(Path(root))
    removed, freed = cache.prune(limit)
    left = sum(r[1] for r in cache.entries())
    print(f"pruned {removed} entries ({_size(freed)}) from {root}; {_size(left)} left (bound {_size(limit)})")
    return 0


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
