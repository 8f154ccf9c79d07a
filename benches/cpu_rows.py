"""A CPU row's timing in its cache mode (docs/measurement.md).

Warm: every call of a timed block on the same buffers (benches.timing.time_cpu).  Cold:
each block's calls cycle over the row's inputs and output and copies of them that
together exceed twice the host's last-level cache (benches.timing.Rotation), so that
every call starts cold, as the CUDA graphs' rotation does on a GPU; a footprint already
past twice the cache is cold by size and runs on its own buffers.  The copies are views
made once per row into one block of memory the sweep's rows share (benches.cases.Scratch),
the row's input values written back into it before each of its rounds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from benches.cases import (
    Case,
    Copies,
    InputCache,
    MakeCall,
    RunConfig,
    Scratch,
    clone_inputs,
    gc_paused,
    make_copies,
)
from benches.timing import Rotation, Timing, time_cpu_rounds
from benches.timing_plan import TIMER_CPU, TIMER_CPU_ROTATED, CpuPlan, cpu_cache_bytes, cpu_rotation
from roofline.model.schema import DEFAULT_CACHE

# The timers of CPU rows (same buffers, or a cold row's rotated copies): rows timed in
# rounds, their samples pooled at the end.
CPU_TIMERS = (TIMER_CPU, TIMER_CPU_ROTATED)


@functools.cache
def host_llc_bytes() -> int:
    """The host's last-level cache a cold CPU row's copies rotate past (read once)."""
    return cpu_cache_bytes()


def rotation(case: Case) -> tuple[int | None, str]:
    """(sets of buffers its calls rotate over, note) of a CPU case: None for a warm one,
    and for a cold one cold by size (the note says so)."""
    if case.cache != DEFAULT_CACHE:
        return None, ""
    return cpu_rotation(case.spec.nbytes(case.shape, case.dtype), host_llc_bytes())


def sweep_cache(cfg: RunConfig) -> InputCache:
    """A sweep's input cache, with the memory its cold CPU rows' copies share: room for
    the largest rotation (twice the last-level cache plus a footprint of at most twice
    it, cpu_rotation), touched only as far as the rows use it."""
    if cfg.target.kind == "cuda" or cfg.check_only:
        return InputCache()
    return InputCache(Scratch(4 * host_llc_bytes() + 2**20))


def row_copies(case: Case, cfg: RunConfig, cache: InputCache, inputs: dict[str, Any],
               out: torch.Tensor) -> Copies | None:
    """The copies a cold CPU row rotates over (None: warm, a GPU, or cold by size), made
    once per (kernel, dtype, shape) and kept in `cache` for the row's later rounds."""
    if cfg.target.kind == "cuda" or cfg.check_only:
        return None
    count, _ = rotation(case)
    if count is None:
        return None
    if cache.copies is None or len(cache.copies.pairs) != count - 1:
        cache.copies = None  # the old copies go before the new ones are made
        cache.copies = make_copies(inputs, out, count - 1, cache.scratch)
    return cache.copies


def time_cpu_row(case: Case, cfg: RunConfig, inputs: dict[str, Any], out: torch.Tensor,
                 make_call: MakeCall, call: Callable[[], object], plan: CpuPlan | None,
                 copies: Copies | None) -> tuple[Timing, str]:
    """(timing, note) of a CPU row in rounds (see time_cpu_rounds), each round's first
    buffers fresh.  Warm: every call on the round's buffers.  Cold: the calls cycle over
    those and `copies` (made here when not given), or, for a footprint past twice the
    cache, run on the same buffers (said in the note)."""
    count, size_note = rotation(case)
    extra: list[Callable[[], object]] = []
    if count is not None:
        copies = copies if copies is not None else make_copies(inputs, out, count - 1)
        if case.provider not in copies.calls:
            with gc_paused():
                copies.calls[case.provider] = [make_call(ins, o) for ins, o in copies.pairs]
        extra = copies.calls[case.provider]
        copies.ready()  # this row's inputs in memory other rows' rounds may have used
    held: list[Any] = []

    def round_call(r: int) -> Callable[[], object]:
        base = call
        if r > 0:
            # New buffers are allocated while the previous round's are still held, so
            # they cannot simply reuse the same addresses.
            ins, o = clone_inputs(inputs), torch.empty_like(out)
            held[:] = [ins, o]
            base = make_call(ins, o)
        # The round's own buffers last: the check (or the clone) just touched them, and
        # the copies before them in the rotation push them out of the cache.
        return Rotation([*extra, base]) if count is not None else base

    # host_us stays None: on a CPU the call runs synchronously, so its dispatch cannot
    # be told apart from its run time.
    timing = time_cpu_rounds(round_call, cfg.timing, plan)
    return timing, "; ".join(x for x in (plan.note if plan else "", size_note) if x)
