"""What a row's call costs in energy: the mean power over its timed samples times its
median time, per call (`energy_j`), and what that energy buys (`tflop_per_j`,
`gb_per_j`), with the mean power (`power_w`) and, on a GPU, the power limit in force
(`power_limit_w`).  Read only: nothing here sets a clock, a limit or a mode.

- GPU: NVML's total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the
  driver loaded, Volta and later), read by the run's GpuMonitor with every reading; during
  a timing every GpuMonitor.fast_interval_s.  The mean power of a row is the counter's
  rise between the first and the last reading of its timing window over the time between
  them; a window whose readings span less than MIN_COUNTER_SPAN_S, or a GPU without the
  counter, takes the mean of its power readings (nvmlDeviceGetPowerUsage) instead.
- CPU: RAPL's package counters (/sys/class/powercap/intel-rapl:N/energy_uj, µJ, wrapping
  at max_energy_range_uj) read before and after the row's timing, where readable (root
  only on kernels patched for CVE-2020-8694); else the columns are empty.

Where none of this can be read, the columns stay empty and the run's metadata key
`energy` says why (energy_metadata).
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


def energy_columns(power_w: float | None, ms_median: float | None, flops: float,
                   nbytes: float, power_limit_w: float | None = None) -> dict[str, Any]:
    """The row's energy columns from its mean power and median time per call."""
    cols: dict[str, Any] = dict.fromkeys(ENERGY_COLUMNS)
    cols["power_limit_w"] = power_limit_w
    if power_w is None or not ms_median or power_w <= 0:
        return cols
    joules = power_w * ms_median / 1e3
    cols.update(energy_j=joules, power_w=power_w, tflop_per_j=flops / joules / 1e12,
                gb_per_j=nbytes / joules / 1e9)
    return cols


class RowMeter:
    """A row's energy: on a GPU from the readings of the run's GpuMonitor's last timing
    window (time_unthrottled opens it); on a CPU `around` reads RAPL before and after the
    timing."""

    def __init__(self, monitor: Any | None, rapl: Rapl | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.monitor, self.rapl, self.clock = monitor, rapl, clock
        self.cpu_power_w: float | None = None

    def around(self, timed: Callable[[], T]) -> T:
        """`timed()` with RAPL read before and after it, where readable."""
        if self.rapl is None:
            return timed()
        t0, before = self.clock(), self.rapl.read()
        out = timed()
        t1, after = self.clock(), self.rapl.read()
        if t1 > t0:
            self.cpu_power_w = self.rapl.joules(before, after) / (t1 - t0)
        return out

    def power_limit_w(self) -> float | None:
        m = self.monitor
        try:
            return m.pynvml.nvmlDeviceGetEnforcedPowerLimit(m.handle) / 1000.0
        except Exception:
            return None

    def columns(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.monitor is None:
            power, limit = self.cpu_power_w, None
        else:
            power = window_power_w(getattr(self.monitor, "last_readings", None) or [])
            limit = self.power_limit_w()
        return energy_columns(power, row.get("ms_median"), float(row.get("flops") or 0),
                              float(row.get("bytes") or 0), limit)


def row_meter(monitor: Any | None, kind: str) -> RowMeter:
    """The meter of a row: the GPU monitor's; on a CPU the host's RAPL (where readable);
    none for a GPU without NVML (the host's RAPL would not be the GPU's energy)."""
    if monitor is not None:
        return RowMeter(monitor)
    return RowMeter(None, host_rapl()[0] if kind != "cuda" else None)


def energy_metadata(kind: str, pynvml: Any | None = None,
                    rapl_root: Path = RAPL_ROOT) -> dict[str, Any]:
    """The run's metadata key `energy`: {"source": "nvml" | "rapl" | None, "reason"}."""
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
    except Exception as e:
        return {"source": None, "reason": (
            f"NVML's total energy counter is not readable ({type(e).__name__}: {e}); "
            "older than Volta, or a vGPU")}
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    return {"source": "nvml", "reason": (
        "NVML total energy counter over each row's timed samples x its median time "
        "(the mean of its power readings where they span under "
        f"{MIN_COUNTER_SPAN_S * 1e3:g} ms)")}
