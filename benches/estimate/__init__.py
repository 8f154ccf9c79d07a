"""`run_bench.py --estimate` (estimate_report.py): a sweep priced from its runs (price.py)."""
