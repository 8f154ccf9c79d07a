"""A GPU row's mean power from NVML's total energy counter
(nvmlDeviceGetTotalEnergyConsumption, mJ since the driver loaded), read over a window
long enough for the counter.

The counter does not move smoothly: it changes in steps, every few tens of ms (the
period differs by GPU and driver), so its rise over a row's timing of a few tens of ms
is zero or a whole step over a short span (docs/measurement.md, "Energy").  Here:

1. `probe_counter` reads the counter in a tight loop for at most PROBE_BUDGET_S at the
   start of a GPU run: the period between its changes, the size of a step, whether it
   only rises, and what one read costs (the run's metadata keeps it).
2. `plan_window` sizes a row's window from that period and the precision asked for.
3. `GpuEnergyMeter.measure(run_for)` has the runner replay the row's timed loop for that
   long while a thread of its own reads the counter densely, and takes the energy
   between the first and the last change inside the window over the time between those
   two changes (`fit_edges`): the window's ends, which fall anywhere within a step, do
   not count.  A row's power is empty, with the reason, where no window can be long
   enough, the counter did not move, its steps vary too much for the precision, or the
   power falls outside its bounds (benches.sweep.row_energy.power_bounds_reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scipy.special import stdtrit

from benches.sweep import row_energy as energy
from benches.sweep.gpu_monitor import load_pynvml, nvml_handle
from benches.sweep.row_energy import (
    POWER_LIMIT_SLACK,
    RAPL_ROOT,
    Rapl,
    RowEnergy,
    power_bounds_reason,
)
from contract import meta_parts

METHOD = "nvml counter edges"
# The probe's bound: long enough to see two changes of a counter stepping every 100 ms
# or faster, short enough to cost nothing at a run's start.
PROBE_BUDGET_S = 0.35
PROBE_CHANGES = 8  # the probe stops once it has seen this many changes
# The target: a row's mean power within PRECISION of the true mean, half of it for the
# timing of the two edges, half for the spread of the counter's steps.
PRECISION = 0.05
MIN_STEPS = 3  # a row's window spans this many whole counter periods at least
MAX_WINDOW_S = 2.0  # the most a row is replayed for its energy
POLL_S = 0.0005  # the meter's thread: its sleep between two reads
# While the meter polls, the interpreter hands the GIL over this often (sys's default is
# 5 ms): a thread waiting for it would otherwise see an edge up to 5 ms late when the
# runner's replay loop is busy in Python.
SWITCH_INTERVAL_S = 0.0005
# The precision check holds the steps' mean to this two-sided confidence (Student's t
# over the steps counted: a few steps' spread is a loose estimate of the counter's).
CONFIDENCE = 0.95


# A row's few steps estimate its spread loosely: the median spread of the run's last
# SPREAD_ROWS rows (once there are SPREAD_MIN_ROWS) is a floor under it, and until then a
# row counts FIRST_ROWS_STEPS steps at least (its own spread its only estimate).
SPREAD_ROWS = 32
SPREAD_MIN_ROWS = 3
FIRST_ROWS_STEPS = 6


def noise_factor(steps: int) -> float:
    """Standard errors of the steps' mean that CONFIDENCE spans with `steps` steps."""
    return float(stdtrit(max(steps - 1, 1), 0.5 + CONFIDENCE / 2))


@dataclass(frozen=True)
class CounterRead:
    """One read of the counter: the clock before and after it, and its value (mJ; None
    where the read failed)."""

    t0: float
    t1: float
    mj: int | None


@dataclass(frozen=True)
class Edge:
    """A change of the counter: its time (the middle of the two reads around it), how far
    off that can be (half the span from the first read's start to the second's end) and
    the value it changed to."""

    t: float
    half_s: float
    mj: int


