"""A GPU case timed whole: the checked rows of one (kernel, dtype, shape, cache mode), one
per provider, get their timers ready, then sample in turns (benches/timing/interleave.py)
under the throttle rule (benches/sweep/throttle.py), so that every provider of the case
runs at the same clocks, temperature and power; a compute-bound case first warms the GPU
up to a sustained clock.  Then each row on its own: its kernel-only time (torch.profiler,
in its cache mode), its energy, its metrics.

A provider whose call raises while the case samples fails alone: the case samples again
without it.  A sticky CUDA error aborts the sweep (SweepAborted) after closing every
graph the case captured."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from benches.sweep import kernel_time
from benches.sweep.budget import RowBudget
from benches.sweep.cases import Copies, InputCache, SweepContext, set_timing
from benches.sweep.energy_counter import GpuEnergyMeter
from benches.sweep.gpu_monitor import gpu_monitor
from benches.sweep.row_check import Checked, error_row, plain_call
from benches.sweep.row_energy import RowEnergy
from benches.sweep.throttle import time_unthrottled
from benches.sweep.time_split import RowSplits, TimeSplit
from benches.sweep.timers import GpuTimer, Prepared, RowCall, timer_for, timing_method
from benches.timing import clock
from benches.timing.interleave import Sampler, Sustained, batch_size, sample_case
from benches.timing.plan import TIMER_FLUSHED, TIMER_GRAPH, bound_ms
from contract.record import Clocks, RunRow
from contract.schema import DEFAULT_CACHE, RowKey
from kernels.compiled import compile_mark, recompile_note


def warms_up(item: Checked, cfg: SweepContext) -> bool:
    """Whether the case warms up to a sustained clock before its samples: compute-bound
    and timed by events, at least 20 us a call at the roof (a CUDA-graph case's whole
    sampling lasts about as long as the GPU takes to lower its clock: its providers,
    sampled in turns, share whatever clock it has)."""
    return compute_bound(item, cfg) and timing_method(item.case, cfg) == TIMER_FLUSHED


def compute_bound(item: Checked, cfg: SweepContext) -> bool:
    """Whether the case's roofline bound on the device model is its FLOPs (its clock
    matters most, and a sustained load lowers it) rather than its bytes."""
    case = item.case
    flops = case.spec.flops(case.shape, case.dtype)
    nbytes = case.spec.nbytes(case.shape, case.dtype)
    peak = cfg.ceilings.peak_tflops(case.spec.roof_class(case.dtype, cfg.target))
    compute = bound_ms(flops, 0, peak, None)
    memory = bound_ms(0, nbytes, None, cfg.ceilings.peak_gbps())
    return compute is not None and (memory is None or compute > memory)


@dataclass
class _Ready:
    """A checked row whose timer is ready (`prep`), with its budget."""

    item: Checked
    prep: Prepared
    budget: RowBudget
    compiled: Any  # the provider's compile count before its timer (kernels.compiled)


class _SamplerFailed(Exception):
    """One provider's call raised while the case sampled: which one, and the error."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


def _guarded(index: int, sampler: Sampler) -> Sampler:
    """The sampler, its errors tagged with the provider's place in the case."""
    def take(k: int) -> list[float]:
        try:
            return sampler.take(k)
        except Exception as e:
            raise _SamplerFailed(index, e) from e
    return Sampler(take, sampler.cap, sampler.per_sample_ms, sampler.close)


def time_gpu_case(items: Sequence[Checked], budgets: Sequence[RowBudget], cfg: SweepContext,
                  cache: InputCache, split: TimeSplit, splits: RowSplits,
                  metered: frozenset[RowKey] = frozenset()) -> list[RunRow]:
    """The finished rows of a case's checked rows, in their order (see the module's
    docstring).  `splits` gets each row's own share of the time split; the rows in
    `metered` get an energy window."""
    done: dict[int, RunRow] = {}
    ready: dict[int, _Ready] = {}
    try:
        for i, (item, budget) in enumerate(zip(items, budgets, strict=True)):
            mark = split.mark()
            before = compile_mark(item.case.spec.providers[item.case.provider].compiles)
            got = _prepare(item, cfg, cache, split)
            if isinstance(got, Prepared):
                ready[i] = _Ready(item, got, budget, before)
            else:
                done[i] = got
            splits.add(item.case.key, split.since(mark))
        done.update(_sample_and_finish(ready, cfg, cache, split, splits, metered))
    finally:
        for r in ready.values():
            r.prep.sampler.close()
    return [done[i] for i in range(len(items))]


def _prepare(item: Checked, cfg: SweepContext, cache: InputCache, split: TimeSplit
             ) -> Prepared | RunRow:
    """The row's timer ready to sample (its copies made), or its error row."""
    try:
        timer = timer_for(item.case, cfg)
        assert isinstance(timer, GpuTimer)
        call = RowCall(item.case, cfg, item.inputs, item.out,
                       item.make_call or plain_call(item.case), split=split)
        with split.phase("inputs"):
            copies: Copies | None = timer.copies(call, cache)
        call.copies = copies
        with split.phase("timing"):
            return timer.prepare(call)
    except Exception as e:
        return error_row(item.row, e, item.case, cfg, cache, " while timing")


