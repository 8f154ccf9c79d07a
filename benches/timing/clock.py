"""Timing: triton.testing.do_bench on a GPU (L2 flushed between samples), CUDA-graph
replays of rotated copies for kernels too short for that, timed blocks of calls on a CPU.

This module only adds what those libraries lack:
- the 20th/80th percentiles, sample count and raw samples of one measurement;
- a sample floor (cfg.min_samples) for slow kernels and for the CPU;
- one timing method per (kernel, dtype, shape), decided from the case's analytic roofline
  bound on this device (`choose_method`), so both providers are timed alike and a row
  keeps its method from run to run;
- the plan of a CUDA-graph timer that is cold and fair (benches/timing/graphs.py
  captures and replays it): calls over N distinct copies of inputs and outputs that
  together exceed twice the L2, the call count independent of the provider's speed, the
  capture bounded in nodes and time (`graph_plan`);
- each provider's host dispatch per call (`host_dispatch_us`), kept out of the flushed
  timer's samples by keeping the GPU busy after each flush (`time_flushed`);
- the warm twins of those timers (a row's `cache` mode, docs/measurement.md): warm =
  back-to-back calls on the same buffers, as nvbench's batch measurement: a CUDA graph of
  one copy's calls, CUDA events around calls with no flush (`time_warm`), and on a CPU
  blocks of calls on the same buffers; the cold CPU timer cycles each block's calls over
  copies past twice the last-level cache (`Rotation`), as the CUDA graphs do on a GPU.

How much is timed (settings, sample counts, methods, copies) is plain arithmetic in
benches/timing/plan.py, whose names are re-exported here.
"""

from __future__ import annotations

import gc
import itertools
import math
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from benches.timing.interleave import Batch, Sampler
from benches.timing.plan import (
    TIMER_CPU,
    TIMER_CPU_ROTATED,
    TIMER_FLUSHED,
    TIMER_WARM,
    CpuPlan,
    TimingConfig,
    cpu_round_config,
    plan_cpu,
    sample_count,
)
from benches.timing.stopping import Sampled, sample_until_settled


@dataclass(frozen=True)
class Timing:
    ms_median: float
    ms_p20: float
    ms_p80: float
    n_samples: int
    timer: str
    samples_ms: tuple[float, ...] = ()
    # Host time to dispatch one call (GPU): Python and launch overhead, measured apart.
    host_us: float | None = None
    # What the timer did other than asked, for the row's reason (a capture cut short).
    note: str = ""
    # time.monotonic() at the start and end of the samples on the GPU (the NVML window of
    # the row: a CUDA graph's capture and copies, with the GPU idle, stay out of it).
    span: tuple[float, float] | None = None
    # Seconds the timer spent before its samples that are not part of any measurement
    # (a CUDA graph's warm-up, capture and uploading replays): the run's `capture`.
    setup_s: float = 0.0
    # Why the samples stopped (benches/timing/stopping.py: STOP_NOISE, STOP_CAP); "" for
    # a timer without the rule.
    stopped: str = ""
    # The windows its samples were taken in, when they came in batches between other
    # providers' (benches/timing/interleave.py): a sample's clock is read in its own.
    batches: tuple[Batch, ...] = ()


def until_settled(take: Callable[[int], list[float]], cap: int, cfg: TimingConfig
                  ) -> Sampled:
    """The stopping rule with cfg's settings: samples from take(k) until the median's
    interval is within cfg.ci_rel_width, at least cfg.gate_min_samples (or
    cfg.min_samples when lower), at most `cap` (the timer's time cap)."""
    return sample_until_settled(take, cap, cfg.ci_rel_width, cfg.ci_level,
                                min(cfg.gate_min_samples, cfg.min_samples))


def summarize(samples_ms: Sequence[float], timer: str) -> Timing:
    s = np.asarray(samples_ms, dtype=np.float64)
    p20, p50, p80 = np.percentile(s, [20, 50, 80])
    return Timing(float(p50), float(p20), float(p80), int(s.size), timer,
                  tuple(float(x) for x in s))


