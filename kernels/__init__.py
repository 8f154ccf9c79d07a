"""What is measured: one module per kernel family (Triton kernel, torch implementation,
spec with FLOP/byte formulas, inputs and float64 reference), the facts about dtypes, and
the registry.  Imports nothing from the other packages.  Adding a kernel = one module +
one line in _registry below.

The family modules load on first use of REGISTRY, not on `import kernels`: loading them
decorates their Triton kernels, which fixes for the whole process whether Triton compiles
them or interprets them on the CPU (TRITON_INTERPRET is read then).  So dtype facts
(kernels.spec) can be imported early, before a command decides on the interpreter.
"""

from __future__ import annotations

from typing import Any

from kernels.spec import DTYPE_NAMES, DTYPES, KernelSpec, Target, current_target

PROVIDERS: tuple[str, ...] = ("torch", "triton")


def _registry() -> dict[str, KernelSpec]:
    from kernels import add, attention, dot, gelu, matmul, matvec, mul, rowops

    return {
        spec.name: spec
        for spec in [
            add.SPEC,
            mul.SPEC,
            gelu.SPEC,
            gelu.SPEC_ERF,
            dot.SPEC,
            matvec.SPEC,
            matmul.SPEC,
            rowops.SOFTMAX_SPEC,
            rowops.LAYERNORM_SPEC,
            rowops.RMSNORM_SPEC,
            attention.SPEC,
            attention.SPEC_BWD,
        ]
    }


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        registry = _registry()
        globals()["REGISTRY"] = registry  # later lookups find the plain attribute
        return registry
    raise AttributeError(f"module 'kernels' has no attribute '{name}'")


__all__ = ["DTYPES", "DTYPE_NAMES", "PROVIDERS", "REGISTRY", "KernelSpec", "Target",
           "current_target"]
