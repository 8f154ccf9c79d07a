"""Timing: triton.testing.do_bench / do_bench_cudagraph on a GPU, torch.utils.benchmark
on a CPU.  This module only adds what those lack: the 20th/80th percentiles and sample
count of one measurement, a sample floor for slow kernels, and input rotation for
CUDA-graph timing of tiny kernels (so each call sees a cold L2, as do_bench's flush
gives larger ones).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TimingConfig:
    warmup_ms: float = 25.0  # do_bench warm-up
    rep_ms: float = 100.0  # do_bench measuring time per kernel
    min_samples: int = 25  # raise rep_ms for slow kernels until this many samples
    max_rep_ms: float = 2000.0
    cudagraph_below_ms: float = 0.02  # kernels faster than this: time CUDA-graph replays
    cpu_min_run_time_s: float = 0.15  # torch.utils.benchmark blocked_autorange budget

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Timing:
    ms_median: float
    ms_p20: float
    ms_p80: float
    n_samples: int
    timer: str


def summarize(samples_ms: Sequence[float], timer: str) -> Timing:
    s = np.asarray(samples_ms, dtype=np.float64)
    p20, p50, p80 = np.percentile(s, [20, 50, 80])
    return Timing(float(p50), float(p20), float(p80), int(s.size), timer)


def time_cpu(fn: Callable[[], object], cfg: TimingConfig) -> Timing:
    """torch.utils.benchmark: warms up, picks a per-block repeat count, and returns one
    per-call time per block; the thread count is the process's."""
    from torch.utils import benchmark

    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn},
                            num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=cfg.cpu_min_run_time_s)
    return summarize([t * 1e3 for t in m.times], "torch.utils.benchmark")


def time_gpu(fn: Callable[[], object], cfg: TimingConfig,
             rotated: Callable[[], Sequence[Callable[[], object]]] | None = None) -> Timing:
    """CUDA-event timing after warm-up with L2 flushed between samples (do_bench).

    Kernels below cfg.cudagraph_below_ms are re-timed as CUDA-graph replays, where launch
    overhead no longer dominates; `rotated()` makes calls of the same kernel on distinct
    copies of its inputs (only when needed), cycled inside the graph so L2 stays cold.
    """
    import triton.testing as tt

    # A short first estimate sizes the measurement: at least cfg.min_samples samples.
    est = tt.do_bench(fn, warmup=1, rep=5, return_mode="median")
    rep = min(max(cfg.rep_ms, cfg.min_samples * est * 1.2), cfg.max_rep_ms)
    samples = tt.do_bench(fn, warmup=cfg.warmup_ms, rep=rep, return_mode="all")
    timing = summarize(samples, "do_bench")
    if timing.ms_median >= cfg.cudagraph_below_ms:
        return timing
    calls = list(rotated()) if rotated is not None else [fn]
    counter = iter(range(10**12))

    def rotating() -> None:
        # Called once per unrolled graph node at capture time: node j is bound to input
        # copy j mod len(calls).
        calls[next(counter) % len(calls)]()

    # rep=20 ms of unrolled calls per graph (triton's default): thousands of launches of
    # a microsecond kernel, enough to amortize the replay's own launch.
    graph_samples = tt.do_bench_cudagraph(rotating, rep=20, return_mode="all")
    return summarize(graph_samples, "do_bench_cudagraph")


def rotation_copies(footprint_bytes: int, l2_bytes: int | None, limit: int = 4096) -> int:
    """How many input copies make a rotation whose total footprint is twice the L2."""
    if not l2_bytes or footprint_bytes <= 0:
        return 1
    return max(1, min(limit, math.ceil(2 * l2_bytes / footprint_bytes)))
