"""matmul (GEMM): C = A B with A of shape M x K and B of shape K x N.

FLOPs: 2 M N K (a multiply and an add per term of each of the M N dot products).
Bytes: compulsory traffic only, A and B read once and C written once:
(M K + K N) b_in + M N b_out.  Re-reads of tiles from L2 are not compulsory.

dtypes: fp32 is IEEE fp32 for both providers (Triton input_precision="ieee", torch with
TF32 off); tf32 is its own dtype (fp32 storage, TF32 tensor-core math, its own roof);
fp16/bf16 in and out with fp32 accumulation; fp8 (e4m3 or e5m2) inputs with per-tensor
scales, fp32 accumulation, bf16 output.  B of fp8 runs is stored column-major (what
torch._scaled_mm requires); both providers multiply the very same tensors.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from kernels.dot import FP8, product_out_dtype
from kernels.spec import (
    DTYPE_NAMES,
    DTYPES,
    Inputs,
    KernelSpec,
    Provider,
    Shape,
    Target,
    dequantize,
    quantize,
    randn,
)
from kernels.triton_utils import round_for_store, store_round_bits


@triton.jit
def matmul_kernel(A, B, C, SA, SB, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, PRECISION: tl.constexpr, SCALED: tl.constexpr,
                  MBITS: tl.constexpr):
    # Grouped ordering: consecutive programs walk GROUP_M row-blocks down a column of
    # C-tiles before moving right, so the A and B tiles they share are still in L2.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % group_rows)
    pid_n = (pid % per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Rows/cols past the edge wrap around (modulo) instead of being masked: the loads
    # stay unmasked and in bounds, and the masked store drops the duplicates.
    am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    a_ptrs = A + am.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + offs_k[:, None] * stride_bk + bn.to(tl.int64)[None, :] * stride_bn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SCALED:
        acc = acc * (tl.load(SA) * tl.load(SB))

    c_ptrs = C + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, round_for_store(acc, MBITS).to(C.dtype.element_ty), mask=mask)


def _cfg(bm: int, bn: int, bk: int, stages: int, warps: int, group: int = 8) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                         num_stages=stages, num_warps=warps)


# Candidates per input width, aimed at Hopper: 128x256 / 256x128 tiles with 8 warps
# (two warpgroups) feed wgmma; BLOCK_K spans 128 bytes of a row (64 x 16-bit, 128 x fp8,
# 32 x fp32), the swizzle width of shared memory; 3-4 stages fit in 228 KB of smem.
_CONFIGS: dict[str, list[triton.Config]] = {
    "16bit": [_cfg(128, 256, 64, 3, 8), _cfg(256, 128, 64, 3, 8), _cfg(128, 128, 64, 4, 8),
              _cfg(128, 128, 64, 4, 4), _cfg(128, 64, 64, 4, 4), _cfg(64, 128, 64, 4, 4),
              _cfg(64, 64, 64, 4, 4)],
    "fp8": [_cfg(128, 256, 128, 3, 8), _cfg(256, 128, 128, 3, 8), _cfg(128, 128, 128, 4, 8),
            _cfg(128, 128, 128, 4, 4), _cfg(128, 64, 128, 4, 4), _cfg(64, 128, 128, 4, 4),
            _cfg(64, 64, 128, 4, 4)],
    "tf32": [_cfg(128, 256, 32, 3, 8), _cfg(128, 128, 32, 4, 8), _cfg(128, 128, 32, 3, 4),
             _cfg(128, 64, 32, 4, 4), _cfg(64, 64, 32, 4, 4)],
    # IEEE fp32 runs on the CUDA cores (no tensor cores): smaller tiles, more warps.
    "ieee": [_cfg(128, 128, 32, 3, 8), _cfg(128, 64, 32, 3, 4), _cfg(64, 128, 32, 3, 4),
             _cfg(64, 64, 32, 4, 4), _cfg(32, 64, 32, 4, 4)],
}
# One autotuner per config family, so fp32 and tf32 (same tensor dtype, different math)
# never share a cache entry.
_TUNED = {name: triton.autotune(configs=cfgs, key=["M", "N", "K"])(matmul_kernel)
          for name, cfgs in _CONFIGS.items()}


def _family(dtype: str) -> str:
    return {"fp32": "ieee", "tf32": "tf32"}.get(
        dtype, "fp8" if DTYPES[dtype].is_fp8 else "16bit")


def matmul_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    a, b, dtype = inputs["A"], inputs["B"], inputs["dtype"]
    m, k = a.shape
    n = b.shape[1]
    args = (a, b, out, inputs["sa"], inputs["sb"], m, n, k, *a.stride(), *b.stride(),
            *out.stride())
    # "ieee" keeps fp32 off the tensor cores; "tf32" is also Triton's default, which
    # 16-bit and fp8 operands ignore.
    flags = {"PRECISION": "ieee" if dtype == "fp32" else "tf32",
             "SCALED": DTYPES[dtype].is_fp8}
    if a.device.type == "cuda":
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)
        _TUNED[_family(dtype)][grid](*args, **flags, MBITS=0)
    else:  # interpreter: one small tile, autotuning would only cost time
        bm = bn = bk = 32
        matmul_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](
            *args, **flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=4,
            MBITS=store_round_bits(out))
    return out


class UnsupportedShape(ValueError):
    """A shape this provider's library call rejects; the harness records a skipped row."""


