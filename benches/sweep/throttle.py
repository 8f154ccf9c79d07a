"""Throttle handling of a GPU case's timing (nvbench's --throttle-threshold and
--throttle-recovery-delay): the providers of a case are timed together
(benches/timing/interleave.py), each row's samples below the threshold clock are left out
(benches/sweep/sample_clocks.py), and a case where a row stays throttled is timed again
after a pause; a row still throttled then is kept and marked.  Each row's clock is the
median clock of its own samples."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypedDict

from benches.sweep.gpu_monitor import (
    SLOWDOWN_MASK,
    SLOWDOWN_REASONS,
    ClockWindow,
    MonitorSummary,
    Reading,
    window_of,
)
from benches.sweep.nvml_doc import NvmlFacts
from benches.sweep.sample_clocks import BATCH_SLACK_S, keep_unthrottled, sample_clocks
from benches.timing.clock import Timing
from contract.meta_parts import ClocksFacts, PowerFacts, ThrottleFacts
from contract.record import Clocks, RunRow

# The rule, as nvbench's: a timing is throttled when the SM clock it ran at sat below
# threshold_pct of the GPU's maximum SM clock, and only then.  nvbench times the clock
# over each trial (nvbench/detail/gpu_frequency.cxx, has_throttled: the measured rate
# below threshold x cudaDevAttrClockRate, default 75%) and reads no clock-event reasons.
# Here the clock is NVML's SM clock of each sample (the busy readings inside the row's
# own batches of its case's window: GpuMonitor.busy_between).  The reasons NVML gives are
# reported beside the clock (the row's reason, the run's summary), never judged alone:
# - sw_power_cap is the GPU holding its power limit, the normal state of a sustained
#   GEMM at TDP (an H100 SXM at 700 W reports it routinely): what it costs shows in the
#   clock, and above the threshold it is the speed the GPU has, not a throttled timing
#   (counting the bit alone re-timed and marked the big bf16/fp8 matmuls, failing the
#   gate).
# - hw_slowdown, hw_thermal and hw_power_brake cut the clock "by a factor of 2 or more"
#   (nvml.h), so a sustained one puts the clock under any threshold above 50%; NVML also
#   reports hw_slowdown "during PState or clock change", which a window opening on a GPU
#   coming out of idle contains.  With the clock above the threshold they are reported,
#   not counted.  sw_thermal lowers the clock in steps: the same rule holds.

@dataclass(frozen=True)
class ThrottleConfig:
    """When a GPU timing counts as throttled, and what is done about it.

    As nvbench does (its --throttle-threshold, default 75%, and
    --throttle-recovery-delay, default 0.05 s): a timing during which the median SM clock
    of the busy GPU sat below `threshold_pct` of the GPU's maximum SM clock is taken
    again after `recovery_delay_s`, up to `retries` times; if the last one is throttled
    too, the row keeps it and is marked (`throttled`), so the regression gate can tell a
    hot or power-starved GPU from slower code.  Clock-event reasons are reported, not
    judged (see the rule above)."""

    threshold_pct: float = 75.0
    recovery_delay_s: float = 0.05
    retries: int = 3

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _reasons_text(window: ClockWindow) -> str:
    names = window.throttle_reasons
    return f"clock-event reasons {', '.join(names)}" if names else ""


def throttle_state(window: ClockWindow, max_sm_clock_mhz: float | None,
                   cfg: ThrottleConfig) -> str | None:
    """Why a timing window counts as throttled (its SM clock below the threshold, with
    the reasons NVML gave), or None when it does not or cannot be told (no busy reading,
    no known maximum)."""
    clock = window.sm_clock_mhz
    if not (isinstance(clock, int | float) and max_sm_clock_mhz and
            clock < cfg.threshold_pct / 100.0 * max_sm_clock_mhz):
        return None
    why = (f"SM clock {clock:.0f} MHz, below {cfg.threshold_pct:g}% of its "
           f"{max_sm_clock_mhz:.0f} MHz maximum")
    reasons = _reasons_text(window)
    return f"{why}; {reasons}" if reasons else why


def _windows(timing: Any, t0: float, t1: float) -> list[tuple[float, float]]:
    """The windows a timing's samples ran in: its batches (widened by BATCH_SLACK_S), else
    its span, else the whole call [t0, t1]."""
    batches = getattr(timing, "batches", ())
    if batches:
        return [(b.start - BATCH_SLACK_S, b.end + BATCH_SLACK_S) for b in batches]
    span = getattr(timing, "span", None)
    if isinstance(span, tuple) and len(span) == 2 and \
            all(isinstance(x, int | float) for x in span) and span[0] <= span[1]:
        return [(float(span[0]), float(span[1]))]
    return [(t0, t1)]


def row_readings(monitor: Any, timing: Any, t0: float, t1: float) -> list[Reading]:
    """The monitor's busy readings inside a timing's own windows (_windows), oldest
    first, each once."""
    seen: dict[int, Reading] = {}
    for a, b in _windows(timing, t0, t1):
        for r in monitor.busy_between(a, b):
            seen[id(r)] = r
    return sorted(seen.values(), key=lambda r: r.t)


@dataclass
class RowVerdict:
    """One row's timing after the throttle rule: the timing (its slow samples left out),
    its clock window, why it counts as throttled (None: it does not), how many samples
    were left out (None: the rule per sample could not be applied)."""

    timing: Any
    window: ClockWindow
    why: str | None
    dropped: int | None


def power_capped(readings: list[Reading], threshold_mhz: float) -> bool:
    """Whether every reading under the threshold clock names the power cap as its only
    power/thermal reason (sw_power_cap: the GPU holding its limit), and one does."""
    low = [r for r in readings if r.clock is not None and r.clock < threshold_mhz]
    return bool(low) and all(
        r.reasons is not None
        and r.reasons & SLOWDOWN_MASK == SLOWDOWN_REASONS["sw_power_cap"]
        for r in low)


def judge(timing: Any, readings: list[Reading], max_clock: float | None,
          cfg: ThrottleConfig, sustained: bool = False) -> RowVerdict:
    """nvbench's rule on one row: per sample where each sample's clock is known (the slow
    ones left out, the row throttled only when too few would be left), else over the
    row's window; the row's clock the median of its kept samples' clocks.

    `sustained`: the case was warmed up to its sustained clock (a compute-bound case):
    there a clock lowered by the power cap alone is the speed the GPU sustains under its
    limit, the speed a long GEMM has, so no sample is left out for it and the row is not
    throttled (a thermal or hardware slowdown still is)."""
    window = window_of(readings)
    if sustained and max_clock and power_capped(readings, cfg.threshold_pct / 100 * max_clock):
        known = [c for c in sample_clocks(timing, readings) if c is not None] \
            if isinstance(timing, Timing) else []
        clock = float(statistics.median(known)) if known else window.sm_clock_mhz
        return RowVerdict(timing, replace(window, sm_clock_mhz=clock, power_capped=True),
                          None, None)
    kept = keep_unthrottled(timing, readings, cfg.threshold_pct / 100 * max_clock) \
        if max_clock and readings else None
    if kept is not None:
        timing, dropped, clock = kept
        return RowVerdict(timing, replace(window, sm_clock_mhz=clock or window.sm_clock_mhz),
                          None, dropped)
    if isinstance(timing, Timing) and readings:
        # The median clock of its own samples (each sample once), not of the readings.
        known = [c for c in sample_clocks(timing, readings) if c is not None]
        if known:
            window = replace(window, sm_clock_mhz=float(statistics.median(known)))
    return RowVerdict(timing, window, throttle_state(window, max_clock, cfg), None)


def time_unthrottled(time_fn: Callable[[], list[tuple[Any, str]]], monitor: Any,
                     cfg: ThrottleConfig, sleep: Callable[[float], None] = time.sleep,
                     sustained: bool = False) -> list[tuple[Any, str, Clocks]]:
    """The rows of one case timed by `time_fn` (each (timing, note)), under the
    monitor's readings, and the whole case timed again after a pause while any row is
    throttled (ThrottleConfig): its providers share the GPU's state, so they are timed
    again together.  Each row's window is its own samples' (row_readings).  Gives per
    row (timing, note, its Clocks group): its clock, whether it was throttled, the
    samples left out; the note says what was done and which clock-event reasons NVML gave."""
    max_clock = getattr(monitor, "max_sm_clock_mhz", None)
    fast = getattr(monitor, "fast", contextlib.nullcontext)
    now = getattr(monitor, "clock", time.monotonic)  # the readings' time base
    attempt = 0
    while True:
        t0 = now()
        with fast():
            got = time_fn()
        t1 = now()
        monitor.window(t0, t1)  # the case's readings, booked for the run's summary
        # A row too short for a reading of its own gets the one taken right after the
        # case (the window's last): the GPU as the samples left it.
        after = (getattr(monitor, "last_busy", None) or [])[-1:]
        verdicts = [judge(t, row_readings(monitor, t, t0, t1) or after, max_clock, cfg,
                          sustained) for t, _ in got]
        if all(v.why is None for v in verdicts) or attempt >= cfg.retries:
            break
        attempt += 1
        sleep(cfg.recovery_delay_s)
    return [(v.timing, _said(note, v, attempt, max_clock, cfg), _clocks(v))
            for (_, note), v in zip(got, verdicts, strict=True)]


def _clocks(v: RowVerdict) -> Clocks:
    return Clocks(sm_clock_mhz=v.window.sm_clock_mhz, throttled=v.why is not None,
                  throttled_samples=v.dropped)


def _said(note: str, v: RowVerdict, attempt: int, max_clock: float | None,
          cfg: ThrottleConfig) -> str:
    """The row's note: what the throttle rule did, and the reasons NVML gave."""
    if v.why is not None:
        said = f"GPU throttled in all {attempt + 1} timings ({v.why}): kept and marked"
    elif attempt:
        said = f"timed again {attempt}x after the GPU throttled"
    else:
        said = ""
    if v.dropped:
        said = "; ".join(x for x in (said, (
            f"{v.dropped} of {v.dropped + v.timing.n_samples} samples left out: SM clock "
            f"below {cfg.threshold_pct:g}% of {max_clock:.0f} MHz")) if x)
    reasons = _reasons_text(v.window)
    clock = v.window.sm_clock_mhz
    if v.window.power_capped and isinstance(clock, int | float):
        return "; ".join(x for x in (note, said, (
            f"SM clock {clock:.0f} MHz under the power cap alone (sw_power_cap), below "
            f"{cfg.threshold_pct:g}% of {max_clock:.0f} MHz: the case's sustained speed, "
            "not throttled")) if x)
    if reasons and v.why is None and isinstance(clock, int | float):
        # Reported beside the clock, as the row's verdict rests on the clock alone.
        above = (f", above {cfg.threshold_pct:g}% of {max_clock:.0f} MHz: not throttled"
                 if max_clock else "")
        said = "; ".join(x for x in (said, f"{reasons} at SM clock {clock:.0f} MHz{above}")
                         if x)
    return "; ".join(x for x in (note, said) if x)