def counter_edges(reads: Sequence[CounterRead]) -> tuple[list[Edge], str]:
    """The counter's changes over consecutive readable reads; ("" or why they stop: the
    counter went backwards)."""
    edges: list[Edge] = []
    prev: CounterRead | None = None
    for r in reads:
        if r.mj is None:
            continue
        if prev is not None and prev.mj is not None and r.mj != prev.mj:
            if r.mj < prev.mj:
                return edges, (f"the energy counter went backwards ({prev.mj} -> {r.mj} mJ)")
            edges.append(Edge((prev.t0 + r.t1) / 2, (r.t1 - prev.t0) / 2, r.mj))
        prev = r
    return edges, ""


# ---- the probe at a run's start ------------------------------------------------------

@dataclass(frozen=True)
class CounterProbe:
    """How the counter moves: `period_s` the median time between changes (min and max
    beside it), `step_mj` the median change, `changes` seen in `reads` reads over
    `probed_s`, `read_s` the median cost of one read; `reason` says why there is no
    period ("" where there is)."""

    period_s: float | None
    period_min_s: float | None
    period_max_s: float | None
    step_mj: float | None
    changes: int
    reads: int
    read_s: float
    probed_s: float
    monotonic: bool
    reason: str = ""

    def to_json(self) -> meta_parts.CounterProbe:
        return meta_parts.CounterProbe(**asdict(self), how=(
            f"read in a tight loop for up to {PROBE_BUDGET_S * 1e3:.0f} ms (stopping at "
            f"{PROBE_CHANGES} changes) at the run's start, the GPU idle; a change's time is "
            "the middle of the two reads around it"))


def probe_counter(read: Callable[[], int], clock: Callable[[], float] = time.monotonic,
                  budget_s: float = PROBE_BUDGET_S,
                  max_changes: int = PROBE_CHANGES) -> CounterProbe:
    """Read the counter back to back for at most `budget_s` (fewer once `max_changes`
    changes are seen) and measure its period, step and monotonicity.  A read that
    raises ends the probe with the error as its reason."""
    reads: list[CounterRead] = []
    start = clock()
    why = ""
    changes = 0
    while clock() - start < budget_s and changes < max_changes:
        t0 = clock()
        try:
            mj = int(read())
        except Exception as e:
            why = f"the energy counter could not be read ({type(e).__name__}: {e})"
            break
        reads.append(CounterRead(t0, clock(), mj))
        if len(reads) > 1 and mj != reads[-2].mj:
            changes += 1
    probed = clock() - start
    edges, backwards = counter_edges(reads)
    cost = statistics.median(r.t1 - r.t0 for r in reads) if reads else 0.0
    gaps = [b.t - a.t for a, b in zip(edges, edges[1:], strict=False)]
    steps = [b.mj - a.mj for a, b in zip(edges, edges[1:], strict=False)]
    if not why and backwards:
        why = backwards
    elif not why and len(edges) < 2:
        why = (f"the energy counter changed {len(edges)} time(s) in {probed * 1e3:.0f} ms "
               "of reads: no period between changes")
    return CounterProbe(
        period_s=statistics.median(gaps) if gaps and not why else None,
        period_min_s=min(gaps) if gaps and not why else None,
        period_max_s=max(gaps) if gaps and not why else None,
        step_mj=float(statistics.median(steps)) if steps and not why else None,
        changes=len(edges), reads=len(reads), read_s=cost, probed_s=probed,
        monotonic=not backwards, reason=why)


# Per NVML module (the run's pynvml; a test's stand-in), per device UUID.
_PROBES: weakref.WeakKeyDictionary[Any, dict[str, CounterProbe]] = weakref.WeakKeyDictionary()


def counter_probe(pynvml: Any, handle: Any,
                  clock: Callable[[], float] = time.monotonic) -> CounterProbe:
    """The device's probe, taken once per process: the run's metadata and its meter
    share it."""
    try:
        key = str(pynvml.nvmlDeviceGetUUID(handle))
    except Exception:
        key = f"handle-{id(handle)}"
    probes = _PROBES.setdefault(pynvml, {})
    if key not in probes:
        probes[key] = probe_counter(
            lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), clock)
    return probes[key]


# ---- a row's window -------------------------------------------------------------------

