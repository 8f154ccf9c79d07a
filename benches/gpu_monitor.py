"""The GPU's clocks, power and throttling through NVML (nvidia-ml-py), read from the NVML
device that is the CUDA device in use, and nvbench-style throttle handling of a timing:
a timing during which the GPU throttled is taken again after a pause, and marked if it
stays throttled.

Light on imports (torch only) and free of the sweep: benches.runner calls
`time_unthrottled` around each GPU row's timing.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def _message(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


# Clock-event ("throttle") reason bits that mean the GPU slowed itself down (nvml.h):
# SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake
# 0x80.  Not counted: GPU idle 0x1, application clocks setting 0x2, sync boost 0x10,
# display clock 0x100 (none of them lowers a busy kernel's clock below what was asked).
REAL_THROTTLE_REASONS: dict[str, int] = {
    "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}
REAL_THROTTLE_MASK = sum(REAL_THROTTLE_REASONS.values())


def throttle_names(reasons: int) -> list[str]:
    return [n for n, bit in REAL_THROTTLE_REASONS.items() if reasons & bit]


def _nvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _decode(v: Any) -> Any:
    return v.decode() if isinstance(v, bytes) else v


def _norm_uuid(u: Any) -> str:
    s = str(_decode(u) or "").strip().lower()
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


def nvml_reading(pynvml: Any, h: Any) -> dict[str, Any]:
    """One reading: SM clock (MHz), power (W), temperature (C), clock-event reasons."""
    readers = {
        "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
        "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
            h, pynvml.NVML_TEMPERATURE_GPU),
        "clock_reasons": lambda: _clock_reasons(pynvml, h),
    }
    out: dict[str, Any] = {"t": time.monotonic()}
    for key, read in readers.items():
        try:
            out[key] = read()
        except Exception:
            out[key] = None
    return out


class GpuMonitor:
    """Samples the CUDA device's clocks, power and clock-event reasons through NVML on a
    background thread (every `interval_s`), so each row can say at what SM clock it ran
    and whether the GPU throttled while it ran, not only at the run's idle ends."""

    def __init__(self, pynvml: Any, handle: Any, interval_s: float = 0.1,
                 keep: int = 100_000) -> None:
        self.pynvml, self.handle, self.interval_s = pynvml, handle, interval_s
        self.readings: deque[dict[str, Any]] = deque(maxlen=keep)
        # The readings of the timing windows (see window): what the run's clocks, power
        # and throttle facts describe, not the compile and reference work between them.
        self.timed: deque[dict[str, Any]] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The SM clock the GPU may boost to: what the throttle threshold is a share of.
        try:
            self.max_sm_clock_mhz: float | None = float(
                pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        except Exception:
            self.max_sm_clock_mhz = None

    def sample(self) -> dict[str, Any]:
        r = nvml_reading(self.pynvml, self.handle)
        with self._lock:
            self.readings.append(r)
        return r

    def start(self) -> GpuMonitor:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="nvml-sampler",
                                            daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 1)
            self._thread = None

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """Per-row columns over [t0, t1] plus one reading taken now (a row shorter than
        the sampling interval still gets one): the median SM clock, and whether any
        reading showed a real throttle reason.  The window's readings are kept for the
        run's summary."""
        now = self.sample()
        rs: list[dict[str, Any]] = []
        with self._lock:
            # Newest first, stopping at the window's start: a row costs its own readings,
            # not the run's (the deque holds up to `keep` readings).
            for r in reversed(self.readings):
                if r["t"] < t0:
                    break
                if r["t"] <= t1 and r is not now:
                    rs.append(r)
            rs.reverse()
            rs.append(now)
            self.timed.extend(rs)
        clocks = [r["sm_clock_mhz"] for r in rs if isinstance(r.get("sm_clock_mhz"), int | float)]
        reasons = [r["clock_reasons"] for r in rs if isinstance(r.get("clock_reasons"), int)]
        return {
            "sm_clock_mhz": float(statistics.median(clocks)) if clocks else None,
            "throttled": any(bool(x & REAL_THROTTLE_MASK) for x in reasons)
            if reasons else None,
            "throttle_reasons": sorted({n for x in reasons for n in throttle_names(x)}),
        }

    def summary(self) -> dict[str, Any]:
        """Over the readings of every timing window so far (window): SM clock range, peak
        power, throttle share; `readings` counts them, `readings_all` every reading."""
        with self._lock:
            rs, n_all = list(self.timed), len(self.readings)
        clocks = [r["sm_clock_mhz"] for r in rs if isinstance(r.get("sm_clock_mhz"), int | float)]
        power = [r["power_w"] for r in rs if isinstance(r.get("power_w"), int | float)]
        reasons = [r["clock_reasons"] for r in rs if isinstance(r.get("clock_reasons"), int)]
        seen = sorted({n for x in reasons for n in throttle_names(x)})
        return {
            "readings": len(rs),
            "readings_all": n_all,
            "interval_s": self.interval_s,
            "sm_clock_mhz_min": min(clocks) if clocks else None,
            "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
            "sm_clock_mhz_max": max(clocks) if clocks else None,
            "power_w_max": max(power) if power else None,
            "throttled_fraction": (sum(bool(x & REAL_THROTTLE_MASK) for x in reasons)
                                   / len(reasons)) if reasons else None,
            "throttle_reasons_seen": seen,
        }


