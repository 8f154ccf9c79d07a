"""The GPU's clocks, power and throttling through NVML (nvidia-ml-py), read from the NVML
device that is the CUDA device in use, and nvbench-style throttle handling of a timing:
a timing whose SM clock sat below a share of the maximum is taken again after a pause,
and marked if it stays throttled.

Light on imports (torch only) and free of the sweep: benches.sweep.runner calls
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

from benches.sweep.failures import error_message
from benches.sweep.sample_clocks import keep_unthrottled

T = TypeVar("T")


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


def throttle_names(reasons: int) -> list[str]:
    return [n for n, bit in SLOWDOWN_REASONS.items() if reasons & bit]


def is_idle(reading: dict[str, Any]) -> bool:
    """A reading of an idle GPU: flagged GPU-idle by NVML, or no kernel ran during
    NVML's last utilization period (1/6 s to 1 s).  A timing's window also spans host
    work with the GPU waiting (a CUDA graph's dispatch bursts, input copies and capture):
    the clock read then is an idle or falling clock, not the one the kernels ran at."""
    reasons, util = reading.get("clock_reasons"), reading.get("gpu_util_pct")
    return (isinstance(reasons, int) and bool(reasons & GPU_IDLE_REASON)) or \
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


# A light reading (GpuMonitor.fast, during a timing): what a sample's clock, the idle
# rule and the row's energy need, three NVML calls.
LIGHT_KEYS = ("sm_clock_mhz", "clock_reasons", "energy_mj")


def nvml_reading(pynvml: Any, h: Any, light: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
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
    out: dict[str, Any] = {"t": clock()}
    for key, read in readers.items():
        if light and key not in LIGHT_KEYS:
            continue
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
                 keep: int = 100_000, fast_interval_s: float = 0.01,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pynvml, self.handle, self.interval_s = pynvml, handle, interval_s
        # During a timing (fast()) light readings every fast_interval_s between the full
        # ones: each sample's clock (benches/sweep/sample_clocks.py) and the energy counter.
        self.fast_interval_s, self.clock = fast_interval_s, clock
        self._fast = threading.Event()
        self.last_readings: list[dict[str, Any]] = []
        self.last_busy: list[dict[str, Any]] = []
        self.readings: deque[dict[str, Any]] = deque(maxlen=keep)
        # The busy readings of the timing windows (see window): what the run's clocks,
        # power and throttle facts describe, not the compile and reference work between
        # them nor the idle spells inside a window (counted in idle_in_windows).
        self.timed: deque[dict[str, Any]] = deque(maxlen=keep)
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

    def sample(self, light: bool = False) -> dict[str, Any]:
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
        self._fast.set()
        try:
            yield
        finally:
            self._fast.clear()

    def _loop(self) -> None:
        next_full = 0.0
        while not self._stop.wait(self.fast_interval_s if self._fast.is_set()
                                  else self.interval_s):
            light = self._fast.is_set() and self.clock() < next_full
            self.sample(light)
            next_full = next_full if light else self.clock() + self.interval_s

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s + 1)
            self._thread = None

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """A timing's clock over [t0, t1] plus one reading taken now (a row shorter than
        the sampling interval still gets one), from the readings of a busy GPU (is_idle):
        the median SM clock (None when every reading was idle or unreadable), the
        power/thermal clock-event reasons seen, and how many idle readings were left out.
        The busy readings are kept for the run's summary."""
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
            busy = [r for r in rs if not is_idle(r)]
            # The last window's readings: each sample's clock, the row's energy.
            self.last_readings, self.last_busy = rs, busy
            self.timed.extend(busy)
            self.idle_in_windows += len(rs) - len(busy)
        clocks = [r["sm_clock_mhz"] for r in busy
                  if isinstance(r.get("sm_clock_mhz"), int | float)]
        reasons = [r["clock_reasons"] for r in busy if isinstance(r.get("clock_reasons"), int)]
        return {
            "sm_clock_mhz": float(statistics.median(clocks)) if clocks else None,
            "throttle_reasons": sorted({n for x in reasons for n in throttle_names(x)}),
            "idle_readings": len(rs) - len(busy),
        }

    def summary(self) -> dict[str, Any]:
        """Over the busy readings of every timing window so far (window): SM clock range,
        peak power, and the share of readings that carried a power/thermal clock-event
        reason (`throttled_fraction`: reported, not a throttle verdict); `readings`
        counts them, `readings_idle` the idle ones left out, `readings_all` every
        reading."""
        with self._lock:
            rs, n_all, n_idle = list(self.timed), len(self.readings), self.idle_in_windows
        clocks = [r["sm_clock_mhz"] for r in rs if isinstance(r.get("sm_clock_mhz"), int | float)]
        power = [r["power_w"] for r in rs if isinstance(r.get("power_w"), int | float)]
        reasons = [r["clock_reasons"] for r in rs if isinstance(r.get("clock_reasons"), int)]
        seen = sorted({n for x in reasons for n in throttle_names(x)})
        return {
            "readings": len(rs),
            "readings_idle": n_idle,
            "readings_all": n_all,
            "interval_s": self.interval_s,
            "sm_clock_mhz_min": min(clocks) if clocks else None,
            "sm_clock_mhz_median": statistics.median(clocks) if clocks else None,
            "sm_clock_mhz_max": max(clocks) if clocks else None,
            "power_w_max": max(power) if power else None,
            "throttled_fraction": (sum(bool(x & SLOWDOWN_MASK) for x in reasons)
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
        snap: dict[str, Any] = {"nvml_match": how}
        with contextlib.suppress(Exception):
            snap["driver"] = decode_nvml(pynvml.nvmlSystemGetDriverVersion())
        if h is None:
            return snap
        with contextlib.suppress(Exception):
            snap["nvml_uuid"] = decode_nvml(pynvml.nvmlDeviceGetUUID(h))
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
        # Reasons only: a reading at the run's (idle) ends cannot say whether a timing
        # was throttled; that is judged per row, by its clock (throttle_state).
        tr = snap.get("clock_reasons")
        snap["throttle_reasons"] = throttle_names(tr) if isinstance(tr, int) else None
        if _MONITOR is not None:
            snap["during_run"] = _MONITOR.summary()
        return snap
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


# ---- throttle handling (nvbench's --throttle-threshold / --throttle-recovery-delay) ----
#
# The rule, as nvbench's: a timing is throttled when the SM clock it ran at sat below
# threshold_pct of the GPU's maximum SM clock, and only then.  nvbench times the clock
# over each trial (nvbench/detail/gpu_frequency.cxx, has_throttled: the measured rate
# below threshold x cudaDevAttrClockRate, default 75%) and reads no clock-event reasons.
# Here the clock is NVML's SM clock, the median over the busy readings of the timing's
# window (GpuMonitor.window).  The reasons NVML gives are reported beside the clock (the
# row's reason, the run's summary), never judged alone:
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


def _reasons_text(window: dict[str, Any]) -> str:
    names = window.get("throttle_reasons") or []
    return f"clock-event reasons {', '.join(names)}" if names else ""


def throttle_state(window: dict[str, Any], max_sm_clock_mhz: float | None,
                   cfg: ThrottleConfig) -> str | None:
    """Why a timing window counts as throttled (its SM clock below the threshold, with
    the reasons NVML gave), or None when it does not or cannot be told (no busy reading,
    no known maximum)."""
    clock = window.get("sm_clock_mhz")
    if not (isinstance(clock, int | float) and max_sm_clock_mhz and
            clock < cfg.threshold_pct / 100.0 * max_sm_clock_mhz):
        return None
    why = (f"SM clock {clock:.0f} MHz, below {cfg.threshold_pct:g}% of its "
           f"{max_sm_clock_mhz:.0f} MHz maximum")
    reasons = _reasons_text(window)
    return f"{why}; {reasons}" if reasons else why


def _span(timing: Any) -> tuple[float, float] | None:
    """The time.monotonic() span a timer reports for its samples (`span`: the start of
    its first sample, the end of its last), where it reports one."""
    span = getattr(timing, "span", None)
    if isinstance(span, tuple) and len(span) == 2 and \
            all(isinstance(x, int | float) for x in span) and span[0] <= span[1]:
        return float(span[0]), float(span[1])
    return None


def time_unthrottled(time_fn: Callable[[], tuple[T, str]], monitor: Any,
                     cfg: ThrottleConfig, sleep: Callable[[float], None] = time.sleep
                     ) -> tuple[T, str, dict[str, Any]]:
    """(timing, note, row columns) of `time_fn` under the monitor's NVML window, taken
    again after a pause while throttled (ThrottleConfig).  The window is the timing's
    own samples where the timer reports their span (a CUDA graph's capture and the
    copies made for it then stay out), else the whole call.  The columns are the last
    timing's median SM clock and whether it was throttled; the note says what was done,
    and which clock-event reasons NVML gave while it ran."""
    max_clock = getattr(monitor, "max_sm_clock_mhz", None)
    fast = getattr(monitor, "fast", contextlib.nullcontext)
    attempt = 0
    while True:
        t0 = time.monotonic()
        with fast():
            timing, note = time_fn()
        window = monitor.window(*(_span(timing) or (t0, time.monotonic())))
        why = throttle_state(window, max_clock, cfg)
        # nvbench's rule per sample where each sample's clock is known: the slow samples
        # are left out, and the timing is taken again only when too few would be left.
        busy = getattr(monitor, "last_busy", None)
        kept = keep_unthrottled(timing, busy, cfg.threshold_pct / 100 * max_clock) \
            if max_clock and busy else None
        if kept is not None:
            timing, dropped, clock = kept
            why, window = None, {**window, "sm_clock_mhz": clock or window.get("sm_clock_mhz")}
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
    if kept is not None and dropped:
        said = "; ".join(x for x in (said, (
            f"{dropped} of {dropped + timing.n_samples} samples left out: SM clock below "
            f"{cfg.threshold_pct:g}% of {max_clock:.0f} MHz")) if x)
    reasons = _reasons_text(window)
    clock = window.get("sm_clock_mhz")
    if reasons and why is None and isinstance(clock, int | float):
        # Reported beside the clock, as the row's verdict rests on the clock alone.
        above = (f", above {cfg.threshold_pct:g}% of {max_clock:.0f} MHz: not throttled"
                 if max_clock else "")
        said = "; ".join(x for x in (said, f"{reasons} at SM clock {clock:.0f} MHz{above}")
                         if x)
    if said:
        note = f"{note}; {said}" if note else said
    cols = {"sm_clock_mhz": window.get("sm_clock_mhz"), "throttled": why is not None}
    return timing, note, cols | ({"throttled_samples": dropped} if kept is not None else {})


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
            "readings_idle_left_out": during.get("readings_idle"),
            "throttled_fraction_of_readings": during.get("throttled_fraction"),
            "reasons_seen": during.get("throttle_reasons_seen") or [],
            "throttled_rows": len(throttled),
        },
    }
