"""How a row is timed: one class per method, one interface, chosen in one place
(`timer_for`).  docs/measurement.md gives the methods' reasons.

| class | device | cache mode | what it times |
| --- | --- | --- | --- |
| FlushedEvents | GPU | cold | CUDA events around each call after an L2 flush (do_bench's) |
| ColdGraph | GPU | cold | CUDA-graph replays over copies of the buffers past twice the L2 |
| WarmEvents | GPU | warm | CUDA events around back-to-back calls on one set of buffers |
| WarmGraph | GPU | warm | CUDA-graph replays of back-to-back calls on one set of buffers |
| CpuBlocks | CPU | warm, or cold by size | blocks of calls on the same buffers, in rounds |
| CpuRotated | CPU | cold | blocks whose calls cycle over copies past twice the last-level cache |

Events or graph on a GPU follows the case's roofline bound on the device model
(`timing_method`).  A graph that cannot be used (too large, too slow to capture, not
capturable) falls back to events, and the row's reason says why.  A rotating timer's
copies are made once per (kernel, dtype, shape) as one block per tensor and shared by its
providers (`RowTimer.copies`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from benches.sweep.cases import (
    Case,
    Copies,
    InputCache,
    MakeCall,
    Scratch,
    SweepContext,
    clone_inputs,
    gc_paused,
    make_copies,
)
from benches.sweep.failures import error_message, is_sticky_cuda_error
from benches.sweep.time_split import TimeSplit
from benches.timing.clock import (
    Dispatch,
    Rotation,
    Timing,
    flush_padding_us,
    flushed_sampler,
    measure_dispatch,
    padded_sampler,
    summarize,
    time_cpu_rounds,
)
from benches.timing.graphs import CaptureTooSlow, cudagraph_sampler, probe_call
from benches.timing.interleave import RowSamples, Sampler, interleave
from benches.timing.plan import (
    TIMER_CPU,
    TIMER_CPU_ROTATED,
    TIMER_FLUSHED,
    TIMER_GRAPH,
    TIMER_GRAPH_FALLBACK,
    TIMER_WARM,
    TIMER_WARM_FALLBACK,
    CpuPlan,
    choose_method,
    cpu_cache_bytes,
    cpu_rotation,
    graph_plan,
    rotation_copies,
)
from contract.schema import DEFAULT_CACHE
from kernels.spec import Inputs

# The timers of CPU rows: timed in rounds, their samples pooled at the end.
CPU_TIMERS = (TIMER_CPU, TIMER_CPU_ROTATED)


@dataclass
class RowCall:
    """What a timer times: a checked case's buffers and its provider's call on them
    (`make_call(inputs, out)`; a Triton row's is bound to its chosen configs), with the
    copies a cold row rotates over (made by the timer when not given), a CPU row's plan
    of samples per round, and the run's time split (a CUDA graph's capture is booked)."""

    case: Case
    cfg: SweepContext
    inputs: Inputs
    out: torch.Tensor
    make_call: MakeCall
    copies: Copies | None = None
    plan: CpuPlan | None = None
    split: TimeSplit = field(default_factory=TimeSplit)

    @functools.cached_property
    def call(self) -> Callable[[], object]:
        return self.make_call(self.inputs, self.out)

    def calls_on_copies(self) -> list[Callable[[], object]]:
        """The provider's calls on each copy, made once and kept with the copies."""
        copies = self.copies
        assert copies is not None
        if self.case.provider not in copies.calls:
            with gc_paused():
                copies.calls[self.case.provider] = [self.make_call(ins, o)
                                                    for ins, o in copies.pairs]
        return copies.calls[self.case.provider]


class RowTimer:
    """A timing method: `time(row)` gives (timing, note), the note what the row's reason
    should say about how it was timed."""

    name = ""  # the `timer` a row timed this way records

    def copies(self, row: RowCall, cache: InputCache) -> Copies | None:
        """The copies this method rotates over (None: it rotates over none), made once per
        (kernel, dtype, shape) and kept in `cache` for the case's other rows."""
        return None

    def time(self, row: RowCall) -> tuple[Timing, str]:
        raise NotImplementedError


def _cached_copies(cache: InputCache, row: RowCall, count: int,
                   scratch: Scratch | None = None) -> Copies:
    if cache.copies is None or len(cache.copies.pairs) != count - 1:
        cache.copies = None  # the old copies go before the new ones are made
        cache.copies = make_copies(row.inputs, row.out, count - 1, scratch)
    return cache.copies


# ---- GPU -------------------------------------------------------------------------------

def timing_method(case: Case, cfg: SweepContext) -> str:
    """Events (TIMER_FLUSHED) or CUDA graphs (TIMER_GRAPH) for a (kernel, dtype, shape)
    on this device, CPU blocks (TIMER_CPU) on a CPU: one answer for both providers and
    both cache modes, from the case's roofline bound under the device model's ceilings."""
    if cfg.target.kind != "cuda":
        return TIMER_CPU
    rc = case.spec.roof_class(case.dtype, cfg.target)
    c = cfg.ceilings
    return choose_method(case.spec.flops(case.shape, case.dtype),
                         case.spec.nbytes(case.shape, case.dtype),
                         c.peak_tflops(rc), c.peak_gbps(), cfg.timing)


