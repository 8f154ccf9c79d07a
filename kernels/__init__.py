"""Kernel families and their registry.  Adding a kernel = one module + one line below."""

from __future__ import annotations

from kernels import add, dot, gelu, matmul, matvec, mul
from kernels.spec import DTYPE_NAMES, DTYPES, KernelSpec, Target, current_target

REGISTRY: dict[str, KernelSpec] = {
    spec.name: spec
    for spec in [
        add.SPEC,
        mul.SPEC,
        gelu.SPEC,
        gelu.SPEC_ERF,
        dot.SPEC,
        matvec.SPEC,
        matmul.SPEC,
    ]
}
PROVIDERS: tuple[str, ...] = ("torch", "triton")

__all__ = ["DTYPES", "DTYPE_NAMES", "PROVIDERS", "REGISTRY", "KernelSpec", "Target",
           "current_target"]
