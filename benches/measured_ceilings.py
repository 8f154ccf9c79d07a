"""The ceilings measured on the device present: a large copy for memory bandwidth, a
small one for cache bandwidth, the best of large matrix products per roof class for
compute (what the vendor library reaches is what a kernel can hope for), cached per
device and software versions.  What they mean, and their format in a run's metadata,
is contract/ceilings.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from benches.timing.clock import (
    flush_padding_us,
    flushed_sampler,
    host_dispatch_us,
    time_cpu,
    time_flushed,
)
from benches.timing.interleave import interleave, sustain
from benches.timing.plan import (
    TIMER_CPU,
    TIMER_FLUSHED,
    TimingConfig,
    plan_best_of_cpu,
)
from contract.ceilings import Ceilings, datasheet_of, no_roofs
from contract.devices import ROOF_CLASSES, DeviceModel, Present
from contract.schema import atomic_write_text

CACHE_VERSION = 1
# When set, the one folder every command keeps its ceiling cache in, in place of the one
# it would use (run_bench's <out>/.ceilings, a fleet rank's own, the planner's and
# `pytest benches/`'s results/.ceilings).  The test suite points it at a temporary cache
# per session (tests/conftest.py), so running the tests never replaces measured peaks.
CACHE_DIR_ENV = "GPUBENCH_CEILINGS_DIR"


# ---- measurement ---------------------------------------------------------------------
# Compute ceilings are the best of large matrix products, the standard empirical
# roofline: what the vendor library reaches is what a kernel can hope for.

def _gemm_fn(roof_class: str, n: int, device: str):
    """(fn, flops) for an n x n x n product in the roof class's precision."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g)
    b = torch.randn(n, n, device=device, generator=g)
    flops = 2 * n**3
    if roof_class == "fp8":
        # The same call as the torch provider, so the ceiling accumulates in the fp8
        # mode the rows use (kernels.spec.fp8_accum; part of cache_key).
        from kernels.matmul import scaled_mm

        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major, as required
        one = torch.ones((), device=device)
        return (lambda: scaled_mm(a8, b8, one, one, torch.bfloat16)), flops
    dt = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
          "bf16": torch.bfloat16}[roof_class]
    a, b = a.to(dt), b.to(dt)
    from kernels.matmul import fp32_matmul_precision

    def fn():
        with fp32_matmul_precision(roof_class == "tf32"):
            return a @ b

    return fn, flops


# The sweep's own timers (benches/timing/clock.py) with a ceiling's longer measuring time:
# do_bench's rep of 200 ms for a GPU ceiling, 0.3 s of blocks on a CPU (cut to what fits
# in row_budget_s, 5 s, for a slow call: plan_best_of_cpu).  The stopping rule is off: a
# ceiling is the fastest sample, which fewer samples would make slower, not the median
# the rule settles.
CEILING_TIMING = TimingConfig(rep_ms=200.0, cpu_min_run_time_s=0.3, ci_rel_width=0.0)
def ceiling_timer(device: str) -> str:
    """The timer a ceiling is measured with (its TIMER_* name): on a GPU CUDA events with
    the L2 flushed before each call (the DRAM copy, the matmuls, the L2 probe's one long
    kernel); on a CPU timed blocks of calls on the same buffers."""
    return TIMER_FLUSHED if device == "cuda" else TIMER_CPU


def _time_ms(fn, device: str) -> float:
    """Best ms of fn: a ceiling is the most the hardware showed, so the fastest sample
    (not the median) is the estimator, which also keeps a busy host from lowering it.
    The timer is ceiling_timer's: CUDA events after an L2 flush, padded by the call's
    dispatch time; on a CPU blocks of calls on the same buffers, as many as fit in the
    budget (plan_best_of_cpu: fewer for a slow call, at least one after the warm-up
    call)."""
    if ceiling_timer(device) == TIMER_FLUSHED:
        import torch

        host_us = host_dispatch_us(fn, torch.cuda.synchronize)
        return float(min(time_flushed(fn, CEILING_TIMING, host_us).samples_ms))
    t0 = time.perf_counter()
    fn()  # warm-up, and the time of one call the samples are planned from
    plan = plan_best_of_cpu(time.perf_counter() - t0, CEILING_TIMING)
    return float(min(time_cpu(fn, CEILING_TIMING, plan).samples_ms))


