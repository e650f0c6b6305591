"""edgedeploy: PyTorch checkpoint → validated, release-gated inference artifact.

Layers, bottom up (``tests/test_layering.py`` enforces them; a module imports only its own
layer or lower ones, and the module graph has no cycles):

0. ``errors``, ``_version``, ``_compat``, plain data: ``schema``, ``policy``, ``artifacts``,
   ``config``, ``targets/``, ``device/`` (the standalone device script);
1. tools: ``fileio/`` (hashing, atomic store), ``modelio/`` (checkpoint, inputs, goldens,
   user-code loading, torch helpers), ``onnxtools/`` (export helpers, ORT session, shapes, op support);
2. domain: ``precision/``, ``trt/``, ``validate/``, ``train/``, ``backends/``, ``remote/`` (the device
   step over SSH);
3. ``stages/``: orchestration only (the stage contract, one stage per module, no stage imports another);
4. ``pipeline/``: runner, cache, manifest, report, gate;
5. ``api``, ``commands/``, ``cli``.

``build`` and ``load_config`` are loaded on first use, so importing ``edgedeploy.errors`` does not
pull in the whole pipeline.
"""

from __future__ import annotations

from typing import Any

from edgedeploy._version import __version__

__all__ = ["__version__", "build", "load_config"]


def __getattr__(name: str) -> Any:
    if name in ("build", "load_config"):
        from edgedeploy import api

        return getattr(api, name)
    raise AttributeError(f"module 'edgedeploy' has no attribute {name!r}")
