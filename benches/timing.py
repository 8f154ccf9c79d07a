"""Timing: triton.testing.do_bench on a GPU (L2 flushed between samples), CUDA-graph
replays of rotated copies for kernels too short for that, timed blocks of calls on a CPU.

This module only adds what those libraries lack:
- the 20th/80th percentiles, sample count and raw samples of one measurement;
- a sample floor (cfg.min_samples) for slow kernels and for the CPU;
- one timing method per (kernel, dtype, shape), decided from the case's analytic roofline
  bound on this device (`choose_method`), so both providers are timed alike and a row
  keeps its method from run to run;
- a CUDA-graph timer that is cold and fair (`time_cudagraph`): the graph captures calls
  over N distinct copies of inputs and outputs that together exceed twice the L2, each
  call's output stays alive, and the call count does not depend on the provider's speed;
  its capture bounded in nodes and time (`graph_plan`, `count_launches`);
- each provider's host dispatch per call (`host_dispatch_us`), kept out of the flushed
  timer's samples by keeping the GPU busy after each flush (`time_flushed`).
"""

from __future__ import annotations

import math
import time
import timeit
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

# Timer names written to the `timer` column.  The comparison treats a change of timer
# between two runs as a changed row, so these strings are part of the result contract.
TIMER_FLUSHED = "do_bench"
TIMER_GRAPH = "cudagraph"
TIMER_GRAPH_FALLBACK = "do_bench (cudagraph not possible)"
TIMER_CPU = "timeit blocks"


@dataclass(frozen=True)
class TimingConfig:
    warmup_ms: float = 25.0  # do_bench warm-up
    rep_ms: float = 100.0  # measuring time per kernel (do_bench and graph replays)
    min_samples: int = 25  # every method returns at least this many samples
    # Cases whose roofline bound (the fastest the device could possibly run them) is
    # below this are timed as CUDA-graph replays, where launch overhead no longer
    # dominates; the rest by do_bench with the L2 flushed between samples.
    cudagraph_below_ms: float = 0.02
    # Calls per captured graph at least (whole rounds over the rotated copies), so the
    # graph launch itself is < 1% of a replay of microsecond kernels.
    graph_min_calls: int = 200
    # Samples of one GPU timing at most (a 5 us kernel would otherwise take ~1,100 per
    # 100 ms): more than the regression gate can use, and results.json keeps them all.
    max_samples: int = 1000
    # Bounds of one capture.  At the smallest sizes the rotation needs ~12,800 copies
    # (fp8 dot at 2^12 on a 50 MB L2) and torch's eager fp8 paths launch 6-14 kernels a
    # call: ~180k graph nodes in one capture (~700k for the full preset), minutes of
    # capture and gigabytes of graph.  graph_plan predicts both from the nodes one call
    # adds (count_launches) and its dispatch time (capture ~ 2x dispatch per call):
    # past a bound, a graph holds one round over the copies instead of graph_min_calls;
    # past it even then, the row is timed by do_bench with L2 flushes, and its reason
    # says so.  time_cudagraph also stops a capture that runs past max_capture_s (at a
    # round's end; within the first round: flushed timing, said in the reason).
    max_graph_nodes: int = 100_000
    max_capture_s: float = 10.0
    # Graph nodes per call assumed where they cannot be counted (the driver cannot be
    # asked): above the most seen from one eager torch call in this suite (14).
    assumed_launches: int = 16
    # CPU: one sample is a block of calls lasting at least cpu_block_s (the timer's own
    # overhead, about 1 us a block, is then under 0.1% of it); a row's samples together
    # last at least cpu_min_run_time_s, and at least min_samples of them are taken.
    cpu_block_s: float = 1e-3
    cpu_min_run_time_s: float = 0.05
    # Every row's timing has a budget, as nvbench's --timeout and minimum-time rules: a
    # row samples until min_samples or row_budget_s, whichever comes first, and never
    # takes fewer than gate_min_samples (the row then says the budget applied).  A row
    # whose gate_min_samples cannot fit in row_budget_s is not timed: skipped, with the
    # time of one call in its reason.  10 is what the regression gate's rank test needs
    # to call a change at the per-row significance of a 1,000-row comparison (10 vs 10
    # samples reach p = 1/C(20, 10) = 5.4e-6 < 1e-5; tests/test_budget.py pins it).
    # 5 s: a matmul of 0.5 s a call still gets the gate's 10 samples (fp16 512^3 on the
    # 2-core VM takes 0.1 s quiet, 0.2 s beside another job).
    row_budget_s: float = 5.0
    gate_min_samples: int = 10
    # CPU samples come in this many rounds, each on freshly allocated inputs and output,
    # and the sweep interleaves the rounds of neighbouring cases (runner.iterate): round r
    # of every case in a chunk of about cpu_chunk_s seconds, then round r + 1.  On a
    # shared machine the speed of the same op moves in spells of seconds (measured on the
    # 2-core CI VM: fp32 add of 2^18 elements at 24 or 41 us, steady within 10 ms and
    # switching between rounds seconds apart), so samples taken back to back hold one
    # spell and understate the run-to-run spread.  Rounds seconds apart sample several
    # spells, and the fast end of a row is then steady between runs (the fastest of 25
    # samples of identical quick sweeps within 1.16x and 1.28x of each other in two
    # batches of 6 and 8 runs, against 1.98x with the rounds back to back).
    cpu_rounds: int = 5
    cpu_chunk_s: float = 3.0
    # Set by cpu_round_config: the rounds of the row a one-round config belongs to (the
    # budget's messages speak of the whole row).
    cpu_rounds_of_row: int = 1

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


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


