"""The machinery shared by the elementwise families (add, mul, gelu): one Triton kernel
body, made into a kernel per op, and a spec factory.  Each family module supplies only its math.

Semantics per dtype: fp32/fp16/bf16 tensors in and out, math in fp32.  fp8 (e4m3 or
e5m2): inputs with per-tensor scales, math in fp32 on the dequantized values, output
re-quantized to the same fp8 format with its own per-tensor scale (docs/design.md).
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.spec import (
    DTYPES,
    PLAIN_DTYPES,
    Inputs,
    KernelSpec,
    Provider,
    Shape,
    TritonLaunch,
    dequantize,
    out_scale_for,
    quantize,
    randn,
)
from kernels.triton_utils import round_for_store, run_launch, store_round_bits

ELEMENTWISE_DTYPES = tuple(d for d in PLAIN_DTYPES if d != "tf32")  # tf32 is a matmul mode


def elementwise_kernel(X, Y, O, SX, SY, SO, n, ARITY: tl.constexpr, SCALED: tl.constexpr,
                       APPROX: tl.constexpr, BLOCK: tl.constexpr, MBITS: tl.constexpr):
    # The body of every op's kernel (elementwise_kernel_for binds OP_FN, the op's math).
    # One pass over memory: each program owns BLOCK contiguous elements.  Contiguous
    # aranges let the compiler emit 16-byte vector loads (BLOCK is a multiple of
    # 16 bytes / itemsize x threads).  Offsets in int64 so n > 2^31 cannot overflow.
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # Upcast to fp32 before any arithmetic: exact for every input format, and the
    # interpreter's bf16 arithmetic is wrong without it.
    x = tl.load(X + offs, mask=mask).to(tl.float32)
    if SCALED:
        x = x * tl.load(SX)
    if ARITY == 2:
        y = tl.load(Y + offs, mask=mask).to(tl.float32)
        if SCALED:
            y = y * tl.load(SY)
        r = OP_FN(x, y, APPROX)  # noqa: F821 (bound per op)
    else:
        r = OP_FN(x, x, APPROX)  # noqa: F821
    if SCALED:
        # One reciprocal per program, a multiply per element: a division per element is
        # div.full.f32, three instructions with its range scaling.
        r = r * (1.0 / tl.load(SO))
    tl.store(O + offs, round_for_store(r, MBITS).to(O.dtype.element_ty), mask=mask)


@functools.cache
def elementwise_kernel_for(op) -> triton.JITFunction:
    """The elementwise kernel of one op: elementwise_kernel's code with `op` (a
    @triton.jit (x, y, APPROX) -> r) bound as the global OP_FN of its own namespace.

    Not a constexpr argument: whenever a post-compile hook is set (the sweep always sets
    one), a launch's constexprs are serialised to JSON, and triton 3.6 cannot serialise a
    jit function (TypeError on the first launch of every op).  Not a closure either: the
    CPU interpreter re-executes a kernel's source in its function's globals, losing
    closures; globals are what both the compiler and the interpreter read, and Triton
    hashes the globals a kernel uses into its cache key.  One kernel object per op, kept:
    its compiled variants live on it."""
    body = elementwise_kernel
    fn = types.FunctionType(body.__code__, {**globals(), "OP_FN": op}, body.__name__,
                            body.__defaults__)
    # A new function object carries none of these; the JIT reads the constexpr
    # annotations to know which parameters are compile-time.
    fn.__annotations__ = dict(body.__annotations__)
    fn.__module__, fn.__qualname__ = body.__module__, body.__qualname__
    return triton.jit(fn)


def approx_ok(out: torch.Tensor) -> bool:
    """Whether an op may use approximate transcendentals (kernels.triton_utils) for an
    output like `out`: 16- and 8-bit formats, whose unit roundoff (2^-11 and coarser) is
    at or above tanh.approx's error; fp32 keeps exact math."""
    return out.element_size() < 4


def _block_for(t: torch.Tensor) -> tuple[int, int]:
    """(BLOCK, num_warps): 8 warps x 32 threads each moving 4 x 16-byte vectors."""
    per_thread = 4 * 16 // t.element_size()
    return 256 * per_thread, 8


def elementwise_launch(op, arity: int, inputs: Inputs, out: torch.Tensor) -> TritonLaunch:
    """The one launch of an elementwise op: a fixed BLOCK per element size, no tuning."""
    x = inputs["x"]
    y = inputs.get("y", x)
    n = x.numel()
    block, warps = _block_for(x)
    return TritonLaunch(
        fn=elementwise_kernel_for(op),
        args=(x, y, out, inputs["sx"], inputs.get("sy", inputs["sx"]), inputs["so"], n),
        constexprs={"ARITY": arity,
                    "SCALED": x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2),
                    "APPROX": approx_ok(out), "MBITS": store_round_bits(out)},
        configs=(triton.Config({"BLOCK": block}, num_warps=warps),),
        grid=lambda meta: (triton.cdiv(n, meta["BLOCK"]),),
        operands={"X": (1,), "Y": (1,)} if arity == 2 else {"X": (1,)},
    )