# Seconds one call of a ceiling's matmul may take: a slower call is timed once (the
# call after its warm-up) instead of for _time_ms's 0.3 s and more.
CEILING_CALL_BUDGET_S = 0.5


def _sustained_ms(fn) -> tuple[float, str]:
    """A GPU compute ceiling's fastest sample, taken at the sustained clock as the sweep's
    compute-bound cases are (benches/timing/interleave.py): the GPU warmed up until its SM
    clock has stopped falling, then CEILING_TIMING's samples (flushed, padded by the
    call's dispatch); and the clock they ran at, for the ceiling's method."""
    import torch

    from benches.sweep.gpu_monitor import gpu_monitor

    host_us = host_dispatch_us(fn, torch.cuda.synchronize)
    sampler = flushed_sampler(fn, CEILING_TIMING, flush_padding_us(host_us))
    monitor = gpu_monitor()
    fast = monitor.fast() if monitor is not None else contextlib.nullcontext()
    # Windows on the monitor's own time base, which its readings carry.
    now = getattr(monitor, "clock", time.monotonic)
    with fast:
        warmed = sustain([sampler], CEILING_TIMING, monitor, now)
        got = interleave([sampler], CEILING_TIMING, now)[0]
    clock = monitor.clock_between(*got.span) if monitor is not None and got.span else None
    said = f"SM {clock:.0f} MHz" if clock else "SM clock unread"
    return float(min(got.samples)), (f"{said} after {warmed.ms:.0f} ms of warm-up"
                                     + ("" if warmed.settled else " (not settled)"))


def _budgeted_ms(fn, device: str, once_s: float | None = None) -> float:
    """_time_ms(fn), or for a call slower than CEILING_CALL_BUDGET_S on a CPU the time of
    the one call after the warm-up one.  `once_s`: the warm-up call's seconds, when the
    caller made it (else it is made here)."""
    if once_s is None:
        t0 = time.perf_counter()
        fn()  # warm-up, and whether it runs at all
        once_s = time.perf_counter() - t0
    if device != "cuda" and once_s > CEILING_CALL_BUDGET_S:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return _time_ms(fn, device)


def _copy_fn(nbytes: int, device: str, reps: int = 1):
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)

    def copy():
        for _ in range(reps):
            dst.copy_(src)

    return copy


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class MeasuredCeilings(TypedDict):
    """The ceilings measured (`measure`): a cache entry's JSON, and a run's
    metadata.ceilings.measured (contract/ceilings.py says what each means), in this key
    order.  GB/s None where not measured; `left_out` names each ceiling left out with
    why, `method[name]` how each was measured (or "left out: <why>").  A measurement
    that raised has neither time key; an older cache entry may lack `left_out`."""

    tflops: dict[str, float]
    hbm_gbps: float | None
    l2_gbps: float | None
    method: dict[str, str]
    left_out: NotRequired[dict[str, str]]
    measured_at: NotRequired[str]
    seconds: NotRequired[float]


CACHE_ATTEMPTS = 3
# How method[name] starts for a ceiling that was not recorded (its reason follows); the
# same reason is in the measurement's `left_out` (contract/ceilings.py).
LEFT_OUT = "left out"


