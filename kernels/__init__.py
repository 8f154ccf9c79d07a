"""What is measured: one module per kernel family (Triton kernel, torch implementation,
spec with FLOP/byte formulas, inputs, float64 reference and shape group), the facts about
dtypes, and the registry.  Imports nothing from the other packages.  Adding a kernel = one
module + one line in _registry below (docs/adding-a-kernel.md).

The registry's order is the canonical kernel order: the sweep runs the families in it
(so a GPU job step with a time budget, cut short, has measured the first ones: keep the
existing entries' order and append new families), and the reports
(contract.rows.kernel_order) list and draw them in it.

The family modules load on first use of REGISTRY, not on `import kernels`: loading them
decorates their Triton kernels, which fixes for the whole process whether Triton compiles
them or interprets them on the CPU (TRITON_INTERPRET is read then).  So dtype facts
(kernels.spec) can be imported early, before a command decides on the interpreter.
"""

from __future__ import annotations

from typing import Any

from kernels.spec import DTYPE_NAMES, DTYPES, KernelSpec, Target, current_target

# Every provider a kernel may have: torch (eager), triton (this project's kernel),
# torch.compile of the torch provider (kernels/compiled.py: every family), and attention's
# SDPA backends one by one (kernels/attention_sdpa.py).  `--providers all` is every one but
# the opt-in compile-max (minutes of autotuning per shape); the default is
# DEFAULT_PROVIDERS, the two this suite always compared.
PROVIDERS: tuple[str, ...] = ("torch", "triton", "compile", "compile-max", "sdpa-flash",
                              "sdpa-cudnn", "sdpa-efficient", "sdpa-math")
ALL_PROVIDERS: tuple[str, ...] = tuple(p for p in PROVIDERS if p != "compile-max")
DEFAULT_PROVIDERS: tuple[str, ...] = ("torch", "triton")


def _registry() -> dict[str, KernelSpec]:
    from kernels import add, attention, dot, gelu, matmul, matvec, mul, rowops
    from kernels.compiled import with_compiled

    return checked([with_compiled(s) for s in [
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
    ]])


def checked(specs: list[KernelSpec]) -> dict[str, KernelSpec]:
    """The specs by name, in order; ValueError for a name given twice or a spec without a
    shape group (it would have no sizes to be swept at)."""
    registry: dict[str, KernelSpec] = {}
    for spec in specs:
        if spec.name in registry:
            raise ValueError(f"kernel {spec.name} is registered twice")
        if spec.shape_group is None:
            raise ValueError(f"kernel {spec.name} declares no shape group "
                             "(KernelSpec.shape_group)")
        unknown = set(spec.providers) - set(PROVIDERS)
        if unknown:
            raise ValueError(f"kernel {spec.name}: provider(s) {', '.join(sorted(unknown))} "
                             "not in kernels.PROVIDERS")
        registry[spec.name] = spec
    return registry


def triton_selection(kernels: list[str], dtypes: list[str], target: Target
                     ) -> tuple[list[tuple[KernelSpec, str]], list[str]]:
    """The (spec, dtype) pairs of a selection whose Triton provider runs on `target`, in
    order, and a note for each pair that has the variant but cannot run there (why).
    Kernels without Triton launches and dtypes their Triton provider lacks are passed
    over in silence: there is nothing of theirs to compile or launch."""
    from kernels import REGISTRY  # loads the families (this module's __getattr__)

    pairs: list[tuple[KernelSpec, str]] = []
    notes: list[str] = []
    for kernel in kernels:
        spec = REGISTRY[kernel]
        if spec.triton_launches is None or "triton" not in spec.providers:
            continue
        for dtype in dtypes:
            if dtype not in spec.providers["triton"].dtypes:
                continue
            reason = spec.skip_reason("triton", dtype, target)
            if reason:
                notes.append(f"{kernel} {dtype}: {reason}")
            else:
                pairs.append((spec, dtype))
    return pairs, notes


def __getattr__(name: str) -> Any:
    if name == "REGISTRY":
        registry = _registry()
        globals()["REGISTRY"] = registry  # later lookups find the plain attribute
        return registry
    raise AttributeError(f"module 'kernels' has no attribute '{name}'")


__all__ = ["ALL_PROVIDERS", "DEFAULT_PROVIDERS", "DTYPES", "DTYPE_NAMES", "PROVIDERS",
           "REGISTRY", "KernelSpec", "Target",
           "current_target"]