def launch_elementwise(op, arity: int, inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    run_launch(elementwise_launch(op, arity, inputs, out))
    return out


@dataclass(frozen=True)
class _Op:
    """One elementwise op's parts (elementwise_spec's arguments) and the spec's functions
    made of them: its inputs, float64 reference, torch and Triton runs and bytes."""

    arity: int
    triton_op: Any
    math: Callable[..., torch.Tensor]
    torch_native: Callable[..., torch.Tensor]
    out_bound: Callable[..., torch.Tensor]

    @property
    def names(self) -> tuple[str, ...]:
        return ("x", "y")[:self.arity]

    def make_inputs(self, shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
        n = shape["n"]
        inputs: Inputs = {}
        amaxes = []
        for i, nm in enumerate(self.names):
            stored, scale = quantize(randn((n,), seed + i, device), dtype)
            inputs[nm], inputs["s" + nm] = stored, scale
            amaxes.append(dequantize(stored, scale).abs().amax().float())
        one = torch.ones((), dtype=torch.float32, device=device)
        inputs["so"] = out_scale_for(self.out_bound(*amaxes), dtype) \
            if DTYPES[dtype].is_fp8 else one
        return inputs

    def reference(self, inputs: Inputs, dtype: str) -> torch.Tensor:
        return self.math(*(dequantize(inputs[nm], inputs["s" + nm]) for nm in self.names))

    def run_torch(self, inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
        if inputs["x"].dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            return self.torch_native(*(inputs[nm] for nm in self.names), out=out)
        # No fp8 arithmetic in eager PyTorch: upcast, compute in fp32, re-quantize.
        vals = [inputs[nm].float() * inputs["s" + nm] for nm in self.names]
        return (self.math(*vals) / inputs["so"]).to(out.dtype)

    def run_triton(self, inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
        return launch_elementwise(self.triton_op, self.arity, inputs, out)

    def launches(self, inputs: Inputs, out: torch.Tensor, sms: int) -> list[TritonLaunch]:
        return [elementwise_launch(self.triton_op, self.arity, inputs, out)]

    def nbytes(self, shape: Shape, dtype: str) -> int:
        # Compulsory traffic: each input read once and the output written once, all in
        # the storage dtype.  fp8 scales (4 bytes each) are negligible and not counted.
        return (self.arity + 1) * shape["n"] * DTYPES[dtype].itemsize


def _alloc_out(inputs: Inputs, dtype: str) -> torch.Tensor:
    return torch.empty_like(inputs["x"])


def _decode(out: torch.Tensor, inputs: Inputs, dtype: str) -> torch.Tensor:
    return dequantize(out, inputs["so"])


def elementwise_spec(
    name: str,
    arity: int,
    triton_op,
    math: Callable[..., torch.Tensor],
    torch_native: Callable[..., torch.Tensor],
    flops_per_element: int,
    flops_note: str,
    out_bound: Callable[..., torch.Tensor],
    description: str,
) -> KernelSpec:
    """Build the spec of an elementwise op.

    triton_op: @triton.jit (x, y, APPROX) -> r on fp32 blocks (unary ops ignore y;
      APPROX: approx_ok of the output, approximate transcendentals allowed).
    math: the op on torch tensors of any float dtype (the float64 reference, and the fp32
      math of the eager fp8 path, where torch has no fp8 kernels).
    torch_native: what a user writes in eager PyTorch: (*tensors, out=out) -> tensor.
    out_bound: bound on |result| from the inputs' amax values (sizes the fp8 output scale).
    """
    op = _Op(arity, triton_op, math, torch_native, out_bound)
    return KernelSpec(
        name=name,
        family=name.split("_")[0],
        dims=("n",),
        flops=lambda shape, dtype: flops_per_element * shape["n"],
        nbytes=op.nbytes,
        flops_formula=f"{flops_per_element} n  ({flops_note})",
        bytes_formula=f"{arity + 1} n b",
        make_inputs=op.make_inputs,
        alloc_out=_alloc_out,
        reference=op.reference,
        decode=_decode,
        providers={
            "torch": Provider("torch", op.run_torch, ELEMENTWISE_DTYPES,
                              note="eager op; fp8: upcast to fp32, compute, re-quantize"),
            "triton": Provider("triton", op.run_triton, ELEMENTWISE_DTYPES,
                               note="one pass, fp32 math, 64 B per thread"),
        },
        description=description,
        triton_launches=op.launches,
    )
