"""The passive readings of fleet acceptance, through nvidia-ml-py (pynvml), read-only:
every call here is a nvmlDeviceGet* / nvmlSystemGet* query, none changes a setting.
A reading that fails (not supported by the GPU or driver, no permission) is None, with
NVML's message kept, so the rule (benches/fleet/acceptance_rules.py) says UNKNOWN.

Units as the rules want them: watts (NVML gives mW), degrees C, counts.  The NVML
handle of this rank's GPU and the sampling of clocks, temperature and clock-event
reasons during the stress come from benches/sweep/gpu_monitor.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from benches.fleet.acceptance_records import NvmlReading, PcieLink, StressNvml
from benches.sweep.failures import error_message
from benches.sweep.gpu_monitor import SLOWDOWN_REASONS, Reading, decode_nvml, is_idle


def _read(errors: dict[str, str], key: str, fn: Callable[[], Any]) -> Any:
    """fn()'s reading, None where it fails (NVML's message in errors[key])."""
    try:
        return fn()
    except Exception as e:  # NVMLError_NotSupported and friends: unreadable, not OK
        errors[key] = error_message(e)
        return None


def _nvlink_states(nv: Any, h: Any) -> list[int] | None:
    """The state (1 up, 0 down) of every NVLink the GPU reports; links it does not have
    answer NOT_SUPPORTED or INVALID_ARGUMENT and are not counted ([] = no NVLink, as on a
    PCIe card).  Any other error means the state could not be read: None."""
    absent = {getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3),
              getattr(nv, "NVML_ERROR_INVALID_ARGUMENT", 2)}
    states = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            states.append(int(nv.nvmlDeviceGetNvLinkState(h, link)))
        except Exception as e:
            if getattr(e, "value", None) not in absent:
                return None
    return states


def read_pcie(nv: Any, h: Any) -> PcieLink:
    """The PCIe link's current generation and width: read while the GPU is busy, as an
    idle GPU lowers its link generation to save power."""
    errors: dict[str, str] = {}
    gen = _read(errors, "pcie_gen", lambda: int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)))
    width = _read(errors, "pcie_width", lambda: int(nv.nvmlDeviceGetCurrPcieLinkWidth(h)))
    return PcieLink(gen, width, errors)


def read_passive(nv: Any, h: Any) -> NvmlReading:
    """Every passive reading of one GPU, with NVML's message for each reading that
    failed (`errors`); the PCIe link's is read apart, under load (read_pcie)."""
    errors: dict[str, str] = {}

    def read(key: str, fn: Callable[[], Any]) -> Any:
        return _read(errors, key, fn)

    unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    # Read in this order (the arguments' order), so that `errors` lists them so.
    return NvmlReading(
        name=read("name", lambda: decode_nvml(nv.nvmlDeviceGetName(h))),
        uuid=read("uuid", lambda: decode_nvml(nv.nvmlDeviceGetUUID(h))),
        ecc_mode=read("ecc_mode", lambda: tuple(int(x) for x in nv.nvmlDeviceGetEccMode(h))),
        ecc_uncorrected_volatile=read("ecc_uncorrected_volatile", lambda: int(
            nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_VOLATILE_ECC))),
        ecc_uncorrected_aggregate=read("ecc_uncorrected_aggregate", lambda: int(
            nv.nvmlDeviceGetTotalEccErrors(h, unc, nv.NVML_AGGREGATE_ECC))),
        # (correctable, uncorrectable, pending, failure): A100 and later remap rows.
        remapped_rows=read("remapped_rows", lambda: tuple(
            int(x) for x in nv.nvmlDeviceGetRemappedRows(h))),
        # Earlier GPUs retire pages, for multiple single-bit errors or a double-bit one.
        retired_pages=read("retired_pages", lambda: sum(
            len(nv.nvmlDeviceGetRetiredPages(h, cause)) for cause in (
                nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))),
        retired_pages_pending=read("retired_pages_pending", lambda: int(
            nv.nvmlDeviceGetRetiredPagesPendingStatus(h))),
        # The most the GPU and the host's slot together allow (a Gen5 GPU in a Gen4
        # host is not degraded).
        pcie_gen_max=read("pcie_gen_max", lambda: int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h))),
        pcie_width_max=read("pcie_width_max", lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(h))),
        nvlink_links=None if (states := _nvlink_states(nv, h)) is None else len(states),
        nvlink_up=None if states is None else sum(s == 1 for s in states),
        power_limit_w=read("power_limit_w",
                           lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
        power_default_w=read("power_default_w",
                             lambda: nv.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1000.0),
        temperature_c=read("temperature_c", lambda: float(
            nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
        temp_slowdown_c=read("temp_slowdown_c", lambda: float(
            nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))),
        temp_gpu_max_c=read("temp_gpu_max_c", lambda: float(
            nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_GPU_MAX))),
        driver=read("driver", lambda: decode_nvml(nv.nvmlSystemGetDriverVersion())),
        vbios=read("vbios", lambda: decode_nvml(nv.nvmlDeviceGetVbiosVersion(h))),
        errors=errors)


def stress_summary(readings: list[Reading], max_sm_clock_mhz: float | None
                   ) -> StressNvml:
    """Over the busy readings (gpu_monitor.is_idle) a GpuMonitor took during the stress:
    how many, the share carrying each clock-event reason, the hottest temperature and
    the median SM clock."""
    busy = [x for x in readings if not is_idle(x)]
    reasons = [x.clock_reasons for x in busy if isinstance(x.clock_reasons, int)]
    temps = [x.temperature_c for x in busy if isinstance(x.temperature_c, int | float)]
    clocks = [x.sm_clock_mhz for x in busy if isinstance(x.sm_clock_mhz, int | float)]
    return StressNvml(
        readings=len(reasons),
        reason_fractions={name: sum(bool(x & bit) for x in reasons) / len(reasons)
                          for name, bit in SLOWDOWN_REASONS.items()} if reasons else {},
        temperature_c_max=max(temps) if temps else None,
        sm_clock_mhz_median=statistics.median(clocks) if clocks else None,
        sm_clock_mhz_max_possible=max_sm_clock_mhz,
    )
