"""`run_bench.py --estimate`: what a sweep will cost on a device, phase by phase, from the
plan the sweep itself follows (price), priced with speeds of earlier runs or a device
model (rows, speeds), printed (report)."""
