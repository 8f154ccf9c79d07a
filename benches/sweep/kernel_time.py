"""A GPU row's kernel-only time: torch.profiler (CUPTI) over a few calls in the row's
cache mode (a cold row's each after an L2 flush), apart from the timing, and the sum of
the device work's durations (kernels, memcpy, memset) per call: `kernel_ms`, beside the
events' `ms_median`; and which kernels ran
(`kernels`: the library kernel torch chose, the Triton kernel).  Events' time above the
kernels' by more than 10% is a launch gap (roofline/report/energy.py): the GPU waited
between the calls' kernels, for the host or for launches.

The events come from the live profiler (`events_from_profiler`) or from a trace it
exported (`events_from_trace`, chrome-trace JSON: export_chrome_trace), so a recorded
trace stands in for the GPU in the tests.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benches.step.profile import is_device_event, profile_events
from benches.sweep.failures import error_message, is_sticky_cuda_error
from contract.libraries import library_of
from contract.meta_parts import KernelTimeSource
from contract.record import Profile

# Device work in an exported trace's "cat" (kineto's activity types); GPU user
# annotations ("gpu_user_annotation", record_function ranges) are spans, not work.
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
# Calls profiled per row, and the device time they may take together (s): a long GEMM
# gets fewer calls (never fewer than one).
PROFILED_CALLS = 5
PROFILE_BUDGET_S = 0.01
# Characters of the `kernels` column at most (cuBLAS's names are long templates).
KERNELS_TEXT_MAX = 400


@dataclass(frozen=True)
class DeviceEvent:
    name: str
    dur_us: float
    # On the profiler's clock: orders the device work (not part of what the event is).
    start_us: float = field(default=0.0, compare=False)


@dataclass(frozen=True)
class KernelTime:
    kernel_ms: float  # device work per call
    kernels: str  # the work's names, once each, in order of first appearance
    library: str | None  # the library the kernels come from (contract/libraries.py)


def events_from_profiler(events: Iterable[Any]) -> list[DeviceEvent]:
    """Device work of a live profiler's event list (FunctionEvent: device_type not CPU),
    each once; user annotations left out."""
    return [DeviceEvent(str(e.name), float(e.time_range.elapsed_us()),
                        float(getattr(e.time_range, "start", 0.0))) for e in events
            if is_device_event(e) and not getattr(e, "is_user_annotation", False)]


# A dict: torch.profiler's own trace document (its shape is torch's), read here only.
def events_from_trace(doc: dict[str, Any]) -> list[DeviceEvent]:
    """Device work of an exported chrome trace ({"traceEvents": [...]}, the JSON document
    torch.profiler writes and only this reads): complete events
    ("ph": "X") of a DEVICE_WORK category, their `dur` in µs."""
    out = []
    for e in doc.get("traceEvents", []):
        if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in DEVICE_WORK \
                and isinstance(e.get("dur"), int | float):
            out.append(DeviceEvent(str(e.get("name", "")), float(e["dur"]),
                                   float(e.get("ts") or 0.0)))
    return out


def read_trace(path: str | Path) -> list[DeviceEvent]:
    return events_from_trace(json.loads(Path(path).read_text()))


def short_name(name: str) -> str:
    """A C++ kernel's name ("void f<...>(...)") without "void ", its template arguments
    and its parameter list: at::native::vectorized_elementwise_kernel; other names
    (nvjet_hsh_256x128_..., a Triton kernel's, "Memset (Device)") as they are."""
    name = name.strip()
    if not name.startswith("void "):
        return name
    return re.split(r"[<(]", name[5:], maxsplit=1)[0].strip() or name


def kernel_time(events: list[DeviceEvent], calls: int) -> KernelTime | None:
    """Device work per call over `calls` profiled calls (None when none was seen)."""
    if not events or calls < 1:
        return None
    names = list(dict.fromkeys(short_name(e.name) for e in events))
    text = "; ".join(names)
    if len(text) > KERNELS_TEXT_MAX:
        text = text[:KERNELS_TEXT_MAX - 3] + "..."
    # The library from the full names: a short name may have lost what tells it apart.
    return KernelTime(sum(e.dur_us for e in events) / calls / 1e3, text,
                      library_of(e.name for e in events))


def calls_to_profile(call_s: float | None) -> int:
    """PROFILED_CALLS, fewer where they would take over PROFILE_BUDGET_S of device time."""
    if not call_s or call_s <= 0:
        return PROFILED_CALLS
    return max(1, min(PROFILED_CALLS, int(PROFILE_BUDGET_S / call_s)))


def without_flushes(events: list[DeviceEvent], flush: Counter[str], flushes: int
                    ) -> list[DeviceEvent]:
    """`events` less the device work of `flushes` L2 flushes, each run before one call
    (`flush`: the names one flush ran, and how often each).  The work runs in order on one
    stream, flush then call, so where it splits into `flushes` equal groups each group's
    first events are its flush's: a provider whose own kernel shares the flush's name
    keeps its launches.  Else by name and count, the earliest first."""
    ordered = sorted(events, key=lambda e: e.start_us)
    k = sum(flush.values())
    if flushes and k and len(ordered) % flushes == 0 and len(ordered) // flushes > k:
        group = len(ordered) // flushes
        heads = [e for i in range(0, len(ordered), group) for e in ordered[i:i + k]]
        if Counter(e.name for e in heads) == Counter(
                {name: n * flushes for name, n in flush.items()}):
            return [e for i in range(0, len(ordered), group) for e in ordered[i + k:i + group]]
    left = Counter({name: n * flushes for name, n in flush.items()})
    out = []
    for e in ordered:
        if left[e.name] > 0:
            left[e.name] -= 1
            continue
        out.append(e)
    return out


_FLUSH_KERNELS: Counter[str] | None = None
# Flushes profiled to learn one flush's device work: CUPTI may drop the first kernels of
# a profiling session (pytorch/pytorch#192021), so one flush alone could read as none.
FLUSHES_PROFILED = 3


def flush_kernels(flush: Callable[[], object]) -> Counter[str]:
    """The device work one L2 flush runs (names and counts): FLUSHES_PROFILED flushes
    profiled, each name's count over them rounded (a dropped first launch leaves it the
    same), once a process; an empty answer is not kept (asked again next time)."""
    global _FLUSH_KERNELS
    if _FLUSH_KERNELS is None:
        import torch

        torch.cuda.synchronize()

        def flushes() -> None:
            for _ in range(FLUSHES_PROFILED):
                flush()

        seen = Counter(e.name for e in events_from_profiler(profile_events(flushes,
                                                                          on_gpu=True)))
        one = Counter({n: k for n, c in seen.items()
                       if (k := round(c / FLUSHES_PROFILED)) >= 1})
        if not one:
            return one
        _FLUSH_KERNELS = one
    return _FLUSH_KERNELS


def profile_calls(call: Callable[[], object], calls: int,
                  flush: Callable[[], object] | None = None) -> KernelTime | None:
    """torch.profiler (CPU and CUDA activity) over `calls` calls, the GPU idle before
    them: back to back (a warm row), or each after an L2 flush (`flush`: a cold row),
    whose own kernel is then left out (without_flushes), so that a cold row's kernel time
    is taken cold as its samples are.  The row's call ran in its check and its timing
    just before, so no lazy first launch is left to keep out (an unprofiled call before
    them would cost a backward pass its whole device time again)."""
    import torch

    torch.cuda.synchronize()

    def run() -> None:
        for _ in range(calls):
            if flush is not None:
                flush()
            call()

    events = events_from_profiler(profile_events(run, on_gpu=True))
    if flush is not None:
        events = without_flushes(events, flush_kernels(flush), calls)
    return kernel_time(events, calls)


def row_profile(call: Callable[[], object], call_s: float | None, provider: str = "",
                flush: Callable[[], object] | None = None) -> tuple[Profile, str]:
    """A GPU row's Profile group (kernel_ms, kernels, library) and a note for its reason:
    why it is empty, where the profiler failed or saw no device work.  A Triton row's
    library is this project's Triton whatever the profiler names.  `flush`: a cold row's
    L2 flush, run before each profiled call (profile_calls)."""
    known = "triton" if provider == "triton" else None
    try:
        got = profile_calls(call, calls_to_profile(call_s), flush)
    except Exception as e:
        if is_sticky_cuda_error(e):
            raise  # run_case aborts the sweep on it (SweepAborted), as on a timing error
        return Profile(library=known), f"kernel_ms: torch.profiler failed ({error_message(e)})"
    if got is None:
        return Profile(library=known), "kernel_ms: the profiler saw no kernel"
    return Profile(got.kernel_ms, got.kernels, known or got.library), ""


def kernel_time_metadata(kind: str) -> KernelTimeSource:
    """The run's metadata key `kernel_time`: where kernel_ms comes from, or why not."""
    if kind != "cuda":
        return {"source": None, "reason": (
            "no GPU: kernel_ms is the device kernels' time under torch.profiler (CUPTI); "
            "a CPU call is its own time (ms_median)")}
    return {"source": "torch.profiler", "reason": (
        f"device kernels, memcpy and memset per call over up to {PROFILED_CALLS} "
        f"calls (at most {PROFILE_BUDGET_S * 1e3:g} ms of them) after the timing, in the "
        "row's cache mode: each after an L2 flush for a cold row (the flush's own kernel "
        "left out by name and count), back to back for a warm one")}
