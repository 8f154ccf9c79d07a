"""`run_bench.py --estimate`: a sweep priced, phase by phase, from what the device's newest
run measured (runs: the runs read back; price: the pricing; report: the command)."""
