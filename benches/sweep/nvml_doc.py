"""What the run reads back from an NVML snapshot (benches/sweep/gpu_monitor.py's
nvml_snapshot, contract.meta_parts.NvmlSnapshot: the run's metadata telemetry.nvml_start
and nvml_end).  Its own module, free of NVML and torch."""

from __future__ import annotations

from dataclasses import dataclass

from contract.meta_parts import NvmlSnapshot


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