class ClockFacts(TypedDict):
    """The run's metadata keys `clocks`, `power` and `throttle` (JSON documents
    summary.md reads)."""

    clocks: ClocksFacts
    power: PowerFacts
    throttle: ThrottleFacts


def run_clock_facts(during: MonitorSummary | None, at: NvmlFacts,
                    rows: Sequence[RunRow], cfg: ThrottleConfig) -> ClockFacts:
    """The run's metadata keys `clocks`, `power` and `throttle` (what summary.md shows):
    from the sampler's summary over the run (`during`), the facts of the NVML snapshot
    at its start (`at`), and the rows' own `throttled` marks."""
    throttled = [r for r in rows if r.clocks.throttled is True]
    return {
        "clocks": {
            "sm_mhz_min": during.sm_clock_mhz_min if during else None,
            "sm_mhz_median": during.sm_clock_mhz_median if during else None,
            "sm_mhz_max": during.sm_clock_mhz_max if during else None,
            "sm_mhz_max_possible": at.max_sm_clock_mhz,
            "mem_mhz": at.mem_clock_mhz,
        },
        "power": {"max_w": during.power_w_max if during else None,
                  "limit_w": at.power_limit_w},
        "throttle": {
            "threshold_pct": cfg.threshold_pct, "recovery_delay_s": cfg.recovery_delay_s,
            "retries": cfg.retries,
            "readings": during.readings if during else None,
            "readings_idle_left_out": during.readings_idle if during else None,
            "throttled_fraction_of_readings": during.throttled_fraction if during else None,
            "reasons_seen": list(during.throttle_reasons_seen) if during else [],
            "throttled_rows": len(throttled),
        },
    }
