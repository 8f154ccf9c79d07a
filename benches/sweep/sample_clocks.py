"""The SM clock of each timed sample, and nvbench's throttle rule applied per sample.

nvbench measures the clock over each trial and throws away the trials below its
threshold, not the whole measurement.  Here a GPU row's samples are enqueued ahead of the
GPU and read back after one synchronize, so a sample's clock is not read while it runs:
it is the NVML reading nearest in time to the sample's estimated midpoint.  A row timed
with the other providers of its case (benches/timing/interleave.py) took its samples in
batches, each with its own window (Timing.batches: the first launch to the synchronize):
a batch's samples are laid over its window in proportion to their durations, and only
readings inside that window (BATCH_SLACK_S either side) can give their clock, never one
taken while another provider ran.  A timing without batches is one window, its span.
The monitor reads the clock every GpuMonitor.fast_interval_s during a timing, so a
sample's nearest reading is at most a few such intervals away.

Pure functions, no NVML: benches/sweep/gpu_monitor.py calls `keep_unthrottled` from
time_unthrottled with a timing window's busy readings.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from benches.sweep.gpu_monitor import Reading
from benches.timing.clock import Timing, summarize
from benches.timing.interleave import Batch

# A sample's reading must be this close to its estimated midpoint (s), else its clock is
# unknown and the sample is kept (a lone reading far away says nothing about it).
MAX_DISTANCE_S = 0.05
# How far outside its batch's window a reading may be and still give a batch's sample
# its clock: about the monitor's fast interval, a fraction of a batch of another provider.
BATCH_SLACK_S = 0.003
# Samples that must remain, as a share of all and as a count (the gate's minimum), for a
# timing to be kept with its slow samples left out; fewer, and it is timed again whole.
MIN_KEPT_SHARE = 0.5
MIN_KEPT = 10


def sample_midpoints(samples_ms: list[float], span: tuple[float, float]) -> list[float]:
    """Estimated time.monotonic() of each sample's midpoint: the samples laid end to end
    over `span` in proportion to their durations."""
    total = sum(samples_ms)
    t0, t1 = span
    if not samples_ms:
        return []
    if total <= 0:
        return [t0 + (t1 - t0) * (i + 0.5) / len(samples_ms) for i in range(len(samples_ms))]
    out, done = [], 0.0
    for s in samples_ms:
        out.append(t0 + (t1 - t0) * (done + s / 2) / total)
        done += s
    return out


def per_sample_clocks(samples_ms: list[float], span: tuple[float, float],
                      readings: list[Reading]) -> list[float | None]:
    """Each sample's SM clock (MHz): that of the busy reading nearest its midpoint, None
    where none is within MAX_DISTANCE_S."""
    timed = _timed_clocks(readings)
    clocks: list[float | None] = []
    for m in sample_midpoints(samples_ms, span):
        best = min(timed, key=lambda tc: abs(tc[0] - m), default=None)
        clocks.append(best[1] if best is not None and abs(best[0] - m) <= MAX_DISTANCE_S
                      else None)
    return clocks


def _timed_clocks(readings: list[Reading]) -> list[tuple[float, float]]:
    return sorted((float(r.t), float(r.clock)) for r in readings
                  if r.clock is not None and isinstance(r.t, int | float))


def batch_sample_clocks(samples_ms: list[float], batches: Sequence[Batch],
                        readings: list[Reading],
                        slack_s: float = BATCH_SLACK_S) -> list[float | None]:
    """Each sample's SM clock when the samples came in `batches` (in order, their counts
    adding up to the samples): the reading nearest the sample's midpoint among those
    inside its own batch's window widened by `slack_s`, None where there is none."""
    timed = _timed_clocks(readings)
    clocks: list[float | None] = []
    at = 0
    for b in batches:
        mine = samples_ms[at:at + b.count]
        at += b.count
        near = [tc for tc in timed if b.start - slack_s <= tc[0] <= b.end + slack_s]
        for m in sample_midpoints(mine, (b.start, b.end)):
            best = min(near, key=lambda tc: abs(tc[0] - m), default=None)  # noqa: B023
            clocks.append(best[1] if best is not None else None)
    return clocks + [None] * (len(samples_ms) - len(clocks))


def sample_clocks(timing: Timing, readings: list[Reading]) -> list[float | None]:
    """Each of a timing's samples' SM clock: by its batches where it has them, else laid
    over its span (None for every sample of a timing with neither)."""
    samples = list(timing.samples_ms)
    if timing.batches:
        return batch_sample_clocks(samples, timing.batches, readings)
    if timing.span is None:
        return [None] * len(samples)
    return per_sample_clocks(samples, timing.span, readings)


def keep_unthrottled(timing: Any, readings: list[Reading],
                     threshold_mhz: float) -> tuple[Timing, int, float | None] | None:
    """The timing without its samples whose clock sat below `threshold_mhz` (nvbench's
    rule, per sample), as (timing, samples left out, median clock of those kept); None
    when it cannot be applied (no span, no sample with a known clock) or too few samples
    would be left (MIN_KEPT_SHARE, MIN_KEPT): the caller then judges the whole timing."""
    samples = list(getattr(timing, "samples_ms", ()) or ())
    if not isinstance(timing, Timing) or not samples or \
            (timing.span is None and not timing.batches):
        return None
    clocks = sample_clocks(timing, readings)
    if all(c is None for c in clocks):
        return None
    kept = [s for s, c in zip(samples, clocks, strict=True)
            if c is None or c >= threshold_mhz]
    dropped = len(samples) - len(kept)
    if len(kept) < max(MIN_KEPT, MIN_KEPT_SHARE * len(samples)) and dropped:
        return None
    known = [c for c in clocks if c is not None and c >= threshold_mhz]
    median = float(statistics.median(known)) if known else None
    if not dropped:
        return timing, 0, median
    s = summarize(kept, timing.timer)
    return (replace(timing, ms_median=s.ms_median, ms_p20=s.ms_p20, ms_p80=s.ms_p80,
                    n_samples=s.n_samples, samples_ms=s.samples_ms), dropped, median)
