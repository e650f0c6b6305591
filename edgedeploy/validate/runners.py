"""The backends a build produced, each wrapped as a polygraphy runner, and running them on golden inputs.

ONNX Runtime models run through polygraphy's ``OnnxrtRunner``, TensorRT engines through its
``TrtRunner``, and the TorchScript capture through a runner written here (a subclass of polygraphy's
``BaseRunner``), so every backend is driven the same way by ``polygraphy.comparator.Comparator.run``.
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edgedeploy.artifacts import PRECISION_MODELS
from edgedeploy.errors import ArtifactIntegrityError, ConfigError
from edgedeploy.fileio.hashing import sha256_bytes

if TYPE_CHECKING:
    from edgedeploy.config import DeployConfig

TORCHSCRIPT = "model.ts"
ONNX_MODELS = PRECISION_MODELS
ENGINE_FILES = ("model.engine", "model.plan")
# validation backend kinds, in the order a build's artifacts are judged; a runtime names the ones that run
# its artifact (``edgedeploy.runtimes``: ``validation_backends``)
VALIDATION_KINDS = ("torchscript", "onnxruntime", "tensorrt")
ONNX_KINDS = frozenset({"onnxruntime"})  # kinds that run the ONNX model itself (divergence localization applies)


@dataclass(frozen=True)
class Backend:
    """One artifact to validate: how it runs, at which precision, from which file.

    Attributes:
        name: report name, e.g. ``onnxruntime-int8``.
        kind: ``torchscript``, ``onnxruntime`` or ``tensorrt``.
        precision: the precision whose tolerance judges it.
        artifact: file name inside the build folder.
        sha256: expected sha256 of the artifact (TorchScript is only loaded when it matches).
        onnx: True when the artifact is an ONNX model (divergence localization applies).
    """

    name: str
    kind: str
    precision: str
    artifact: str
    sha256: str = ""

    @property
    def onnx(self) -> bool:
        return self.kind in ONNX_KINDS


@dataclass(frozen=True)
class SkippedBackend:
    name: str
    reason: str


def discover_backends(
    folder: Path, build_precision: str, sha256: Callable[[str], str], kinds: Sequence[str] = VALIDATION_KINDS
) -> tuple[list[Backend], list[SkippedBackend]]:
    """Every artifact in ``folder`` that can be validated, and the ones that cannot (with why).

    Args:
        folder: the build's staging or output folder.
        build_precision: the build's precision (the TensorRT engine is judged at it).
        sha256: callable(name) -> sha256 of an artifact in ``folder``.
        kinds: the validation backends of the target's runtime (``RuntimeBackend.validation_backends``);
            artifacts of other kinds are not judged.

    Raises:
        ConfigError: a kind no validation backend here implements.
    """
    unknown = [k for k in kinds if k not in VALIDATION_KINDS]
    if unknown:
        raise ConfigError(
            f"unknown validation backend(s) {', '.join(unknown)}",
            hint=f"a runtime's validation_backends are some of {', '.join(VALIDATION_KINDS)}",
        )
    found: list[Backend] = []
    skipped: list[SkippedBackend] = []
    if "torchscript" in kinds and (folder / TORCHSCRIPT).is_file():
        found.append(Backend("torchscript", "torchscript", "fp32", TORCHSCRIPT, sha256(TORCHSCRIPT)))
    for precision, name in ONNX_MODELS.items():
        if "onnxruntime" in kinds and (folder / name).is_file():
            found.append(Backend(f"onnxruntime-{precision}", "onnxruntime", precision, name))
    if "tensorrt" in kinds:
        engine = next((e for e in ENGINE_FILES if (folder / e).is_file()), None)
        if not tensorrt_available():
            skipped.append(SkippedBackend("tensorrt", "no TensorRT"))
        elif engine is None:
            skipped.append(SkippedBackend("tensorrt", "no TensorRT engine in this build"))
        else:
            # one name for the engine candidate, as the device step's rows: a gate's required_backends matches both
            found.append(Backend("tensorrt", "tensorrt", build_precision, engine))
    return found, skipped


def tensorrt_available() -> bool:
    """True when TensorRT's Python bindings import (the type-stub package alone does not count)."""
    from edgedeploy.trt.adapter import tensorrt_version

    return tensorrt_version() is not None


def _input_metadata(cfg: DeployConfig) -> Any:
    from polygraphy.common import TensorMetadata

    meta = TensorMetadata()
    for spec in cfg.inputs:
        meta.add(spec.name, dtype=np.dtype(spec.dtype), shape=[d if isinstance(d, int) else None for d in spec.shape])
    return meta


