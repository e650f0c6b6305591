"""The device script keeps its own error classes (it runs without edgedeploy installed): same exit codes."""

from __future__ import annotations

from edgedeploy import errors
from edgedeploy.device import complete_bundle as device


def test_device_exit_codes_match_the_package():
    pairs = [
        (device.BundleInputError, errors.InputError),
        (device.BuildFailed, errors.StageError),
        (device.ParityFailed, errors.ParityError),
        (device.IntegrityFailed, errors.ArtifactIntegrityError),
        (device.EngineIncompatible, errors.EngineCompatibilityError),
    ]
    for dev, pkg in pairs:
        assert dev.exit_code == pkg.exit_code, dev.__name__
        assert dev.kind == pkg.kind, dev.__name__
