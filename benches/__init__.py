"""How it is measured: timing, shapes, a case to a row (correctness first), a run's
lifecycle (checks, signals, resume, files), re-timing, inspection, and everything else
that launches kernels (the planner's GEMM timing, the pytest-benchmark suites)."""