@dataclass(frozen=True)
class WindowPlan:
    """How long a row is replayed (`window_s`; None with the `reason` where no window
    can do) and what it rests on: `bracket_s` the expected span of the two reads around
    an edge, `counted_s` the time between the first and last edge it needs."""

    window_s: float | None
    reason: str = ""
    bracket_s: float = 0.0
    counted_s: float = 0.0


def plan_window(probe: CounterProbe, precision: float = PRECISION,
                poll_s: float = POLL_S, switch_s: float = SWITCH_INTERVAL_S,
                max_window_s: float = MAX_WINDOW_S, min_steps: int = MIN_STEPS) -> WindowPlan:
    """The replay a row needs: MIN_STEPS whole periods between its first and last edge,
    and enough that the two edges' timing (each within half a bracket: a poll, two reads
    and a GIL hand-over) costs at most half the precision; plus one period to reach the
    first edge and the period's spread.  Over `max_window_s`: no window."""
    if probe.period_s is None:
        return WindowPlan(None, probe.reason or "no counter period was measured")
    bracket = poll_s + 2 * probe.read_s + switch_s
    counted = max(min_steps * probe.period_s, bracket / (precision / 2))
    spread = (probe.period_max_s or probe.period_s) - (probe.period_min_s or probe.period_s)
    window = counted + probe.period_s + spread + bracket
    if window > max_window_s:
        return WindowPlan(None, (
            f"the energy counter changes every {probe.period_s * 1e3:.0f} ms: a row needs "
            f"{window:.2f} s of replay, over the {max_window_s:g} s limit"), bracket, counted)
    return WindowPlan(window, "", bracket, counted)


# ---- the edges inside a window --------------------------------------------------------

@dataclass(frozen=True)
class EdgeFit:
    """The counter over a window: mean power between its first and last change
    (`span_s` apart, `steps` changes after the first), the relative error of the two
    edges' timing (`timing_rel`, a bound) and of the steps' spread (`noise_rel`, one
    standard error), or why there is none (`reason`); `error_rel` sums the bound and
    the steps' CONFIDENCE interval."""

    power_w: float | None
    span_s: float | None = None
    steps: int = 0
    timing_rel: float = 0.0
    noise_rel: float = 0.0
    reason: str = ""
    per_step_rel: float = 0.0  # one step's own spread (noise_rel x sqrt(steps))
    bracket_s: float = 0.0  # the first and last edges' half-spans, summed

    @property
    def error_rel(self) -> float:
        return self.timing_rel + noise_factor(self.steps) * self.noise_rel


def fit_edges(reads: Sequence[CounterRead], t_start: float, t_end: float) -> EdgeFit:
    """The mean power from the counter's changes seen by reads inside [t_start, t_end]:
    (value at the last change - value at the first) over the time between them.  Each
    interval's own power spreads by the power's variation and by its edges' timing; the
    part the edges' brackets explain (uniform within each) is taken out of the spread
    before it counts as noise."""
    inside = [r for r in reads if r.t0 >= t_start and r.t1 <= t_end]
    edges, backwards = counter_edges(inside)
    window_ms = (t_end - t_start) * 1e3
    if backwards:
        return EdgeFit(None, reason=backwards)
    if len(edges) < 3:
        return EdgeFit(None, reason=(
            f"the energy counter changed {len(edges)} time(s) in {window_ms:.0f} ms of "
            "replay: too few for a mean (3 at least)"))
    first, last = edges[0], edges[-1]
    span = last.t - first.t
    power = (last.mj - first.mj) / 1e3 / span
    timing = (first.half_s + last.half_s) / span
    noise = per_step = 0.0
    if power > 0:
        p = [(b.mj - a.mj) / 1e3 / (b.t - a.t) for a, b in zip(edges, edges[1:], strict=False)]
        explained = statistics.fmean((a.half_s ** 2 + b.half_s ** 2) / 3 / (b.t - a.t) ** 2
                                     for a, b in zip(edges, edges[1:], strict=False))
        var = statistics.variance(p) / power ** 2 - explained
        per_step = max(var, 0.0) ** 0.5
        noise = per_step / len(p) ** 0.5
    return EdgeFit(power, span, len(edges) - 1, timing, noise, "", per_step,
                   first.half_s + last.half_s)


