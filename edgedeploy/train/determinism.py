"""Deterministic kernels, so that a run stopped and resumed on a GPU ends bit-identical to an uninterrupted one.

On CPU torch's kernels already give the same bits for the same inputs. On CUDA some do not: cuDNN may pick a
convolution algorithm that sums with atomics, and kernels such as the backward of adaptive average pooling or
of index_add accumulate in whatever order the threads finish. ``run.deterministic`` chooses:

- ``auto`` (default): deterministic kernels wherever torch has one (``torch.use_deterministic_algorithms``
  with ``warn_only``, cuDNN's deterministic algorithms, cuBLAS's fixed workspace); an op that has none still
  runs, and torch names it in a warning: a resume is then exact except for that op's last bits.
- ``strict``: an op with no deterministic kernel stops the run, naming the op.
- ``off``: torch's settings as the process has them (cuDNN may pick its fastest, non-deterministic algorithms).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

import torch

from edgedeploy.errors import TargetCapabilityError

# cuBLAS gives run-to-run identical results only with a fixed workspace (CUDA >= 10.2); torch refuses a cuBLAS
# call under deterministic mode unless this is set. It must be set before the process's first cuBLAS handle.
CUBLAS_WORKSPACE = ":4096:8"
_NO_KERNEL = re.compile(r"^(?P<op>\S+) does not have a deterministic implementation")


@contextlib.contextmanager
def deterministic_kernels(mode: str, device: torch.device, source: str) -> Iterator[None]:
    """Run the body with the kernels ``mode`` asks for on ``device``; torch's settings are restored after.
    ``source`` names the config in the error.

    Raises:
        TargetCapabilityError: under ``strict``, an op the model runs has no deterministic kernel on ``device``.
    """
    if mode == "off":
        yield
        return
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    if device.type == "cuda":  # left set after the run: a cuBLAS handle made under it keeps it anyway
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True, warn_only=mode != "strict")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # benchmarking may time a different algorithm per run
    try:
        yield
    except RuntimeError as e:
        refused = no_deterministic_kernel(e, device, source)
        if refused is None:
            raise
        raise refused from None
    finally:
        enabled, warn_only, torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def no_deterministic_kernel(error: BaseException, device: torch.device, source: str) -> TargetCapabilityError | None:
    """Our error for torch's refusal of an op that has no deterministic kernel (strict mode); None for others."""
    found = _NO_KERNEL.match(str(error))
    if found is None:
        return None
    return TargetCapabilityError(
        f"{source}: key 'run.deterministic' = 'strict' but {found['op']} has no deterministic kernel on {device.type}",
        hint="set run.deterministic = 'auto' (runs it; a resume is then exact except for that op) "
        "or use an op that has one",
    )
