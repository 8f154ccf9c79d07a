"""The ceilings measured on the device present: a large copy for memory bandwidth, a
small one for cache bandwidth, the best of large matrix products per roof class for
compute (what the vendor library reaches is what a kernel can hope for), cached per
device and software versions.  What they mean, and their format in a run's metadata,
is roofline/model/ceilings.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from benches.timing.clock import host_dispatch_us, time_cpu, time_flushed, time_warm
from benches.timing.plan import TimingConfig
from roofline.model.ceilings import Ceilings, datasheet_of, no_roofs
from roofline.model.devices import ROOF_CLASSES, DeviceModel, Present
from roofline.model.schema import atomic_write_text

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
# do_bench's rep of 200 ms for a GPU ceiling, 0.3 s of blocks on a CPU.
CEILING_TIMING = TimingConfig(rep_ms=200.0, cpu_min_run_time_s=0.3)


def _time_ms(fn, device: str, l2_flush: bool = True) -> float:
    """Best ms of fn: a ceiling is the most the hardware showed, so the fastest sample
    (not the median) is the estimator, which also keeps a busy host from lowering it.
    The sweep's timers: on a GPU CUDA events with the L2 flushed before each call (a
    DRAM copy, a matmul) or back to back (`l2_flush` False: the cache copy), padded by
    the call's dispatch time; on a CPU blocks of calls on the same buffers."""
    if device == "cuda":
        import torch

        host_us = host_dispatch_us(fn, torch.cuda.synchronize)
        timer = time_flushed if l2_flush else time_warm
        return float(min(timer(fn, CEILING_TIMING, host_us).samples_ms))
    return float(min(time_cpu(fn, CEILING_TIMING).samples_ms))


# Seconds one call of a ceiling's matmul may take: a slower call is timed once (the
# call after its warm-up) instead of for _time_ms's 0.3 s and more.
CEILING_CALL_BUDGET_S = 0.5


def _budgeted_ms(fn, device: str) -> float:
    """_time_ms(fn), or for a call slower than CEILING_CALL_BUDGET_S on a CPU the time of
    the one call after the warm-up one."""
    t0 = time.perf_counter()
    fn()  # warm-up, and whether it runs at all
    once = time.perf_counter() - t0
    if device != "cuda" and once > CEILING_CALL_BUDGET_S:
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


CACHE_ATTEMPTS = 3
L2_LEFT_OUT = "left out"  # how method["l2"] starts when the cache copy was not recorded