def steps_needed(fit: EdgeFit, period_s: float, precision: float, most: int,
                 least: int = 2) -> int | None:
    """The fewest steps (`least` to `most`) whose edge timing and step spread, as this
    fit measured them, stay within the precision; None when none do."""
    for n in range(max(fit.steps, least), most + 1):
        timing = fit.bracket_s / (n * period_s)
        if timing + noise_factor(n) * fit.per_step_rel / n ** 0.5 <= precision:
            return n
    return None


# ---- the meter -----------------------------------------------------------------------

class GpuEnergyMeter:
    """A GPU's per-row energy meter, made once per run from the run's NVML module and the
    CUDA device's handle (GpuMonitor.pynvml, GpuMonitor.handle).  Probes the counter on
    first use (shared with the run's metadata), then `measure(run_for)` per row."""

    def __init__(self, pynvml: Any, handle: Any, probe: CounterProbe | None = None, *,
                 precision: float = PRECISION, max_window_s: float = MAX_WINDOW_S,
                 poll_s: float = POLL_S, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.pynvml, self.handle = pynvml, handle
        self.precision, self.max_window_s, self.poll_s = precision, max_window_s, poll_s
        self.clock, self.sleep = clock, sleep
        self.probe = probe if probe is not None else counter_probe(pynvml, handle, clock)
        self.plan = plan_window(self.probe, precision, poll_s, max_window_s=max_window_s)
        # The per-step spreads of the run's rows so far (EdgeFit.per_step_rel).
        self.spreads: deque[float] = deque(maxlen=SPREAD_ROWS)

    def read(self) -> int:
        return int(self.pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    def power_limit_w(self) -> float | None:
        try:
            return self.pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0
        except Exception:
            return None

    def measure(self, run_for: Callable[[float], None]) -> RowEnergy:
        """The row's mean power over `run_for(seconds)`: the runner's replay of the
        row's timed loop (same calls, same flushes) for at least that long, called with
        the planned window and, while the counter's steps spread more than the precision
        allows, again for the steps missing (within max_window_s in all).  Nothing is
        replayed where no window can do (the record says why).  run_for's exceptions
        propagate, after the polling thread has stopped."""
        limit = self.power_limit_w()
        if self.plan.window_s is None:
            return RowEnergy(None, METHOD, self.plan.reason, power_limit_w=limit)
        reads: list[CounterRead] = []
        stop = threading.Event()
        poller = threading.Thread(target=self._poll, args=(reads, stop), daemon=True,
                                  name="energy-counter")
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
        poller.start()
        try:
            t_start = self.clock()
            run_for(self.plan.window_s)
            t_end = self.clock()
            raw = fit_edges(list(reads), t_start, t_end)
            # Longer while the steps so far say the precision needs more of them and
            # max_window_s allows them.
            while extra := self._extra_s(self._floored(raw), t_end - t_start):
                run_for(extra)
                t_end = self.clock()
                raw = fit_edges(list(reads), t_start, t_end)
        finally:
            stop.set()
            poller.join()
            sys.setswitchinterval(switch)
        fit = self._floored(raw)
        if raw.power_w is not None:
            self.spreads.append(raw.per_step_rel)
        return self._record(fit, t_end - t_start, limit)

    def _floored(self, fit: EdgeFit) -> EdgeFit:
        """`fit` with its per-step spread raised to the median of the run's rows so far,
        where 3 rows or more gave one."""
        if fit.power_w is None or len(self.spreads) < SPREAD_MIN_ROWS:
            return fit
        floor = statistics.median(self.spreads)
        if fit.per_step_rel >= floor:
            return fit
        return dataclasses.replace(fit, per_step_rel=floor, noise_rel=floor / fit.steps ** 0.5)

    def _poll(self, reads: list[CounterRead], stop: threading.Event) -> None:
        while not stop.is_set():
            t0 = self.clock()
            try:
                mj: int | None = self.read()
            except Exception:
                mj = None
            reads.append(CounterRead(t0, self.clock(), mj))
            self.sleep(self.poll_s)

    def _extra_s(self, fit: EdgeFit, ran_s: float) -> float:
        """The replay still needed where the first window fell short of the precision
        (0.0 where it did not, or where no extension within max_window_s can help)."""
        period = self.probe.period_s
        least = FIRST_ROWS_STEPS if len(self.spreads) < SPREAD_MIN_ROWS else 2
        if fit.power_w is None or not period or (
                fit.error_rel <= self.precision and fit.steps >= least):
            return 0.0
        most = int((self.max_window_s - ran_s) / period) + fit.steps - 2
        n = steps_needed(fit, period, self.precision, most, least)
        return (n - fit.steps + 1) * period if n is not None else 0.0

    def _record(self, fit: EdgeFit, ran_s: float, limit: float | None) -> RowEnergy:
        common = dict(method=METHOD, span_s=fit.span_s, window_s=ran_s, steps=fit.steps,
                      error_rel=fit.error_rel if fit.power_w is not None else None,
                      power_limit_w=limit)
        if fit.power_w is None:
            return RowEnergy(None, reason=fit.reason, **common)
        if fit.error_rel > self.precision:
            return RowEnergy(None, reason=(
                f"the energy counter's {fit.steps} steps over {fit.span_s * 1e3:.0f} ms give "
                f"{fit.power_w:.0f} W within ±{fit.error_rel:.1%} only, over the "
                f"{self.precision:.0%} target"), **common)
        out_of_bounds = power_bounds_reason(fit.power_w, limit)
        if out_of_bounds:
            return RowEnergy(None, reason=out_of_bounds, **common)
        return RowEnergy(fit.power_w, **common)


# ---- the run's metadata ---------------------------------------------------------------

def energy_metadata(kind: str, pynvml: Any | None = None,
                    rapl_root: Path = RAPL_ROOT) -> meta_parts.EnergySource:
    """The run's metadata key `energy`: {"source": "nvml" | "rapl" | None, "reason"}; on
    a GPU also how its counter moves (`counter`: benches.sweep.energy_counter's probe,
    taken here once per process) and the replay a row needs for it (`row_window_s`)."""
    if kind != "cuda":
        rapl, why = Rapl.find(rapl_root) if rapl_root != RAPL_ROOT else energy.host_rapl()
        if rapl is None:
            return {"source": None, "reason": f"CPU: {why}"}
        return {"source": "rapl", "reason": (
            f"RAPL package energy ({len(rapl.domains)} package(s)) over each row's timing "
            "x its median time")}
    nv = pynvml if pynvml is not None else load_pynvml()
    if nv is None:
        return {"source": None, "reason": "nvidia-ml-py (pynvml) is not installed"}
    try:
        nv.nvmlInit()
    except Exception as e:
        return {"source": None, "reason": f"NVML did not start ({type(e).__name__}: {e})"}
    try:
        h, how = nvml_handle(nv)
        if h is None:
            return {"source": None, "reason": how}
        nv.nvmlDeviceGetTotalEnergyConsumption(h)
        return _counter_metadata(nv, h)
    except Exception as e:
        return {"source": None, "reason": (
            f"NVML's total energy counter is not readable ({type(e).__name__}: {e}); "
            "older than Volta, or a vGPU")}
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def _counter_metadata(nv: Any, h: Any) -> meta_parts.EnergySource:
    probe = counter_probe(nv, h)
    plan = plan_window(probe)
    if plan.window_s is None:
        out = meta_parts.EnergySource(source=None,
                                      reason=f"NVML total energy counter: {plan.reason}")
    else:
        out = meta_parts.EnergySource(source="nvml", reason=(
            f"NVML total energy counter, changing every {probe.period_s * 1e3:.0f} ms: each "
            "row's mean power from the counter's first to last change over a "
            f"{plan.window_s * 1e3:.0f} ms replay of the row, x its median time"))
    out.update(counter=probe.to_json(), row_window_s=plan.window_s, precision=PRECISION,
               bounds=f"(0, {POWER_LIMIT_SLACK:g} x the enforced power limit]")
    return out
