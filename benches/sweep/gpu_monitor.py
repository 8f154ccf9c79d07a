"""The GPU's clocks, power and clock-event reasons through NVML (nvidia-ml-py), read from
the NVML device that is the CUDA device in use, on a background thread while the sweep
runs (what a timing found throttled, and what is done about it: benches/sweep/throttle.py).

Light on imports (torch only) and free of the sweep: benches/sweep/throttle.py reads it
around each GPU case's timing.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benches.sweep.failures import error_message
from contract.meta_parts import DuringRun, NvmlSnapshot

# Clock-event ("throttle") reason bits that name a power or thermal limit on the clock
# (nvml.h): SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power
# brake 0x80.  They are reported beside the SM clock, and never decide on their own
# whether a timing was throttled: the clock does (throttle_state).  Not reported:
# application clocks setting 0x2, sync boost 0x10, display clock 0x100.
SLOWDOWN_REASONS: dict[str, int] = {
    "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}
SLOWDOWN_MASK = sum(SLOWDOWN_REASONS.values())
# "Nothing is running on the GPU and the clocks are dropping to Idle state" (nvml.h).
GPU_IDLE_REASON = 0x1


# What a reading reads, in this order (nvml_reading), and a light reading
# (GpuMonitor.fast, during a timing): what a sample's clock, the idle rule and the row's
# energy need, three NVML calls.
READ_KEYS = ("sm_clock_mhz", "power_w", "temperature_c", "clock_reasons", "gpu_util_pct",
             "energy_mj")
LIGHT_KEYS = ("sm_clock_mhz", "clock_reasons", "energy_mj")


def throttle_names(reasons: int) -> list[str]:
    return [n for n, bit in SLOWDOWN_REASONS.items() if reasons & bit]


@dataclass(frozen=True)
class Reading:
    """One NVML reading at `t` (the monitor's clock): SM clock (MHz), power (W),
    temperature (C), clock-event reasons (bits), GPU utilization (%), the total energy
    counter (mJ).  None: unreadable, or not read (`light`: LIGHT_KEYS only)."""

    t: float
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    clock_reasons: int | None = None
    gpu_util_pct: float | None = None
    energy_mj: int | None = None
    light: bool = False

    @property
    def clock(self) -> float | None:
        """The SM clock where it is a number."""
        c = self.sm_clock_mhz
        return c if isinstance(c, int | float) else None

    @property
    def reasons(self) -> int | None:
        """The clock-event reason bits where they were read."""
        return self.clock_reasons if isinstance(self.clock_reasons, int) else None


def clocks_of(readings: Iterable[Reading]) -> list[float]:
    """The readings' SM clocks, where numbers."""
    return [c for r in readings if (c := r.clock) is not None]


def reasons_of(readings: Iterable[Reading]) -> list[int]:
    """The readings' clock-event reason bits, where read."""
    return [x for r in readings if (x := r.reasons) is not None]


def reason_names(readings: Iterable[Reading]) -> tuple[str, ...]:
    """The power/thermal clock-event reasons any of the readings carried, sorted."""
    return tuple(sorted({n for x in reasons_of(readings) for n in throttle_names(x)}))


@dataclass(frozen=True)
class ClockWindow:
    """A timing's clock: the median SM clock of its busy readings (None: none, or none
    readable), the power/thermal clock-event reasons seen, the idle readings left out;
    `power_capped`: a clock under the threshold by the power cap alone, on a case warmed
    to its sustained clock (benches/sweep/throttle.py judge)."""

    sm_clock_mhz: float | None
    throttle_reasons: tuple[str, ...] = ()
    idle_readings: int = 0
    power_capped: bool = False


def window_of(readings: list[Reading], idle: int = 0) -> ClockWindow:
    """The clock window of busy readings (`idle` readings were left out)."""
    clocks = clocks_of(readings)
    return ClockWindow(float(statistics.median(clocks)) if clocks else None,
                       reason_names(readings), idle)


@dataclass(frozen=True)
class MonitorSummary:
    """Over the busy readings of every timing window (GpuMonitor.summary): how many
    (`readings`), the idle ones left out, every reading taken, the sampling interval,
    the SM clock's range, peak power, and the share of readings that carried a
    power/thermal clock-event reason (`throttled_fraction`: reported, not a throttle
    verdict) with the reasons seen."""

    readings: int
    readings_idle: int
    readings_all: int
    interval_s: float
    sm_clock_mhz_min: float | None
    sm_clock_mhz_median: float | None
    sm_clock_mhz_max: float | None
    power_w_max: float | None
    throttled_fraction: float | None
    throttle_reasons_seen: tuple[str, ...]

    def to_json(self) -> DuringRun:
        """As a snapshot holds it (during_run)."""
        return DuringRun(**{**asdict(self),
                            "throttle_reasons_seen": list(self.throttle_reasons_seen)})


def is_idle(reading: Reading) -> bool:
    """A reading of an idle GPU: flagged GPU-idle by NVML, or no kernel ran during
    NVML's last utilization period (1/6 s to 1 s).  A timing's window also spans host
    work with the GPU waiting (a CUDA graph's dispatch bursts, input copies and capture):
    the clock read then is an idle or falling clock, not the one the kernels ran at."""
    reasons, util = reading.reasons, reading.gpu_util_pct
    return (reasons is not None and bool(reasons & GPU_IDLE_REASON)) or \
        (isinstance(util, int | float) and util == 0)


def load_pynvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def decode_nvml(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _norm_uuid(u: Any) -> str:
    s = str(decode_nvml(u) or "").strip().lower()
    for prefix in ("gpu-", "mig-"):
        s = s.removeprefix(prefix)
    return s


def nvml_handle(pynvml: Any, cuda_index: int | None = None) -> tuple[Any, str]:
    """The NVML handle of the CUDA device in use, matched by UUID, else by PCI bus id
    (NVML's index order need not be CUDA's: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER).
    Returns (handle or None, how it matched or why not).  NVML must be initialized."""
    idx = torch.cuda.current_device() if cuda_index is None else cuda_index
    props = torch.cuda.get_device_properties(idx)
    uuid = _norm_uuid(getattr(props, "uuid", "") or "")
    pci = tuple(getattr(props, a, None) for a in ("pci_domain_id", "pci_bus_id",
                                                  "pci_device_id"))
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
               for i in range(pynvml.nvmlDeviceGetCount())]
    if uuid:
        for h in handles:
            with contextlib.suppress(Exception):
                if _norm_uuid(pynvml.nvmlDeviceGetUUID(h)) == uuid:
                    return h, "uuid"
    if None not in pci:
        for h in handles:
            with contextlib.suppress(Exception):
                info = pynvml.nvmlDeviceGetPciInfo(h)
                if (info.domain, info.bus, info.device) == pci:
                    return h, "pci_bus_id"
    return None, "no NVML device has the CUDA device's UUID or PCI bus id"


def _clock_reasons(pynvml: Any, h: Any) -> int:
    """Current clock-event reasons; the pre-R535 "throttle reasons" call on old drivers."""
    current = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if current is not None:
        try:
            return int(current(h))
        except Exception:
            pass
    return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))


