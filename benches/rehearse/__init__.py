"""A rehearsal of every Triton launch the sweep makes on a GPU, without one: a stand-in
CUDA driver for Triton that launches nothing (driver.py), tensors that take a launch down
the GPU path (tensors.py), what the autotuner does recorded from inside it
(tuning_record.py), the cases and their three ways through Triton (rehearsal.py), the
table and rehearsal.json (rehearsal_report.py) and the command line (cli.py).
docs/rehearsal.md says what it covers."""