def summarize(samples_ms: Sequence[float], timer: str) -> Timing:
    s = np.asarray(samples_ms, dtype=np.float64)
    p20, p50, p80 = np.percentile(s, [20, 50, 80])
    return Timing(float(p50), float(p20), float(p80), int(s.size), timer,
                  tuple(float(x) for x in s))


def bound_ms(flops: float, nbytes: float, peak_tflops: float | None,
             peak_gbps: float | None) -> float | None:
    """The roofline lower bound of a case's time in ms: max(flops / peak, bytes / bw).
    None when neither ceiling is known."""
    parts = []
    if peak_tflops:
        parts.append(flops / (peak_tflops * 1e12) * 1e3)
    if peak_gbps:
        parts.append(nbytes / (peak_gbps * 1e9) * 1e3)
    return max(parts) if parts else None


def choose_method(flops: float, nbytes: float, peak_tflops: float | None,
                  peak_gbps: float | None, cfg: TimingConfig) -> str:
    """TIMER_GRAPH or TIMER_FLUSHED for a (kernel, dtype, shape) on this device.

    Decided from the analytic bound, not from a measurement: the same for both providers
    of a case and for every run on the same device model.  A case that cannot finish in
    cfg.cudagraph_below_ms even at the roof is long enough for flushed do_bench."""
    b = bound_ms(flops, nbytes, peak_tflops, peak_gbps)
    if b is None:
        return TIMER_FLUSHED
    return TIMER_GRAPH if b < cfg.cudagraph_below_ms else TIMER_FLUSHED


class OverBudget(Exception):
    """A row whose minimum samples cannot fit in its time budget (the message says why)."""


@dataclass(frozen=True)
class CpuPlan:
    """How one round of a CPU row is sampled: `samples` blocks of `number` calls each
    (number None: sized to cfg.cpu_block_s when the round starts); `note` says when the
    budget cut the samples."""

    samples: int
    number: int | None = None
    note: str = ""


