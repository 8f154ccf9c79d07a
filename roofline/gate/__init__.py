"""The regression gate: a run compared with a stored baseline row by row from raw timing
samples (statistics, verdicts), the runs read and checked, the report rendered (markdown,
CI step summary, benchmark JSON), and baselines promoted.  Saved results only: no kernel
is launched here (re-timing is a callback that run_bench.py provides).

    python -m roofline compare BASELINE RUN [--threshold PCT] [--allow LIST]
                                            [--allow-device-mismatch] [--md PATH] [--json PATH]
    python -m roofline promote RUN [RUN ...] [--device KEY] [--baselines DIR] [--force]
"""