@contextmanager
def fp32_matmul_precision(tf32: bool):
    """TF32 on ("high") or IEEE fp32 ("highest") for torch's fp32 matmuls, restored after.
    set_float32_matmul_precision is the API stable across torch versions; the older
    allow_tf32 flag is deprecated in newer releases."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


def matmul_torch(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    a, b = inputs["A"], inputs["B"]
    if a.dtype in FP8:
        if a.device.type == "cuda" and any(d % 16 for d in (*a.shape, b.shape[1])):
            raise UnsupportedShape("torch._scaled_mm needs M, N and K to be multiples of 16")
        return torch._scaled_mm(a, b, inputs["sa"], inputs["sb"], out_dtype=out.dtype)
    # fp32 and tf32 share fp32 tensors; the dtype tag picks the math.
    with fp32_matmul_precision(inputs["dtype"] == "tf32"):
        return torch.matmul(a, b, out=out)


def _torch_skip(dtype: str, target: Target) -> str | None:
    if dtype == "tf32" and target.kind != "cuda":
        return "tf32 is an NVIDIA tensor-core mode; the CPU has none"
    if dtype == "fp8e5" and target.kind == "cuda":
        return "torch._scaled_mm does not multiply two e5m2 matrices"
    return None


def _triton_skip(dtype: str, target: Target) -> str | None:
    if target.kind != "cuda" and target.interpret and dtype == "bf16":
        return "tl.dot on bf16 is wrong in the Triton interpreter (checked on GPU only)"
    return None


def make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
    m, n, k = shape["M"], shape["N"], shape["K"]
    scale = k ** -0.25  # entries of C ~ N(0, 1) whatever K: inside fp8 and fp16 range
    a, sa = quantize(randn((m, k), seed, device, scale), dtype)
    if DTYPES[dtype].is_fp8:
        # Column-major B: allocate N x K and view it transposed.
        b, sb = quantize(randn((n, k), seed + 1, device, scale), dtype)
        b = b.t()
    else:
        b, sb = quantize(randn((k, n), seed + 1, device, scale), dtype)
    # The dtype tag tells fp32 from tf32, whose tensors are identical.
    return {"A": a, "B": b, "sa": sa, "sb": sb, "dtype": dtype}


def _nbytes(shape: Shape, dtype: str) -> int:
    m, n, k = shape["M"], shape["N"], shape["K"]
    return (m * k + k * n) * DTYPES[dtype].itemsize + m * n * product_out_dtype(dtype).itemsize


SPEC = KernelSpec(
    name="matmul",
    family="matmul",
    dims=("M", "N", "K"),
    flops=lambda shape, dtype: 2 * shape["M"] * shape["N"] * shape["K"],
    nbytes=_nbytes,
    flops_formula="2 M N K  (multiply + add per term)",
    bytes_formula="(M K + K N) b_in + M N b_out",
    make_inputs=make_inputs,
    alloc_out=lambda inputs, dtype: torch.empty(
        inputs["A"].shape[0], inputs["B"].shape[1], dtype=product_out_dtype(dtype),
        device=inputs["A"].device),
    reference=lambda inputs, dtype: dequantize(inputs["A"], inputs["sa"])
    @ dequantize(inputs["B"], inputs["sb"]),
    providers={
        "torch": Provider("torch", matmul_torch, DTYPE_NAMES, skip=_torch_skip,
                          note="torch.matmul (cuBLAS); fp8: torch._scaled_mm"),
        "triton": Provider("triton", matmul_triton, DTYPE_NAMES, skip=_triton_skip,
                           note="tiled tl.dot, grouped ordering, autotuned for Hopper"),
    },
    matrix_unit=True,
    description="matrix-matrix product (GEMM)",
)