class Rotation:
    """A cold CPU row's call: each call runs the next of `calls`, one per copy of the
    case's inputs and output (together past twice the last-level cache: timing_plan.
    cpu_rotation), cycling, so no call finds its buffers in cache, as the CUDA graphs'
    rotation does on a GPU.  time_cpu times blocks of it (`block`) without the cycling's
    own cost in the timed loop; calling it directly (block sizing, a plain timer) cycles
    too.  The position carries on from call to call and block to block."""

    def __init__(self, calls: Sequence[Callable[[], object]]) -> None:
        if not calls:
            raise ValueError("a rotation needs at least one call")
        self.calls = list(calls)
        self.at = 0

    def __len__(self) -> int:
        return len(self.calls)

    def __call__(self) -> object:
        call = self.calls[self.at]
        self.at = (self.at + 1) % len(self.calls)
        return call()

    def block(self, number: int) -> list[Callable[[], object]]:
        """The next `number` calls in rotation order (and the position moved past them)."""
        out = list(itertools.islice(itertools.cycle(self.calls), self.at, self.at + number))
        self.at = (self.at + number) % len(self.calls)
        return out


def block_number(fn: Callable[[], object], block_s: float) -> int:
    """Calls per sample so that one block lasts at least block_s: from the time of one
    call, then of the block that should last block_s, corrected until it does."""
    number = 1
    t = timeit.Timer(fn).timeit(1)  # also the warm call
    while t < block_s and number < 10**7:
        number = min(10**7, max(2 * number, math.ceil(number * 1.2 * block_s / max(t, 1e-9))))
        t = timeit.Timer(fn).timeit(number)
    return number


def _time_block(calls: Sequence[Callable[[], object]]) -> float:
    """Seconds to run `calls` in order, the garbage collector off as timeit has it."""
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for call in calls:
            call()
        return time.perf_counter() - t0
    finally:
        if gc_was_on:
            gc.enable()


def time_cpu(fn: Callable[[], object], cfg: TimingConfig, plan: CpuPlan | None = None
             ) -> Timing:
    """Samples of `fn` on a CPU: plan.samples blocks of calls (the stdlib's timeit; the
    thread count is the process's), each block's time divided by its calls.

    Not torch.utils.benchmark's blocked_autorange: it sizes every block to 10,000x its
    timer's overhead (about 10 ms, whatever the kernel) and estimates that size by
    running blocks of 1, 10, 100... calls, so a 5 us kernel cost about 0.3 s a round,
    and it has no time budget; on a 2-core machine that was most of the default run.
    Here a block lasts cfg.cpu_block_s (the overhead stays under 0.1% of it) and the
    sample count comes from plan_cpu.

    `fn` a Rotation (a cold row): each block runs the rotation's next calls, every one on
    other buffers than the one before (TIMER_CPU_ROTATED); any other callable runs on its
    own buffers call after call, warm from the second call on (TIMER_CPU)."""
    if plan is None:
        t0 = time.perf_counter()
        fn()
        plan = plan_cpu(time.perf_counter() - t0, cfg)
    number = plan.number or block_number(fn, cfg.cpu_block_s)
    if isinstance(fn, Rotation):
        # The block's calls are listed before its clock starts: the loop then costs what
        # timeit's does, and the cycling is not timed.
        times = [_time_block(fn.block(number)) for _ in range(plan.samples)]
        return summarize([t / number * 1e3 for t in times], TIMER_CPU_ROTATED)
    times = timeit.Timer(fn).repeat(repeat=plan.samples, number=number)
    return summarize([t / number * 1e3 for t in times], TIMER_CPU)


def time_cpu_rounds(make_call: Callable[[int], Callable[[], object]],
                    cfg: TimingConfig, plan: CpuPlan | None = None) -> Timing:
    """time_cpu over cfg.cpu_rounds rounds taken back to back; `make_call(r)` gives round
    r's callable (on its own buffers; a Rotation for a cold row), and the samples of all
    rounds are pooled under the rounds' timer."""
    per_round = cpu_round_config(cfg)
    samples: list[float] = []
    timer = TIMER_CPU
    for r in range(max(1, cfg.cpu_rounds)):
        t = time_cpu(make_call(r), per_round, plan)
        samples += t.samples_ms
        timer = t.timer
    return summarize(samples, timer)


# Device time host_dispatch_us may spend on one row's calls: 100 calls up to 0.2 ms each,
# fewer for longer ones (it was 0.25 s: 20 s of the H200's quick sweep, 80 s of its
# default one, on calls whose dispatch three bursts of two measure as well).
DISPATCH_BUDGET_S = 0.02