def l2_bytes(cfg: SweepContext) -> int | None:
    mb = cfg.present.l2_mb or cfg.model.l2_mb
    return int(mb * 2**20) if mb else None


def rotation_of(case: Case, cfg: SweepContext) -> int | None:
    """Calls in one round of a cold graph row's rotation (its own buffers and the
    copies), None when the L2 size is unknown."""
    return rotation_copies(case.spec.nbytes(case.shape, case.dtype), l2_bytes(cfg))


@dataclass
class Prepared:
    """A GPU row's timer ready to take samples (its dispatch measured, its estimate,
    warm-up or CUDA-graph capture done): the sampler, the `timer` the row records, the
    note for its reason, its host dispatch per call (us) and the seconds spent before
    any sample that no measurement holds (a graph's capture: the run's `capture`)."""

    sampler: Sampler
    timer: str
    note: str
    host_us: float
    setup_s: float = 0.0

    def timing(self, got: RowSamples) -> Timing:
        """The row's Timing from what its sampler took (benches/timing/interleave.py)."""
        return replace(summarize(got.samples, self.timer), host_us=self.host_us,
                       note=self.note, span=got.span, setup_s=self.setup_s,
                       stopped=got.stopped, batches=tuple(got.batches))


class GpuTimer(RowTimer):
    """A GPU method: the call's host dispatch time is measured first (the event timers pad
    the GPU by it, and the row records it), then the method's sampler is made ready
    (`ready`); the providers of a case sample in turns (benches/sweep/gpu_case.py)."""

    def prepare(self, row: RowCall) -> Prepared:
        dispatch = measure_dispatch(row.call, torch.cuda.synchronize)
        return self.ready(row, dispatch)

    def ready(self, row: RowCall, dispatch: Dispatch) -> Prepared:
        raise NotImplementedError

    def time(self, row: RowCall) -> tuple[Timing, str]:
        """The row timed alone (no other provider between its batches)."""
        prep = self.prepare(row)
        try:
            got = interleave([prep.sampler], row.cfg.timing)
        finally:
            prep.sampler.close()
        return prep.timing(got[0]), prep.note


class FlushedEvents(GpuTimer):
    name = TIMER_FLUSHED

    def ready(self, row: RowCall, dispatch: Dispatch) -> Prepared:
        sampler = flushed_sampler(row.call, row.cfg.timing,
                                  flush_padding_us(dispatch.host_us), dispatch.once_ms)
        return Prepared(sampler, TIMER_FLUSHED, "", dispatch.host_us)


class WarmEvents(GpuTimer):
    name = TIMER_WARM

    def ready(self, row: RowCall, dispatch: Dispatch) -> Prepared:
        sampler = padded_sampler(row.call, row.cfg.timing, flush_padding_us(dispatch.host_us),
                                 None, dispatch.once_ms)
        return Prepared(sampler, TIMER_WARM, "", dispatch.host_us)


def _graph_ready(row: RowCall, host_us: float, calls: list[Callable[[], object]]
                 ) -> Prepared | str:
    """The row's CUDA graphs over `calls` (the row's call and one call per copy), sized by
    graph_plan and split by graph_split, captured and ready to replay; else why no graph
    could be used (the caller times otherwise).  The row's call is probed first (its
    nodes, its replay's time), so a call that cannot be captured fails before its copies
    are."""
    cfg, split = row.cfg, row.split
    try:
        with split.phase("capture"):
            probe = probe_call(row.call)
        counted = probe.nodes
        total, why = graph_plan(len(calls), counted or cfg.timing.assumed_launches,
                                host_us, cfg.timing, counted=counted is not None)
        if total is not None:
            got = cudagraph_sampler(calls, cfg.timing, total, probe.replay_ms)
            split.move(got.setup_s, "capture")
            note = "; ".join(x for x in (why, got.note) if x)
            return Prepared(got.sampler, TIMER_GRAPH, note, host_us, got.setup_s)
    except Exception as e:
        if is_sticky_cuda_error(e):
            raise
        why = str(e) if isinstance(e, CaptureTooSlow) else \
            f"CUDA-graph timing failed ({error_message(e)})"
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # the graphs' pool, before the caller's other timing
    return why


class ColdGraph(GpuTimer):
    """Replays over distinct copies of inputs and output, together more than twice the
    L2, so every replayed call starts from a cold cache (as do_bench's flush gives)."""

    name = TIMER_GRAPH

    def copies(self, row: RowCall, cache: InputCache) -> Copies | None:
        count = rotation_of(row.case, row.cfg)
        if count is None or count < 2:
            return None
        return _cached_copies(cache, row, count)

    def ready(self, row: RowCall, dispatch: Dispatch) -> Prepared:
        count = rotation_of(row.case, row.cfg)
        if count is None:
            return self._fallback(row, dispatch,
                                  "L2 size unknown: no rotation can be shown to be cold")
        if row.copies is None and count > 1:
            row.copies = make_copies(row.inputs, row.out, count - 1)
        with row.split.phase("capture"):
            extra = row.calls_on_copies() if count > 1 else []
        got = _graph_ready(row, dispatch.host_us, [row.call, *extra])
        return got if isinstance(got, Prepared) else self._fallback(row, dispatch, got)

    @staticmethod
    def _fallback(row: RowCall, dispatch: Dispatch, why: str) -> Prepared:
        prep = FlushedEvents().ready(row, dispatch)
        return replace(prep, timer=TIMER_GRAPH_FALLBACK,
                       note=f"timed with L2 flushes instead of CUDA graphs: {why}")