_MONITOR: GpuMonitor | None = None
_MONITOR_TRIED = False


def gpu_monitor() -> GpuMonitor | None:
    """The process's NVML sampler of the CUDA device in use, started on first use
    (None without nvidia-ml-py, NVML or a matching device)."""
    global _MONITOR, _MONITOR_TRIED
    if _MONITOR is None and not _MONITOR_TRIED:
        _MONITOR_TRIED = True
        pynvml = _nvml()
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


def stop_gpu_monitor() -> dict[str, Any] | None:
    """Stop the sampler (if running) and return its summary."""
    global _MONITOR, _MONITOR_TRIED
    m, _MONITOR, _MONITOR_TRIED = _MONITOR, None, False
    if m is None:
        return None
    m.stop()
    return m.summary()


def nvml_snapshot() -> dict[str, Any] | None:
    """Clocks, power and clock-event reasons of the CUDA device in use (matched to its
    NVML device by UUID or PCI bus id), where readable; with the run's sampler summary
    once one is running."""
    pynvml = _nvml()
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
            return {"nvml_device": None, "nvml_match": _message(e)}
        snap: dict[str, Any] = {"nvml_match": how}
        with contextlib.suppress(Exception):
            snap["driver"] = _decode(pynvml.nvmlSystemGetDriverVersion())
        if h is None:
            return snap
        with contextlib.suppress(Exception):
            snap["nvml_uuid"] = _decode(pynvml.nvmlDeviceGetUUID(h))
        reading = nvml_reading(pynvml, h)
        reading.pop("t", None)
        snap.update(reading)
        extra = {
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(
                h, pynvml.NVML_CLOCK_SM),
            "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
        }
        for key, read in extra.items():
            try:
                snap[key] = read()
            except Exception:
                snap[key] = None
        tr = snap.get("clock_reasons")
        snap["throttled"] = bool(tr & REAL_THROTTLE_MASK) if isinstance(tr, int) else None
        snap["throttle_reasons"] = throttle_names(tr) if isinstance(tr, int) else None
        if _MONITOR is not None:
            snap["during_run"] = _MONITOR.summary()
        return snap
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


# ---- throttle handling (nvbench's --throttle-threshold / --throttle-recovery-delay) ----

