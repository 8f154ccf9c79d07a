"""What `run_bench.py --estimate` assumes about a device's speed where the sweep's plan
and a reference run's rows do not say: every such number in one place, each with where
it comes from.  docs/measurement.md explains the estimate.

A row's own call time and host dispatch come from a reference run's rows (the newest
results.json of the device model under --out, or of another device scaled by the two
models' roofline bounds); the numbers here price everything around them.  The GPU
figures were fit to the GPU runs there are, none of which recorded its phases (an H200,
2026-11-26: the quick sweep cut at its 219th row after about 150 s; `run_bench.py
--device h100 --dtypes bf16,fp8` stopped after 79 rows at 50 s and 102 rows at 60 s):
the method before estimates 144, 44 and 53 s for them.  Only those totals check the
figures, not how they split them.  A CPU estimate scales the phases by those the newest
run of this CPU recorded (metadata.time_split_s), where there is one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeviceSpeed:
    # Seconds before the sweep that no phase books: interpreter start-up, imports, CUDA
    # and NVML set-up (the H200's 1-row run with no ceilings took 6 s in all).
    startup_s: float
    # Measuring the ceilings (copy, cache copy and one matmul per dtype) where the
    # reference runs recorded no time of their own (Reference.ceilings_s: their
    # metadata's ceilings.measured.seconds wins); a cached file costs nothing.
    ceilings_s: float
    # Host (Python and driver) time per call where no row says: torch's eager op, a
    # Triton launch (the H200's rows: torch 6-9 us, its fp8 casts 50 us, Triton 15-25 us).
    host_us: dict[str, float] = field(default_factory=lambda: {"torch": 8.0,
                                                               "triton": 16.0})
    # Where no row of a kernel, provider and dtype says how fast it runs: this fraction
    # of its roofline bound, and never under floor_ms (a launch's own latency).
    roof_fraction: float = 0.5
    floor_ms: float = 0.002
    # One Triton compile (a kernel, its specialization and one config), Triton's cache
    # cold, and loading one from its on-disk cache.
    compile_s: float = 0.3
    cached_compile_s: float = 0.01
    # triton.testing.do_bench per autotuning candidate: its 25 ms warm-up and 100 ms of
    # samples, their L2 flushes included.
    tune_candidate_s: float = 0.14
    # Worker processes compiling ahead (benches/sweep/triton_cache.py: half the cores, at
    # most 8; the H200's host has 16), and how long a worker takes from its start to its
    # first compile: the interpreter, torch, Triton, the kernels, the case's launches.
    # Measured on the 2-core CPU VM (triton 3.6, 2026-11-26, load average 10): 3.9-4.2 s
    # for one worker, 4.2 s for two (1.9 s of it CPU time); a GPU host's torch loads its
    # CUDA libraries on top.  The command starts them once it has parsed its arguments
    # (run_bench._early_workers, compile_worker_spawn_s after the process started: 1.8-2.0
    # s on the CPU VM, 2026-11-27, its own imports, torch's included), and they import
    # torch, Triton and the kernels then; they get the jobs when the ceilings' measuring
    # starts and are stopped when it ends, so they hide (start-up + ceilings - spawn -
    # worker start-up, at most the ceilings) x workers of compiles.
    compile_workers: int = 8
    compile_worker_startup_s: float = 4.0
    compile_worker_spawn_s: float = 2.0
    # A CUDA-graph capture per captured call, in units of the call's host dispatch (the
    # same Python and launch path, recorded instead of run).
    capture_per_host: float = 0.5
    # Before: one clone per input, an empty output and the provider's call per rotated
    # copy and provider; now: one view, an input dict and the provider's call.
    clone_us: float = 15.0
    view_us: float = 4.0
    # Zeroing Triton's 256 MB flush buffer (do_bench's L2 flush), per sample.
    flush_ms: float = 0.06
    # Making a case's inputs (torch.randn and casts), its float64 reference (flops at
    # fp64_tflops plus 8-byte traffic at fill_gbps), the comparison: per byte, per flop.
    fill_gbps: float = 400.0
    fp64_tflops: float = 30.0
    # Python around each row not booked to a phase (budget, row dict, NVML window), and
    # the synchronizations and small copies of a row's check.
    row_s: float = 0.004
    sync_s: float = 0.001
    # A GPU row's torch.profiler pass (benches/sweep/kernel_time.py) beside its calls:
    # the profiler's start and stop and its events read (2.6 ms median on the 2-core VM
    # without CUPTI, 2026-11-26; a few ms more with it), and CUPTI's one-time start in a
    # run (about 1 s).  Not yet measured apart on a GPU: the runs before 2026-11-28
    # booked it in timing (benches/estimate/calibrate.py adds it to their timing).
    profile_s: float = 0.006
    profile_first_s: float = 1.0
    # Writing a row to the journal and the CSV; the results, summary and figures: a
    # fixed part and one growing with the rows that ran (the figures' points, panels and
    # labels, the summary's tables).  Fit to the H200's runs of 2026-11-27 (write phase:
    # 2 to 24 rows 0.6-2.0 s; the quick sweep, 406 cases of which 368 ran, 9.7 and 9.9
    # s); the 3.0 s it was, flat, priced that 9.8 s at 5.4 s even scaled.
    write_row_s: float = 0.002
    write_end_s: float = 0.8
    figure_row_s: float = 0.022


# GPU models: the H200 figures, fit as the module says; an H100 runs the same host code
# (a row's own device time scales by the roofline, see benches/estimate/price.py).  The
# ceilings: the H200's five measurements of 2026-11-26 took 3.55, 3.71, 3.77, 3.88 and
# 3.88 s (metadata.ceilings.measured.seconds of its runs), used for every GPU model
# where the reference runs recorded none (an H100 does the same copies and matmuls).
GPU = DeviceSpeed(startup_s=5.0, ceilings_s=3.8)

# The 2-core CPU VM (the default run quiet: about 42 s, 4 s of it writing for its 398
# cases, 175 of which ran, 2026-11-27): start-up with torch and the
# Triton interpreter imported 4-6 s, ceilings measured 9-11 s; an elementwise case of
# 2^22 fp32 elements (48 MB) takes 0.4 s to make, 0.2 s for its reference and 0.2-0.3 s
# to compare (0.25 GB/s); CPU rows have no graph, copies or compiles.
CPU = DeviceSpeed(startup_s=5.0, ceilings_s=10.0, host_us={"torch": 0.0, "triton": 0.0},
                  fill_gbps=0.25, fp64_tflops=0.02, row_s=0.005, write_row_s=0.003,
                  write_end_s=0.8, figure_row_s=0.012)


# Compute capability of the GPU models, by key prefix, for the launches an estimate
# builds (autotuning candidates are per architecture); Hopper where none matches.
GPU_CAPABILITY = {"a100": (8, 0), "l40": (8, 9), "h100": (9, 0), "h200": (9, 0),
                  "gh200": (9, 0), "b200": (10, 0), "gb200": (10, 0)}


def capability_of(key: str) -> tuple[int, int]:
    return next((cc for prefix, cc in GPU_CAPABILITY.items() if key.startswith(prefix)),
                (9, 0))


def speed_of(kind: str) -> DeviceSpeed:
    """The assumptions for a device of `kind` ("cuda" or "cpu")."""
    return GPU if kind == "cuda" else CPU