def plan_cpu(call_s: float, cfg: TimingConfig, budget_s: float | None = None) -> CpuPlan:
    """The samples of one CPU round (cfg is a round's config: cpu_round_config) from the
    time of one call, `call_s` (the checked call: on a CPU the call is synchronous).

    Wanted: cfg.min_samples, more while they last less than cfg.cpu_min_run_time_s
    together; at most what fits in the budget (cfg.row_budget_s, or the run's smaller
    share `budget_s`); never fewer than cfg.gate_min_samples.  Raises OverBudget when
    even those would take longer than cfg.row_budget_s."""
    floor = min(cfg.gate_min_samples, cfg.min_samples)
    per_sample = max(call_s, cfg.cpu_block_s)
    if call_s * floor > cfg.row_budget_s:
        rounds = cfg.cpu_rounds_of_row
        raise OverBudget(
            f"over the row budget: one call takes {call_s:.3g} s here, so the "
            f"{floor * rounds} samples the regression gate needs would take "
            f"{call_s * floor * rounds:.3g} s, past the row budget of "
            f"{cfg.row_budget_s * rounds:.3g} s (--row-budget)")
    want = max(cfg.min_samples, math.ceil(cfg.cpu_min_run_time_s / per_sample))
    budget = cfg.row_budget_s if budget_s is None else max(0.0, min(budget_s,
                                                                    cfg.row_budget_s))
    fit = int(budget / per_sample)
    samples = max(floor, min(want, fit))
    number = 1 if call_s >= cfg.cpu_block_s else None
    note = ""
    if samples < want:
        rounds = cfg.cpu_rounds_of_row
        note = (f"row budget applied: {samples * rounds} of {want * rounds} "
                f"samples (one call {call_s:.3g} s, budget "
                f"{budget * rounds:.3g} s)")
    return CpuPlan(samples, number, note)


def block_number(fn: Callable[[], object], block_s: float) -> int:
    """Calls per sample so that one block lasts at least block_s: from the time of one
    call, then of the block that should last block_s, corrected until it does."""
    number = 1
    t = timeit.Timer(fn).timeit(1)  # also the warm call
    while t < block_s and number < 10**7:
        number = min(10**7, max(2 * number, math.ceil(number * 1.2 * block_s / max(t, 1e-9))))
        t = timeit.Timer(fn).timeit(number)
    return number


def time_cpu(fn: Callable[[], object], cfg: TimingConfig, plan: CpuPlan | None = None
             ) -> Timing:
    """Samples of `fn` on a CPU: plan.samples blocks of calls (the stdlib's timeit; the
    thread count is the process's), each block's time divided by its calls.

    Not torch.utils.benchmark's blocked_autorange: it sizes every block to 10,000x its
    timer's overhead (about 10 ms, whatever the kernel) and estimates that size by
    running blocks of 1, 10, 100... calls, so a 5 us kernel cost about 0.3 s a round,
    and it has no time budget; on a 2-core machine that was most of the default run.
    Here a block lasts cfg.cpu_block_s (the overhead stays under 0.1% of it) and the
    sample count comes from plan_cpu."""
    if plan is None:
        t0 = time.perf_counter()
        fn()
        plan = plan_cpu(time.perf_counter() - t0, cfg)
    number = plan.number or block_number(fn, cfg.cpu_block_s)
    times = timeit.Timer(fn).repeat(repeat=plan.samples, number=number)
    return summarize([t / number * 1e3 for t in times], TIMER_CPU)


def cpu_round_config(cfg: TimingConfig) -> TimingConfig:
    """The budget of one of cfg.cpu_rounds rounds: its share of the samples, run time and
    row budget (so that the rounds together give what the row asks).  A config of one
    round is its own."""
    rounds = cfg.cpu_rounds
    if rounds <= 1:
        return cfg
    return replace(cfg, cpu_rounds=1, cpu_rounds_of_row=rounds,
                   min_samples=math.ceil(cfg.min_samples / rounds),
                   gate_min_samples=math.ceil(cfg.gate_min_samples / rounds),
                   cpu_min_run_time_s=cfg.cpu_min_run_time_s / rounds,
                   row_budget_s=cfg.row_budget_s / rounds)


def time_cpu_rounds(make_call: Callable[[int], Callable[[], object]],
                    cfg: TimingConfig, plan: CpuPlan | None = None) -> Timing:
    """time_cpu over cfg.cpu_rounds rounds taken back to back; `make_call(r)` gives round
    r's callable (on its own buffers), and the samples of all rounds are pooled."""
    per_round = cpu_round_config(cfg)
    samples: list[float] = []
    for r in range(max(1, cfg.cpu_rounds)):
        samples += time_cpu(make_call(r), per_round, plan).samples_ms
    return summarize(samples, TIMER_CPU)