@dataclass(frozen=True)
class Dispatch:
    """What measuring a call's host dispatch found: the dispatch per call (us) and the
    wall time of one synchronized call, dispatch and device time together (ms), which
    the event timers use as the time of a sample where it is long (see _padded_samples)."""

    host_us: float
    once_ms: float


def measure_dispatch(call: Callable[[], object], sync: Callable[[], None],
                     reps: int = 20, repeats: int = 5,
                     budget_s: float = DISPATCH_BUDGET_S) -> Dispatch:
    """Host time to dispatch one call: the wall time of `reps` back-to-back calls with no
    synchronization between them, divided by `reps`; the median of `repeats` such bursts,
    each after a sync.  On a GPU the calls only enqueue work, so this is the Python and
    launch overhead a provider pays per call, apart from its device time.  (On a CPU the
    call runs synchronously: this would be its run time, so it is not taken there.)

    Every burst's calls also run on the device before the next burst starts, so a slow
    call (one synchronous call, dispatch plus device, takes `once`) gets fewer: at most
    budget_s / once calls in all, in 3 bursts of 2 at least (a 1 ms matmul costs 18
    calls, not 100).  A call too slow for those 6 (over budget_s / 6, 3.3 ms) takes no
    burst: its dispatch is the time the first two calls, each after a sync, took to
    return to the host (the smaller).  The H200's rows over 3 ms (attention, fp8 casts at
    2^27) measured 18-110 us of dispatch by bursts against 3.4-4.6 ms of device time:
    there the dispatch only sizes the flush padding, and 6 calls of a 230 ms backward
    pass would cost 1.4 s."""
    sync()
    t0 = time.perf_counter()
    call()  # warm: lazy init, JIT cache lookups
    returned = [time.perf_counter() - t0]
    sync()
    t0 = time.perf_counter()
    call()
    returned.append(time.perf_counter() - t0)
    sync()
    once = time.perf_counter() - t0
    fit = int(budget_s / max(once, 1e-9))
    if fit < 2 * 3:
        return Dispatch(min(returned) * 1e6, once * 1e3)
    if fit < reps * repeats:
        repeats = min(repeats, 3)
        reps = max(2, min(reps, fit // repeats))
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        per_call.append((time.perf_counter() - t0) / reps * 1e6)
        sync()
    return Dispatch(float(np.median(per_call)), once * 1e3)


def host_dispatch_us(call: Callable[[], object], sync: Callable[[], None],
                     reps: int = 20, repeats: int = 5,
                     budget_s: float = DISPATCH_BUDGET_S) -> float:
    """measure_dispatch's dispatch per call, in us."""
    return measure_dispatch(call, sync, reps, repeats, budget_s).host_us


# SM cycles per microsecond the flush padding assumes: the top boost clock of the GPUs in
# the table (~2 GHz).  A GPU clocked lower spins longer, which only adds margin.
PAD_CYCLES_PER_US = 2000


def flush_padding_us(host_us: float | None) -> float:
    """How long the GPU is kept busy after each L2 flush, in us, so that the host has
    recorded the start event and dispatched the call before the GPU reaches them: twice
    the provider's measured dispatch time plus 10 us, or 0 when it is unknown."""
    return 2.0 * host_us + 10.0 if host_us else 0.0


def time_flushed(fn: Callable[[], object], cfg: TimingConfig,
                 host_us: float | None = None, once_ms: float | None = None) -> Timing:
    """CUDA-event timing after warm-up with L2 flushed between samples.

    triton.testing.do_bench records its start event right after the flush: a provider
    whose Python dispatch takes longer than the flush's device time (~85 us on an H100,
    ~55 us on an H200) leaves the GPU idle between the start event and its kernel, so
    host time is counted as device time (Triton's launch path pays more Python per call
    than torch's).  With the provider's dispatch time known (`host_us`), this loop is
    do_bench's with one addition: the GPU spins (torch.cuda._sleep) for
    flush_padding_us after each flush.  Each sample then takes the GPU longer than the
    host needs to enqueue it (flush, sleep, start event, call, end event), so the host
    runs ahead of the GPU and every call is already queued when the GPU reaches its start
    event: the event pair spans the call's device time only.  The flush buffer is
    Triton's own; the sample count follows do_bench (`rep` over the time of one sample,
    flush and padding included), at least cfg.min_samples, and fewer once the median
    has settled (the stopping rule, benches/timing/stopping.py).  `once_ms`: one
    synchronized call's wall time where the caller measured it (Dispatch.once_ms), which
    spares a slow call the 5-sample estimate (_padded_samples)."""
    import triton.testing as tt

    t_start = time.monotonic()
    pad_us = flush_padding_us(host_us)
    if pad_us:
        sampled = padded_flushed_samples(fn, cfg, pad_us, once_ms)
        return replace(summarize(sampled.samples, TIMER_FLUSHED), stopped=sampled.stopped,
                       span=(t_start, time.monotonic()))
    # A short first estimate (flush included, as do_bench's own) sizes the measurement.
    est = tt.do_bench(fn, warmup=1, rep=5, return_mode="median")
    warmed: list[bool] = []

    def take(k: int) -> list[float]:
        got: list[float] = []
        while len(got) < k:  # do_bench counts its flush in its estimate: top up
            # Warm-up as do_bench sizes it (from its own estimate), on the first call only.
            got += tt.do_bench(fn, warmup=cfg.warmup_ms if not warmed else 0,
                               rep=max(1e-3, (k - len(got)) * est), return_mode="all")
            warmed.append(True)
        return got

    sampled = until_settled(take, sample_count(est, cfg), cfg)
    return replace(summarize(sampled.samples, TIMER_FLUSHED), stopped=sampled.stopped,
                   span=(t_start, time.monotonic()))



def flush_buffer() -> torch.Tensor:
    """The buffer do_bench zeroes to flush the L2 (256 MB in Triton 3.x)."""
    try:
        from triton.runtime import driver

        return driver.active.get_empty_cache_for_benchmark()
    except Exception:
        return torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")


def flushed_sampler(fn: Callable[[], object], cfg: TimingConfig, pad_us: float,
                    once_ms: float | None = None) -> Sampler:
    """padded_sampler with an L2 flush (Triton's buffer zeroed) before each sample."""
    return padded_sampler(fn, cfg, pad_us, flush_buffer().zero_, once_ms)


def padded_flushed_samples(fn: Callable[[], object], cfg: TimingConfig,
                           pad_us: float, once_ms: float | None = None) -> Sampled:
    """do_bench's loop (estimate, warm-up, then one CUDA-event pair around each call
    after an L2 flush) with the GPU kept busy for `pad_us` after every flush; the
    samples in ms, until the stopping rule or the time cap (benches/timing/stopping.py),
    and why they stopped.  See time_flushed."""
    return _padded_samples(fn, cfg, pad_us, flush_buffer().zero_, once_ms)


def estimate_needed(once_ms: float | None, cfg: TimingConfig) -> bool:
    """Whether the event timers estimate a sample's time from 5 samples (do_bench's way):
    not for a call whose one synchronized call (Dispatch.once_ms) took at least a fifth
    of the warm-up (5 ms of 25), where those 5 samples would last the warm-up or more."""
    return once_ms is None or 5 * once_ms < cfg.warmup_ms


def warmup_calls(per_sample_ms: float, cfg: TimingConfig, once_ms: float | None) -> int:
    """Calls of the warm-up by time (cfg.warmup_ms of samples, at least one call), less
    what the caller's own synchronized call ran just before where it timed one long
    enough to stand for a sample (`once_ms`, see estimate_needed): the GPU ran the same
    kernel then, so a 200 ms backward pass needs no warm-up call after it, and an 8 ms
    one 2 calls instead of 3.  A caller that timed nothing (once_ms None) or a short call
    gets do_bench's warm-up."""
    if once_ms is None or estimate_needed(once_ms, cfg):
        return max(1, int(cfg.warmup_ms / per_sample_ms))
    return max(0, int((cfg.warmup_ms - once_ms) / per_sample_ms))


def _padded_samples(fn: Callable[[], object], cfg: TimingConfig, pad_us: float,
                    flush: Callable[[], object] | None,
                    once_ms: float | None = None) -> Sampled:
    """padded_sampler's samples of one call timed alone: until the stopping rule or the
    time cap (benches/timing/stopping.py)."""
    s = padded_sampler(fn, cfg, pad_us, flush, once_ms)
    return until_settled(s.take, s.cap, cfg)


def padded_sampler(fn: Callable[[], object], cfg: TimingConfig, pad_us: float,
                   flush: Callable[[], object] | None,
                   once_ms: float | None = None) -> Sampler:
    """The loop of padded_flushed_samples (flush: the L2 flush before each sample) and of
    time_warm (flush None: nothing between the calls but the padding, skipped when 0),
    warmed up and ready to take samples (benches/timing/interleave.py times the
    providers of a case in turns of such samplers).

    A sample's time sizes the warm-up (by time) and the sample cap.  As do_bench, it is
    the mean of 5 samples, after a call to warm up; a call whose caller measured it long
    (`once_ms`, see estimate_needed: the caller's own calls warmed it) takes once_ms plus
    the padding instead, and its warm-up counts that call (warmup_calls).  That leaves
    out the flush's device time (under 2 % of such a sample), which can only add a
    warm-up call or a sample, never take one away."""
    cycles = int(pad_us * PAD_CYCLES_PER_US)

    def sample(start: torch.cuda.Event | None = None,
               end: torch.cuda.Event | None = None) -> None:
        if flush is not None:
            flush()
        if flush is not None or cycles:
            torch.cuda._sleep(cycles)  # touches no memory: the L2 stays as it was
        if start is not None:
            start.record()
        fn()
        if end is not None:
            end.record()

    if estimate_needed(once_ms, cfg):
        fn()
        torch.cuda.synchronize()
        # As do_bench: the time of one sample, flush included (and the padding), from 5.
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(5):
            sample()
        t1.record()
        torch.cuda.synchronize()
        per_sample_ms = max(t0.elapsed_time(t1) / 5, 1e-4)
    else:
        per_sample_ms = float(once_ms) + pad_us * 1e-3  # type: ignore[arg-type]
    for _ in range(warmup_calls(per_sample_ms, cfg, once_ms)):
        fn()

    def take(k: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        if flush is None:
            fn()  # untimed: a warm row's buffers back in the L2 after another's batch
        for s, e in zip(starts, ends, strict=True):
            sample(s, e)
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]

    # sample_count's samples at most (the time cap), fewer once the median has settled.
    return Sampler(take, sample_count(per_sample_ms, cfg), per_sample_ms)


def time_warm(fn: Callable[[], object], cfg: TimingConfig,
              host_us: float | None = None, once_ms: float | None = None) -> Timing:
    """The warm twin of time_flushed: CUDA events around back-to-back calls on the same
    buffers with nothing flushed, so each call finds what the one before it left in the
    L2 (nvbench's batch measurement keeps the cache so too).  One event pair a call: the
    samples are per call, as the flushed timer's, and as many (sample_count within the
    row's budget, from the time of one sample).

    Back to back, the host runs ahead of the GPU once the launch queue holds work, unless
    its dispatch is slower than the call's device time: then the GPU would wait between
    the start event and the call, and the sample would count host time.  With the
    provider's dispatch time known (`host_us`), the GPU spins for flush_padding_us before
    each start event, as after each flush in time_flushed; the spin touches no memory,
    so the cache stays warm."""
    t_start = time.monotonic()
    sampled = _padded_samples(fn, cfg, flush_padding_us(host_us), None, once_ms)
    return replace(summarize(sampled.samples, TIMER_WARM), stopped=sampled.stopped,
                   span=(t_start, time.monotonic()))


def time_gpu(fn: Callable[[], object], cfg: TimingConfig) -> Timing:
    """Device time of one callable with L2 flushed between samples (what the
    pytest-benchmark suite reports beside its host timing): its host dispatch measured
    first, so that the GPU is kept busy after each flush for longer than the host takes
    to dispatch (see time_flushed); Timing.host_us carries it."""
    host_us = host_dispatch_us(fn, torch.cuda.synchronize)
    return replace(time_flushed(fn, cfg, host_us), host_us=host_us)


def time_call_ms(call: Callable[[], object], on_gpu: bool) -> float:
    """One call's time in ms: between CUDA events on the current stream on a GPU (the
    call's device time, launch to completion), the wall clock on a CPU, where the call
    is synchronous."""
    if on_gpu:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    t = time.perf_counter()
    call()
    return (time.perf_counter() - t) * 1e3

