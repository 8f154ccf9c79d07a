"""Regression tracking across every CI run: a store of runs per device, change points per
series, a report for CI and a static dashboard.

    python -m roofline history add RUN [--store results/history]
    python -m roofline history report STORE [--since N] [--fail-on-new]
    python -m roofline history html STORE --out DIR

A series is one row key across runs: (kernel, provider, dtype, shape, cache mode), as the
regression gate joins rows (contract.schema.ROW_ID).  Saved results only: nothing here
launches a kernel (the report's re-timing is a command the command line passes in).
"""
