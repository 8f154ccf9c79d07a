"""The SM clock of each timed sample, and nvbench's throttle rule applied per sample.

nvbench measures the clock over each trial and throws away the trials below its
threshold, not the whole measurement.  Here a GPU row's samples are enqueued ahead of the
GPU and read back after one synchronize, so a sample's clock is not read while it runs:
it is the NVML reading nearest in time to the sample's estimated midpoint.  The samples
are laid over the timing's span (Timing.span: the start and end of its sampling, the end
at the synchronize) in proportion to their durations; the CUDA-graph timers' spans are
their samples' own, the event timers' also hold do_bench's short estimate and warm-up at
the start, so there a sample's place is early by at most that share (docs/measurement.md).
The monitor reads the clock every GpuMonitor.fast_interval_s during a timing, so a
sample's nearest reading is at most a few such intervals away.

Pure functions, no NVML: benches/sweep/gpu_monitor.py calls `keep_unthrottled` from
time_unthrottled with a timing window's busy readings.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from benches.timing.clock import Timing, summarize

# A sample's reading must be this close to its estimated midpoint (s), else its clock is
# unknown and the sample is kept (a lone reading far away says nothing about it).
MAX_DISTANCE_S = 0.05
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
                      readings: list[dict[str, Any]]) -> list[float | None]:
    """Each sample's SM clock (MHz): that of the busy reading nearest its midpoint, None
    where none is within MAX_DISTANCE_S."""
    timed = sorted((float(r["t"]), float(r["sm_clock_mhz"])) for r in readings
                   if isinstance(r.get("sm_clock_mhz"), int | float)
                   and isinstance(r.get("t"), int | float))
    clocks: list[float | None] = []
    for m in sample_midpoints(samples_ms, span):
        best = min(timed, key=lambda tc: abs(tc[0] - m), default=None)
        clocks.append(best[1] if best is not None and abs(best[0] - m) <= MAX_DISTANCE_S
                      else None)
    return clocks


def keep_unthrottled(timing: Any, readings: list[dict[str, Any]],
                     threshold_mhz: float) -> tuple[Timing, int, float | None] | None:
    """The timing without its samples whose clock sat below `threshold_mhz` (nvbench's
    rule, per sample), as (timing, samples left out, median clock of those kept); None
    when it cannot be applied (no span, no sample with a known clock) or too few samples
    would be left (MIN_KEPT_SHARE, MIN_KEPT): the caller then judges the whole timing."""
    span = getattr(timing, "span", None)
    samples = list(getattr(timing, "samples_ms", ()) or ())
    if not isinstance(timing, Timing) or span is None or not samples:
        return None
    clocks = per_sample_clocks(samples, span, readings)
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