def measure(present: Present, log=print) -> MeasuredCeilings:
    """Measure bandwidth and per-dtype compute ceilings on the device present.

    Never raises for a ceiling (only an interrupt goes through): one whose timing fails
    (an out-of-memory, a driver error) is left out, its reason in `left_out` and in its
    `method` entry, and the others are measured as usual."""
    device = "cuda" if present.kind == "cuda" else "cpu"
    t0 = time.perf_counter()
    left: dict[str, str] = {}
    out = MeasuredCeilings(tflops={}, hbm_gbps=None, l2_gbps=None, method={}, left_out=left)

    def leave_out(name: str, why: str) -> None:
        left[name] = why
        out["method"][name] = f"{LEFT_OUT}: {why}"
        log(f"  {name} ceiling left out: {why}")

    _measure_copy(out, device, log, leave_out)
    _measure_cache_copy(out, present, device, log, leave_out)
    sizes = (4096, 8192) if device == "cuda" else (256, 512, 1024)
    # fp4 has no per-tensor torch matmul to measure it with (only the block-scaled
    # torch._scaled_mm of sm_100): its roof is the datasheet's.
    classes = [c for c in ROOF_CLASSES
               if c != "fp4" and not (c == "tf32" and device != "cuda")]
    if device == "cuda" and (present.capability or (0, 0)) < (8, 9):
        classes = [c for c in classes if c != "fp8"]
    for rc in classes:
        _measure_class(out, rc, sizes, device, log, leave_out)
    for rc, why in no_roofs(out["tflops"]).items():
        log(f"  {rc}: not a roof: {why}")
    out["method"]["compute"] = (f"best of square matmuls {sizes}: torch.matmul, "
                                "torch._scaled_mm for fp8"
                                + (", each at the GPU's sustained clock (warmed up until "
                                   "its SM clock stopped falling)" if device == "cuda"
                                   else ""))
    out["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def _measure_copy(out: MeasuredCeilings, device: str, log, leave_out) -> None:
    """Memory: a device-to-device copy moves each byte twice (read + write)."""
    copy_bytes = (1 << 30) if device == "cuda" else (1 << 28)
    try:
        if device == "cuda":
            import torch

            free, _ = torch.cuda.mem_get_info()
            copy_bytes = min(copy_bytes, free // 8)
        ms = _time_ms(_copy_fn(copy_bytes, device), device)
    except Exception as e:  # the copy could not be timed: no DRAM ceiling measured
        leave_out("hbm", f"the copy of {copy_bytes / 2**20:.0f} MiB failed: {one_line(e)}")
        return
    out["hbm_gbps"] = 2 * copy_bytes / (ms * 1e-3) / 1e9
    out["method"]["hbm"] = f"copy of {copy_bytes / 2**20:.0f} MiB, read + write counted"
    log(f"  copy bandwidth {out['hbm_gbps']:.1f} GB/s")


def _measure_cache_copy(out: MeasuredCeilings, present: Present, device: str, log,
                        leave_out) -> None:
    """On-chip cache: a copy whose source and destination together fill a quarter of the
    GPU's L2 (or 4 MiB on a CPU, inside its L2/LLC), repeated without a flush so that
    all but the first pass hit in cache.  On a GPU one long Triton kernel makes the
    passes (benches/l2_probe.py: back-to-back copy kernels measured their launches as
    much as the cache); on a CPU, back-to-back copies (ceiling_timer)."""
    cache_bytes = int(present.l2_mb * 2**20) // 8 if device == "cuda" and present.l2_mb \
        else (1 << 21 if device == "cpu" else 0)
    if not cache_bytes:
        return
    hbm = out["hbm_gbps"]
    if hbm is None:
        leave_out("l2", "no DRAM copy was measured to check the cache copy against")
        return
    reps = 50
    # A cache copy slower than the DRAM copy is the host's load, not the cache: on a
    # loaded host with few cores each parallel copy_ waits a scheduler slice for its
    # second thread, at a small fraction of its speed alone (docs/measurement.md,
    # "Figures behind the code's choices").  Retried a few times, 1 s apart, and left
    # out rather than recorded as a roof below DRAM's.
    best = 0.0
    try:
        if device == "cuda":
            from benches.l2_probe import l2_copy

            probe = l2_copy(cache_bytes, present.sms or 1, device)
            # Flushed before each sample as the DRAM copy: the probe's first pass reads
            # from DRAM, ~0.2% of its milliseconds (l2_probe.BYTES_PER_CALL).
            fn, moved, method = probe.fn, probe.bytes_moved, probe.method
        else:
            fn, moved = _copy_fn(cache_bytes, device, reps), 2 * cache_bytes * reps
            method = f"{reps} back-to-back copies of {cache_bytes / 2**20:.1f} MiB"
        for attempt in range(CACHE_ATTEMPTS):
            if attempt:
                time.sleep(1.0)
            ms = _time_ms(fn, device)
            best = max(best, moved / (ms * 1e-3) / 1e9)
            if best > hbm:
                break
    except Exception as e:  # the copy could not be timed (or compiled)
        leave_out("l2", f"the cache copy failed: {one_line(e)}")
        return
    if best > hbm:
        out["l2_gbps"] = best
        out["method"]["l2"] = method
        log(f"  cache copy bandwidth {best:.1f} GB/s")
    else:
        leave_out("l2", f"{best:.1f} GB/s in {CACHE_ATTEMPTS} attempts, below the DRAM "
                        f"copy's {hbm:.1f} (host busy)")


def _measure_class(out: MeasuredCeilings, rc: str, sizes: tuple[int, ...], device: str,
                   log, leave_out) -> None:
    """Compute: the best of square matmuls of roof class `rc` over `sizes`."""
    best = 0.0
    for n in sizes:
        try:
            fn, flops = _gemm_fn(rc, n, device)
            t0 = time.perf_counter()
            fn()  # warm-up, and whether it runs at all
            once_s = time.perf_counter() - t0
        except Exception as e:  # a dtype the device/library cannot multiply
            out["method"][f"{rc}_error"] = one_line(e)
            break
        try:
            if device == "cuda":
                ms, clock = _sustained_ms(fn)
            else:
                ms, clock = _budgeted_ms(fn, device, once_s), ""
        except Exception as e:  # it runs, but its timing failed: no ceiling this time
            leave_out(rc, f"the {n}^3 matmul's timing failed: {one_line(e)}")
            return
        if flops / (ms * 1e-3) / 1e12 > best:
            best = flops / (ms * 1e-3) / 1e12
            if clock:
                out["method"][f"{rc}_clock"] = f"{n}^3: {clock}"
        # The next size does 8x the work: not where one call would take seconds (a
        # CPU without the dtype's unit: fp8 torch._scaled_mm at 14 MFLOP/s takes 150 s
        # a call at 1024^3).  4x the call budget of margin: a small size's time is
        # mostly fixed cost on some paths (one run here saw fp8 at 64 ms a call at
        # 256^3, 19 ms at 1024^3), and stopping there would understate the roof.
        if ms * 8 > 4 * CEILING_CALL_BUDGET_S * 1e3:
            out["method"][f"{rc}_sizes"] = f"stopped at {n}^3: {ms:.4g} ms a call"
            break
    if best:
        out["tflops"][rc] = best
        log(f"  {rc} matmul {best:.3f} TFLOP/s")


def cache_dir_of(out_root: Path) -> Path:
    """The ceiling cache a run under `out_root` reads ($GPUBENCH_CEILINGS_DIR where set)."""
    return Path(os.environ.get(CACHE_DIR_ENV) or out_root / ".ceilings")


def any_cached(out_root: Path) -> bool:
    """Whether that cache holds any entry: asked before the device is known (which entry
    is this device's needs torch and the GPU), where a run may skip measuring."""
    return any(cache_dir_of(out_root).glob("ceilings-*.json"))


def cache_key(present: Present, threads: int | None = None,
              fp8_mode: str | None = None) -> str:
    """The cache entry of `present` under this process's software, for a process running
    `threads` torch threads (default: this one's) in fp8 accumulation mode `fp8_mode`
    (default: the one in force)."""
    import torch

    try:
        import triton

        triton_v = triton.__version__
    except ImportError:
        triton_v = "-"
    from kernels.spec import fp8_accum

    # The fp8 ceiling depends on the accumulation mode, and a CPU's on the threads that
    # ran it (a fleet rank runs its share of the cores): one cache entry for each.
    ident = json.dumps([CACHE_VERSION, present.key, present.name, torch.__version__,
                        torch.version.cuda, triton_v,
                        torch.get_num_threads() if threads is None else threads,
                        fp8_mode or fp8_accum()])
    return f"{present.key}-{hashlib.sha1(ident.encode()).hexdigest()[:12]}"


def _positive(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) \
        and x > 0


def cache_problem(doc: Any) -> str | None:
    """Why a cached measurement cannot be used (None when it can): every roof a row is
    held against comes from it, so a list, a string where a number belongs, a
    non-positive value or a cache roof below the DRAM roof (a measurement under load)
    must not silently drop or corrupt roofs."""
    if not isinstance(doc, dict):
        return f"not a JSON object ({type(doc).__name__})"
    left_out = doc.get("left_out")
    if isinstance(left_out, dict) and left_out:
        return (f"{', '.join(map(str, left_out))} left out when it was measured "
                "(under load, or failed): measured again")
    tflops = doc.get("tflops")
    if not isinstance(tflops, dict) or not tflops:
        return "'tflops' is not a non-empty object"
    for rc, v in tflops.items():
        if rc not in ROOF_CLASSES or not _positive(v):
            return f"tflops[{rc!r}] = {v!r} is not a positive number of a known roof"
    if not _positive(doc.get("hbm_gbps")):
        return f"hbm_gbps = {doc.get('hbm_gbps')!r} is not a positive number"
    l2 = doc.get("l2_gbps")
    if l2 is not None and not _positive(l2):
        return f"l2_gbps = {l2!r} is not a positive number"
    method = doc.get("method")
    if isinstance(method, dict) and str(method.get("l2", "")).startswith(LEFT_OUT):
        return "the cache copy was left out (measured under load): measured again"
    if l2 is not None and l2 <= doc["hbm_gbps"]:
        return f"l2_gbps = {l2:g} is below hbm_gbps = {doc['hbm_gbps']:g} (measured under load)"
    if l2 is not None and isinstance(method, dict) and \
            "CUDA graph" in str(method.get("l2", "")):
        return ("the cache copy was copy kernels replayed in CUDA graphs, bound by their "
                "launches (benches/l2_probe.py): measured again")
    return None


def cached_entry(cache_dir: Path, present: Present) -> tuple[Path, Any]:
    """The cache entry of `present` in `cache_dir` (in $GPUBENCH_CEILINGS_DIR where that
    is set): its path and the document it holds (None where absent or unreadable)."""
    path = Path(os.environ.get(CACHE_DIR_ENV) or cache_dir) / f"ceilings-{cache_key(present)}.json"
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return path, None


def get_ceilings(model: DeviceModel, present: Present, cache_dir: Path, *,
                 measure_ceilings: bool = True, force: bool = False, log=print) -> Ceilings:
    """Datasheet ceilings of `model` beside ceilings measured on the device present.

    Measurements are cached per device and software versions in cache_dir (in
    $GPUBENCH_CEILINGS_DIR where that is set); `force` re-measures.  A device without a
    datasheet is always measured.
    """
    datasheet = datasheet_of(model)
    if not measure_ceilings and datasheet is not None:
        return Ceilings(datasheet, None)
    path, cached = cached_entry(cache_dir, present)
    if path.exists() and not force:
        problem = cache_problem(cached)
        if problem is None:
            return Ceilings(datasheet, cached)
        log(f"ignoring the ceiling cache {path}: {problem}")  # re-measured below
    log(f"measuring ceilings on {present.name} (cached in {path})")
    try:
        measured = measure(present, log=log)
    except Exception as e:  # measure leaves a failing ceiling out; this is the rest
        why = f"the measurement failed: {one_line(e)}"
        log(f"ceilings not measured: {why}")
        measured = MeasuredCeilings(tflops={}, hbm_gbps=None, l2_gbps=None,
                                    method={"all": f"{LEFT_OUT}: {why}"},
                                    left_out={"all": why})
    if measured.get("left_out"):
        # Measured again next time rather than cached with ceilings missing (and a good
        # cache entry, when --remeasure-ceilings made this one, is kept).
        log(f"ceilings not cached: {', '.join(measured['left_out'])} left out")
        return Ceilings(datasheet, measured)
    try:
        atomic_write_text(path, json.dumps(measured, indent=2))
    except OSError as e:  # the run still has its ceilings; the next one measures again
        log(f"ceilings not cached in {path}: {one_line(e)}")
    return Ceilings(datasheet, measured)


def device_ceilings(key: str, log: Any = print) -> tuple[DeviceModel, Present, Ceilings]:
    """The ceilings of device model `key` with the device present behind them (measured
    where the model has no datasheet, as a CPU's; cached), and that Present and model:
    the planner's harness function (roofline/plan/harness.py)."""
    from contract.devices import resolve_device

    dev = resolve_device(key)
    model, present = dev.model, dev.present
    for w in dev.warnings:
        log(f"warning: {w}")
    ceilings = get_ceilings(model, present, Path("results") / ".ceilings",
                            measure_ceilings=not model.peaks_tflops, log=log)
    return model, present, ceilings
