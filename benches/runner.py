"""The sweep: for every (kernel, provider, dtype, shape) check correctness against the
float64 reference, time it, derive the roofline metrics, and write the row.

Rows are appended to results.csv/results.json as they complete (each file rewritten
atomically), so an interrupted run keeps every finished row.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from benches.gpu_monitor import (  # noqa: F401  (re-exported: runner was their home)
    REAL_THROTTLE_MASK,
    REAL_THROTTLE_REASONS,
    GpuMonitor,
    ThrottleConfig,
    gpu_monitor,
    nvml_handle,
    nvml_reading,
    nvml_snapshot,
    stop_gpu_monitor,
    throttle_names,
    time_unthrottled,
)
from benches.interrupt import signal_name
from benches.shapes import shapes_for
from benches.timing import (
    TIMER_CPU,
    TIMER_FLUSHED,
    TIMER_GRAPH_FALLBACK,
    Timing,
    TimingConfig,
    choose_method,
    count_launches,
    cpu_round_config,
    graph_plan,
    host_dispatch_us,
    rotation_copies,
    summarize,
    time_cpu_rounds,
    time_cudagraph,
    time_flushed,
)
from kernels import DTYPES, REGISTRY, KernelSpec, Target
from kernels.matmul import UnsupportedShape
from kernels.spec import Shape, TritonLaunch
from kernels.triton_utils import configs_text, parse_configs, prepared_call, run_launch
from roofline import metrics
from roofline.ceilings import Ceilings
from roofline.devices import DeviceModel, Present
from roofline.schema import (
    ALL_COLUMNS,
    RESULTS_CSV,
    RESULTS_JSON,
    ROWS_JOURNAL,
    SAMPLES,
    atomic_write_text,
    format_shape,
)


@dataclass(frozen=True)
class Case:
    spec: KernelSpec
    provider: str
    dtype: str
    shape: Shape

    @property
    def shape_str(self) -> str:
        return format_shape(self.shape)

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.provider} {self.dtype} {self.shape_str}"


@dataclass
class RunConfig:
    kernels: list[str]
    dtypes: list[str]
    providers: list[str]
    sizes: str  # preset name
    explicit_shapes: list[Shape] | None
    seed: int
    check_only: bool
    model: DeviceModel
    present: Present
    target: Target
    ceilings: Ceilings
    timing: TimingConfig = field(default_factory=TimingConfig)
    throttle: ThrottleConfig = field(default_factory=lambda: ThrottleConfig())
    # Triton configs to run instead of autotuning, by (kernel, provider, dtype, shape):
    # re-timing children get the confirmed row's own (its `config` column).
    configs: dict[tuple[str, str, str, str], str] = field(default_factory=dict)


def build_cases(cfg: RunConfig) -> list[Case]:
    """Cases in run order: kernel, dtype, shape, then provider, so that both providers
    of a (kernel, dtype, shape) share one set of inputs."""
    cases = []
    on_gpu = cfg.target.kind == "cuda"
    for name in cfg.kernels:
        spec = REGISTRY[name]
        for dtype in cfg.dtypes:
            if dtype not in spec.dtypes:
                continue  # e.g. tf32 exists for matmul only
            for shape in shapes_for(spec, cfg.sizes, on_gpu, cfg.explicit_shapes):
                for prov in cfg.providers:
                    cases.append(Case(spec, prov, dtype, shape))
    return cases


def case_seed(base: int, spec: KernelSpec, dtype: str, shape: Shape) -> int:
    """Stable per-(kernel, dtype, shape) seed: fresh data per case, reproducible per run."""
    return (base * 1_000_003 + zlib.crc32(f"{spec.name}|{dtype}|{shape}".encode())) % 2**31


class SweepAborted(Exception):
    """A kernel error left the CUDA context unusable (illegal address, launch failure):
    `row` is that case's failed row, `reason` the error; the sweep cannot go on."""

    def __init__(self, row: dict[str, Any], reason: str) -> None:
        super().__init__(reason)
        self.row = row
        self.reason = reason


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300]}" if msg else type(e).__name__