def host_dispatch_us(call: Callable[[], object], sync: Callable[[], None],
                     reps: int = 20, repeats: int = 5, budget_s: float = 0.25) -> float:
    """Host time to dispatch one call, in us: the wall time of `reps` back-to-back calls
    with no synchronization between them, divided by `reps`; the median of `repeats`
    such bursts, each after a sync.  On a GPU the calls only enqueue work, so this is the
    Python and launch overhead a provider pays per call, apart from its device time.
    (On a CPU the call runs synchronously: this would be its run time, so it is not
    taken there.)

    Every burst's calls also run on the device before the next burst starts, so a slow
    call (one synchronous call, dispatch plus device, takes `once`) gets fewer: at most
    budget_s / once calls in all, and never fewer than 3 bursts of 2 (a 100 ms matmul
    costs 6 calls, not 100)."""
    sync()
    call()  # warm: lazy init, JIT cache lookups
    sync()
    t0 = time.perf_counter()
    call()
    sync()
    once = time.perf_counter() - t0
    fit = int(budget_s / max(once, 1e-9))
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
    return float(np.median(per_call))


# SM cycles per microsecond the flush padding assumes: the top boost clock of the GPUs in
# the table (~2 GHz).  A GPU clocked lower spins longer, which only adds margin.
PAD_CYCLES_PER_US = 2000


def flush_padding_us(host_us: float | None) -> float:
    """How long the GPU is kept busy after each L2 flush, in us, so that the host has
    recorded the start event and dispatched the call before the GPU reaches them: twice
    the provider's measured dispatch time plus 10 us, or 0 when it is unknown."""
    return 2.0 * host_us + 10.0 if host_us else 0.0


