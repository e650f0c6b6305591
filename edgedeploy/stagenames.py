"""Stage names: one constant per stage, used by the runner, report, gate and commands (no magic strings)."""

from __future__ import annotations

REFERENCE = "reference"
CAPTURE = "capture"
EXPORT = "export"
CHECK = "check"
PRECISION = "precision"
BUILD = "build"
VALIDATE = "validate"
GATE = "gate"
