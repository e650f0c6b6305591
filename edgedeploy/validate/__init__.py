"""Validation of built artifacts, all in one place: parity metrics (``parity``, also copied to the
device), runners per backend, the repeated-row batch of batch consistency (``repeated_rows``), latency,
divergence localization, and the release gate (``gate``:
a report judged against a policy). ``stages/validate.py`` and ``stages/gate.py`` orchestrate these.

Domain layer (2): may import plain data, the tools and ``trt``; never ``stages`` or ``pipeline``.
"""
