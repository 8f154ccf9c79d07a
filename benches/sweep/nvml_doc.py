"""The NVML snapshot's document (benches/sweep/gpu_monitor.py's nvml_snapshot: the run's
metadata telemetry.nvml_start and nvml_end) and what the run reads back from it.  Its own
module, free of NVML and torch, so that readers of saved runs can name its shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict


class DuringRun(TypedDict):
    """The sampler's summary so far (MonitorSummary's fields), in a snapshot."""

    readings: int
    readings_idle: int
    readings_all: int
    interval_s: float
    sm_clock_mhz_min: float | None
    sm_clock_mhz_median: float | None
    sm_clock_mhz_max: float | None
    power_w_max: float | None
    throttled_fraction: float | None
    throttle_reasons_seen: list[str]


class NvmlSnapshot(TypedDict, total=False):
    """nvml_snapshot's document (the run's metadata telemetry.nvml_start and nvml_end),
    keys in this order; a device NVML could not match has nvml_device (None) and why in
    nvml_match only, an unreadable value is None or absent."""

    nvml_device: None
    nvml_match: str
    driver: str
    nvml_uuid: str
    sm_clock_mhz: float | None
    power_w: float | None
    temperature_c: float | None
    clock_reasons: int | None
    gpu_util_pct: float | None
    energy_mj: int | None
    mem_clock_mhz: float | None
    max_sm_clock_mhz: float | None
    power_limit_w: float | None
    throttle_reasons: list[str] | None
    during_run: DuringRun


@dataclass(frozen=True)
class NvmlFacts:
    """What the run reads back from an NVML snapshot (nvml_snapshot's document): the
    driver, the SM clock's maximum, the memory clock and the enforced power limit."""

    driver: str | None = None
    max_sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_limit_w: float | None = None

    @classmethod
    def of(cls, snap: NvmlSnapshot | None) -> NvmlFacts:
        """The facts of a snapshot (None, or a key it lacks: None)."""
        doc: NvmlSnapshot = snap or {}
        return cls(driver=doc.get("driver"), max_sm_clock_mhz=doc.get("max_sm_clock_mhz"),
                   mem_clock_mhz=doc.get("mem_clock_mhz"),
                   power_limit_w=doc.get("power_limit_w"))
