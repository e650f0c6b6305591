"""One error hierarchy for everything edgedeploy reports to a user.

Each class carries the process exit code the CLI uses for it (documented in
README.md). Messages are one line: what went wrong, where, and the fix.
"""

from __future__ import annotations

from typing import Any


class DeployError(Exception):
    """Base of every error edgedeploy raises on purpose.

    Attributes:
        exit_code: process exit code the CLI returns for this error class.
        hint: optional one-line fix appended to the message.
    """

    exit_code: int = 1
    kind: str = "error"
    partial: Any = None  # a failing stage's partial result (stages.base.StageResult), for the report
    report: Any = None  # the failed build's report.json contents, once written (deploy build --json prints it)

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        """The message the CLI prints: ``<kind>: <message> (fix: <hint>)``."""
        text = f"{self.kind}: {self.message}"
        if self.hint:
            text += f" -- fix: {self.hint}"
        return " ".join(text.split("\n"))


class ConfigError(DeployError):
    """The config file or a CLI flag is invalid (unknown key, wrong type, bad value)."""

    exit_code = 2
    kind = "config error"


class InputError(DeployError):
    """An input file (checkpoint, calibration data, report) is missing or unreadable."""

    exit_code = 3
    kind = "input error"


class CheckpointError(InputError):
    """A checkpoint is missing, truncated, corrupt, carries pickled code or does not fit the model."""

    kind = "checkpoint error"


class StageInputError(InputError):
    """A stage is about to run without a file it declares as input (a staging file or an external input):
    the pipeline around it is wired wrong, as opposed to the stage's own failure (StageError)."""

    kind = "missing stage input"

    def __init__(self, stage: str, name: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"[{stage}] {message}", hint=hint)
        self.stage = stage
        self.input = name


class TargetCapabilityError(DeployError):
    """The target was asked for something it cannot do (e.g. INT8 on a GPU without fast INT8)."""

    exit_code = 4
    kind = "target capability error"


class UnsupportedOpsError(DeployError):
    """Operator preflight found operators the target runtime cannot run."""

    exit_code = 5
    kind = "unsupported operators"

    def __init__(self, message: str, *, findings: list | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.findings = findings or []


class StageError(DeployError):
    """A pipeline stage failed (capture, export, quantization, engine build)."""

    exit_code = 6
    kind = "stage failed"

    def __init__(self, stage: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"[{stage}] {message}", hint=hint)
        self.stage = stage


class NoInt8ComputeError(StageError):
    """An INT8 build whose model has no INT8 compute left (every quantizable node kept float, for accuracy,
    speed or ``precision.keep_fp32``): refused rather than labelled INT8."""

    kind = "no INT8 compute"


class ParityError(DeployError):
    """A built artifact does not agree with the PyTorch reference within tolerance."""

    exit_code = 7
    kind = "parity failure"

    def __init__(self, message: str, *, failures: list | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.failures = failures or []


class PerformanceRegressionError(DeployError):
    """Latency regressed against the baseline beyond the gate policy's threshold."""

    exit_code = 8
    kind = "performance regression"


class ArtifactIntegrityError(DeployError):
    """An artifact is missing or its sha256 does not match the manifest (tampered)."""

    exit_code = 9
    kind = "artifact integrity error"


class EngineCompatibilityError(DeployError):
    """A TensorRT engine was built for another TensorRT version or GPU than the one running."""

    exit_code = 10
    kind = "engine incompatible"


class DeviceTrustError(DeployError):
    """A device's SSH host key is not in known_hosts or differs from it, or it refused key authentication."""

    exit_code = 11
    kind = "device not trusted"


class DeviceUnreachableError(DeployError):
    """A device host cannot be reached over SSH (refused, no route, connect timeout, connection lost)."""

    exit_code = 12
    kind = "device unreachable"


class DeviceTimeoutError(DeployError):
    """The device step on a host ran past its time limit (it is stopped; nothing of it is kept)."""

    exit_code = 13
    kind = "device step timed out"


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "unexpected internal error (traceback printed)",
    ConfigError.exit_code: "config error (bad key, type or value in the config file or a flag)",
    InputError.exit_code: "input or checkpoint error (missing, truncated, corrupt, pickled code)",
    TargetCapabilityError.exit_code: "target cannot do what was asked (precision, DLA, ...)",
    UnsupportedOpsError.exit_code: "operator preflight found unsupported operators",
    StageError.exit_code: "a stage failed (capture, export, quantization, build)",
    ParityError.exit_code: "parity failure (artifact disagrees with PyTorch, NaN/Inf)",
    PerformanceRegressionError.exit_code: "performance regression against the baseline",
    ArtifactIntegrityError.exit_code: "missing or tampered artifact (hash mismatch with manifest)",
    EngineCompatibilityError.exit_code: "engine built for another TensorRT version or GPU",
    DeviceTrustError.exit_code: "device SSH host key unknown or changed, or key authentication refused",
    DeviceUnreachableError.exit_code: "device host unreachable over SSH (refused, no route, connect timeout)",
    DeviceTimeoutError.exit_code: "device step ran past its time limit",
}