def time_flushed(fn: Callable[[], object], cfg: TimingConfig,
                 host_us: float | None = None) -> Timing:
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
    flush and padding included), at least cfg.min_samples."""
    import triton.testing as tt

    t_start = time.monotonic()
    pad_us = flush_padding_us(host_us)
    if pad_us:
        return replace(summarize(padded_flushed_samples(fn, cfg, pad_us), TIMER_FLUSHED),
                       span=(t_start, time.monotonic()))
    # A short first estimate (flush included, as do_bench's own) sizes the measurement.
    est = tt.do_bench(fn, warmup=1, rep=5, return_mode="median")
    n = sample_count(est, cfg)
    samples: list[float] = []
    while len(samples) < n:  # do_bench counts its flush in its estimate: top up
        # Warm-up as do_bench sizes it (from its own estimate), on the first call only.
        samples += tt.do_bench(fn, warmup=0 if samples else cfg.warmup_ms,
                               rep=max(1e-3, (n - len(samples)) * est), return_mode="all")
    return replace(summarize(samples, TIMER_FLUSHED), span=(t_start, time.monotonic()))


def sample_count(per_sample_ms: float, cfg: TimingConfig) -> int:
    """Samples of a GPU timing whose samples each take `per_sample_ms` of device time
    (flush, padding or graph replay included): as do_bench, cfg.rep_ms of them, at least
    cfg.min_samples and at most cfg.max_samples, within cfg.row_budget_s unless that
    leaves fewer than cfg.gate_min_samples."""
    per = max(per_sample_ms, 1e-4)
    want = max(cfg.min_samples, int(cfg.rep_ms / per))
    fit = int(cfg.row_budget_s * 1e3 / per)
    return max(min(cfg.gate_min_samples, cfg.min_samples), min(want, fit, cfg.max_samples))


def _flush_buffer() -> torch.Tensor:
    """The buffer do_bench zeroes to flush the L2 (256 MB in Triton 3.x)."""
    try:
        from triton.runtime import driver

        return driver.active.get_empty_cache_for_benchmark()
    except Exception:
        return torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda")


def padded_flushed_samples(fn: Callable[[], object], cfg: TimingConfig,
                           pad_us: float) -> list[float]:
    """do_bench's loop (estimate, warm-up, then one CUDA-event pair around each call
    after an L2 flush) with the GPU kept busy for `pad_us` after every flush; the
    samples in ms.  See time_flushed."""
    flush = _flush_buffer()
    cycles = int(pad_us * PAD_CYCLES_PER_US)

    def sample(start: torch.cuda.Event | None = None,
               end: torch.cuda.Event | None = None) -> None:
        flush.zero_()
        torch.cuda._sleep(cycles)
        if start is not None:
            start.record()
        fn()
        if end is not None:
            end.record()

    fn()
    torch.cuda.synchronize()
    # As do_bench: the time of one sample, flush included (and here the padding), from 5.
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(5):
        sample()
    t1.record()
    torch.cuda.synchronize()
    per_sample_ms = max(t0.elapsed_time(t1) / 5, 1e-4)
    for _ in range(max(1, int(cfg.warmup_ms / per_sample_ms))):
        fn()
    n = sample_count(per_sample_ms, cfg)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends, strict=True):
        sample(s, e)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def count_launches(call: Callable[[], object]) -> int | None:
    """GPU work items (kernels, memsets, copies) one call enqueues: the nodes it adds to
    a CUDA graph, counted from a capture of one call (CUDAGraph(keep_graph=True), then
    the driver's cuGraphGetNodes on the uninstantiated graph).  That is exactly what
    time_cudagraph's capture holds per call, and needs no profiler: torch.profiler's
    CUPTI session costs a set-up and teardown per case, and CUPTI may drop the first
    kernels of a session (pytorch/pytorch#192021), which would undercount.  None when the
    driver cannot be asked; a call that cannot be captured raises (it could not be timed
    by CUDA graphs either)."""
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        call()
    try:
        return graph_nodes(graph.raw_cuda_graph()) or None
    except (OSError, AttributeError, RuntimeError):
        return None


def graph_nodes(raw_graph: int) -> int:
    """Nodes of a cudaGraph_t (the same handle as the driver's CUgraph)."""
    import ctypes

    lib = ctypes.CDLL("libcuda.so.1")
    n = ctypes.c_size_t(0)
    # cuGraphGetNodes(graph, NULL, &n) returns the node count in n.
    rc = lib.cuGraphGetNodes(ctypes.c_void_p(raw_graph), None, ctypes.byref(n))
    if rc != 0:
        raise RuntimeError(f"cuGraphGetNodes returned CUresult {rc}")
    return int(n.value)


def graph_plan(copies: int, launches: int, host_us: float | None,
               cfg: TimingConfig, counted: bool = True) -> tuple[int | None, str]:
    """(calls per captured graph, note): graph_calls(copies) when the capture stays under
    cfg.max_graph_nodes nodes (calls x launches per call) and cfg.max_capture_s of
    capture (about twice the host dispatch time per captured call); else one round over
    the copies; None when even that is past a bound (time with L2 flushes instead).
    The note says which bound applied (and when the launches per call were assumed,
    `counted` False, rather than counted)."""
    per_call = f"{launches} launches a call" + ("" if counted else ", assumed: not counted")

    def too_big(calls: int) -> str | None:
        nodes = calls * launches
        if nodes > cfg.max_graph_nodes:
            return f"{calls:,} calls x {per_call} = {nodes:,} graph nodes > " \
                   f"{cfg.max_graph_nodes:,}"
        if host_us and calls * 2 * host_us * 1e-6 > cfg.max_capture_s:
            return (f"~{calls * 2 * host_us * 1e-6:.0f} s of capture for {calls:,} calls "
                    f"> {cfg.max_capture_s:g} s")
        return None

    full = graph_calls(copies, cfg)
    why = too_big(full)
    if why is None:
        return full, ""
    why_round = too_big(copies)
    if why_round is None:
        return copies, f"graph of one round over the {copies} copies instead of {full} " \
                       f"calls ({why})"
    return None, f"CUDA graph too large even for one round ({why_round})"


def time_gpu(fn: Callable[[], object], cfg: TimingConfig) -> Timing:
    """Device time of one callable with L2 flushed between samples (what the
    pytest-benchmark suite reports beside its host timing): its host dispatch measured
    first, so that the GPU is kept busy after each flush for longer than the host takes
    to dispatch (see time_flushed); Timing.host_us carries it."""
    host_us = host_dispatch_us(fn, torch.cuda.synchronize)
    return replace(time_flushed(fn, cfg, host_us), host_us=host_us)


def rotation_copies(footprint_bytes: int, l2_bytes: int | None) -> int | None:
    """How many copies of a case (inputs + output, `footprint_bytes` each) make a
    rotation that really exceeds twice the L2: the smallest N with N x footprint > 2 L2.
    None when the L2 size is unknown (then no rotation can be shown to be cold)."""
    if not l2_bytes or footprint_bytes <= 0:
        return None
    return 2 * l2_bytes // footprint_bytes + 1


def graph_calls(copies: int, cfg: TimingConfig) -> int:
    """Calls captured in one graph: whole rounds over the copies, at least
    cfg.graph_min_calls.  Depends on the copy count only, never on the kernel's speed,
    so both providers of a case replay the same number of calls."""
    return copies * max(1, math.ceil(cfg.graph_min_calls / copies))


class CaptureTooSlow(RuntimeError):
    """A CUDA-graph capture passed cfg.max_capture_s before one round over the copies."""


def time_cudagraph(calls: Sequence[Callable[[], object]], cfg: TimingConfig,
                   total: int | None = None) -> Timing:
    """Per-call time from CUDA-graph replays: the graph holds graph_calls(len(calls))
    launches cycling over `calls` (one per rotated copy of inputs and output); each
    sample is one replay timed with CUDA events, divided by the calls it holds.

    Outputs a call returns are kept referenced for the len(calls) calls that follow it
    (and the last round's for the graph's life), so an op that allocates a fresh output
    (F.gelu, torch._scaled_mm) writes as many distinct buffers as the rotation has
    copies, like a provider that writes into its copy's preallocated output; dropping
    them would let the graph pool hand one L2-resident block to every call.

    The capture stops at the end of the first whole round after cfg.max_capture_s (the
    graph then holds fewer calls, said in Timing.note); past it within the first round
    it raises CaptureTooSlow (fewer calls than the copies would not be cold).  graph_plan
    predicts the capture time from the dispatch time; this is the guard where capturing
    costs more than dispatching (allocations during capture, a slow driver).
    """
    n = len(calls)
    total = graph_calls(n, cfg) if total is None else total
    # Warm-up on a side stream before capture (lazy init, autotuning, JIT): capture must
    # see only kernel launches.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    live: deque[object] = deque(maxlen=n)
    captured = total
    t_capture = time.perf_counter()
    with torch.cuda.graph(graph):
        for j in range(total):
            live.append(calls[j % n]())
            done = j + 1
            if done < total and (done < n or done % n == 0) \
                    and time.perf_counter() - t_capture > cfg.max_capture_s:
                captured = done
                break
    capture_s = time.perf_counter() - t_capture
    if captured < n:
        del graph
        live.clear()
        raise CaptureTooSlow(f"capture passed {cfg.max_capture_s:g} s after {captured:,} "
                             f"of the {n:,} calls of one round over the copies")
    note = "" if captured == total else (
        f"capture stopped after {captured:,} of {total:,} calls ({capture_s:.1f} s > "
        f"{cfg.max_capture_s:g} s)")
    try:
        graph.replay()  # the first replay uploads the graph
        torch.cuda.synchronize()
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        graph.replay()
        t1.record()
        torch.cuda.synchronize()
        replay_ms = max(t0.elapsed_time(t1), 1e-3)
        reps = sample_count(replay_ms, cfg)
        t_start = time.monotonic()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends, strict=True):
            s.record()
            graph.replay()
            e.record()
        torch.cuda.synchronize()
        span = (t_start, time.monotonic())
        samples = [s.elapsed_time(e) / captured for s, e in zip(starts, ends, strict=True)]
    finally:
        del graph
        live.clear()
    return replace(summarize(samples, TIMER_GRAPH), note=note, span=span)


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

