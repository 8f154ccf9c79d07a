"""What one benchmark case is, and what its row starts as: the (kernel, provider, dtype,
shape) cases of a run in order, the run's configuration, the row's analytic columns,
and the inputs and float64 reference its providers share.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from benches.gpu_monitor import (
    ThrottleConfig,
)
from benches.shapes import shapes_for
from benches.timing import (
    TimingConfig,
)
from kernels import DTYPES, REGISTRY, KernelSpec, Target
from kernels.spec import Shape
from roofline import metrics
from roofline.ceilings import Ceilings
from roofline.devices import DeviceModel, Present
from roofline.schema import (
    ALL_COLUMNS,
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
    # Seconds the sweep's timing may take in all (None: no run budget; rows keep theirs,
    # timing.row_budget_s).  See benches/budget.py.
    run_budget_s: float | None = None
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
