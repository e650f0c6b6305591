"""Training stage: the team's training practices as a library, and ``deploy train``.

Domain layer (2): may import plain data and the tools (``fileio``, ``modelio``); never ``stages`` or
``pipeline``. Modules by concern: ``amp`` (autocast, GradScaler, safe step, FP32 islands), ``clipping``,
``monitors`` (gradient flow), ``blocks`` (residual block, init policy), ``losses``, ``lr_finder``, ``utils``
(param diff, peak memory, profiler, anomaly detection), ``distributed`` (DDP via torchrun),
``checkpoint`` (safetensors + metadata sidecar read by ``deploy build``), ``loop``, ``config``,
``splits`` / ``data`` / ``sources`` (digits, npz, image folders, WebDataset, text, callables), ``text``
(tokenizer, bundled corpus), ``options`` (freeze, compile, graph, temperature export), ``tensorboard``,
``models`` (the zoo ``deploy build`` trusts), ``lightning``, ``runner``. Lightning, transformers,
webdataset, tensorboard and torchviz are optional and imported lazily.
"""

from typing import Any

__all__ = ["export_for_deploy"]


def __getattr__(name: str) -> Any:
    """``edgedeploy.train.export_for_deploy`` without importing torch until it is used."""
    if name == "export_for_deploy":
        from edgedeploy.train.export import export_for_deploy

        return export_for_deploy
    raise AttributeError(f"module 'edgedeploy.train' has no attribute {name!r}")
