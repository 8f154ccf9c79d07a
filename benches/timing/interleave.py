"""The providers of one case timed side by side: rounds of short sample batches A, B, C,
A, B, C, ... so that each provider sees the same clocks, temperature and power.

A GPU holding its power limit lowers its SM clock within tens of milliseconds of
sustained compute-bound work.  Timed one after the other, the first provider of a case
takes its samples at the boost clock and the next one throttled, and their ratio
measures the clock as much as the code (docs/measurement.md, "Providers at equal
clocks").  Here:

1. every provider's timer is prepared first (its estimate, warm-up, CUDA-graph capture:
   a `Sampler`, which only takes samples);
2. a compute-bound case warms up to a sustained clock (`sustain`): rounds of batches,
   discarded, until the SM clock's median over successive rounds has stopped falling,
   within a cap;
3. then rounds of batches of about TimingConfig.interleave_ms each (`interleave`), until
   every provider's samples meet the stopping rule (benches/timing/stopping.py) or reach
   their time cap: the rule judges the case, never a provider alone, and never before
   the clock has settled.

Each batch keeps its own window (time.monotonic() at its first launch and at its
synchronize), so a row's clock is that of its own samples (benches/sweep/sample_clocks.py).
Plain control flow over `Sampler.take`: nothing here touches CUDA or NVML, so a
stand-in device can drive it (tests/test_interleave.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from benches.timing.plan import TimingConfig
from benches.timing.stopping import STOP_CAP, STOP_NOISE, settled


def _nothing() -> None:
    return None


@dataclass
class Sampler:
    """One row's prepared timer: `take(k)` runs k more samples and returns their times in
    ms once they are done (one synchronize at the end); at most `cap` samples in all
    (its time cap); `per_sample_ms`, the time of one sample (flush and padding included),
    sizes its batches.  `close()` frees what the samples needed (a CUDA graph's pool)."""

    take: Callable[[int], list[float]]
    cap: int
    per_sample_ms: float
    close: Callable[[], None] = _nothing


@dataclass(frozen=True)
class Batch:
    """A batch of one row's samples: its window in time.monotonic() seconds (the first
    launch to the synchronize after the last) and how many samples it took."""

    start: float
    end: float
    count: int


@dataclass
class RowSamples:
    """What one provider's samples came to: the samples in the order taken, their
    batches, and why they stopped (STOP_NOISE, STOP_CAP)."""

    samples: list[float] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    stopped: str = ""

    @property
    def span(self) -> tuple[float, float] | None:
        return (self.batches[0].start, self.batches[-1].end) if self.batches else None


class ClockWatch(Protocol):
    """The SM clock the GPU ran at: the median MHz of the busy readings in a window
    (None when none was taken there or the clock cannot be read)."""

    def clock_between(self, start: float, end: float) -> float | None: ...


@dataclass(frozen=True)
class Sustained:
    """What the warm-up to a sustained clock did: how long it ran (ms of wall time),
    the median clock of each of its rounds, and whether the clock settled (False: its
    cap stopped it, or no clock could be read and it warmed for its minimum only)."""

    ms: float = 0.0
    clocks: tuple[float | None, ...] = ()
    settled: bool = True

    def note(self) -> str:
        """The rows' reason text for a warm-up that did not settle ("" when it did or
        none ran)."""
        if self.settled or not self.ms:
            return ""
        known = [c for c in self.clocks if c is not None]
        if not known:
            return (f"warmed {self.ms:.0f} ms before sampling with no SM clock to read: "
                    "whether the clock had settled is unknown")
        return (f"SM clock still falling after {self.ms:.0f} ms of warm-up "
                f"({known[0]:.0f} -> {known[-1]:.0f} MHz): sampled at its cap")


def batch_size(sampler: Sampler, taken: int, cfg: TimingConfig) -> int:
    """Samples in the next batch of `sampler`: about cfg.interleave_ms of device time, at
    least one, no more than its cap leaves."""
    want = max(1, round(cfg.interleave_ms / max(sampler.per_sample_ms, 1e-6)))
    return max(0, min(want, sampler.cap - taken))


def _round(samplers: Sequence[Sampler], sizes: Sequence[int],
           now: Callable[[], float]) -> list[tuple[Batch, list[float]]]:
    """One batch of each sampler in turn (a size of 0 skips it)."""
    out = []
    for s, k in zip(samplers, sizes, strict=True):
        if k <= 0:
            out.append((Batch(now(), now(), 0), []))
            continue
        t0 = now()
        got = s.take(k)
        out.append((Batch(t0, now(), len(got)), got))
    return out


def sustain(samplers: Sequence[Sampler], cfg: TimingConfig, watch: ClockWatch | None,
            now: Callable[[], float] = time.monotonic) -> Sustained:
    """Warm a compute-bound case's GPU up to a sustained clock before any sample counts:
    rounds of one batch per provider (discarded) until the median SM clock of each of
    the last cfg.sustain_still rounds is within cfg.sustain_drop of the round before,
    and either the clock has come down (from its first round's, or below the GPU's
    maximum, `watch.max_sm_clock_mhz` where it has one) or it has held for
    cfg.sustain_min_ms (a clock flat at its boost for that long is not being lowered);
    at most cfg.sustain_cap_ms.  Without a clock to read (`watch` None, or no
    reading in any round) it warms for cfg.sustain_min_ms and says it could not tell."""
    if not samplers or cfg.sustain_cap_ms <= 0:
        return Sustained()
    start = now()
    clocks: list[float | None] = []
    while True:
        sizes = [batch_size(s, 0, cfg) or 1 for s in samplers]
        batches = _round(samplers, sizes, now)
        elapsed_ms = (now() - start) * 1e3
        t0, t1 = batches[0][0].start, batches[-1][0].end
        clocks.append(watch.clock_between(t0, t1) if watch is not None else None)
        if _clock_settled(clocks, elapsed_ms, cfg, getattr(watch, "max_sm_clock_mhz", None)):
            return Sustained(elapsed_ms, tuple(clocks), True)
        if elapsed_ms >= cfg.sustain_cap_ms or (
                elapsed_ms >= cfg.sustain_min_ms and all(c is None for c in clocks)):
            return Sustained(elapsed_ms, tuple(clocks), False)


def _clock_settled(clocks: list[float | None], elapsed_ms: float,
                   cfg: TimingConfig, max_mhz: float | None = None) -> bool:
    """Whether the warm-up may stop (see sustain): the last cfg.sustain_still round
    medians each within cfg.sustain_drop of the one before, and the clock already down
    (from its first reading, or below the GPU's maximum `max_mhz`: a case before this one
    lowered it) or held for cfg.sustain_min_ms."""
    known = [c for c in clocks if c is not None]
    tail = clocks[-(cfg.sustain_still + 1):]
    if len(tail) < cfg.sustain_still + 1 or any(c is None for c in tail):
        return False
    steady = all(b >= a * (1 - cfg.sustain_drop)  # type: ignore[operator]
                 for a, b in zip(tail, tail[1:], strict=False))
    came_down = known[-1] < max(known[0], max_mhz or 0.0) * (1 - cfg.sustain_drop)
    return steady and (came_down or elapsed_ms >= cfg.sustain_min_ms)


def interleave(samplers: Sequence[Sampler], cfg: TimingConfig,
               now: Callable[[], float] = time.monotonic) -> list[RowSamples]:
    """Rounds of one batch per provider (batch_size: about cfg.interleave_ms each) until
    the case is judged: every provider's samples meet the stopping rule (the median's
    interval within cfg.ci_rel_width, at least the gate's minimum) or every one that
    does not has reached its cap.  A provider that settled early keeps sampling with
    the others, so that every provider's samples span the same stretch of the GPU's
    state.  cfg.ci_rel_width 0 turns the rule off: each provider takes its cap."""
    rows = [RowSamples() for _ in samplers]
    floor = min(cfg.gate_min_samples, cfg.min_samples)

    def done(r: RowSamples, s: Sampler) -> bool:
        return cfg.ci_rel_width > 0 and settled(r.samples, cfg.ci_rel_width,
                                                cfg.ci_level, floor)

    while True:
        sizes = [batch_size(s, len(r.samples), cfg) for s, r in zip(samplers, rows,
                                                                    strict=True)]
        if not any(sizes):
            break
        for r, (batch, got) in zip(rows, _round(samplers, sizes, now), strict=True):
            if batch.count:
                r.samples += got
                r.batches.append(batch)
        if all(done(r, s) or len(r.samples) >= s.cap for r, s in zip(rows, samplers,
                                                                     strict=True)):
            break
    for r, s in zip(rows, samplers, strict=True):
        r.stopped = STOP_NOISE if done(r, s) else STOP_CAP
    return rows


def sample_case(samplers: Sequence[Sampler], cfg: TimingConfig,
                watch: ClockWatch | None, compute_bound: bool,
                now: Callable[[], float] = time.monotonic
                ) -> tuple[list[RowSamples], Sustained]:
    """A case's samples, one RowSamples per sampler in order: a compute-bound case warmed
    up to a sustained clock first (sustain), then interleaved rounds (interleave)."""
    warmed = sustain(samplers, cfg, watch, now) if compute_bound else Sustained()
    return interleave(samplers, cfg, now), warmed


def median_clock(clocks: Sequence[float | None]) -> float | None:
    """The median of the known clocks (None when none is known)."""
    known = [c for c in clocks if c is not None]
    return float(statistics.median(known)) if known else None
