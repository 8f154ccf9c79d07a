"""The sweep, run_bench.py's main job: its cases (cases, shapes), the run (job: arguments,
ceilings, resume, compare), the rows (runner: check, then timer, then row; timers: the
timing methods), what is written (results, run_folder, console) and what keeps a run
whole (budget, phases, interrupt, failures, gpu_monitor, triton_cache, retime)."""
