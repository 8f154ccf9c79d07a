"""What a row's call costs in energy: the mean power over a replay or timing of the row
times its median time, per call (`energy_j`), and what that energy buys (`tflop_per_j`,
`gb_per_j`), with the mean power (`power_w`) and, on a GPU, the power limit in force
(`power_limit_w`).  Read only: nothing here sets a clock, a limit or a mode.

- GPU: NVML's total energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ since the
  driver loaded, Volta and later), which changes in steps tens of ms apart: a row's power
  is the energy between the counter's first and last change over a replay of the row
  long enough for it (benches/sweep/energy_counter.py, GpuEnergyMeter; docs/measurement.md,
  "Energy"; benches/sweep/gpu_case.py replays the row).
- CPU: RAPL's package counters (/sys/class/powercap/intel-rapl:N/energy_uj, µJ, wrapping
  at max_energy_range_uj) read before and after the row's timing, where readable (root
  only on kernels patched for CVE-2020-8694); else the columns are empty.

A power at or below zero, or above POWER_LIMIT_SLACK x the enforced power limit, is not
written: the columns stay empty and RowEnergy.note says why.  Where no source can be read
the columns stay empty and the run's metadata key `energy` says why
(benches/sweep/energy_counter.py, energy_metadata).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from contract.record import Energy, RunRow

T = TypeVar("T")

RAPL_ROOT = Path("/sys/class/powercap")
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


def power_bounds_reason(power_w: float, power_limit_w: float | None) -> str:
    """Why a mean power cannot be the board's ("" where it can): at or below zero, or
    above POWER_LIMIT_SLACK x the enforced power limit (where known)."""
    if power_w <= 0:
        return f"mean power {power_w:.3g} W is at or below zero: not written"
    if power_limit_w and power_w > POWER_LIMIT_SLACK * power_limit_w:
        return (f"{power_w:.0f} W is above {POWER_LIMIT_SLACK:g} x the {power_limit_w:.0f} W "
                "power limit: not written")
    return ""


def energy_of(power_w: float | None, ms_median: float | None, flops: float,
              nbytes: float, power_limit_w: float | None = None) -> Energy:
    """The row's Energy group from its mean power and median time per call; empty (but
    for the limit) where the power is missing or out of its bounds
    (power_bounds_reason)."""
    if power_w is None or not ms_median or power_bounds_reason(power_w, power_limit_w):
        return Energy(power_limit_w=power_limit_w)
    joules = power_w * ms_median / 1e3
    return Energy(energy_j=joules, tflop_per_j=flops / joules / 1e12,
                  gb_per_j=nbytes / joules / 1e9, power_w=power_w,
                  power_limit_w=power_limit_w)


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

    def group(self, ms_median: float | None, flops: float, nbytes: float) -> Energy:
        """The Energy group of a row of this median time (ms), FLOPs and bytes."""
        return energy_of(self.power_w, ms_median, flops, nbytes, self.power_limit_w)

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


class RaplMeter:
    """A CPU row's energy: RAPL read before and after its timing (`around`), where
    readable (`rapl` None: the columns stay empty, metadata.energy says why)."""

    def __init__(self, rapl: Rapl | None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.rapl, self.clock = rapl, clock
        self.power_w: float | None = None
        self.span_s: float | None = None

    def around(self, timed: Callable[[], T]) -> T:
        """`timed()` with RAPL read before and after it, where readable."""
        if self.rapl is None:
            return timed()
        t0, before = self.clock(), self.rapl.read()
        out = timed()
        t1, after = self.clock(), self.rapl.read()
        if t1 > t0:
            self.power_w = self.rapl.joules(before, after) / (t1 - t0)
            self.span_s = t1 - t0
        return out

    def energy(self) -> RowEnergy:
        """The timing's mean power, bounded (power_bounds_reason)."""
        return bounded(self.power_w, "rapl", span_s=self.span_s,
                       missing="" if self.rapl is None else "RAPL read no timing")

    def group(self, row: RunRow) -> Energy:
        """The timed row's Energy group."""
        return self.energy().group(row.timing.ms_median, float(row.accounting.flops or 0),
                                   float(row.accounting.bytes or 0))


def rapl_meter() -> RaplMeter:
    """A CPU row's meter on this host's RAPL (where readable)."""
    return RaplMeter(host_rapl()[0])
