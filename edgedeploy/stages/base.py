"""The contract every pipeline stage follows."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from edgedeploy.artifacts import CHECKPOINT, MODEL_CODE

if TYPE_CHECKING:
    from edgedeploy.stages.context import BuildContext


@dataclass
class StageResult:
    """What a stage returns, cached as a whole: JSON-able metrics, warnings for the user, notes for the report.

    A stage that fails after measuring something attaches its partial result to the error
    (``DeployError.partial``) instead of writing into the context.
    """

    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "warnings": list(self.warnings), "notes": list(self.notes)}

    @classmethod
    def of(cls, value: Any) -> StageResult:
        """A result from what ``run`` returned (a StageResult, a metrics dict, or None)."""
        if isinstance(value, StageResult):
            return value
        return cls(metrics=dict(value or {}))


class Stage(ABC):
    """One step of the pipeline, named by what it makes from what (``OnnxFromTorch``).

    A stage declares the staging files it consumes (written by earlier stages; optional
    ones may be absent), the external inputs it depends on (:meth:`inputs`: checkpoint,
    user code, calibration or validation data; a declared input the build lacks is an
    error) and the files it produces. Its cache key hashes ``name``, ``version``,
    :meth:`config_key`, the consumed files and the inputs; when the key is unchanged the
    stage is not run and its files and whole :class:`StageResult` (warnings included)
    come from the cache. Stages never import each other: shared code lives in the tool
    and domain packages, shared names in ``edgedeploy.artifacts``.
    """

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    cacheable: ClassVar[bool] = True  # False: always run (a verdict on this build, like the gate)
    consumes: ClassVar[tuple[str, ...]] = ()
    produces: ClassVar[tuple[str, ...]] = ()

    def applies(self, ctx: BuildContext) -> str | None:
        """None when the stage runs for this build, else the reason it is skipped."""
        return None

    def outputs(self, ctx: BuildContext) -> tuple[str, ...]:
        """Files this stage writes for this build (default: ``produces``)."""
        return self.produces

    def inputs(self, ctx: BuildContext) -> tuple[str, ...]:
        """External inputs (``artifacts.CHECKPOINT``, ``MODEL_CODE``, ``CALIBRATION``,
        ``VALIDATION_DATA``) this stage's result depends on for this build; each is hashed into
        the cache key, and one the build does not have is an error. Default: none.
        """
        return ()

    def config_key(self, ctx: BuildContext) -> Any:
        """The config fields (and target facts) this stage's result depends on."""
        return None

    @abstractmethod
    def run(self, ctx: BuildContext) -> StageResult | dict[str, Any]:
        """Do the work: write ``outputs`` into ``ctx.staging``; return a :class:`StageResult`
        (a plain metrics dict is accepted). Warnings given to ``ctx.warn`` while the stage runs
        become part of its result, so they survive a cache hit.

        Raises:
            DeployError: a subclass naming what failed and how to fix it.
        """


def model_inputs(ctx: BuildContext) -> tuple[str, ...]:
    """The inputs of anything computed from the PyTorch model: its code and, when configured, its weights."""
    return ((CHECKPOINT,) if CHECKPOINT in ctx.external else ()) + (MODEL_CODE,)
