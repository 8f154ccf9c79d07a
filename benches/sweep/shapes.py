"""The shapes a sweep runs: a size preset's, from each kernel's shape group
(KernelSpec.shape_group; the built-in groups are in kernels/shape_groups.py), or
explicit `--sizes`, parsed against the dimensions the registered families have.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from contract.models import (
    MODEL_SIZES,
    LayerShape,
    ModelConfigError,
    parse_model_sizes,
    step_shapes,
)
from kernels.shape_groups import GROUPS
from kernels.spec import SIZE_PRESETS, KernelSpec, Shape

PRESETS: tuple[str, ...] = SIZE_PRESETS  # the --sizes names

# The built-in groups' shapes by preset, then group name: what each preset sweeps.
GPU_PRESETS: dict[str, dict[str, list[Shape]]] = {
    p: {g.name: g.shapes(p, on_gpu=True) for g in GROUPS} for p in PRESETS}
CPU_PRESETS: dict[str, dict[str, list[Shape]]] = {
    p: {g.name: g.shapes(p, on_gpu=False) for g in GROUPS} for p in PRESETS}


class ShapeError(ValueError):
    """A malformed --sizes value (one-line message)."""


def preset_shapes(spec: KernelSpec, preset: str, on_gpu: bool) -> list[Shape]:
    """The shapes `spec` runs at in a size preset, on a GPU or a CPU."""
    if spec.shape_group is None:
        raise ShapeError(f"kernel {spec.name} declares no shape group")
    if preset not in PRESETS:
        raise ShapeError(f"unknown size preset '{preset}' (choose from {', '.join(PRESETS)})")
    return spec.shape_group.shapes(preset, on_gpu)


def _flags(spec: KernelSpec) -> tuple[str, ...]:
    return spec.shape_group.flags if spec.shape_group is not None else ()


def _registered() -> list[KernelSpec]:
    # Here, not at import: loading the registry decorates the Triton kernels (see
    # kernels/__init__.py), which a command decides on after importing this module.
    from kernels import REGISTRY

    return list(REGISTRY.values())


def _usage(kinds: list[tuple[str, ...]]) -> str:
    """'use n=..., M=...,K=... or B=...,causal=...': the shapes the families take."""
    forms = [",".join(f"{d}=..." for d in dims) for dims in kinds]
    if len(forms) < 2:
        return "use " + (forms[0] if forms else "the dimensions of a registered kernel")
    return f"use {', '.join(forms[:-1])} or {forms[-1]}"


def parse_sizes(text: str, specs: Iterable[KernelSpec] | None = None) -> list[Shape]:
    """Explicit shapes: entries separated by ';' (or spaces), each either a full shape of
    one family's dimensions ('n=1048576', 'M=4096,K=4096', 'M=4096,N=4096,K=4096', rows
    'M=4096,N=4096', 'B=1,H=16,S=4096,D=128,causal=1') or one integer meaning that size
    in every dimension of each family that takes one ('4096' -> n=4096, M=K=4096, ...;
    see shapes_for).  The families are `specs` (default: the registry's)."""
    specs = _registered() if specs is None else list(specs)
    kinds = list(dict.fromkeys(s.dims for s in specs))  # in registry order, once each
    names = {d for dims in kinds for d in dims}
    flags = {f for s in specs for f in _flags(s)}
    usage = _usage(kinds)
    entries = [e for e in text.replace(";", " ").split() if e]
    if not entries:
        raise ShapeError("--sizes is empty")
    shapes: list[Shape] = []
    for entry in entries:
        if "=" not in entry:
            try:
                v = int(entry)
            except ValueError:
                raise ShapeError(f"bad size '{entry}': expected {', '.join(PRESETS)}, "
                                 "an integer or a shape like M=4096,N=4096,K=4096") from None
            if v < 1:
                raise ShapeError(f"bad size '{entry}': must be >= 1")
            shapes.append({"*": v})
            continue
        shape: Shape = {}
        for part in entry.split(","):
            name, eq, value = part.partition("=")
            name = name.strip()
            if name not in names or not eq:
                raise ShapeError(f"bad shape '{entry}': {usage}")
            try:
                v = int(value)
            except ValueError:
                raise ShapeError(f"bad shape '{entry}': '{value}' is not an integer") from None
            if name in flags and v not in (0, 1):
                raise ShapeError(f"bad shape '{entry}': {name} is 0 or 1")
            if v < 1 and name not in flags:
                raise ShapeError(f"bad shape '{entry}': dimensions must be >= 1")
            if name in shape:
                raise ShapeError(f"bad shape '{entry}': {name} given twice")
            shape[name] = v
        if not any(set(shape) == set(dims) for dims in kinds):
            raise ShapeError(f"bad shape '{entry}': {usage}")
        shapes.append(shape)
    return shapes


def is_model_sizes(sizes: str) -> bool:
    """Whether `sizes` names a model (`model:NAME[:tokens=N]`), not a preset."""
    return sizes.startswith(MODEL_SIZES)


@cache
def _model_layers(sizes: str) -> tuple[LayerShape, ...]:
    try:
        return tuple(step_shapes(parse_model_sizes(sizes)))
    except ModelConfigError as e:
        raise ShapeError(str(e)) from None


def model_layers(sizes: str, kernel: str) -> list[LayerShape]:
    """The layers of `--sizes model:...` that `kernel` stands for (contract.models), in
    the model's order; ShapeError for a model that cannot be read."""
    return [s for s in _model_layers(sizes) if s.kernel == kernel]


def shapes_for(spec: KernelSpec, sizes: str, on_gpu: bool,
               explicit: list[Shape] | None = None) -> list[Shape]:
    """The shapes a kernel runs at: a preset's, a model's (`model:NAME`, the layers it
    stands for), or the explicit ones that fit its dims.  One integer sizes every
    dimension of a family without flags (a family with one, attention's causal, takes
    whole shapes only)."""
    if is_model_sizes(sizes):
        return [dict(s.shape) for s in model_layers(sizes, spec.name)]
    if explicit is None:
        return preset_shapes(spec, sizes, on_gpu)
    out = []
    for s in explicit:
        if "*" in s:
            if not _flags(spec):
                out.append({d: s["*"] for d in spec.dims})
        elif set(s) == set(spec.dims):
            out.append({d: s[d] for d in spec.dims})
    return out
