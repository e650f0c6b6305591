"""Validation of built artifacts: runners per backend, latency, divergence localization, gate policy."""