def nvml_reading(pynvml: Any, h: Any, light: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> Reading:
    """One reading: SM clock (MHz), power (W), temperature (C), clock-event reasons,
    GPU utilization (%), the total energy counter (mJ); `light`: LIGHT_KEYS only."""
    readers = {
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
            h, pynvml.NVML_TEMPERATURE_GPU),
        "clock_reasons": lambda: _clock_reasons(pynvml, h),
        "gpu_util_pct": lambda: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "energy_mj": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h),
    }
    t = clock()
    got = {}
    for key, read in readers.items():
        if light and key not in LIGHT_KEYS:
            continue
        try:
            got[key] = read()
        except Exception:
            got[key] = None
    return Reading(t, light=light, **got)


class GpuMonitor:
    """Samples the CUDA device's clocks, power and clock-event reasons through NVML on a
    background thread (every `interval_s`), so each row can say at what SM clock it ran
    and whether the GPU throttled while it ran, not only at the run's idle ends."""

    def __init__(self, pynvml: Any, handle: Any, interval_s: float = 0.1,
                 keep: int = 100_000, fast_interval_s: float = 0.005,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pynvml, self.handle, self.interval_s = pynvml, handle, interval_s
        # During a timing (fast()) light readings every fast_interval_s between the full
        # ones: each sample's clock (benches/sweep/sample_clocks.py) and the energy counter.
        self.fast_interval_s, self.clock = fast_interval_s, clock
        self._fast = threading.Event()
        self._wake = threading.Event()  # set to read at once (fast(), stop())
        self.last_readings: list[Reading] = []
        self.last_busy: list[Reading] = []
        self.readings: deque[Reading] = deque(maxlen=keep)
        # The busy readings of the timing windows (see window): what the run's clocks,
        # power and throttle facts describe, not the compile and reference work between
        # them nor the idle spells inside a window (counted in idle_in_windows).
        self.timed: deque[Reading] = deque(maxlen=keep)
        self.idle_in_windows = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The SM clock the GPU may boost to: what the throttle threshold is a share of.
        try:
            self.max_sm_clock_mhz: float | None = float(
                pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception:
            self.max_sm_clock_mhz = None

    def sample(self, light: bool = False) -> Reading:
        r = nvml_reading(self.pynvml, self.handle, light, self.clock)
        with self._lock:
            self.readings.append(r)
        return r

    def start(self) -> GpuMonitor:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="nvml-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    @contextlib.contextmanager
    def fast(self) -> Any:
        """Light readings every fast_interval_s inside the block, from its first moment:
        the thread is woken, not left in the rest of its slow interval (up to 0.1 s,
        longer than a CUDA-graph case's whole sampling)."""
        self._fast.set()
        self._wake.set()
        try:
            yield
        finally:
            self._fast.clear()

    def _loop(self) -> None:
        next_full = 0.0
        while not self._stop.is_set():
            self._wake.wait(self.fast_interval_s if self._fast.is_set() else self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            light = self._fast.is_set() and self.clock() < next_full
            self.sample(light)
            next_full = next_full if light else self.clock() + self.interval_s

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 1)
            self._thread = None

    def window(self, t0: float, t1: float) -> ClockWindow:
        """A timing's clock over [t0, t1] plus one reading taken now (a row shorter than
        the sampling interval still gets one), from the readings of a busy GPU (is_idle):
        the median SM clock (None when every reading was idle or unreadable), the
        power/thermal clock-event reasons seen, and how many idle readings were left out.
        The busy readings are kept for the run's summary."""
        now = self.sample()
        rs: list[Reading] = []
        with self._lock:
            # Newest first, stopping at the window's start: a row costs its own readings,
            # not the run's (the deque holds up to `keep` readings).
            for r in reversed(self.readings):
                if r.t < t0:
                    break
                if r.t <= t1 and r is not now:
                    rs.append(r)
            rs.reverse()
            rs.append(now)
            busy = [r for r in rs if not is_idle(r)]
            # The last window's readings: each sample's clock, the row's energy.
            self.last_readings, self.last_busy = rs, busy
            self.timed.extend(busy)
            self.idle_in_windows += len(rs) - len(busy)
        return window_of(busy, len(rs) - len(busy))

    def busy_between(self, t0: float, t1: float) -> list[Reading]:
        """The busy readings taken in [t0, t1] (is_idle left out), oldest first, without
        booking them: a row's own share of a case's window (window books the case's)."""
        with self._lock:
            rs = []
            for r in reversed(self.readings):
                if r.t < t0:
                    break
                if r.t <= t1 and not is_idle(r):
                    rs.append(r)
        rs.reverse()
        return rs

    def clock_between(self, t0: float, t1: float) -> float | None:
        """The median SM clock of the busy readings in [t0, t1] (None: none there): the
        clock a compute-bound case's warm-up watches (benches/timing/interleave.py)."""
        clocks = clocks_of(self.busy_between(t0, t1))
        return float(statistics.median(clocks)) if clocks else None

    def summary(self) -> MonitorSummary:
        """Over the busy readings of every timing window so far (window)."""
        with self._lock:
            rs, n_all, n_idle = list(self.timed), len(self.readings), self.idle_in_windows
        clocks, reasons = clocks_of(rs), reasons_of(rs)
        power = [r.power_w for r in rs if isinstance(r.power_w, int | float)]
        return MonitorSummary(
            readings=len(rs), readings_idle=n_idle, readings_all=n_all,
            interval_s=self.interval_s,
            sm_clock_mhz_min=min(clocks) if clocks else None,
            sm_clock_mhz_median=statistics.median(clocks) if clocks else None,
            sm_clock_mhz_max=max(clocks) if clocks else None,
            power_w_max=max(power) if power else None,
            throttled_fraction=(sum(bool(x & SLOWDOWN_MASK) for x in reasons)
                                / len(reasons)) if reasons else None,
            throttle_reasons_seen=reason_names(rs))


_MONITOR: GpuMonitor | None = None
_MONITOR_TRIED = False


def gpu_monitor() -> GpuMonitor | None:
    """The process's NVML sampler of the CUDA device in use, started on first use
    (None without nvidia-ml-py, NVML or a matching device)."""
    global _MONITOR, _MONITOR_TRIED
    if _MONITOR is None and not _MONITOR_TRIED:
        _MONITOR_TRIED = True
        pynvml = load_pynvml()
        if pynvml is None:
            return None
        try:
            pynvml.nvmlInit()
            h, _ = nvml_handle(pynvml)
        except Exception:
            return None
        if h is not None:
            _MONITOR = GpuMonitor(pynvml, h).start()
    return _MONITOR


def stop_gpu_monitor() -> MonitorSummary | None:
    """Stop the sampler (if running) and return its summary."""
    global _MONITOR, _MONITOR_TRIED
    m, _MONITOR, _MONITOR_TRIED = _MONITOR, None, False
    if m is None:
        return None
    m.stop()
    return m.summary()


def nvml_snapshot() -> NvmlSnapshot | None:
    """Clocks, power and clock-event reasons of the CUDA device in use (matched to its
    NVML device by UUID or PCI bus id), where readable; with the run's sampler summary
    once one is running.  A JSON document: the run's metadata telemetry.nvml_start and
    nvml_end, read back by NvmlFacts.of."""
    pynvml = load_pynvml()
    if pynvml is None:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        try:
            h, how = nvml_handle(pynvml)
        except Exception as e:
            return {"nvml_device": None, "nvml_match": error_message(e)}
        snap: NvmlSnapshot = {"nvml_match": how}
        with contextlib.suppress(Exception):
            snap["driver"] = decode_nvml(pynvml.nvmlSystemGetDriverVersion())
        if h is not None:
            snap.update(_device_snapshot(pynvml, h))
        return snap
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _device_snapshot(pynvml: Any, h: Any) -> NvmlSnapshot:
    """nvml_snapshot's part read from the device (its document's keys, in order)."""
    snap: NvmlSnapshot = {}
    with contextlib.suppress(Exception):
        snap["nvml_uuid"] = decode_nvml(pynvml.nvmlDeviceGetUUID(h))
    r = nvml_reading(pynvml, h)
    snap.update(sm_clock_mhz=r.sm_clock_mhz, power_w=r.power_w, temperature_c=r.temperature_c,
                clock_reasons=r.clock_reasons, gpu_util_pct=r.gpu_util_pct,
                energy_mj=r.energy_mj)
    snap["mem_clock_mhz"] = _or_none(
        lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
    snap["max_sm_clock_mhz"] = _or_none(
        lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
    snap["power_limit_w"] = _or_none(
        lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0)
    # Reasons only: a reading at the run's (idle) ends cannot say whether a timing
    # was throttled; that is judged per row, by its clock (throttle_state).
    tr = r.reasons
    snap["throttle_reasons"] = throttle_names(tr) if tr is not None else None
    if _MONITOR is not None:
        during = _MONITOR.summary()
        snap["during_run"] = during.to_json()
    return snap


def _or_none(read: Callable[[], float]) -> float | None:
    """A value NVML may not give (unsupported on the device): None then."""
    try:
        return read()
    except Exception:
        return None