def _message(e: BaseException) -> str:
    """Type and the telling part of an exception's message: its first line, plus its
    last line when they differ (a Triton CompilationError starts with the source
    location and ends with the error)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    text = lines[0] if lines[-1] == lines[0] else f"{lines[0]} ... {lines[-1]}"
    return f"{type(e).__name__}: {text[:400]}"


# Out of memory on either device: torch.OutOfMemoryError on a GPU; on a CPU the default
# allocator raises RuntimeError "DefaultCPUAllocator: can't allocate memory: you tried to
# allocate N bytes. Error code 12 (Cannot allocate memory)".
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def _is_oom(e: BaseException) -> bool:
    msg = str(e).lower()
    return isinstance(e, torch.OutOfMemoryError) or any(m in msg for m in _OOM_MESSAGES)


def device_memory_bytes(cfg: RunConfig) -> float | None:
    """Memory of the device the cases run on: the GPU's total, or the host's RAM."""
    if cfg.target.kind == "cuda":
        gb = cfg.present.memory_gb
        return gb * 1e9 if gb else None
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def footprint_reason(case: Case, cfg: RunConfig) -> str | None:
    """Why a case cannot fit, decided before anything is allocated: its compulsory bytes
    (inputs and output once, the spec's byte count) exceed the device's memory."""
    need = case.spec.nbytes(case.shape, case.dtype)
    have = device_memory_bytes(cfg)
    if have is None or need <= have:
        return None
    return (f"out of memory at this shape: inputs and output need {need / 1e9:.6g} GB, "
            f"the device has {have / 1e9:.4g} GB (not allocated)")


# CUDA errors that are sticky: after one, the context is unusable and every later CUDA
# call fails with the same error (CUDA runtime docs).  Matched on the message, with "_"
# read as " " so the driver API's names (CUDA_ERROR_ILLEGAL_ADDRESS) match too, since
# torch raises them as RuntimeError / torch.AcceleratorError and Triton as RuntimeError.
_STICKY_CUDA_ERRORS = (
    "illegal memory access", "illegal address", "launch failure", "launch failed",
    "misaligned address", "illegal instruction", "invalid program counter", "invalid pc",
    "hardware stack error", "device-side assert", "device side assert", "error assert",
    "launch timed out", "launch timeout", "uncorrectable ecc", "ecc uncorrectable",
    "invalid address space", "not supported on global/shared address space",
    # CUDA libraries' own names for a kernel of theirs that faulted on the device
    # (CUBLAS_STATUS_EXECUTION_FAILED: "GPU program failed to execute"; the same status
    # in cuDNN, cuSOLVER and cuSPARSE; CUFFT_EXEC_FAILED): the fault poisons the context
    # like any other, and the next case's first call would take the blame.
    "status execution failed", "cufft exec failed",
)
# Words that mark a message as coming from CUDA or one of its libraries.
_CUDA_WORDS = ("cuda", "cublas", "cudnn", "cufft", "cusolver", "cusparse")


def is_sticky_cuda_error(e: BaseException) -> bool:
    """Whether `e` is a CUDA error that leaves the context unusable."""
    msg = str(e).lower().replace("_", " ")
    is_cuda = any(w in msg for w in _CUDA_WORDS) or type(e).__name__ == "AcceleratorError"
    return is_cuda and any(p in msg for p in _STICKY_CUDA_ERRORS)


def _compile_error_types() -> tuple[type[BaseException], ...]:
    """Triton's compile-time failures: the kernel did not build (or does not fit)."""
    try:
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources, PTXASError
    except ImportError:  # pragma: no cover - triton is a dependency
        return ()
    return (CompilationError, OutOfResources, PTXASError)


def _error_row(row: dict[str, Any], e: BaseException, case: Case, cfg: RunConfig,
               cache: _InputCache, stage: str) -> dict[str, Any]:
    """The row of a case whose kernel raised.  Only a shape the library rejects and
    out-of-memory are `skipped` (cannot run here by design); a compile error, a CUDA
    error or any other exception is `failed`.  A sticky CUDA error raises SweepAborted."""
    msg = _message(e)
    if is_sticky_cuda_error(e):
        row.update(status="failed",
                   reason=f"CUDA error{stage} (context unusable, sweep aborted): {msg}")
        raise SweepAborted(row, f"{case.label}: {msg}") from e
    if isinstance(e, UnsupportedShape):
        row.update(status="skipped", reason=str(e))
    elif _is_oom(e) and not isinstance(e, _compile_error_types()):
        cache.clear()
        if cfg.target.kind == "cuda":
            torch.cuda.empty_cache()
        row.update(status="skipped", reason=f"out of memory at this shape{stage} ({msg})")
    elif isinstance(e, _compile_error_types()):
        row.update(status="failed", reason=f"Triton compile error: {msg}")
    elif "cuda" in str(e).lower() or type(e).__name__ == "AcceleratorError":
        row.update(status="failed", reason=f"CUDA error{stage}: {msg}")
    else:
        row.update(status="failed", reason=f"kernel raised{stage}: {msg}")
    return row


def _sync(target: Target) -> None:
    if target.kind == "cuda":
        torch.cuda.synchronize()


def _roofs(case: Case, cfg: RunConfig) -> tuple[float | None, float | None,
                                                float | None, float | None]:
    """(peak_tflops, peak_gbps, meas_peak_tflops, meas_peak_gbps) a row is held against.

    On a CPU the fp8 compute ceiling is measured with e4m3 (torch._scaled_mm); an e5m2
    product takes another, much slower path there, so fp8e5 matrix rows get no roof
    rather than one measured on a different format."""
    spec, dtype = case.spec, case.dtype
    rc = spec.roof_class(dtype)
    ceil = cfg.ceilings
    if cfg.target.kind != "cuda" and spec.matrix_unit and dtype == "fp8e5" \
            and ceil.meas_tflops("fp8e5") is None:
        return None, None, None, None
    return ceil.peak_tflops(rc), ceil.peak_gbps(), ceil.meas_tflops(rc), ceil.meas_gbps()


def base_row(case: Case, cfg: RunConfig) -> dict[str, Any]:
    spec, dtype = case.spec, case.dtype
    flops = spec.flops(case.shape, dtype)
    nbytes = spec.nbytes(case.shape, dtype)
    rc = spec.roof_class(dtype)
    row: dict[str, Any] = {c: None for c in ALL_COLUMNS}
    row.update(
        kernel=spec.name, provider=case.provider, dtype=dtype, shape=case.shape_str,
        flops=flops, bytes=nbytes, device=cfg.model.key, gpu_name=cfg.present.name,
        roof_class=rc, tolerance=DTYPES[dtype].tol, n_samples=0,
    )
    row.update(metrics.derive(flops, nbytes, None, *_roofs(case, cfg)))
    return row


class _InputCache:
    """Inputs of the current (kernel, dtype, shape) and their float64 reference, shared
    by its providers (a large float64 matmul reference is worth computing once)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.inputs: dict[str, Any] | None = None
        self.ref: torch.Tensor | None = None

    def get(self, case: Case, cfg: RunConfig) -> dict[str, Any]:
        key = (case.spec.name, case.dtype, case.shape_str)
        if key != self.key:
            self.clear()
            seed = case_seed(cfg.seed, case.spec, case.dtype, case.shape)
            self.inputs = case.spec.make_inputs(case.shape, case.dtype, seed,
                                                cfg.target.device)
            self.key = key
        assert self.inputs is not None
        return self.inputs

    def reference(self, case: Case) -> torch.Tensor:
        """float64 reference of the inputs last returned by get() for this case."""
        assert self.inputs is not None
        if self.ref is None:
            self.ref = case.spec.reference(self.inputs, case.dtype)
        return self.ref

    def clear(self) -> None:
        self.key, self.inputs, self.ref = None, None, None


def _clone_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def run_case(case: Case, cfg: RunConfig, cache: _InputCache) -> dict[str, Any]:
    """One row: skipped, failed (wrong result or the kernel raised) or ok (correct and
    timed).  Raises SweepAborted (carrying the failed row) on a sticky CUDA error."""
    row = base_row(case, cfg)
    reason = case.spec.skip_reason(case.provider, case.dtype, cfg.target)
    if reason is None and case.provider == "triton" and cfg.target.kind != "cuda" \
            and not cfg.check_only:
        reason = "Triton on the CPU runs only in the interpreter: checked, not timed (--check-only)"
    reason = reason or footprint_reason(case, cfg)
    if reason:
        row.update(status="skipped", reason=reason)
        return row
    spec, dtype = case.spec, case.dtype
    fn = spec.providers[case.provider].fn
    make_call: MakeCall | None = None
    try:
        inputs = cache.get(case, cfg)
        out = spec.alloc_out(inputs, dtype)
        # First call untimed: an autotuned kernel tunes here, running every candidate
        # config into `out`.  Only then is `out` poisoned, so an element the chosen
        # config fails to write stays NaN instead of holding another config's answer.
        launches = _triton_launches(case, cfg, inputs, out)
        if launches is None:
            fn(inputs, out)
            call: Callable[[], object] = lambda: fn(inputs, out)  # noqa: E731
        else:
            # A Triton row runs (and records) its chosen configs; re-timing passes the
            # confirmed row's configs in, so it never tunes to another one.
            forced = cfg.configs.get(_case_key(case))
            chosen = parse_configs(launches, forced) if forced else [None] * len(launches)
            chosen = [run_launch(ln, c) for ln, c in zip(launches, chosen, strict=True)]
            call = lambda: fn(inputs, out)  # noqa: E731
            if all(c is not None for c in chosen):
                row["config"] = configs_text(launches, chosen)
                make_call = _bound_triton_call(case, cfg, chosen)
                call = make_call(inputs, out)
        _sync(cfg.target)
        out.fill_(float("nan"))
        result = call()
        result = out if result is None else result
        _sync(cfg.target)
        rel_err = spec.check(result, inputs, dtype, ref=cache.reference(case))
    except Exception as e:
        return _error_row(row, e, case, cfg, cache, "")
    finite = rel_err != float("inf")
    row["rel_err"] = rel_err if finite else None
    row["correct"] = bool(rel_err <= DTYPES[dtype].tol)
    if not row["correct"]:
        why = (f"rel_err {rel_err:.3g} > tolerance {DTYPES[dtype].tol:g}" if finite else
               "output holds NaN/inf (unwritten or overflowed elements)")
        row.update(status="failed", reason=why)
        return row
    if cfg.check_only:
        row.update(status="ok", reason="check-only: not timed")
        return row
    # On a GPU the NVML window covers the timing only: not the inputs, the float64
    # reference, compilation or autotuning above, whose idle clocks and power events say
    # nothing about the samples.
    monitor = gpu_monitor() if cfg.target.kind == "cuda" else None
    clocks: dict[str, Any] = {}
    try:
        def timed() -> tuple[Timing, str]:
            if make_call is None:
                return _time_case(case, cfg, inputs, out)
            return _time_case(case, cfg, inputs, out, make_call)

        if monitor is None:
            timing, note = timed()
        else:
            timing, note, clocks = time_unthrottled(timed, monitor, cfg.throttle)
    except Exception as e:
        return _error_row(row, e, case, cfg, cache, " while timing")
    row = _set_timing(row, case, cfg, timing, note)
    row.update(clocks)
    return row


def _triton_launches(case: Case, cfg: RunConfig, inputs: dict[str, Any],
                     out: torch.Tensor) -> list[TritonLaunch] | None:
    """The declared launches of a Triton row (None for torch rows)."""
    if case.provider != "triton" or case.spec.triton_launches is None:
        return None
    sms = (cfg.present.sms or 0) if cfg.target.kind == "cuda" else 0
    return case.spec.triton_launches(inputs, out, sms)


def _bound_triton_call(case: Case, cfg: RunConfig, configs: list[Any]) -> MakeCall:
    def make(ins: dict[str, Any], o: torch.Tensor) -> Callable[[], object]:
        launches = _triton_launches(case, cfg, ins, o)
        assert launches is not None
        return prepared_call(launches, configs)
    return make


def _case_key(case: Case) -> tuple[str, str, str, str]:
    return (case.spec.name, case.provider, case.dtype, case.shape_str)


def _set_timing(row: dict[str, Any], case: Case, cfg: RunConfig, timing: Timing,
                note: str) -> dict[str, Any]:
    row.update(ms_median=timing.ms_median, ms_p20=timing.ms_p20, ms_p80=timing.ms_p80,
               n_samples=timing.n_samples, timer=timing.timer, status="ok", reason=note,
               host_us=timing.host_us)
    row[SAMPLES] = list(timing.samples_ms)
    row.update(metrics.derive(row["flops"], row["bytes"], timing.ms_median,
                              *_roofs(case, cfg)))
    return row


def timing_method(case: Case, cfg: RunConfig) -> str:
    """How a (kernel, dtype, shape) is timed on this device: one answer for both
    providers, from the case's roofline bound under the device model's ceilings."""
    if cfg.target.kind != "cuda":
        return TIMER_CPU
    rc = case.spec.roof_class(case.dtype)
    c = cfg.ceilings
    return choose_method(case.spec.flops(case.shape, case.dtype),
                         case.spec.nbytes(case.shape, case.dtype),
                         c.peak_tflops(rc), c.peak_gbps(), cfg.timing)


def _l2_bytes(cfg: RunConfig) -> int | None:
    mb = cfg.present.l2_mb or cfg.model.l2_mb
    return int(mb * 2**20) if mb else None


MakeCall = Callable[[dict[str, Any], torch.Tensor], Callable[[], object]]


def _plain_call(case: Case) -> MakeCall:
    fn = case.spec.providers[case.provider].fn
    return lambda ins, o: (lambda: fn(ins, o))


def _time_case(case: Case, cfg: RunConfig, inputs: dict[str, Any], out: torch.Tensor,
               make_call: MakeCall | None = None) -> tuple[Timing, str]:
    """(timing, note): the note says why a CUDA-graph case fell back to do_bench or
    what bound its graph.  `make_call(inputs, out)` gives the provider's call on those
    buffers (a Triton row's is bound once to its chosen configs); on a GPU the timing
    carries the call's host dispatch time."""
    make_call = make_call or _plain_call(case)
    call = make_call(inputs, out)
    method = timing_method(case, cfg)
    if method == TIMER_CPU:
        held: list[Any] = []

        def round_call(r: int) -> Callable[[], object]:
            if r == 0:
                return call
            # New buffers are allocated while the previous round's are still held, so
            # they cannot simply reuse the same addresses.
            ins, o = _clone_inputs(inputs), torch.empty_like(out)
            held[:] = [ins, o]
            return make_call(ins, o)

        return time_cpu_rounds(round_call, cfg.timing), ""
    host_us = host_dispatch_us(call, torch.cuda.synchronize)
    timing, note = _time_gpu(case, cfg, inputs, out, make_call, call, host_us)
    return replace(timing, host_us=host_us), note


def _time_gpu(case: Case, cfg: RunConfig, inputs: dict[str, Any], out: torch.Tensor,
              make_call: MakeCall, call: Callable[[], object], host_us: float
              ) -> tuple[Timing, str]:
    if timing_method(case, cfg) == TIMER_FLUSHED:
        return time_flushed(call, cfg.timing, host_us), ""
    copies = rotation_copies(case.spec.nbytes(case.shape, case.dtype), _l2_bytes(cfg))
    if copies is None:
        return _fallback(time_flushed(call, cfg.timing, host_us),
                         "L2 size unknown: no rotation can be shown to be cold")
    launches = count_launches(call) or cfg.timing.assumed_launches
    total, bound = graph_plan(copies, launches, host_us, cfg.timing)
    if total is None:
        return _fallback(time_flushed(call, cfg.timing, host_us), bound)
    calls: list[Callable[[], object]] = [call]
    try:
        # Distinct copies of inputs and output, together more than twice the L2, so
        # every replayed call starts from a cold cache (as do_bench's flush gives).
        for _ in range(copies - 1):
            ins, o = _clone_inputs(inputs), torch.empty_like(out)
            calls.append(make_call(ins, o))
        return time_cudagraph(calls, cfg.timing, total), bound
    except Exception as e:
        if is_sticky_cuda_error(e):
            raise
        why = _message(e)
    del calls
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return _fallback(time_flushed(call, cfg.timing, host_us),
                     f"CUDA-graph timing failed ({why})")


def _fallback(t: Timing, why: str) -> tuple[Timing, str]:
    return (replace(t, timer=TIMER_GRAPH_FALLBACK),
            f"timed with L2 flushes instead of CUDA graphs: {why}")


# ---- metadata -------------------------------------------------------------------------

def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _llc_mb() -> float | None:
    """Size of the CPU's last-level cache in MiB (Linux sysfs), or None."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best: tuple[int, float] | None = None
    for idx in base.glob("index*"):
        try:
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size:
            continue
        mult = {"K": 2**-10, "M": 1.0, "G": 2**10}.get(size[-1], 2**-20)
        try:
            mb = float(size.rstrip("KMG")) * mult
        except ValueError:
            continue
        if best is None or level > best[0]:
            best = (level, mb)
    return best[1] if best else None


def _fp8_accum() -> str | None:
    from kernels import spec as kernel_spec

    mode = getattr(kernel_spec, "fp8_accum", None)  # absent in older kernel modules
    return mode() if callable(mode) else None


def collect_metadata(cfg: RunConfig, run_id: str, argv: list[str]) -> dict[str, Any]:
    try:
        import triton

        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    p = cfg.present
    t = cfg.timing
    meta: dict[str, Any] = {
        "run_id": run_id,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device_key": cfg.model.key,
        "device_name": p.name,
        "device_model": cfg.model.name,
        "device_kind": p.kind,
        "detected_key": p.key,
        "capability": list(p.capability) if p.capability else None,
        "sms": p.sms,
        "l2_mb": p.l2_mb,
        "llc_mb": _llc_mb() if p.kind == "cpu" else None,
        "gpu_memory_gb": p.memory_gb,
        "cpu_cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_v,
        "triton_interpret": cfg.target.interpret,
        "platform": platform.platform(),
        "git_commit": _git_commit(),
        "command": " ".join([Path(sys.executable).name, *argv]),
        "seed": cfg.seed,
        "sizes": cfg.sizes if cfg.explicit_shapes is None else "explicit",
        "kernels": cfg.kernels,
        "dtypes": cfg.dtypes,
        "providers": cfg.providers,
        "check_only": cfg.check_only,
        "fp8_accum": _fp8_accum(),
        "timing": {
            **t.as_dict(),
            "gpu_method": (
                "one method per (kernel, dtype, shape) for both providers, from its "
                f"roofline bound: below {t.cudagraph_below_ms} ms, CUDA-graph replays "
                "over rotated copies of inputs and outputs totalling more than twice the "
                f"L2 (at least {t.graph_min_calls} calls per graph, time / calls); else "
                "triton.testing.do_bench (CUDA events, L2 flushed between samples)"),
            "cpu_method": "torch.utils.benchmark.Timer.blocked_autorange, topped up to "
                          f"{t.min_samples} blocks, in {t.cpu_rounds} rounds on fresh copies "
                          f"of the inputs, interleaved over chunks of ~{t.cpu_chunk_s:g} s "
                          "of cases",
        },
        "ceilings": cfg.ceilings.to_json(),
        "throttle_settings": cfg.throttle.as_dict(),
        "interrupted": False,
        "complete": False,
    }
    if p.kind == "cuda":
        snap = nvml_snapshot()
        meta["nvml_start"] = snap
        meta["driver"] = (snap or {}).get("driver")
    return meta


# ---- writing ----------------------------------------------------------------------------

class ResultWriter:
    """Keeps the run folder's results current after every row, at a cost per row that
    does not grow with the rows before it.

    A row is appended to the journal (roofline.schema.ROWS_JOURNAL, one JSON row with its
    raw samples per line) and to results.csv; results.json and results.csv are rewritten
    whole (atomically) only by flush(): at the run's start, after its ceilings and at its
    end, also after an interrupt or abort.  Rewriting them after every row cost time
    quadratic in the rows (measured: 242 s of writing by row 700 of 900 samples each).
    A process killed between flushes leaves every row it finished in the journal, which
    readers (schema.read_doc, hence load_run and --resume) take over results.json's rows.

    The folder itself is created (exclusively) by the caller; `rows` are those already in
    the folder when a run is resumed, kept as read so nothing measured is rewritten.
    """

    def __init__(self, run_dir: Path, metadata: dict[str, Any],
                 rows: list[dict[str, Any]] | None = None) -> None:
        self.run_dir = run_dir
        self.metadata = metadata
        self.rows: list[dict[str, Any]] = list(rows or [])
        run_dir.mkdir(parents=True, exist_ok=True)
        self.journal = run_dir / ROWS_JOURNAL
        # The journal holds every row of the run, so it alone can stand for results.json:
        # a resumed run's earlier rows go in first (once, atomically).
        atomic_write_text(self.journal, "".join(_journal_line(r) for r in self.rows))
        self._csv_rows: int | None = None  # rows results.csv holds (None: unknown)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        # One write() per line and file: a kill mid-row leaves at most a partial last
        # line, which readers drop.  Files are reopened each time because flush()
        # replaces them (a handle kept open would append to the replaced file).
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(_journal_line(row))
        if self._csv_rows != len(self.rows) - 1:  # no flush yet: written whole, once
            self._write_csv()
            return
        with open(self.run_dir / RESULTS_CSV, "a", encoding="utf-8") as f:
            f.write(pd.DataFrame([row], columns=ALL_COLUMNS).to_csv(index=False, header=False))
        self._csv_rows += 1

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=ALL_COLUMNS)

    def flush(self) -> None:
        """Rewrite results.csv and results.json whole (metadata included), atomically."""
        self._write_csv()
        doc = {"metadata": self.metadata, "rows": [_jsonable(r) for r in self.rows]}
        atomic_write_text(self.run_dir / RESULTS_JSON, json.dumps(doc, indent=1) + "\n")

    def _write_csv(self) -> None:
        atomic_write_text(self.run_dir / RESULTS_CSV, self.frame().to_csv(index=False))
        self._csv_rows = len(self.rows)

    def close(self) -> None:
        """Final flush; the journal goes once results.json holds every row."""
        self.flush()
        self.journal.unlink(missing_ok=True)


def _journal_line(row: dict[str, Any]) -> str:
    return json.dumps(_jsonable(row), separators=(",", ":")) + "\n"


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None  # JSON has no NaN/inf
    return v


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: _finite_or_none(row.get(k)) for k in ALL_COLUMNS}
    samples = row.get(SAMPLES)
    if samples is not None:
        out[SAMPLES] = [_finite_or_none(float(x)) for x in samples]
    return out


def iterate(cases: list[Case], cfg: RunConfig) -> Iterator[tuple[Case, dict[str, Any]]]:
    """Run the cases in order, yielding each finished row.  A case whose error leaves
    the CUDA context unusable yields its failed row, then SweepAborted is raised: no
    later case could run, and hundreds of follow-on rows would hide the first error.

    CPU-timed sweeps interleave their rounds (see TimingConfig.cpu_rounds): cases are
    checked and timed for one round in chunks of about cpu_chunk_s seconds, then every
    further round of the chunk is timed in turn, and the chunk's rows are yielded
    together.  An interrupt (or any exception) yields the chunk's rows timed so far,
    over the rounds they completed (n_samples says how many), before it propagates."""
    if cfg.target.kind == "cuda" or cfg.check_only or cfg.timing.cpu_rounds <= 1:
        yield from _iterate_serial(cases, cfg)
        return
    cache = _InputCache()
    one_round = replace(cfg, timing=cpu_round_config(cfg.timing))
    # [case, row, inputs, rounds timed]; a row is replaced if a later round fails
    chunk: list[list[Any]] = []
    try:
        start = time.monotonic()
        for case in cases:
            try:
                row = run_case(case, one_round, cache)
            except SweepAborted as e:
                yield from _emit(chunk, cfg, "the sweep's abort")
                yield case, e.row
                raise
            # The case's checked inputs, kept for its later rounds (copied per round:
            # ~1 ms, where making them again takes ~100 ms at 2^22 elements).
            key = (case.spec.name, case.dtype, case.shape_str)
            chunk.append([case, row, cache.inputs if cache.key == key else None, 1])
            if time.monotonic() - start >= cfg.timing.cpu_chunk_s:
                _later_rounds(chunk, cfg, one_round, cache)
                yield from _emit(chunk, cfg)
                start = time.monotonic()
        _later_rounds(chunk, cfg, one_round, cache)
        yield from _emit(chunk, cfg)
    except GeneratorExit:
        raise  # closed by the consumer: nothing may be yielded any more
    except BaseException as e:
        yield from _emit(chunk, cfg, signal_name(e) or type(e).__name__)
        raise
    finally:
        cache.clear()


def _iterate_serial(cases: list[Case], cfg: RunConfig
                    ) -> Iterator[tuple[Case, dict[str, Any]]]:
    cache = _InputCache()
    try:
        for case in cases:
            try:
                row = run_case(case, cfg, cache)
            except SweepAborted as e:
                yield case, e.row
                raise
            yield case, row
    finally:
        cache.clear()


def _later_rounds(chunk: list[list[Any]], cfg: RunConfig, one_round: RunConfig,
                  cache: _InputCache) -> None:
    """Rounds 2..cpu_rounds of a chunk's CPU-timed rows, round by round over the chunk,
    each on fresh copies of the case's inputs and a fresh output.  A row's samples grow
    by whole rounds only."""
    cache.clear()
    for _ in range(1, cfg.timing.cpu_rounds):
        for item in chunk:
            case, row, inputs, _ = item
            if row["status"] != "ok" or row.get("timer") != TIMER_CPU or inputs is None:
                continue
            try:
                ins = _clone_inputs(inputs)
                out = case.spec.alloc_out(ins, case.dtype)
                timing, _ = _time_case(case, one_round, ins, out)
            except Exception as e:
                # A kernel that raises in a later round failed: no timing is kept.
                failed = base_row(case, cfg)
                failed.update(rel_err=row["rel_err"], correct=row["correct"])
                item[1] = _error_row(failed, e, case, cfg, cache, " while timing")
                continue
            row[SAMPLES] = row[SAMPLES] + list(timing.samples_ms)
            item[3] += 1


_CUT_SHORT = re.compile(r"timed in \d+ of \d+ rounds only")


def cut_short(row: dict[str, Any]) -> bool:
    """An ok row whose CPU rounds were cut short by an interrupt (see _emit): --resume
    times it again in full."""
    return row.get("status") == "ok" and bool(_CUT_SHORT.match(str(row.get("reason") or "")))


def _emit(chunk: list[list[Any]], cfg: RunConfig, stopped_by: str = ""
          ) -> Iterator[tuple[Case, dict[str, Any]]]:
    """Yield (and remove) the chunk's rows, each CPU-timed one summarised over all its
    samples; a row cut short (by `stopped_by`) says so in its reason.  A row leaves the
    chunk only as it is yielded, so an interrupt while one is summarised loses none."""
    while chunk:
        case, row, _, rounds = chunk[0]
        if row["status"] == "ok" and row.get("timer") == TIMER_CPU:
            reason = row["reason"]
            if rounds < cfg.timing.cpu_rounds:
                reason = (f"timed in {rounds} of {cfg.timing.cpu_rounds} rounds only "
                          f"(stopped by {stopped_by or 'an error'})")
            _set_timing(row, case, cfg, summarize(row[SAMPLES], TIMER_CPU), reason)
        chunk.pop(0)
        yield case, row
