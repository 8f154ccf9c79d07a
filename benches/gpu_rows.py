"""A GPU row's timing in its cache mode (docs/measurement.md).

One method per (kernel, dtype, shape), from its roofline bound on the device model
(`timing_method`): do_bench with the L2 flushed between samples, or CUDA-graph replays.
Cold graph rows rotate over copies of the inputs and output that together exceed twice
the L2, made once per case as one block per tensor (benches.cases.make_copies) and
shared by its providers (`graph_copies`); warm rows replay calls on one set of buffers,
or take CUDA events around back-to-back calls.  A graph that cannot be used (too large,
too slow to capture, not capturable) falls back to events, and the row's reason says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from benches.cases import Case, Copies, InputCache, MakeCall, RunConfig, gc_paused, make_copies
from benches.failures import error_message, is_sticky_cuda_error
from benches.graph_timing import CaptureTooSlow, probe_call, time_cudagraph
from benches.phases import TimeSplit
from benches.timing import Timing, host_dispatch_us, time_flushed, time_warm
from benches.timing_plan import (
    TIMER_CPU,
    TIMER_FLUSHED,
    TIMER_GRAPH,
    TIMER_GRAPH_FALLBACK,
    TIMER_WARM_FALLBACK,
    choose_method,
    graph_plan,
    rotation_copies,
)
from roofline.model.schema import DEFAULT_CACHE


def timing_method(case: Case, cfg: RunConfig) -> str:
    """How a (kernel, dtype, shape) is timed on this device: one answer for both
    providers, from the case's roofline bound under the device model's ceilings."""
    if cfg.target.kind != "cuda":
        return TIMER_CPU
    rc = case.spec.roof_class(case.dtype, cfg.target)
    c = cfg.ceilings
    return choose_method(case.spec.flops(case.shape, case.dtype),
                         case.spec.nbytes(case.shape, case.dtype),
                         c.peak_tflops(rc), c.peak_gbps(), cfg.timing)


def l2_bytes(cfg: RunConfig) -> int | None:
    mb = cfg.present.l2_mb or cfg.model.l2_mb
    return int(mb * 2**20) if mb else None


def rotation_of(case: Case, cfg: RunConfig) -> int | None:
    """Calls in one round of a cold graph row's rotation (its own buffers and the
    copies), None when the L2 size is unknown."""
    return rotation_copies(case.spec.nbytes(case.shape, case.dtype), l2_bytes(cfg))


def graph_copies(case: Case, cfg: RunConfig, cache: InputCache, inputs: dict[str, Any],
                 out: torch.Tensor) -> Copies | None:
    """The copies a cold CUDA-graph row rotates over (None for every other row), made
    once per (kernel, dtype, shape) and kept in `cache` for its other provider: one block
    per tensor, every copy a view of it (a clone per copy and provider was 342k clones
    in the H200's quick sweep)."""
    if cfg.target.kind != "cuda" or cfg.check_only or case.cache != DEFAULT_CACHE \
            or timing_method(case, cfg) != TIMER_GRAPH:
        return None
    count = rotation_of(case, cfg)
    if count is None or count < 2:
        return None
    if cache.copies is None or len(cache.copies.pairs) != count - 1:
        cache.copies = None  # the old copies go before the new ones are made
        cache.copies = make_copies(inputs, out, count - 1)
    return cache.copies


def time_gpu_row(case: Case, cfg: RunConfig, inputs: dict[str, Any], out: torch.Tensor,
                 make_call: MakeCall, call: Callable[[], object],
                 copies: Copies | None = None, split: TimeSplit | None = None
                 ) -> tuple[Timing, str]:
    """(timing, note) of a GPU row; the timing carries the call's host dispatch time.
    A cold graph row's copies are `copies` (made here when not given); `split` gets the
    capture's time (the caller has the row's timing phase open)."""
    split = split if split is not None else TimeSplit()
    host_us = host_dispatch_us(call, torch.cuda.synchronize)
    if case.cache == DEFAULT_CACHE:
        timing, note = _time_cold(case, cfg, inputs, out, make_call, call, host_us,
                                  copies, split)
    else:
        timing, note = _time_warm(case, cfg, call, host_us, split)
    return replace(timing, host_us=host_us), note


def _time_cold(case: Case, cfg: RunConfig, inputs: dict[str, Any], out: torch.Tensor,
               make_call: MakeCall, call: Callable[[], object], host_us: float,
               copies: Copies | None, split: TimeSplit) -> tuple[Timing, str]:
    if timing_method(case, cfg) == TIMER_FLUSHED:
        return time_flushed(call, cfg.timing, host_us), ""
    count = rotation_of(case, cfg)
    if count is None:
        return _fallback(time_flushed(call, cfg.timing, host_us),
                         "L2 size unknown: no rotation can be shown to be cold")
    if copies is None and count > 1:
        copies = make_copies(inputs, out, count - 1)
    # Distinct copies of inputs and output, together more than twice the L2, so every
    # replayed call starts from a cold cache (as do_bench's flush gives).
    with split.phase("capture"):
        extra = _copy_calls(case, copies, make_call) if count > 1 else []
    got = _graph_timing(call, cfg, host_us, [call, *extra], split)
    if isinstance(got, tuple):
        return got
    return _fallback(time_flushed(call, cfg.timing, host_us), got)


def _copy_calls(case: Case, copies: Copies | None, make_call: MakeCall
                ) -> list[Callable[[], object]]:
    """The provider's calls on each copy, made once and kept with the copies."""
    assert copies is not None
    if case.provider not in copies.calls:
        with gc_paused():
            copies.calls[case.provider] = [make_call(ins, o) for ins, o in copies.pairs]
    return copies.calls[case.provider]


def _graph_timing(call: Callable[[], object], cfg: RunConfig, host_us: float,
                  calls: list[Callable[[], object]], split: TimeSplit
                  ) -> tuple[Timing, str] | str:
    """(timing, note) of CUDA graphs over `calls` (`call` and one call per copy), sized
    by graph_plan and split by graph_split; else why no graph could be used (the caller
    times otherwise).  `call` is probed first (its nodes, its replay's time), so a call
    that cannot be captured fails before its copies are."""
    try:
        with split.phase("capture"):
            probe = probe_call(call)
        counted = probe.nodes
        total, why = graph_plan(len(calls), counted or cfg.timing.assumed_launches,
                                host_us, cfg.timing, counted=counted is not None)
        if total is not None:
            timing = time_cudagraph(calls, cfg.timing, total, probe.replay_ms)
            split.move(timing.setup_s, "capture")
            return timing, "; ".join(x for x in (why, timing.note) if x)
    except Exception as e:
        if is_sticky_cuda_error(e):
            raise
        why = str(e) if isinstance(e, CaptureTooSlow) else \
            f"CUDA-graph timing failed ({error_message(e)})"
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the graphs' pool, before the caller's other timing
    return why


def _fallback(t: Timing, why: str) -> tuple[Timing, str]:
    return (replace(t, timer=TIMER_GRAPH_FALLBACK),
            f"timed with L2 flushes instead of CUDA graphs: {why}")


def _time_warm(case: Case, cfg: RunConfig, call: Callable[[], object], host_us: float,
               split: TimeSplit) -> tuple[Timing, str]:
    """A warm GPU row, by the case's method as a cold one: CUDA graphs of back-to-back
    calls on ONE set of buffers (no rotation, sized as the cold graph's), or CUDA events
    around back-to-back calls with nothing flushed (time_warm)."""
    if timing_method(case, cfg) == TIMER_FLUSHED:
        return time_warm(call, cfg.timing, host_us), ""
    got = _graph_timing(call, cfg, host_us, [call], split)
    if isinstance(got, tuple):
        return got
    return (replace(time_warm(call, cfg.timing, host_us), timer=TIMER_WARM_FALLBACK),
            f"timed back to back without a CUDA graph: {got}")
