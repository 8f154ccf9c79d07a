"""matvec (GEMV): y = A x with A of shape M x K and x of length K.

FLOPs: 2 M K (a multiply and an add per matrix element).  Bytes: A and x read once,
(M K + K) b_in, and y written once, M b_out.  Output dtype as for dot (bf16 for fp8).

Triton: a blocked row reduction.  Each program owns BLOCK_M rows and walks K in BLOCK_K
steps with a [BLOCK_M, BLOCK_K] fp32 accumulator, reduced once at the end, so every
element of A is read exactly once; x is re-read per program but stays in L2.  STAGES > 1
pipelines the steps' loads through shared memory (cp.async), STAGES - 1 tiles ahead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.dot import DOT_DTYPES, FP8, product_out_dtype
from kernels.shape_groups import MATVEC
from kernels.spec import (
    DTYPES,
    Inputs,
    KernelSpec,
    Provider,
    Shape,
    Target,
    TritonLaunch,
    dequantize,
    for_arch,
    launch_capability,
    quantize,
    randn,
)
from kernels.triton_utils import round_for_store, run_launch, store_round_bits


@triton.jit
def matvec_kernel(A, X, Y, SA, SX, M, K, stride_am, BLOCK_M: tl.constexpr,
                  BLOCK_K: tl.constexpr, STAGES: tl.constexpr, MBITS: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    cols = tl.arange(0, BLOCK_K)
    a_ptrs = A + rows.to(tl.int64)[:, None] * stride_am + cols[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        kmask = (k + cols) < K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & kmask[None, :], other=0.0)
        x = tl.load(X + k + cols, mask=kmask, other=0.0)
        acc += a.to(tl.float32) * x.to(tl.float32)[None, :]
        a_ptrs += BLOCK_K
    y = tl.sum(acc, axis=1) * (tl.load(SA) * tl.load(SX))
    tl.store(Y + rows, round_for_store(y, MBITS).to(Y.dtype.element_ty), mask=row_mask)


def _configs(rows: list[tuple[int, int, int, int, int]]) -> list[triton.Config]:
    """(BLOCK_M, BLOCK_K, num_warps, num_stages, STAGES) rows as configs."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_K": bk, "STAGES": st}, num_warps=w,
                          num_stages=s)
            for bm, bk, w, s, st in rows]


# Hopper-oriented candidates: short row blocks keep enough programs in flight for
# M = 4096 on 132 SMs; wide K blocks give each thread several 16-byte loads per step.
# The first seven are the plain loop the H200 run tuned over (STAGES = 1: num_stages
# alone pipelines nothing here, as their SASS shows: each step's loads waited on, then x
# passed through shared memory to the rows' layout, two barriers a step).  The last
# three are pipelined: 4 warps at <= 72 registers and <= 27 KB of buffers, so 7 programs
# an SM (bf16) keep 2-3 tiles each in flight, 144-168 KB an SM against the plain (8 x
# 1024, 8 warps) config's 48 KB, and read x from the pipeline's buffer in the layout the
# FMAs want (docs/hopper.md).  None spills, fp32 to fp8, with triton 3.6 or 3.9.
CONFIGS = _configs([
    (8, 512, 4, 3, 1), (16, 256, 4, 3, 1), (16, 512, 8, 3, 1), (32, 256, 8, 3, 1),
    (4, 1024, 4, 3, 1), (8, 1024, 8, 2, 1), (16, 128, 4, 4, 1),
    (8, 512, 4, 4, 4), (16, 256, 4, 4, 4), (8, 256, 4, 5, 5),
])
# Blackwell (sm_100 class): 4 x 1024 takes 8 warps (with 4 it spills there; docs/kernels.md,
# "Config lists").
SM100_CONFIGS = _configs([
    (8, 512, 4, 3, 1), (16, 256, 4, 3, 1), (16, 512, 8, 3, 1), (32, 256, 8, 3, 1),
    (4, 1024, 8, 3, 1), (8, 1024, 8, 2, 1), (16, 128, 4, 4, 1),
    (8, 512, 4, 4, 4), (16, 256, 4, 4, 4), (8, 256, 4, 5, 5),
])
# Per compute-capability major version; any other GPU (and meta/CPU tensors): CONFIGS.
ARCH_CONFIGS: dict[int, list[triton.Config]] = {10: SM100_CONFIGS}


def triton_launches(inputs: Inputs, out: torch.Tensor, sms: int,
                    target: Target | None = None) -> list[TritonLaunch]:
    """The one launch of a GPU run on `target` (None: the GPU holding the inputs),
    autotuned over that arch's configs (ARCH_CONFIGS, else CONFIGS)."""
    a, x = inputs["A"], inputs["x"]
    m, k = a.shape
    return [TritonLaunch(
        fn=matvec_kernel,
        args=(a, x, out, inputs["sa"], inputs["sx"], m, k, a.stride(0)),
        constexprs={"MBITS": store_round_bits(out)},
        configs=tuple(for_arch(ARCH_CONFIGS, CONFIGS, launch_capability(target, a))),
        grid=lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),),
        tune_key=("M", "K"),
        tuner="matvec",
        # A's rows are walked with contiguous column offsets; x is contiguous.
        operands={"A": ("stride_am", 1), "X": (1,)},
        interp_config=triton.Config({"BLOCK_M": 16, "BLOCK_K": 64, "STAGES": 1}),
    )]


def matvec_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    for launch in triton_launches(inputs, out, 0):
        run_launch(launch)
    return out


def matvec_torch(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    a, x = inputs["A"], inputs["x"]
    if a.dtype in FP8:
        # No fp8 GEMV in eager PyTorch (_scaled_mm needs dims that are multiples of 16):
        # upcast, multiply in fp32, scale, cast to bf16.
        return (torch.mv(a.float(), x.float()) * (inputs["sa"] * inputs["sx"])).to(out.dtype)
    return torch.mv(a, x, out=out)


def make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
    m, k = shape["M"], shape["K"]
    scale = k ** -0.25  # outputs ~ N(0, 1) whatever K
    a, sa = quantize(randn((m, k), seed, device, scale), dtype)
    x, sx = quantize(randn((k,), seed + 1, device, scale), dtype)
    return {"A": a, "x": x, "sa": sa, "sx": sx}


def _nbytes(shape: Shape, dtype: str) -> int:
    m, k = shape["M"], shape["K"]
    return (m * k + k) * DTYPES[dtype].itemsize + m * product_out_dtype(dtype).itemsize


SPEC = KernelSpec(
    name="matvec",
    family="matvec",
    dims=("M", "K"),
    flops=lambda shape, dtype: 2 * shape["M"] * shape["K"],
    nbytes=_nbytes,
    flops_formula="2 M K  (multiply + add per matrix element)",
    bytes_formula="(M K + K) b_in + M b_out",
    make_inputs=make_inputs,
    alloc_out=lambda inputs, dtype: torch.empty(inputs["A"].shape[0],
                                                dtype=product_out_dtype(dtype),
                                                device=inputs["A"].device),
    reference=lambda inputs, dtype: torch.mv(dequantize(inputs["A"], inputs["sa"]),
                                             dequantize(inputs["x"], inputs["sx"])),
    providers={
        "torch": Provider("torch", matvec_torch, DOT_DTYPES,
                          note="torch.mv; fp8: upcast to fp32"),
        "triton": Provider("triton", matvec_triton, DOT_DTYPES,
                           note="blocked row reduction, A read once, fp32 accumulation"),
    },
    description="matrix-vector product (GEMV)",
    triton_launches=triton_launches,
    shape_group=MATVEC,
)