def load_torchscript(path: Path, sha256: str) -> Any:
    """``torch.jit.load`` of this build's own capture, from bytes whose sha256 was checked first.

    Raises:
        ArtifactIntegrityError: the file's sha256 is not the one recorded for it.
    """
    import torch

    data = path.read_bytes()
    if sha256 and sha256_bytes(data) != sha256:
        raise ArtifactIntegrityError(
            f"{path}: sha256 differs from the one recorded when it was built; refusing to load it",
            hint="rebuild with 'deploy build'",
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "torch.jit.load is deprecated": TorchScript is the artifact
        module = torch.jit.load(io.BytesIO(data), map_location="cpu")
    module.eval()
    return module


def _base_runner() -> type:
    from polygraphy.backend.base import BaseRunner

    return BaseRunner


def _onnxrt_runner(backend: Backend, path: Path, cfg: DeployConfig) -> Any:
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    return OnnxrtRunner(SessionFromOnnx(str(path), providers=["cpu"]), name=backend.name)


def _torchscript_runner(backend: Backend, path: Path, cfg: DeployConfig) -> Any:
    return _torchscript_runner_class()(path, backend.sha256, cfg, name=backend.name)


def _trt_runner(backend: Backend, path: Path, cfg: DeployConfig) -> Any:
    from polygraphy.backend.common import BytesFromPath
    from polygraphy.backend.trt import EngineFromBytes, TrtRunner

    return TrtRunner(EngineFromBytes(BytesFromPath(str(path))), name=backend.name)


_RUNNERS: dict[str, Callable[[Backend, Path, DeployConfig], Any]] = {
    "onnxruntime": _onnxrt_runner,
    "torchscript": _torchscript_runner,
    "tensorrt": _trt_runner,
}


def make_runner(backend: Backend, folder: Path, cfg: DeployConfig) -> Any:
    """A polygraphy runner for ``backend`` (not yet activated)."""
    return _RUNNERS[backend.kind](backend, folder / backend.artifact, cfg)


def _torchscript_runner_class() -> type:
    base = _base_runner()

    class TorchScriptRunner(base):  # type: ignore[misc,valid-type]
        """Runs a TorchScript module on numpy feeds; outputs named after the config's ``outputs``."""

        def __init__(self, path: Path, sha256: str, cfg: DeployConfig, name: str | None = None) -> None:
            super().__init__(name=name, prefix="torchscript-runner")
            self._path, self._sha256, self._cfg = path, sha256, cfg

        def activate_impl(self) -> None:
            self.module = load_torchscript(self._path, self._sha256)

        def get_input_metadata_impl(self) -> Any:
            return _input_metadata(self._cfg)

        def infer_impl(self, feed_dict: dict[str, np.ndarray]) -> OrderedDict[str, np.ndarray]:
            import torch

            from edgedeploy.modelio.torchutil import flatten as _flatten
            from edgedeploy.modelio.torchutil import torch_args

            args = torch_args(self._cfg, feed_dict)  # copies: a model that writes its input leaves the feed alone
            start = time.perf_counter()
            with torch.inference_mode():
                result = _flatten(self.module(*args))
            self.inference_time = time.perf_counter() - start
            return OrderedDict((n, t.detach().cpu().numpy()) for n, t in zip(self._cfg.outputs, result))

        def deactivate_impl(self) -> None:
            del self.module

    return TorchScriptRunner


def infer_calls(
    runner: Any, feeds: Sequence[dict[str, np.ndarray]], calls: Sequence[Sequence[int]]
) -> list[dict[str, np.ndarray]]:
    """Each of ``feeds``' outputs from the active polygraphy ``runner``, one call per group of ``calls`` (indices
    into ``feeds``): a group's feeds joined along the batch axis and the outputs split back by rows
    (:class:`edgedeploy.precision.analysis.JoinedCalls`: every batch alone where joining would change an output)."""
    from edgedeploy.precision.analysis import JoinedCalls

    def one(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # copies: a runner may reuse its output buffers between calls (polygraphy's TrtRunner)
        return {k: np.array(v) for k, v in runner.infer(batch).items()}

    out: list[dict[str, np.ndarray]] = [{} for _ in feeds]
    joined = JoinedCalls(one)
    for call in calls:
        for i, got in zip(call, joined([feeds[i] for i in call])):
            out[i] = got
    return out


@contextlib.contextmanager
def quiet_polygraphy() -> Iterator[None]:
    """Silence polygraphy's progress logging (its errors still raise PolygraphyException)."""
    from polygraphy.logger import G_LOGGER

    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        yield


def short_error(exc: BaseException) -> str:
    """One line of at most 300 characters describing ``exc`` (polygraphy wraps runtime errors verbosely)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}"


def run_feeds(runner: Any, feeds: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """Run ``runner`` on every feed dict with polygraphy's ``Comparator.run``; outputs per feed, in order.

    Raises:
        Exception: whatever the runner raises when it cannot load or run the model (callers report it).
    """
    from polygraphy.comparator import Comparator

    with quiet_polygraphy():
        results = Comparator.run([runner], data_loader=list(feeds))
    iterations = results[runner.name]
    return [{k: np.asarray(v) for k, v in it.items()} for it in iterations]
