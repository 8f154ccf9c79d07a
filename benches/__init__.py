"""Measurement: timing, shape sweeps, the correctness gate, and pytest-benchmark suites."""