@dataclass(frozen=True)
class ThrottleConfig:
    """When a GPU timing counts as throttled, and what is done about it.

    As nvbench does (its --throttle-threshold, default 75%, and
    --throttle-recovery-delay, default 0.05 s): a timing during which the median SM clock
    sat below `threshold_pct` of the GPU's maximum SM clock, or a real throttle reason
    (power cap, thermal, hardware slowdown) was seen, is taken again after
    `recovery_delay_s`, up to `retries` times; if the last one is throttled too, the row
    keeps it and is marked (`throttled`), so the regression gate can tell a hot or
    power-capped GPU from slower code."""

    threshold_pct: float = 75.0
    recovery_delay_s: float = 0.05
    retries: int = 3

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def throttle_state(window: dict[str, Any], max_sm_clock_mhz: float | None,
                   cfg: ThrottleConfig) -> str | None:
    """Why a timing window counts as throttled, or None when it does not."""
    reasons = window.get("throttle_reasons") or []
    if reasons or window.get("throttled"):
        return "clock-event reasons: " + (", ".join(reasons) or "power/thermal")
    clock = window.get("sm_clock_mhz")
    if isinstance(clock, int | float) and max_sm_clock_mhz and \
            clock < cfg.threshold_pct / 100.0 * max_sm_clock_mhz:
        return (f"SM clock {clock:.0f} MHz, below {cfg.threshold_pct:g}% of its "
                f"{max_sm_clock_mhz:.0f} MHz maximum")
    return None


def time_unthrottled(time_fn: Callable[[], tuple[T, str]], monitor: Any,
                     cfg: ThrottleConfig, sleep: Callable[[float], None] = time.sleep
                     ) -> tuple[T, str, dict[str, Any]]:
    """(timing, note, row columns) of `time_fn` under the monitor's NVML window, taken
    again after a pause while throttled (ThrottleConfig).  The columns are the last
    timing's median SM clock and whether it was throttled; the note says what was done."""
    max_clock = getattr(monitor, "max_sm_clock_mhz", None)
    attempt = 0
    while True:
        t0 = time.monotonic()
        timing, note = time_fn()
        window = monitor.window(t0, time.monotonic())
        why = throttle_state(window, max_clock, cfg)
        if why is None or attempt >= cfg.retries:
            break
        attempt += 1
        sleep(cfg.recovery_delay_s)
    if why is not None:
        said = f"GPU throttled in all {attempt + 1} timings ({why}): kept and marked"
    elif attempt:
        said = f"timed again {attempt}x after the GPU throttled"
    else:
        said = ""
    if said:
        note = f"{note}; {said}" if note else said
    return timing, note, {"sm_clock_mhz": window.get("sm_clock_mhz"),
                          "throttled": why is not None}



def run_clock_facts(during: dict[str, Any] | None, start: dict[str, Any] | None,
                    rows: list[dict[str, Any]], cfg: ThrottleConfig) -> dict[str, Any]:
    """The run's metadata keys `clocks`, `power` and `throttle` (what summary.md shows):
    from the sampler's summary over the run (`during`), the NVML snapshot at its start,
    and the rows' own `throttled` marks."""
    during, start = during or {}, start or {}
    throttled = [r for r in rows if r.get("throttled") is True]
    return {
        "clocks": {
            "sm_mhz_min": during.get("sm_clock_mhz_min"),
            "sm_mhz_median": during.get("sm_clock_mhz_median"),
            "sm_mhz_max": during.get("sm_clock_mhz_max"),
            "sm_mhz_max_possible": start.get("max_sm_clock_mhz"),
            "mem_mhz": start.get("mem_clock_mhz"),
        },
        "power": {"max_w": during.get("power_w_max"),
                  "limit_w": start.get("power_limit_w")},
        "throttle": {
            **cfg.as_dict(),
            "readings": during.get("readings"),
            "throttled_fraction_of_readings": during.get("throttled_fraction"),
            "reasons_seen": during.get("throttle_reasons_seen") or [],
            "throttled_rows": len(throttled),
        },
    }
