"""The sweep: for every (kernel, provider, dtype, shape) check correctness against the
float64 reference, time it, derive the roofline metrics, and write the row.

Rows are appended to results.csv/results.json as they complete (each file rewritten
atomically), so an interrupted run keeps every finished row.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from benches.shapes import shapes_for
from benches.timing import TimingConfig, rotation_copies, time_cpu, time_gpu
from kernels import DTYPES, REGISTRY, KernelSpec, Target
from kernels.matmul import UnsupportedShape
from kernels.spec import Shape
from roofline import metrics
from roofline.ceilings import Ceilings
from roofline.devices import DeviceModel, Present
from roofline.schema import (
    ALL_COLUMNS,
    RESULTS_CSV,
    RESULTS_JSON,
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


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _sync(target: Target) -> None:
    if target.kind == "cuda":
        torch.cuda.synchronize()


def base_row(case: Case, cfg: RunConfig) -> dict[str, Any]:
    spec, dtype = case.spec, case.dtype
    flops = spec.flops(case.shape, dtype)
    nbytes = spec.nbytes(case.shape, dtype)
    rc = spec.roof_class(dtype)
    ceil = cfg.ceilings
    row: dict[str, Any] = {c: None for c in ALL_COLUMNS}
    row.update(
        kernel=spec.name, provider=case.provider, dtype=dtype, shape=case.shape_str,
        flops=flops, bytes=nbytes, device=cfg.model.key, gpu_name=cfg.present.name,
        roof_class=rc, tolerance=DTYPES[dtype].tol, n_samples=0,
    )
    row.update(metrics.derive(flops, nbytes, None, ceil.peak_tflops(rc), ceil.peak_gbps(),
                              ceil.meas_tflops(rc), ceil.meas_gbps()))
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
    row = base_row(case, cfg)
    reason = case.spec.skip_reason(case.provider, case.dtype, cfg.target)
    if reason is None and case.provider == "triton" and cfg.target.kind != "cuda" \
            and not cfg.check_only:
        reason = "Triton on the CPU runs only in the interpreter: checked, not timed (--check-only)"
    if reason:
        row.update(status="skipped", reason=reason)
        return row
    spec, dtype = case.spec, case.dtype
    fn = spec.providers[case.provider].fn
    try:
        inputs = cache.get(case, cfg)
        out = spec.alloc_out(inputs, dtype)
        out.fill_(float("nan"))  # an element the kernel fails to write stays NaN and fails
        result = fn(inputs, out)
        _sync(cfg.target)
        rel_err = spec.check(result, inputs, dtype, ref=cache.reference(case))
    except Exception as e:
        if _is_oom(e):
            cache.clear()
            if cfg.target.kind == "cuda":
                torch.cuda.empty_cache()
            row.update(status="skipped", reason=f"out of memory at this shape ({_first_line(e)})")
        elif isinstance(e, UnsupportedShape):
            row.update(status="skipped", reason=str(e))
        else:
            row.update(status="skipped", reason=f"kernel could not run: {_first_line(e)}")
        return row
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
    try:
        timing = _time_case(case, cfg, inputs, out)
    except Exception as e:
        if _is_oom(e) and cfg.target.kind == "cuda":
            torch.cuda.empty_cache()
        row.update(status="skipped", reason=f"timing failed: {_first_line(e)}")
        return row
    row.update(ms_median=timing.ms_median, ms_p20=timing.ms_p20, ms_p80=timing.ms_p80,
               n_samples=timing.n_samples, timer=timing.timer, status="ok", reason="")
    row.update(metrics.derive(row["flops"], row["bytes"], timing.ms_median,
                              row["peak_tflops"], row["peak_gbps"],
                              row["meas_peak_tflops"], row["meas_peak_gbps"]))
    return row


def _time_case(case: Case, cfg: RunConfig, inputs: dict[str, Any], out: torch.Tensor):
    fn = case.spec.providers[case.provider].fn
    call = lambda: fn(inputs, out)  # noqa: E731
    if cfg.target.kind != "cuda":
        return time_cpu(call, cfg.timing)
    l2 = int((cfg.present.l2_mb or 0) * 2**20)
    footprint = case.spec.nbytes(case.shape, case.dtype)

    def rotated() -> list[Callable[[], object]]:
        # For CUDA-graph timing of tiny kernels: distinct input copies totalling twice
        # the L2, so each replayed call starts from a cold cache.
        calls: list[Callable[[], object]] = [call]
        for _ in range(rotation_copies(footprint, l2) - 1):
            ins = _clone_inputs(inputs)
            o = torch.empty_like(out)
            calls.append(lambda ins=ins, o=o: fn(ins, o))
        return calls

    return time_gpu(call, cfg.timing, rotated=rotated)


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


def nvml_snapshot() -> dict[str, Any] | None:
    """Clocks, power and throttle reasons of GPU 0 through nvidia-ml-py, where readable."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        snap: dict[str, Any] = {}
        readers = {
            "driver": lambda: pynvml.nvmlSystemGetDriverVersion(),
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(
                h, pynvml.NVML_CLOCK_SM),
            "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "temperature_c": lambda: pynvml.nvmlDeviceGetTemperature(
                h, pynvml.NVML_TEMPERATURE_GPU),
            "throttle_reasons": lambda: int(
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
        }
        for key, read in readers.items():
            try:
                v = read()
                snap[key] = v.decode() if isinstance(v, bytes) else v
            except Exception:
                snap[key] = None
        # Throttle bits other than idle (0x1) and application clocks (0x2) mean the
        # GPU slowed itself down (power cap, thermal, ...).
        tr = snap.get("throttle_reasons")
        snap["throttled"] = bool(tr & ~0x3) if isinstance(tr, int) else None
        return snap
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def collect_metadata(cfg: RunConfig, run_id: str, argv: list[str]) -> dict[str, Any]:
    try:
        import triton

        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    p = cfg.present
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
        "timing": {
            **cfg.timing.as_dict(),
            "gpu_method": "triton.testing.do_bench (CUDA events, L2 flushed between "
                          "samples); do_bench_cudagraph with rotated inputs below "
                          f"{cfg.timing.cudagraph_below_ms} ms",
            "cpu_method": "torch.utils.benchmark.Timer.blocked_autorange",
        },
        "ceilings": cfg.ceilings.to_json(),
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
    """Keeps the run folder's results.csv and results.json current after every row.

    The folder itself is created (exclusively) by the caller; `rows` are those already in
    the folder when a run is resumed, kept as read so nothing measured is rewritten.
    """

    def __init__(self, run_dir: Path, metadata: dict[str, Any],
                 rows: list[dict[str, Any]] | None = None) -> None:
        self.run_dir = run_dir
        self.metadata = metadata
        self.rows: list[dict[str, Any]] = list(rows or [])
        run_dir.mkdir(parents=True, exist_ok=True)

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.flush()

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=ALL_COLUMNS)

    def flush(self) -> None:
        atomic_write_text(self.run_dir / RESULTS_CSV, self.frame().to_csv(index=False))
        doc = {"metadata": self.metadata, "rows": [_jsonable(r) for r in self.rows]}
        atomic_write_text(self.run_dir / RESULTS_JSON, json.dumps(doc, indent=1) + "\n")


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
    later case could run, and hundreds of follow-on rows would hide the first error."""
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
