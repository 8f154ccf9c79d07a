"""dot: s = sum_i x_i y_i over n elements.

FLOPs: 2n (a multiply and an add per element).  Bytes: both inputs read once (2 n b) plus
the scalar output written once.  Output dtype: the input dtype for fp32/fp16/bf16; bf16
for fp8 inputs (fp8 products produce bf16 results, as matmul does).  Accumulation is fp32.

Triton: a deterministic two-stage reduction.  Stage 1 runs a fixed number of programs,
each striding over the input and keeping a BLOCK-wide fp32 accumulator, then writing one
partial sum; stage 2, one program, sums the partials in a fixed tree order.  The same n
on the same GPU always gives bit-identical results (no atomics).
"""

from __future__ import annotations

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
    quantize,
    randn,
)
from kernels.triton_utils import round_for_store, run_launch, store_round_bits

DOT_DTYPES = tuple(d for d in PLAIN_DTYPES if d != "tf32")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def product_out_dtype(dtype: str) -> torch.dtype:
    """Output dtype of the product families (dot, matvec, matmul): bf16 for fp8 and
    block-scaled inputs."""
    d = DTYPES[dtype]
    return torch.bfloat16 if d.is_fp8 or d.block else d.storage


@triton.jit
def dot_partial_kernel(X, Y, P, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    # Grid-stride loop: program p handles blocks p, p + P, p + 2P, ...
    for start in range(pid.to(tl.int64) * BLOCK, n, nprog.to(tl.int64) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(X + offs, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + offs, mask=mask, other=0.0).to(tl.float32)
        acc += x * y
    tl.store(P + pid, tl.sum(acc, axis=0))


@triton.jit
def dot_final_kernel(P, O, SX, SY, nparts, BLOCK: tl.constexpr, MBITS: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    parts = tl.load(P + offs, mask=offs < nparts, other=0.0)
    s = tl.sum(parts, axis=0) * tl.load(SX) * tl.load(SY)
    tl.store(O, round_for_store(s, MBITS).to(O.dtype.element_ty))


def _num_partials(n: int, block: int, sms: int) -> int:
    # On a GPU: enough programs to fill every SM several times over, few enough partials
    # for one program to sum them.  A multiple of 16, so that Triton specializes the
    # count as divisible by 16 and the final sum loads 128 bits per thread (568 partials
    # on a 142-SM L40S gave 32-bit loads).  sms = 0: the CPU interpreter.
    cap = max(16, 4 * sms // 16 * 16) if sms else 64
    return max(1, min(triton.cdiv(n, block), cap))


def triton_launches(inputs: Inputs, out: torch.Tensor, sms: int) -> list[TritonLaunch]:
    """The two launches of a dot on a GPU with `sms` SMs: partial sums, then their sum."""
    x, y = inputs["x"], inputs["y"]
    n = x.numel()
    block = 4096 if x.element_size() >= 2 else 8192
    nparts = _num_partials(n, block, sms)
    partials = torch.empty(nparts, dtype=torch.float32, device=x.device)
    return [
        TritonLaunch(
            fn=dot_partial_kernel, args=(x, y, partials, n), constexprs={"BLOCK": block},
            configs=(triton.Config({}, num_warps=8),), grid=lambda meta: (nparts,),
            operands={"X": (1,), "Y": (1,)}),
        TritonLaunch(
            fn=dot_final_kernel, args=(partials, out, inputs["sx"], inputs["sy"], nparts),
            constexprs={"BLOCK": triton.next_power_of_2(nparts),
                        "MBITS": store_round_bits(out)},
            configs=(triton.Config({}, num_warps=4),), grid=lambda meta: (1,),
            operands={"P": (1,)}),
    ]


def dot_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    x = inputs["x"]
    sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
           if x.device.type == "cuda" else 0)
    for launch in triton_launches(inputs, out, sms):
        run_launch(launch)
    return out


def dot_torch(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    x, y = inputs["x"], inputs["y"]
    if x.dtype in FP8:
        # No fp8 dot in eager PyTorch: upcast, dot in fp32, scale, cast to bf16.
        return (torch.dot(x.float(), y.float()) * inputs["sx"] * inputs["sy"]).to(out.dtype)
    return torch.dot(x, y, out=out)


def make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
    n = shape["n"]
    # x ~ N(0, n^-1/2) and y = x/2 + independent noise of the same size: the dot is then
    # about sqrt(n)/2 +- 1, never near zero by chance (a scalar's relative error blows up
    # when the reference cancels to ~0), and far below fp16's 65504 for any n < 2^34.
    scale = n ** -0.25
    xf = randn((n,), seed, device, scale)
    x, sx = quantize(xf, dtype)
    y, sy = quantize(0.5 * xf + randn((n,), seed + 1, device, scale), dtype)
    return {"x": x, "y": y, "sx": sx, "sy": sy}


SPEC = KernelSpec(
    name="dot",
    family="dot",
    dims=("n",),
    flops=lambda shape, dtype: 2 * shape["n"],
    nbytes=lambda shape, dtype: (2 * shape["n"] * DTYPES[dtype].itemsize
                                 + product_out_dtype(dtype).itemsize),
    flops_formula="2 n  (multiply + add per element)",
    bytes_formula="2 n b + b_out",
    make_inputs=make_inputs,
    alloc_out=lambda inputs, dtype: torch.empty((), dtype=product_out_dtype(dtype),
                                                device=inputs["x"].device),
    reference=lambda inputs, dtype: torch.dot(dequantize(inputs["x"], inputs["sx"]),
                                              dequantize(inputs["y"], inputs["sy"])),
    providers={
        "torch": Provider("torch", dot_torch, DOT_DTYPES,
                          note="torch.dot; fp8: upcast to fp32"),
        "triton": Provider("triton", dot_triton, DOT_DTYPES,
                           note="deterministic two-stage reduction, fp32 accumulation"),
    },
    description="inner product of two vectors",
    triton_launches=triton_launches,
)