class WarmGraph(GpuTimer):
    """Replays of back-to-back calls on one set of buffers (no rotation, sized as the
    cold graph's); without a graph, events around back-to-back calls."""

    name = TIMER_GRAPH

    def ready(self, row: RowCall, dispatch: Dispatch) -> Prepared:
        got = _graph_ready(row, dispatch.host_us, [row.call])
        if isinstance(got, Prepared):
            return got
        prep = WarmEvents().ready(row, dispatch)
        return replace(prep, timer=TIMER_WARM_FALLBACK,
                       note=f"timed back to back without a CUDA graph: {got}")


# ---- CPU -------------------------------------------------------------------------------

@functools.cache
def host_llc_bytes() -> int:
    """The host's last-level cache a cold CPU row's copies rotate past (read once)."""
    return cpu_cache_bytes()


def sweep_cache(cfg: SweepContext) -> InputCache:
    """A sweep's input cache, with the memory its cold CPU rows' copies share: room for
    the largest rotation (twice the last-level cache plus a footprint of at most twice
    it, cpu_rotation), touched only as far as the rows use it."""
    if cfg.target.kind == "cuda" or cfg.check_only:
        return InputCache()
    return InputCache(Scratch(4 * host_llc_bytes() + 2**20))


class CpuBlocks(RowTimer):
    """Blocks of calls on a round's own buffers, in cfg.timing.cpu_rounds rounds (see
    time_cpu_rounds), each round after the first on fresh copies of the inputs.  A cold
    case whose footprint is already past twice the cache runs so too (`note` says it)."""

    name = TIMER_CPU
    rotates = False

    def __init__(self, note: str = "") -> None:
        self.note = note

    def rotated(self, row: RowCall) -> list[Callable[[], object]]:
        """The calls on copies a round's calls cycle through before its own (none here)."""
        return []

    def time(self, row: RowCall) -> tuple[Timing, str]:
        extra = self.rotated(row)
        held: list[Any] = []

        def round_call(r: int) -> Callable[[], object]:
            base = row.call
            if r > 0:
                # New buffers are allocated while the previous round's are still held,
                # so they cannot simply reuse the same addresses.
                ins, o = clone_inputs(row.inputs), torch.empty_like(row.out)
                held[:] = [ins, o]
                base = row.make_call(ins, o)
            # The round's own buffers last: the check (or the clone) just touched them,
            # and the copies before them in the rotation push them out of the cache.
            return Rotation([*extra, base]) if self.rotates else base

        # host_us stays None: on a CPU the call runs synchronously, so its dispatch
        # cannot be told apart from its run time.
        timing = time_cpu_rounds(round_call, row.cfg.timing, row.plan)
        plan_note = row.plan.note if row.plan else ""
        return timing, "; ".join(x for x in (plan_note, self.note) if x)


class CpuRotated(CpuBlocks):
    """Each block's calls cycle over the row's buffers and copies of them that together
    exceed twice the host's last-level cache, so that every call starts cold, as the
    CUDA graphs' rotation does on a GPU.  The copies are views into one block of memory
    the sweep's rows share (benches.sweep.cases.Scratch), the row's values written back into
    it before each of its rounds."""

    name = TIMER_CPU_ROTATED
    rotates = True

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def copies(self, row: RowCall, cache: InputCache) -> Copies | None:
        return _cached_copies(cache, row, self.count, cache.scratch)

    def rotated(self, row: RowCall) -> list[Callable[[], object]]:
        if row.copies is None:
            row.copies = make_copies(row.inputs, row.out, self.count - 1)
        extra = row.calls_on_copies()
        row.copies.ready()  # this row's inputs in memory other rows' rounds may have used
        return extra


def timer_for(case: Case, cfg: SweepContext) -> RowTimer:
    """The one place a row's timing method is chosen: by device, cache mode and (on a GPU)
    the case's roofline bound, or (on a CPU) whether a cold case is cold by size."""
    cold = case.cache == DEFAULT_CACHE
    if cfg.target.kind != "cuda":
        if not cold:
            return CpuBlocks()
        count, note = cpu_rotation(case.spec.nbytes(case.shape, case.dtype), host_llc_bytes())
        return CpuRotated(count) if count is not None else CpuBlocks(note)
    if timing_method(case, cfg) == TIMER_FLUSHED:
        return FlushedEvents() if cold else WarmEvents()
    return ColdGraph() if cold else WarmGraph()