def measure(present: Present, log=print) -> dict[str, Any]:
    """Measure bandwidth and per-dtype compute ceilings on the device present."""
    import torch

    device = "cuda" if present.kind == "cuda" else "cpu"
    t0 = time.perf_counter()
    out: dict[str, Any] = {"tflops": {}, "hbm_gbps": None, "l2_gbps": None, "method": {}}

    # Memory: a device-to-device copy moves each byte twice (read + write).
    copy_bytes = (1 << 30) if device == "cuda" else (1 << 28)
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        copy_bytes = min(copy_bytes, free // 8)
    ms = _time_ms(_copy_fn(copy_bytes, device), device)
    out["hbm_gbps"] = 2 * copy_bytes / (ms * 1e-3) / 1e9
    out["method"]["hbm"] = f"copy of {copy_bytes / 2**20:.0f} MiB, read + write counted"
    log(f"  copy bandwidth {out['hbm_gbps']:.1f} GB/s")

    # On-chip cache: a copy whose source and destination together fill a quarter of the
    # GPU's L2 (or 4 MiB on a CPU, inside its L2/LLC), repeated back to back without a
    # flush so that all but the first pass hit in cache.
    cache_bytes = int(present.l2_mb * 2**20) // 8 if device == "cuda" and present.l2_mb \
        else (1 << 21 if device == "cpu" else 0)
    if cache_bytes:
        reps = 50
        fn = _copy_fn(cache_bytes, device, reps)
        # A cache copy slower than the DRAM copy is the host's load, not the cache: on a
        # loaded 2-core VM each parallel copy_ waits a scheduler slice for its second
        # thread (seen: 0.4 GB/s against 110-170 GB/s alone).  Retried a few times, 1 s
        # apart, and left out rather than recorded as a roof below DRAM's.
        best = 0.0
        for attempt in range(CACHE_ATTEMPTS):
            if attempt:
                time.sleep(1.0)
            ms = _time_ms(fn, device, l2_flush=False)
            best = max(best, 2 * cache_bytes * reps / (ms * 1e-3) / 1e9)
            if best > out["hbm_gbps"]:
                break
        if best > out["hbm_gbps"]:
            out["l2_gbps"] = best
            out["method"]["l2"] = (f"{reps} back-to-back copies of "
                                   f"{cache_bytes / 2**20:.1f} MiB")
            log(f"  cache copy bandwidth {best:.1f} GB/s")
        else:
            out["method"]["l2"] = (f"{L2_LEFT_OUT}: {best:.1f} GB/s in {CACHE_ATTEMPTS} attempts, "
                                   f"below the DRAM copy's {out['hbm_gbps']:.1f} (host busy)")
            log(f"  cache copy bandwidth left out: {best:.1f} GB/s is below the DRAM copy's "
                "(host busy?)")

    sizes = (4096, 8192) if device == "cuda" else (256, 512, 1024)
    # fp4 has no per-tensor torch matmul to measure it with (only the block-scaled
    # torch._scaled_mm of sm_100): its roof is the datasheet's.
    classes = [c for c in ROOF_CLASSES
               if c != "fp4" and not (c == "tf32" and device != "cuda")]
    if device == "cuda" and (present.capability or (0, 0)) < (8, 9):
        classes = [c for c in classes if c != "fp8"]
    for rc in classes:
        best = 0.0
        for n in sizes:
            try:
                fn, flops = _gemm_fn(rc, n, device)
                ms = _budgeted_ms(fn, device)
            except Exception as e:  # a dtype the device/library cannot multiply
                out["method"][f"{rc}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                break
            best = max(best, flops / (ms * 1e-3) / 1e12)
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
    for rc, why in no_roofs(out["tflops"]).items():
        log(f"  {rc}: not a roof: {why}")
    out["method"]["compute"] = (f"best of square matmuls {sizes}: torch.matmul, "
                                "torch._scaled_mm for fp8")
    out["measured_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


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
    if isinstance(method, dict) and str(method.get("l2", "")).startswith(L2_LEFT_OUT):
        return "the cache copy was left out (measured under load): measured again"
    if l2 is not None and l2 <= doc["hbm_gbps"]:
        return f"l2_gbps = {l2:g} is below hbm_gbps = {doc['hbm_gbps']:g} (measured under load)"
    return None


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
    cache_dir = Path(os.environ.get(CACHE_DIR_ENV) or cache_dir)
    path = cache_dir / f"ceilings-{cache_key(present)}.json"
    if path.exists() and not force:
        try:
            cached = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            cached = None
        problem = cache_problem(cached)
        if problem is None:
            return Ceilings(datasheet, cached)
        log(f"ignoring the ceiling cache {path}: {problem}")  # re-measured below
    log(f"measuring ceilings on {present.name} (cached in {path})")
    measured = measure(present, log=log)
    atomic_write_text(path, json.dumps(measured, indent=2))
    return Ceilings(datasheet, measured)


def device_ceilings(key: str, log: Any = print) -> tuple[DeviceModel, Present, Ceilings]:
    """The ceilings of device model `key` with the device present behind them (measured
    where the model has no datasheet, as a CPU's; cached), and that Present and model:
    the planner's harness function (roofline/plan/harness.py)."""
    from roofline.model.devices import detect, host_cpu, resolve

    present = host_cpu() if key == "cpu" else detect()
    model, warnings = resolve(key, present)
    for w in warnings:
        log(f"warning: {w}")
    ceilings = get_ceilings(model, present, Path("results") / ".ceilings",
                            measure_ceilings=not model.peaks_tflops, log=log)
    return model, present, ceilings
