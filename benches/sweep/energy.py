"""What a row's call costs in energy: the mean power over a replay or timing of the row
times its median time, per call (`energy_j`), and what that energy buys (`tflop_per_j`,
`gb_per_j`), with the mean power (`power_w`) and, on a GPU, the power limit in force
(`power_limit_w`).  Read only: nothing here sets a clock, a limit or a mode.

- GPU: NVML's total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the
  driver loaded, Volta and later), which changes in steps tens of ms apart: a row's power
  is the energy between the counter's first and last change over a replay of the row
  long enough for it (benches/sweep/energy_counter.py, GpuEnergyMeter; docs/measurement.md,
  "Energy").  `window_power_w`, the counter's rise over the timing window's own readings,
  is the older way, kept for the runner until it calls the meter: its windows are too
  short for the counter, so its values are bounded (power_bounds_reason) and often empty.
- CPU: RAPL's package counters (/sys/class/powercap/intel-rapl:N/energy_uj, µJ, wrapping
  at max_energy_range_uj) read before and after the row's timing, where readable (root
  only on kernels patched for CVE-2020-8694); else the columns are empty.

A power at or below zero, or above POWER_LIMIT_SLACK x the enforced power limit, is not
written: the columns stay empty and RowEnergy.note says why.  Where no source can be read
the columns stay empty and the run's metadata key `energy` says why (energy_metadata).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from benches.sweep.gpu_monitor import load_pynvml, nvml_handle

T = TypeVar("T")

RAPL_ROOT = Path("/sys/class/powercap")
# Readings of a window must span this long (s) for the counter's rise to give its power.
MIN_COUNTER_SPAN_S = 0.01
ENERGY_COLUMNS = ("energy_j", "tflop_per_j", "gb_per_j", "power_w", "power_limit_w")
# A board draws at most its enforced limit over any window the counter resolves; the
# slack covers the limit's own regulation (it holds the average, not every millisecond).
POWER_LIMIT_SLACK = 1.05


@dataclass(frozen=True)
class RaplDomain:
    path: Path
    max_uj: int | None


class Rapl:
    """The host's RAPL package domains (intel-rapl:N, not their core/uncore/dram
    subdomains intel-rapl:N:M, which the package already counts)."""

    def __init__(self, domains: list[RaplDomain]) -> None:
        self.domains = domains

    @classmethod
    def find(cls, root: Path = RAPL_ROOT) -> tuple[Rapl | None, str]:
        """(the readable package domains, "") or (None, why not)."""
        dirs = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not dirs:
            return None, f"no RAPL package domain under {root} (not an Intel/AMD RAPL host)"
        domains = []
        for d in dirs:
            try:
                int((d / "energy_uj").read_text())
            except (OSError, ValueError) as e:
                return None, (f"{d / 'energy_uj'} is not readable ({type(e).__name__}: "
                              "root only on kernels patched for CVE-2020-8694)")
            try:
                max_uj: int | None = int((d / "max_energy_range_uj").read_text())
            except (OSError, ValueError):
                max_uj = None
            domains.append(RaplDomain(d, max_uj))
        return cls(domains), ""

    def read(self) -> list[int]:
        return [int((d.path / "energy_uj").read_text()) for d in self.domains]

    def joules(self, before: list[int], after: list[int]) -> float:
        """Energy between two reads, summed over the packages; a counter that wrapped
        (after < before) counts up to its range and on from zero."""
        total = 0
        for d, a, b in zip(self.domains, before, after, strict=True):
            total += b - a if b >= a or not d.max_uj else d.max_uj - a + b
        return total / 1e6


@functools.cache
def host_rapl() -> tuple[Rapl | None, str]:
    return Rapl.find()


def window_power_w(readings: list[dict[str, Any]]) -> float | None:
    """Mean power (W) over a timing window's readings: the energy counter's rise over
    the time between its first and last reading when they span MIN_COUNTER_SPAN_S,
    else the mean of the power readings; None when neither is there."""
    counted = sorted((float(r["t"]), float(r["energy_mj"])) for r in readings
                     if isinstance(r.get("energy_mj"), int | float)
                     and isinstance(r.get("t"), int | float))
    if len(counted) >= 2:
        (t0, e0), (t1, e1) = counted[0], counted[-1]
        if t1 - t0 >= MIN_COUNTER_SPAN_S and e1 >= e0:
            return (e1 - e0) / 1e3 / (t1 - t0)
    power = [float(r["power_w"]) for r in readings
             if isinstance(r.get("power_w"), int | float)]
    return statistics.fmean(power) if power else None


def power_bounds_reason(power_w: float, power_limit_w: float | None) -> str:
    """Why a mean power cannot be the board's ("" where it can): at or below zero, or
    above POWER_LIMIT_SLACK x the enforced power limit (where known)."""
    if power_w <= 0:
        return f"mean power {power_w:.3g} W is at or below zero: not written"
    if power_limit_w and power_w > POWER_LIMIT_SLACK * power_limit_w:
        return (f"{power_w:.0f} W is above {POWER_LIMIT_SLACK:g} x the {power_limit_w:.0f} W "
                "power limit: not written")
    return ""


def energy_columns(power_w: float | None, ms_median: float | None, flops: float,
                   nbytes: float, power_limit_w: float | None = None) -> dict[str, Any]:
    """The row's energy columns from its mean power and median time per call; empty
    where the power is missing or out of its bounds (power_bounds_reason)."""
    cols: dict[str, Any] = dict.fromkeys(ENERGY_COLUMNS)
    cols["power_limit_w"] = power_limit_w
    if power_w is None or not ms_median or power_bounds_reason(power_w, power_limit_w):
        return cols
    joules = power_w * ms_median / 1e3
    cols.update(energy_j=joules, power_w=power_w, tflop_per_j=flops / joules / 1e12,
                gb_per_j=nbytes / joules / 1e9)
    return cols


@dataclass(frozen=True)
class RowEnergy:
    """A row's mean power (W) and how it was had, or why it is empty (`reason`).
    GPU (GpuEnergyMeter): `span_s` the time between the counter's first and last change
    counted, `window_s` how long the row was replayed, `steps` the counter's changes
    counted after the first, `error_rel` the error it was held to (the two edges' timing
    bound plus the 95% interval of the steps' spread).  CPU: `span_s` the timing read
    around."""

    power_w: float | None
    method: str
    reason: str = ""
    span_s: float | None = None
    window_s: float | None = None
    steps: int | None = None
    error_rel: float | None = None
    power_limit_w: float | None = None

    def columns(self, ms_median: float | None, flops: float,
                nbytes: float) -> dict[str, Any]:
        """ENERGY_COLUMNS for a row of this median time (ms), FLOPs and bytes."""
        return energy_columns(self.power_w, ms_median, flops, nbytes, self.power_limit_w)

    @property
    def note(self) -> str:
        """What the row's reason text gets: "" where the power was written."""
        return f"energy: {self.reason}" if self.power_w is None and self.reason else ""


def bounded(power_w: float | None, method: str, power_limit_w: float | None = None,
            span_s: float | None = None, missing: str = "") -> RowEnergy:
    """A RowEnergy of `power_w`, empty with the reason where it is missing (`missing`)
    or out of its bounds."""
    if power_w is None:
        return RowEnergy(None, method, missing, span_s=span_s, power_limit_w=power_limit_w)
    why = power_bounds_reason(power_w, power_limit_w)
    return RowEnergy(None if why else power_w, method, why, span_s=span_s,
                     power_limit_w=power_limit_w)


class RowMeter:
    """A row's energy read around its timing: on a CPU `around` reads RAPL before and
    after it; on a GPU (until the runner calls GpuEnergyMeter) the readings of the run's
    GpuMonitor's last timing window, window_power_w."""

    def __init__(self, monitor: Any | None, rapl: Rapl | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.monitor, self.rapl, self.clock = monitor, rapl, clock
        self.cpu_power_w: float | None = None
        self.cpu_span_s: float | None = None

    def around(self, timed: Callable[[], T]) -> T:
        """`timed()` with RAPL read before and after it, where readable."""
        if self.rapl is None:
            return timed()
        t0, before = self.clock(), self.rapl.read()
        out = timed()
        t1, after = self.clock(), self.rapl.read()
        if t1 > t0:
            self.cpu_power_w = self.rapl.joules(before, after) / (t1 - t0)
            self.cpu_span_s = t1 - t0
        return out

    def power_limit_w(self) -> float | None:
        m = self.monitor
        try:
            return m.pynvml.nvmlDeviceGetEnforcedPowerLimit(m.handle) / 1000.0
        except Exception:
            return None

    def energy(self) -> RowEnergy:
        """The last timing's mean power, bounded (power_bounds_reason)."""
        if self.monitor is None:
            return bounded(self.cpu_power_w, "rapl", span_s=self.cpu_span_s,
                           missing="" if self.rapl is None else "RAPL read no timing")
        power = window_power_w(getattr(self.monitor, "last_readings", None) or [])
        return bounded(power, "nvml timing window", self.power_limit_w(),
                       missing="no energy reading in the timing window")

    def columns(self, row: dict[str, Any]) -> dict[str, Any]:
        return self.energy().columns(row.get("ms_median"), float(row.get("flops") or 0),
                                     float(row.get("bytes") or 0))


def row_meter(monitor: Any | None, kind: str) -> RowMeter:
    """The meter of a row: the GPU monitor's; on a CPU the host's RAPL (where readable);
    none for a GPU without NVML (the host's RAPL would not be the GPU's energy)."""
    if monitor is not None:
        return RowMeter(monitor)
    return RowMeter(None, host_rapl()[0] if kind != "cuda" else None)


def energy_metadata(kind: str, pynvml: Any | None = None,
                    rapl_root: Path = RAPL_ROOT) -> dict[str, Any]:
    """The run's metadata key `energy`: {"source": "nvml" | "rapl" | None, "reason"}; on
    a GPU also how its counter moves (`counter`: benches.sweep.energy_counter's probe,
    taken here once per process) and the replay a row needs for it (`row_window_s`)."""
    if kind != "cuda":
        rapl, why = Rapl.find(rapl_root) if rapl_root != RAPL_ROOT else host_rapl()
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


def _counter_metadata(nv: Any, h: Any) -> dict[str, Any]:
    # Imported here: energy_counter builds on this module's RowEnergy and bounds.
    from benches.sweep.energy_counter import PRECISION, counter_probe, plan_window

    probe = counter_probe(nv, h)
    plan = plan_window(probe)
    meta: dict[str, Any] = {"counter": probe.to_json(), "row_window_s": plan.window_s,
                            "precision": PRECISION,
                            "bounds": f"(0, {POWER_LIMIT_SLACK:g} x the enforced power limit]"}
    if plan.window_s is None:
        return {"source": None, "reason": f"NVML total energy counter: {plan.reason}", **meta}
    return {"source": "nvml", "reason": (
        f"NVML total energy counter, changing every {probe.period_s * 1e3:.0f} ms: each "
        "row's mean power from the counter's first to last change over a "
        f"{plan.window_s * 1e3:.0f} ms replay of the row, x its median time"), **meta}
