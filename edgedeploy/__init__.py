"""edgedeploy: PyTorch checkpoint → validated, release-gated inference artifact."""

__version__ = "0.1.0"

from edgedeploy.api import build, load_config

__all__ = ["__version__", "build", "load_config"]
