"""matmul (GEMM): C = A B with A of shape M x K and B of shape K x N.

FLOPs: 2 M N K (a multiply and an add per term of each of the M N dot products).
Bytes: compulsory traffic only, A and B read once and C written once:
(M K + K N) b_in + M N b_out.  Re-reads of tiles from L2 are not compulsory.

dtypes: fp32 is IEEE fp32 for both providers (Triton input_precision="ieee", torch with
TF32 off); tf32 is its own dtype (fp32 storage, TF32 tensor-core math, its own roof);
fp16/bf16 in and out with fp32 accumulation; fp8 (e4m3 or e5m2) inputs with per-tensor
scales, fp32 accumulation, bf16 output, in the accumulation mode of
kernels.spec.fp8_accum() for both providers (and the measured fp8 ceiling).
Block-scaled mxfp8, mxfp4 and nvfp4 (kernels/blockscaled.py: formats, quantization and
their bytes; kernels/matmul_blockscaled.py: tl.dot_scaled and torch._scaled_mm) are
dispatched there: same FLOPs, bytes of the packed elements plus every scale byte.

Layout: B of fp8 and tf32 runs is stored column-major (K-major).  torch._scaled_mm
requires it for fp8; for tf32 it is what Hopper's wgmma reads from shared memory, so
Triton fills B's tiles with 16-byte cp.async instead of 4-byte ones (row-major B cost 4x
the copy instructions and 255 registers in the 128x256 config, 182 column-major).  Both
providers multiply the very same tensors.  fp32 (IEEE, CUDA cores) and 16-bit B stay
row-major: their copies are 16 bytes either way.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import triton
import triton.language as tl

from kernels import blockscaled, matmul_blockscaled
from kernels.dot import FP8, product_out_dtype
from kernels.shape_groups import MATMUL
from kernels.spec import (
    DTYPE_NAMES,
    DTYPES,
    Inputs,
    KernelSpec,
    Provider,
    Shape,
    Target,
    TritonLaunch,
    UnsupportedShape,
    dequantize,
    for_arch,
    fp8_accum,
    launch_capability,
    quantize,
    randn,
)
from kernels.triton_utils import (
    grouped_coords,
    grouped_tile,
    round_for_store,
    run_launch,
    store_round_bits,
    store_tile,
    tile_config,
)


@triton.jit
def _matmul_tma_persistent(A, B, C, SA, SB, M, N, K, stride_am, stride_bk, stride_bn,
                           stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                           SCALED: tl.constexpr, MBITS: tl.constexpr):
    """The TMA configs' body: tiles through tensor descriptors (the copy engine moves
    them, one elected thread issues each copy, mbarriers say when they landed; edges
    zero-filled on load and clipped on store), each program taking tiles num_programs
    apart until none is left.  The flattened loop pipelines across tiles, so the next
    tile's first copies are in flight while this one's result is stored by TMA."""
    a_desc = tl.make_tensor_descriptor(A, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    if SCALED:  # fp8: B stored K-major, an N x K row-major tensor
        b_desc = tl.make_tensor_descriptor(B, shape=[N, K], strides=[stride_bn, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(B, shape=[K, N], strides=[stride_bk, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(C, shape=[M, N], strides=[stride_cm, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=True):
        pid_m, pid_n = grouped_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            if SCALED:
                b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K]).T
            else:
                b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
        if SCALED:
            acc = acc * (tl.load(SA) * tl.load(SB))
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N],
                     round_for_store(acc, MBITS).to(C.dtype.element_ty))


@triton.jit
def _matmul_tiles(A, B, C, SA, SB, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, PRECISION: tl.constexpr, SCALED: tl.constexpr,
                  FP8_FAST: tl.constexpr, MBITS: tl.constexpr):
    """One output tile per program, its A and B tiles loaded by every thread (cp.async
    pipelined by the compiler)."""
    offs_m, offs_n, am, bn = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + am.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + offs_k[:, None] * stride_bk + bn.to(tl.int64)[None, :] * stride_bn

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if SCALED and not FP8_FAST:
            # Precise fp8: max_num_imprecise_acc = BLOCK_K makes sm_90 wgmma accumulate
            # each BLOCK_K slice in a fresh partial accumulator and add it to `acc` in
            # fp32 (Triton's WGMMA lowering promotes when the limit <= the dot's K).
            acc = tl.dot(a, b, acc, input_precision=PRECISION, max_num_imprecise_acc=BLOCK_K)
        else:
            # Fast fp8 (and every other dtype): no limit given, so sm_90 takes the NVIDIA
            # backend's default of 2^30 > K, and wgmma accumulates the whole K in place.
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SCALED:
        acc = acc * (tl.load(SA) * tl.load(SB))
    store_tile(C, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, MBITS)


@triton.jit
def matmul_kernel(A, B, C, SA, SB, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, PRECISION: tl.constexpr, SCALED: tl.constexpr,
                  FP8_FAST: tl.constexpr, MBITS: tl.constexpr, TMA: tl.constexpr = False):
    if TMA:  # the persistent TMA configs (tma_ok layouts only)
        _matmul_tma_persistent(A, B, C, SA, SB, M, N, K, stride_am, stride_bk, stride_bn,
                               stride_cm, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SCALED, MBITS)
    else:
        _matmul_tiles(A, B, C, SA, SB, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                      stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, PRECISION,
                      SCALED, FP8_FAST, MBITS)


_cfg = tile_config


def _tma_cfg(bm: int, bn: int, bk: int, stages: int, warps: int) -> triton.Config:
    """A persistent TMA candidate (matmul_kernel's TMA branch)."""
    cfg = tile_config(bm, bn, bk, stages, warps)
    cfg.kwargs["TMA"] = True
    return cfg



# Candidates per input width, aimed at Hopper: 128x256 / 256x128 tiles with 8 warps (two
# warpgroups) feed wgmma; BLOCK_K spans the 128-byte swizzle width of shared memory; 3-4
# stages fit in 228 KB.  What `--inspect` ruled out of each list: docs/kernels.md
# ("Config lists").
CONFIGS: dict[str, list[triton.Config]] = {
    "16bit": [_cfg(128, 256, 64, 3, 8), _cfg(256, 128, 64, 3, 8), _cfg(128, 128, 64, 4, 8),
              _cfg(128, 128, 64, 4, 4), _cfg(128, 64, 64, 4, 4), _cfg(64, 128, 64, 4, 4),
              _cfg(64, 64, 64, 4, 4)],
    "fp8": [_cfg(256, 128, 128, 3, 8), _cfg(256, 128, 64, 4, 8), _cfg(128, 128, 128, 4, 8),
            _cfg(128, 128, 128, 4, 4), _cfg(128, 64, 128, 4, 4), _cfg(64, 128, 128, 4, 4),
            _cfg(64, 64, 128, 4, 4)],
    "fp8-precise": [_cfg(128, 128, 128, 4, 8), _cfg(64, 256, 128, 3, 8),
                    _cfg(128, 128, 128, 3, 8), _cfg(128, 64, 128, 4, 8),
                    _cfg(64, 128, 128, 4, 4), _cfg(64, 64, 128, 4, 4)],
    "tf32": [_cfg(128, 256, 32, 3, 8), _cfg(64, 256, 32, 3, 8), _cfg(128, 128, 32, 3, 4),
             _cfg(128, 64, 32, 4, 4), _cfg(64, 64, 32, 4, 4)],
    # IEEE fp32 runs on the CUDA cores (no tensor cores): smaller tiles, more warps.
    "ieee": [_cfg(128, 128, 32, 3, 8), _cfg(128, 64, 32, 3, 4), _cfg(64, 128, 32, 3, 4),
             _cfg(64, 64, 32, 3, 4), _cfg(32, 64, 32, 4, 4)],
}
# Blackwell (sm_100 class): the Hopper lists less the configs that spill there, each
# replaced by the nearest one that compiles clean with triton 3.6 and 3.9 (docs/kernels.md,
# "Config lists").  The tcgen05 tiles keep 128 rows (its MMA is m128).
SM100_CONFIGS: dict[str, list[triton.Config]] = {
    **CONFIGS,
    "tf32": [_cfg(128, 128, 64, 3, 8), _cfg(64, 256, 32, 3, 8), _cfg(128, 128, 32, 4, 8),
             _cfg(128, 64, 32, 4, 4), _cfg(64, 64, 32, 4, 4)],
    "ieee": [_cfg(128, 128, 32, 3, 8), _cfg(128, 64, 32, 3, 4), _cfg(64, 128, 32, 3, 8),
             _cfg(64, 64, 32, 3, 8), _cfg(32, 64, 32, 4, 4)],
}
# Per compute-capability major version; any other GPU (and meta/CPU tensors) tunes over
# CONFIGS.
ARCH_CONFIGS: dict[int, dict[str, list[triton.Config]]] = {10: SM100_CONFIGS}
# Persistent TMA candidates, added on sm_90 and later where the layout allows TMA
# (tma_ok).  The H200's winners as persistent TMA kernels: one program per SM, tiles
# moved by the copy engine (UTMALDG by one elected thread, mbarrier waits: the K loop has
# no BAR.SYNC, against two and 12 LDGSTS a thread per step for 128x256x64), the result
# stored by TMA (UTMASTG) while the next tile's first copies are in flight, 154-161
# registers instead of 202-220.  Shared memory holds the stages and one output tile:
# 128x256x64 at 3 stages is 213 KB (4 would need 262 KB, over the 227 KB a block may
# have).  docs/hopper.md has the SASS.
TMA_CONFIGS: dict[str, list[triton.Config]] = {
    "16bit": [_tma_cfg(128, 256, 64, 3, 8), _tma_cfg(256, 128, 64, 3, 8),
              _tma_cfg(128, 128, 64, 4, 8)],
    "fp8": [_tma_cfg(256, 128, 128, 3, 8), _tma_cfg(128, 256, 128, 3, 8),
            _tma_cfg(128, 128, 128, 4, 8)],
}
TMA_MIN_CAPABILITY = (9, 0)
# Under the interpreter: one small tile.
_INTERP_CONFIG = _cfg(32, 32, 32, 1, 4, group=4)


def configs_for(dtype: str, capability: tuple[int, int] | None,
                tma: bool = False) -> list[triton.Config]:
    """The candidates a dtype is tuned over on a GPU of `capability` (None: CONFIGS),
    with the persistent TMA ones when `tma` (a layout tma_ok allows) and the GPU has
    TMA."""
    family = _family(dtype)
    base = for_arch(ARCH_CONFIGS, CONFIGS, capability)[family]
    if tma and capability is not None and capability >= TMA_MIN_CAPABILITY:
        return base + TMA_CONFIGS.get(family, [])
    return base


def tma_ok(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, b_kmajor: bool) -> bool:
    """Whether tensor descriptors can cover A (row-major), B (K-major when `b_kmajor`,
    else row-major) and the output (row-major): unit last stride, the other stride and
    the base 16-byte aligned (what a TMA descriptor requires)."""
    def rows(t: torch.Tensor, lead: int, unit: int) -> bool:
        return (t.stride(unit) == 1 and t.stride(lead) * t.element_size() % 16 == 0
                and t.data_ptr() % 16 == 0)

    return rows(a, 0, 1) and rows(out, 0, 1) and (rows(b, 1, 0) if b_kmajor else
                                                    rows(b, 0, 1))


def _family(dtype: str) -> str:
    """The CONFIGS list a dtype is tuned over (fp8: per accumulation mode)."""
    if DTYPES[dtype].is_fp8:
        return "fp8" if fp8_accum() == "fast" else "fp8-precise"
    return {"fp32": "ieee", "tf32": "tf32"}.get(dtype, "16bit")


def triton_launches(inputs: Inputs, out: torch.Tensor, sms: int,
                    target: Target | None = None) -> list[TritonLaunch]:
    """The one launch of a GPU run on `target` (None: the GPU holding the inputs),
    autotuned over the dtype family's configs for that arch (configs_for)."""
    a, b, dtype = inputs["A"], inputs["B"], inputs["dtype"]
    if DTYPES[dtype].block:
        return matmul_blockscaled.triton_launches(inputs, out, sms)
    m, k = a.shape
    n = b.shape[1]
    fp8 = DTYPES[dtype].is_fp8
    family = _family(dtype)
    flags = {
        # "ieee" keeps fp32 off the tensor cores; "tf32" is also Triton's default, which
        # 16-bit and fp8 operands ignore.
        "PRECISION": "ieee" if dtype == "fp32" else "tf32",
        "SCALED": fp8,
        "FP8_FAST": fp8_accum() == "fast",
        "MBITS": store_round_bits(out),
    }
    configs = configs_for(dtype, launch_capability(target, a), tma_ok(a, b, out, fp8))

    def grid(meta: dict) -> tuple[int]:
        tiles = triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"])
        # Persistent TMA: at most one program per SM, each looping over tiles.
        return (min(tiles, sms or tiles) if meta.get("TMA") else tiles,)

    return [TritonLaunch(
        fn=matmul_kernel,
        args=(a, b, out, inputs["sa"], inputs["sb"], m, n, k, *a.stride(), *b.stride(),
              *out.stride()),
        constexprs=flags,
        configs=tuple(configs),
        grid=grid,
        tune_key=("M", "N", "K"),
        # fp32 and tf32 (same tensor dtype, different math) and the two fp8 modes must
        # never share a tuned config: one autotuner per CONFIGS list (and per arch:
        # run_launch keys its tuners by the candidates too).
        tuner=family,
        operands={"A": ("stride_am", "stride_ak"), "B": ("stride_bk", "stride_bn")},
        matrix_unit=True,
        interp_config=_INTERP_CONFIG,
    )]


def matmul_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    a = inputs["A"]
    sms = (torch.cuda.get_device_properties(a.device).multi_processor_count
           if a.device.type == "cuda" else 0)
    for launch in triton_launches(inputs, out, sms):
        run_launch(launch)
    return out


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


def scaled_mm(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
              out_dtype: torch.dtype) -> torch.Tensor:
    """torch._scaled_mm (cuBLASLt fp8 GEMM) in the fp8 accumulation mode in force.
    Its own default is use_fast_accum=False; we always set it explicitly, so the torch
    provider and the measured fp8 ceiling accumulate as the Triton kernel does."""
    return torch._scaled_mm(a, b, sa, sb, out_dtype=out_dtype,
                            use_fast_accum=fp8_accum() == "fast")


def scaled_mm_rejects(m: int, n: int, k: int) -> bool:
    """Whether torch._scaled_mm refuses an M x K by K x N product: K and N must be
    multiples of 16 (torch/_meta_registrations.py, meta_scaled_mm); M may be anything."""
    del m
    return k % 16 != 0 or n % 16 != 0


def matmul_torch(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    a, b = inputs["A"], inputs["B"]
    if DTYPES[inputs["dtype"]].block:
        return matmul_blockscaled.matmul_torch(inputs, out)
    if a.dtype in FP8:
        # torch's _scaled_mm checks K (A's columns, B's rows) and N only: M is free.
        if a.device.type == "cuda" and scaled_mm_rejects(a.shape[0], b.shape[1], a.shape[1]):
            raise UnsupportedShape("torch._scaled_mm needs K and N to be multiples of 16")
        return scaled_mm(a, b, inputs["sa"], inputs["sb"], out.dtype)
    # fp32 and tf32 share fp32 tensors; the dtype tag picks the math.
    with fp32_matmul_precision(inputs["dtype"] == "tf32"):
        return torch.matmul(a, b, out=out)


def _torch_skip(dtype: str, target: Target) -> str | None:
    if DTYPES[dtype].block:
        return matmul_blockscaled.torch_skip(dtype, target)
    if dtype == "tf32" and target.kind != "cuda":
        return "tf32 is an NVIDIA tensor-core mode; the CPU has none"
    if dtype == "fp8e5" and target.kind == "cuda":
        return "torch._scaled_mm does not multiply two e5m2 matrices"
    return None


def _triton_skip(dtype: str, target: Target) -> str | None:
    if DTYPES[dtype].block:
        return matmul_blockscaled.triton_skip(dtype, target)
    if target.kind != "cuda" and target.interpret and dtype == "bf16":
        return "tl.dot on bf16 is wrong in the Triton interpreter (checked on GPU only)"
    return None


def make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
    if DTYPES[dtype].block:  # quantized here, on the host side of the timing
        return blockscaled.make_inputs(shape, dtype, seed, device)
    m, n, k = shape["M"], shape["N"], shape["K"]
    scale = k ** -0.25  # entries of C ~ N(0, 1) whatever K: inside fp8 and fp16 range
    a, sa = quantize(randn((m, k), seed, device, scale), dtype)
    if DTYPES[dtype].is_fp8 or dtype == "tf32":
        # Column-major B (see the module docstring): allocate N x K, view it transposed.
        b, sb = quantize(randn((n, k), seed + 1, device, scale), dtype)
        b = b.t()
    else:
        b, sb = quantize(randn((k, n), seed + 1, device, scale), dtype)
    # The dtype tag tells fp32 from tf32, whose tensors are identical.
    return {"A": a, "B": b, "sa": sa, "sb": sb, "dtype": dtype}


def _nbytes(shape: Shape, dtype: str) -> int:
    if DTYPES[dtype].block:
        return blockscaled.nbytes(shape, dtype)
    m, n, k = shape["M"], shape["N"], shape["K"]
    return (m * k + k * n) * DTYPES[dtype].itemsize + m * n * product_out_dtype(dtype).itemsize


def _reference(inputs: Inputs, dtype: str) -> torch.Tensor:
    """float64 A B from the stored (rounded) inputs; block-scaled: dequantized."""
    if DTYPES[dtype].block:
        return blockscaled.reference(inputs, dtype)
    return dequantize(inputs["A"], inputs["sa"]) @ dequantize(inputs["B"], inputs["sb"])


SPEC = KernelSpec(
    name="matmul",
    family="matmul",
    dims=("M", "N", "K"),
    flops=lambda shape, dtype: 2 * shape["M"] * shape["N"] * shape["K"],
    nbytes=_nbytes,
    flops_formula="2 M N K  (multiply + add per term)",
    bytes_formula=("(M K + K N) b_in + M N b_out; block-scaled: (M K + K N) (b_elem + 1/g)"
                   " + 8 (nvfp4's two fp32 tensor scales) + M N b_out, b_elem = 1 (mxfp8) or"
                   " 1/2 (fp4, two per byte), one scale byte per g = 32 (mx) or 16 (nvfp4)"),
    make_inputs=make_inputs,
    alloc_out=lambda inputs, dtype: torch.empty(
        inputs["A"].shape[0], inputs["B"].shape[1], dtype=product_out_dtype(dtype),
        device=inputs["A"].device),
    reference=_reference,
    providers={
        "torch": Provider("torch", matmul_torch, DTYPE_NAMES, skip=_torch_skip,
                          note="torch.matmul (cuBLAS); fp8: torch._scaled_mm; mxfp8, "
                               "mxfp4, nvfp4: its block-scaled path (sm_100)"),
        "triton": Provider("triton", matmul_triton, DTYPE_NAMES, skip=_triton_skip,
                           note="tiled tl.dot, grouped ordering, autotuned for Hopper; "
                                "block-scaled: tl.dot_scaled (native on sm_100, emulated in "
                                "bf16 on sm_90)"),
    },
    matrix_unit=True,
    description="matrix-matrix product (GEMM)",
    triton_launches=triton_launches,
    shape_group=MATMUL,
)
