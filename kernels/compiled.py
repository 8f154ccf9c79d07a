"""The `compile` and `compile-max` providers: a family's torch provider under
torch.compile (Inductor: Triton kernels on a GPU, C++ on a CPU), built for every family
from its `torch` provider (with_compiled), so a family declares nothing for them.

One compiled callable per (kernel, input signature): each gets a fresh code object, so
that torch.compile's cache, which lives on the code object, holds one entry per shape and
dtype; a shared one would recompile at every new shape and, past torch's recompile limit,
silently run eager.  The first call of a signature compiles (the row's check call: the
sweep records its time as `compile_s`, outside the timing); a compile after it, while the
row is timed, shows in compile_count() and the sweep says so in the row.
"""

from __future__ import annotations

import functools
import importlib.util
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from kernels.spec import Inputs, KernelSpec, Provider, ProviderFn, Target

# provider name -> torch.compile mode.  compile-max autotunes Inductor's GEMM templates
# and more (minutes per shape on a GPU): opt-in, not part of --providers all.
COMPILE_MODES: dict[str, str] = {
    "compile": "default",
    "compile-max": "max-autotune-no-cudagraphs",
}


def compile_count() -> int:
    """Frames torch.compile has compiled in this process so far (dynamo's counter): a
    call that changes it compiled (or recompiled) something."""
    from torch._dynamo.utils import counters

    return int(counters["frames"]["total"])


def compile_mark(compiles: Callable[[], int] | None) -> int:
    """A provider's compile counter now (0 for one that does not compile)."""
    return compiles() if compiles is not None else 0


def first_call(call: Callable[[], object], compiles: Callable[[], int] | None,
               sync: Callable[[], None]) -> float | None:
    """Make a row's first call; the seconds it took when it compiled (torch.compile
    compiles at a signature's first call, kept out of the timing this way), else None (a
    provider that does not compile, or a signature compiled by an earlier row)."""
    before = compile_mark(compiles)
    t0 = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - t0 if compile_mark(compiles) != before else None


def recompile_note(compiles: Callable[[], int] | None, before: int) -> str:
    """What a compiling provider's row says when torch.compile compiled again while it
    was timed (`before`: compiles() when the timing began): its samples then hold a
    compile, or a graph other than the checked one.  "" when nothing compiled."""
    if compiles is None or compiles() == before:
        return ""
    return (f"recompiled while timed ({compiles() - before} torch.compile frame(s)): "
            "samples include compiling")


def _signature(inputs: Inputs, out: torch.Tensor) -> tuple[Any, ...]:
    """What a compiled graph is specialized on: every tensor's shape, strides and dtype,
    every other input's value (fp8 tags, causal), in the inputs' order."""
    def sig(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return ("t", tuple(v.shape), v.stride(), str(v.dtype), v.device.type)
        return ("v", repr(v))
    return tuple((k, sig(v)) for k, v in inputs.items()) + (("out", sig(out)),)


def _fresh(fn: ProviderFn) -> ProviderFn:
    """A call of `fn` with a code object of its own (see the module docstring)."""
    def call(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
        return fn(inputs, out)
    code = call.__code__.replace()  # a copy: torch.compile's cache is keyed by it
    return types.FunctionType(code, call.__globals__, call.__name__, call.__defaults__,
                              call.__closure__)


@dataclass(frozen=True)
class Compiled:
    """A provider fn under torch.compile(mode), compiled once per input signature:
    `run(inputs, out)` looks its compiled graph up at each call; `bind(inputs, out)` once,
    for a timer repeating the call on the same buffers (the lookup is the harness's
    cost, not torch.compile's)."""

    fn: ProviderFn
    mode: str
    cache: dict[tuple[Any, ...], Callable[..., torch.Tensor]] = field(default_factory=dict)

    def compiled(self, inputs: Inputs, out: torch.Tensor) -> Callable[..., torch.Tensor]:
        key = _signature(inputs, out)
        got = self.cache.get(key)
        if got is None:
            got = self.cache[key] = torch.compile(_fresh(self.fn), mode=self.mode,
                                                  dynamic=False)
        return got

    def run(self, inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
        return self.compiled(inputs, out)(inputs, out)

    def bind(self, inputs: Inputs, out: torch.Tensor) -> Callable[[], object]:
        return functools.partial(self.compiled(inputs, out), inputs, out)


def compiled_fn(fn: ProviderFn, mode: str) -> ProviderFn:
    """`fn` under torch.compile(mode), compiled once per input signature."""
    return Compiled(fn, mode).run


def compile_skip(target: Target) -> str | None:
    """Why torch.compile cannot run on `target` here, or None."""
    supported = getattr(torch._dynamo, "is_dynamo_supported", None)
    if supported is not None and not supported():
        return "torch.compile is not supported on this Python/platform (dynamo says so)"
    if target.kind == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile on a GPU generates Triton kernels: the triton package is absent"
    return None


def compiled_provider(name: str, base: Provider) -> Provider:
    """The torch provider `base` under torch.compile (COMPILE_MODES[name])."""
    mode = COMPILE_MODES[name]
    base_skip = base.skip

    def skip(dtype: str, target: Target) -> str | None:
        return compile_skip(target) or (base_skip(dtype, target) if base_skip else None)

    comp = Compiled(base.fn, mode)
    return Provider(name, comp.run, base.dtypes, skip=skip, bind=comp.bind,
                    note=f"torch.compile(mode={mode!r}) of the torch provider "
                         f"({base.note or 'eager PyTorch'})",
                    compiles=compile_count)


def with_compiled(spec: KernelSpec) -> KernelSpec:
    """`spec` with a compile and a compile-max provider made from its torch provider
    (unchanged if it has none or declares its own)."""
    base = spec.providers.get("torch")
    if base is None:
        return spec
    provs = dict(spec.providers)
    for name in COMPILE_MODES:
        provs.setdefault(name, compiled_provider(name, base))
    return replace(spec, providers=provs)