def _sample_and_finish(ready: dict[int, _Ready], cfg: SweepContext, cache: InputCache,
                       split: TimeSplit, splits: RowSplits, metered: frozenset[RowKey]
                       ) -> dict[int, RunRow]:
    """Sample the ready rows together (again without a provider that raised), then finish
    each: {its place: its row}."""
    done: dict[int, RunRow] = {}
    monitor = gpu_monitor()
    while ready:
        order = list(ready)
        mark = split.mark()
        try:
            with split.phase("timing"):
                timed, sustained = _sample(
                    [ready[i] for i in order], cfg, monitor,
                    warms_up(ready[order[0]].item, cfg))
        except _SamplerFailed as f:
            bad = ready.pop(order[f.index])
            bad.prep.sampler.close()
            done[order[f.index]] = error_row(bad.item.row, f.error, bad.item.case, cfg,
                                             cache, " while timing")
            continue
        _share(split.since(mark), [ready[i] for i in order], timed, splits)
        for i, (timing, note, clocks) in zip(order, timed, strict=True):
            mark = split.mark()
            done[i] = _finish(ready[i], timing, "; ".join(
                x for x in (note, sustained.note()) if x), clocks, cfg, cache, split,
                ready[i].item.case.key in metered)
            splits.add(ready[i].item.case.key, split.since(mark))
        break
    return done


def _sample(rows: list[_Ready], cfg: SweepContext, monitor: Any, compute: bool
            ) -> tuple[list[tuple[Any, str, Clocks]], Sustained]:
    """The rows' timings (timing, note, Clocks) from samples taken in turns, under
    the throttle rule where the run has an NVML monitor, and what the warm-up did."""
    samplers = [_guarded(i, r.prep.sampler) for i, r in enumerate(rows)]
    warmed: list[Sustained] = []

    # Windows on the monitor's own time base, which its readings carry.
    now = getattr(monitor, "clock", time.monotonic)

    def time_fn() -> list[tuple[Any, str]]:
        got, sustained = sample_case(samplers, cfg.timing, monitor, compute, now)
        warmed[:] = [sustained]
        return [(r.prep.timing(g), r.prep.note) for r, g in zip(rows, got, strict=True)]

    if monitor is None:
        return [(t, n, Clocks()) for t, n in time_fn()], warmed[0]
    return time_unthrottled(time_fn, monitor, cfg.throttle, sustained=compute), warmed[0]


def _share(seconds: dict[str, float], rows: list[_Ready],
           timed: list[tuple[Any, str, Clocks]], splits: RowSplits) -> None:
    """The case's shared sampling time split among its rows by their samples' time."""
    spent = [sum(t.samples_ms) for t, _, _ in timed]
    total = sum(spent)
    for r, s in zip(rows, spent, strict=True):
        splits.add(r.item.case.key, seconds, s / total if total > 0 else 1 / len(rows))


def _finish(r: _Ready, timing: Any, note: str, clocks: Clocks, cfg: SweepContext,
            cache: InputCache, split: TimeSplit, metered: bool) -> RunRow:
    """One row after the case's samples, each stage its own group: its timing and
    metrics, its clocks (`clocks`, from the samples), its kernel profile (in its cache
    mode), its energy (`metered`: in a window of its own, _energy)."""
    item = r.item
    compiles = item.case.spec.providers[item.case.provider].compiles
    try:
        flush: Callable[[], object] | None = clock.flush_buffer().zero_ \
            if item.case.cache == DEFAULT_CACHE else None
        with split.phase("profile"):
            profile, knote = kernel_time.row_profile(item.call, r.budget.call_s,
                                                     item.case.provider, flush)
        with split.phase("energy"):
            spent = _energy(r, cfg, timing.ms_median) if metered else None
    except Exception as e:
        return error_row(item.row, e, item.case, cfg, cache, " while timing")
    row = set_timing(item.row, item.case, cfg, timing, "; ".join(
        x for x in (note, knote, item.ran, recompile_note(compiles, r.compiled),
                    spent.note if spent is not None else "") if x))
    row = replace(row, clocks=clocks, profile=profile)
    if spent is not None:
        row = replace(row, energy=spent.group(row.timing.ms_median,
                                              float(row.accounting.flops or 0),
                                              float(row.accounting.bytes or 0)))
    return row


@functools.lru_cache(maxsize=2)
def energy_meter(monitor: Any) -> GpuEnergyMeter:
    """The run's energy meter (one per NVML monitor: it keeps the run's step spreads)."""
    return GpuEnergyMeter(monitor.pynvml, monitor.handle)


def _energy(r: _Ready, cfg: SweepContext, call_ms: float) -> RowEnergy | None:
    """The row's energy over a replay of its call long enough for NVML's energy counter;
    None without NVML (metadata.energy says why).  The replay is the row's call without
    its timer's flush and padding, which would stand in the window beside it (a 256 MB
    flush and a spin as long as the call itself at the shapes that get a window): a
    CUDA-graph row replays its graphs (their rotation keeps it cold), an events row its
    call back to back (cold by size, or nearly so, at the shapes past the graph timer's
    bound)."""
    monitor = gpu_monitor()
    if monitor is None:
        return None
    now = getattr(monitor, "clock", time.monotonic)
    if r.prep.timer == TIMER_GRAPH:
        sampler = r.prep.sampler

        def batch() -> None:
            sampler.take(batch_size(sampler, 0, cfg.timing) or 1)
    else:
        call, k = r.item.call, max(1, round(cfg.timing.interleave_ms / max(call_ms, 1e-3)))

        def batch() -> None:
            for _ in range(k):
                call()
            torch.cuda.synchronize()

    def run_for(seconds: float) -> None:
        end = now() + seconds
        while now() < end:
            batch()

    return energy_meter(monitor).measure(run_for)
