"""CUDA-graph timing of the cases too short for do_bench's flushed events: a rotation of
calls over copies of the inputs and output, together past twice the L2, so that every
replayed call starts cold (the copies: benches.sweep.cases.make_copies, shared by a case's
providers; their number: benches.timing.plan.rotation_copies).

What a row's graphs hold is plain arithmetic in benches/timing/plan.py (graph_calls,
graph_plan, graph_split, graph_sample_count); this module captures and replays them:

- `probe_call`: one call captured alone, for the graph nodes it adds (the capture's size)
  and the time of its replay (how many calls fit in one replay);
- `time_cudagraph`: the rotation's calls captured in one graph or, when they would take
  longer than TimingConfig.graph_replay_ms to replay, in several graphs of consecutive
  calls replayed in turn, so every call still meets its copy a whole rotation after its
  last use; samples for TimingConfig.graph_rep_ms.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from benches.timing.clock import Timing, summarize, until_settled
from benches.timing.interleave import Sampler
from benches.timing.plan import (
    TIMER_GRAPH,
    TimingConfig,
    graph_calls,
    graph_sample_count,
    graph_split,
)


@dataclass(frozen=True)
class GraphProbe:
    """What one call captured alone says: the graph nodes it adds (None: the driver
    could not be asked) and the time of the one-call graph's replay in ms, launch
    included (None: not replayed)."""

    nodes: int | None
    replay_ms: float | None


def probe_call(call: Callable[[], object], replays: int = 3) -> GraphProbe:
    """Capture one call (CUDAGraph(keep_graph=True)), count its nodes (the driver's
    cuGraphGetNodes on the uninstantiated graph: exactly what the call adds to a
    rotation's graph, with no profiler session to set up, nor CUPTI's dropped first
    kernels, pytorch/pytorch#192021), then replay it: the fastest of `replays` timed
    replays after the first (which instantiates and uploads it).  A call that cannot be
    captured raises here, before any copy is captured with it."""
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(graph):
        call()
    try:
        nodes: int | None = graph_nodes(graph.raw_cuda_graph()) or None
    except (OSError, AttributeError, RuntimeError):
        nodes = None
    try:
        graph.replay()
        best = None
        for _ in range(replays):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            best = ms if best is None else min(best, ms)
    except RuntimeError:
        best = None
    finally:
        del graph
    return GraphProbe(nodes, best)


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


class CaptureTooSlow(RuntimeError):
    """A CUDA-graph capture passed cfg.max_capture_s before one round over the copies."""


def time_cudagraph(calls: Sequence[Callable[[], object]], cfg: TimingConfig,
                   total: int | None = None, call_ms: float | None = None) -> Timing:
    """Per-call time from CUDA-graph replays of `total` calls (default graph_calls)
    cycling over `calls`, one per rotated copy of inputs and output (cudagraph_sampler):
    graph_sample_count replays at most, fewer once the median has settled.

    Timing.setup_s is the time spent before the samples (warm-up, capture, the
    uploading round); Timing.span the samples' own window."""
    prepared = cudagraph_sampler(calls, cfg, total, call_ms)
    try:
        t_start = time.monotonic()
        sampled = until_settled(prepared.sampler.take, prepared.sampler.cap, cfg)
        span = (t_start, time.monotonic())
    finally:
        prepared.sampler.close()
    return replace(summarize(sampled.samples, TIMER_GRAPH), note=prepared.note, span=span,
                   setup_s=prepared.setup_s, stopped=sampled.stopped)


@dataclass
class GraphSampler:
    """A row's captured graphs, ready to replay (`sampler`), with what the capture did:
    the note (a capture cut short) and its seconds before any sample (`setup_s`)."""

    sampler: Sampler
    note: str
    setup_s: float


def cudagraph_sampler(calls: Sequence[Callable[[], object]], cfg: TimingConfig,
                      total: int | None = None, call_ms: float | None = None
                      ) -> GraphSampler:
    """`total` calls (default graph_calls) cycling over `calls`, one per rotated copy of
    inputs and output, captured and uploaded, as a Sampler whose samples are one graph's
    replay timed with CUDA events, divided by the calls it holds.

    The calls are captured in the graphs graph_split gives for `call_ms` (one call's
    time): one graph, or several of consecutive calls sharing one memory pool, replayed
    in the order they were captured, round after round, so a call's copy is touched again
    only after every other copy was, as in one graph.  Every graph is replayed once
    before any sample (the first replay uploads it; the round also leaves each copy as a
    rotation does), then samples continue the round, batch after batch.

    Outputs a call returns are kept referenced for the len(calls) calls that follow it
    (and the last round's for the graphs' life), so an op that allocates a fresh output
    (F.gelu, torch._scaled_mm) writes as many distinct buffers as the rotation has
    copies, like a provider that writes into its copy's preallocated output; dropping
    them would let the graph pool hand one L2-resident block to every call.

    The capture stops at the end of the first whole round after cfg.max_capture_s (the
    graphs then hold fewer calls, said in the note); past it within the first round it
    raises CaptureTooSlow (fewer calls than the copies would not be cold).  The graphs
    live until the sampler's close()."""
    t_setup = time.perf_counter()
    n = len(calls)
    total = graph_calls(n, cfg) if total is None else total
    # Warm-up on a side stream before capture (lazy init, cuBLAS handles, Triton's
    # launcher): capture must see only kernel launches.  The copies' calls are the same
    # kernels on other buffers of the same layout and alignment, so the row's own call
    # and one copy's cover what a first call does.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    sizes = graph_split(total, call_ms, cfg)
    graphs: list[tuple[torch.cuda.CUDAGraph, int]] = []
    live: deque[object] = deque(maxlen=n)
    kept = list(calls)  # their buffers (the copies) live as long as the graphs replay them

    def close() -> None:
        graphs.clear()
        live.clear()
        kept.clear()

    try:
        _, note = _capture(calls, total, sizes, cfg, graphs, live)
        for g, _ in graphs:
            g.replay()  # uploads; one round over the copies
        torch.cuda.synchronize()
        setup_s = time.perf_counter() - t_setup
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        graphs[0][0].replay()
        t1.record()
        torch.cuda.synchronize()
    except BaseException:
        close()
        raise
    replay_ms = max(t0.elapsed_time(t1), 1e-3)
    replayed = [0]

    def take(k: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(k)]
        held = []
        # One untimed replay first: the GPU is busy when the first start event is
        # recorded (no graph launch on an idle GPU counted), and a warm row's buffers are
        # back in the L2 after another provider's batch.
        replayed[0] += 1
        graphs[replayed[0] % len(graphs)][0].replay()
        for s, e in zip(starts, ends, strict=True):
            replayed[0] += 1  # the round goes on after graph 0, batch after batch
            g, size = graphs[replayed[0] % len(graphs)]
            s.record()
            g.replay()
            e.record()
            held.append(size)
        torch.cuda.synchronize()
        return [s.elapsed_time(e) / size for s, e, size in zip(starts, ends, held,
                                                               strict=True)]

    return GraphSampler(Sampler(take, graph_sample_count(replay_ms, cfg), replay_ms, close),
                        note, setup_s)


def _capture(calls: Sequence[Callable[[], object]], total: int, sizes: list[int],
             cfg: TimingConfig, graphs: list[tuple[torch.cuda.CUDAGraph, int]],
             live: deque[object]) -> tuple[int, str]:
    """Capture `total` calls cycling over `calls` into graphs of `sizes` calls (appended
    to `graphs`, with their sizes), stopping at a round's end once cfg.max_capture_s has
    passed; (calls captured, the note when stopped early)."""
    n = len(calls)
    t_capture = time.perf_counter()
    pool = None
    done = 0
    stopped = False
    for size in sizes:
        graph = torch.cuda.CUDAGraph()
        held = 0
        with torch.cuda.graph(graph, pool=pool):
            for _ in range(size):
                live.append(calls[done % n]())
                done += 1
                held += 1
                if done < total and (done < n or done % n == 0) \
                        and time.perf_counter() - t_capture > cfg.max_capture_s:
                    stopped = True
                    break
        if pool is None:
            pool = graph.pool()
        graphs.append((graph, held))
        if stopped:
            break
    capture_s = time.perf_counter() - t_capture
    if done < n:
        raise CaptureTooSlow(f"capture passed {cfg.max_capture_s:g} s after {done:,} "
                             f"of the {n:,} calls of one round over the copies")
    note = "" if done == total else (
        f"capture stopped after {done:,} of {total:,} calls ({capture_s:.1f} s > "
        f"{cfg.max_capture_s:g} s)")
    return done, note
