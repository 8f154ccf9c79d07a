"""matmul in the block-scaled formats (mxfp8, mxfp4, nvfp4): the Triton kernel, the torch
provider and where each can run.  Formats, quantization and storage: kernels/blockscaled.py.

FLOPs: 2 M N K, as every matmul.  Bytes: both operands as stored, packed elements (two
e2m1 per byte) plus every scale byte (one per block of 32, or 16 for NVFP4, plus NVFP4's
4-byte tensor scale), and the bf16 output: blockscaled.nbytes.

Triton: tl.dot_scaled(a, a_scales, fmt, b, b_scales, fmt, acc) per BLOCK_K slice, fp32
accumulator, bf16 output; NVFP4's two tensor scales multiply the accumulator once at the
end.  On sm_100 Triton lowers it to tcgen05's block-scaled MMA (tcgen05.mma
.kind::mxf8f6f4 / mxf4 / mxf4nvf4 .block_scale, compiled with triton 3.6 and 3.9); sm_90
has no such instruction and Triton emulates it: both operands are upcast to bf16 with
their scales applied, then multiplied by bf16 wgmma - tl.dot_scaled's documented "software
emulation", seen in the compiled code (python run_bench.py --inspect: wgmma bf16->f32).
Such rows are held against the bf16 roof (KernelSpec.roof_class).

torch: torch._scaled_mm's block-scaled path (cuBLASLt; sm_100 class): fp8 or
float4_e2m1fn_x2 operands (B column-major), scales in the blocked layout as
float8_e8m0fnu (MX) or float8_e4m3fn (NVFP4); NVFP4's tensor scales go in as
torch.nn.functional.scaled_mm's second scale level (cuBLASLt's alpha) where this torch has
it, else the output is multiplied by them.  Accumulation is fp32 (use_fast_accum=False,
which FP4 requires; the fast mode is a Hopper fp8 wgmma matter).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels import blockscaled as bs
from kernels.spec import (
    DTYPES,
    Inputs,
    Target,
    TritonLaunch,
    UnsupportedShape,
    block_scaled_native,
)
from kernels.triton_utils import (
    grouped_tile,
    run_launch,
    store_round_bits,
    store_tile,
    tile_config,
)


@triton.jit
def blockscaled_matmul_kernel(A, B, SA, SB, GA, GB, C, M, N, KB, KS, S_TILES,
                              stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                              stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                              FORMAT: tl.constexpr, G: tl.constexpr, PACK: tl.constexpr,
                              TENSOR_SCALE: tl.constexpr, MBITS: tl.constexpr):
    # KB: stored bytes per row along K (K padded to whole blocks, / PACK, the elements
    # per byte); KS: block scales per row (K / G); S_TILES: 4-column tiles per row of the
    # blocked scales.  Masks compare with KB and KS themselves, whose divisibility Triton
    # sees (a K // PACK in the mask cut the operand copies to 32 bits).
    offs_m, offs_n, am, bn = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    BLOCK_KB: tl.constexpr = BLOCK_K // PACK
    BLOCK_KS: tl.constexpr = BLOCK_K // G
    offs_kb = tl.arange(0, BLOCK_KB)  # stored bytes along K
    offs_s = tl.arange(0, BLOCK_KS)  # scale columns
    a_ptrs = A + am.to(tl.int64)[:, None] * stride_am + offs_kb[None, :] * stride_ak
    b_ptrs = B + offs_kb[:, None] * stride_bk + bn.to(tl.int64)[None, :] * stride_bn
    # Blocked scale layout (kernels/blockscaled.py): 128 x 4 tiles of 512 bytes, row-major
    # over (row tile, column tile); (r, c) at (r % 32) * 16 + ((r // 32) % 4) * 4 + c % 4.
    sa_row = (am // 128).to(tl.int64) * S_TILES * 512 + (am % 32) * 16 + ((am // 32) % 4) * 4
    sb_row = (bn // 128).to(tl.int64) * S_TILES * 512 + (bn % 32) * 16 + ((bn // 32) % 4) * 4

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(KB, BLOCK_KB)):
        kb_left = KB - k * BLOCK_KB
        cols = k * BLOCK_KS + offs_s
        s_off = (cols // 4) * 512 + cols % 4
        s_ok = offs_s < KS - k * BLOCK_KS
        a = tl.load(a_ptrs, mask=offs_kb[None, :] < kb_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_kb[:, None] < kb_left, other=0.0)
        sa = tl.load(SA + sa_row[:, None] + s_off[None, :], mask=s_ok[None, :], other=0.0)
        sb = tl.load(SB + sb_row[:, None] + s_off[None, :], mask=s_ok[None, :], other=0.0)
        acc = tl.dot_scaled(a, sa, FORMAT, b, sb, FORMAT, acc)
        a_ptrs += BLOCK_KB * stride_ak
        b_ptrs += BLOCK_KB * stride_bk
    if TENSOR_SCALE:
        acc = acc * (tl.load(GA) * tl.load(GB))
    store_tile(C, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, MBITS)


_cfg = tile_config


# Tiles of 128 rows: tcgen05's block-scaled MMA is M = 128 (a 64-row tile compiles to
# the bf16 emulation even on sm_100).  Compiled with triton 3.6 and 3.9 for sm_100 (every
# config: tcgen05.mma ...block_scale, no spills) and sm_90 (bf16 wgmma, no spills); what
# was left out: 4-stage pipelines, 128 x 256 tiles with BLOCK_K >= 128 and 128 x 128 with
# 4 warps, which spill 60-1900 registers in the sm_90 emulation (the upcast operands
# live in registers), and 128 x 64 x 128 e2m1 with 4 warps (nvfp4 spills on 3.9).
# `python run_bench.py --inspect` compiles each.
CONFIGS: dict[str, list[triton.Config]] = {
    "e4m3": [_cfg(128, 256, 64, 3, 8), _cfg(128, 128, 128, 3, 8), _cfg(128, 64, 128, 3, 4)],
    "e2m1": [_cfg(128, 256, 64, 3, 8), _cfg(128, 128, 128, 3, 8), _cfg(128, 64, 128, 3, 8)],
}
# Under the interpreter: one small tile (BLOCK_K a multiple of both block sizes).
_INTERP_CONFIG = _cfg(32, 32, 64, 1, 4, group=4)


def triton_launches(inputs: Inputs, out: torch.Tensor, sms: int) -> list[TritonLaunch]:
    """The one launch of a GPU run, autotuned over its element format's CONFIGS."""
    del sms
    dtype = inputs["dtype"]
    d = DTYPES[dtype]
    fmt = bs.element_format(dtype)
    a, b = inputs["A"], inputs["B"]
    m, n = a.shape[0], b.shape[1]
    kp = bs.padded_k(inputs["K"], dtype)
    ks = kp // d.block
    s_tiles = -(-ks // bs.TILE_COLS)
    return [TritonLaunch(
        fn=blockscaled_matmul_kernel,
        args=(a, b, inputs["sa"], inputs["sb"], inputs["ga"], inputs["gb"], out, m, n,
              a.shape[1], ks, s_tiles, *a.stride(), *b.stride(), *out.stride()),
        constexprs={"FORMAT": fmt, "G": d.block, "PACK": 8 // d.element_bits,
                    "TENSOR_SCALE": d.tensor_scale, "MBITS": store_round_bits(out)},
        configs=tuple(CONFIGS[fmt]),
        grid=lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),),
        tune_key=("M", "N", "KB"),
        # One autotuner per format: nvfp4 and mxfp4 share configs but not the math.
        tuner=dtype,
        operands={"A": ("stride_am", "stride_ak"), "B": ("stride_bk", "stride_bn")},
        matrix_unit=True,
        interp_config=_INTERP_CONFIG,
    )]


def matmul_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    for launch in triton_launches(inputs, out, 0):
        run_launch(launch)
    return out


# ---- torch ------------------------------------------------------------------------------

def torch_operands(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """(A, B, A's scales, B's scales) typed as torch._scaled_mm reads them: views of the
    stored tensors (the same bytes the Triton kernel reads)."""
    d = DTYPES[inputs["dtype"]]
    a, b = inputs["A"], inputs["B"]
    if d.element_bits == 4:
        a, b = a.view(torch.float4_e2m1fn_x2), b.view(torch.float4_e2m1fn_x2)
    return a, b, inputs["sa"].view(d.scale), inputs["sb"].view(d.scale)


def matmul_torch(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    a, b, sa, sb = torch_operands(inputs)
    # cuBLASLt's rule (torch's _scaled_mm checks): A's stored columns and both stored
    # dimensions of B multiples of 16.
    if a.device.type == "cuda" and (a.shape[1] % 16 or b.shape[1] % 16):
        raise UnsupportedShape("torch._scaled_mm needs K and N to be multiples of 16 "
                               "(K counted in stored bytes for fp4)")
    if not DTYPES[inputs["dtype"]].tensor_scale:
        return torch._scaled_mm(a, b, sa, sb, out_dtype=out.dtype, use_fast_accum=False)
    f = torch.nn.functional
    if hasattr(f, "scaled_mm"):
        # Two-level NVFP4: [block scales, tensor scale] per operand; cuBLASLt folds the
        # tensor scales into its alpha, inside the GEMM.
        recipe = [f.ScalingType.BlockWise1x16, f.ScalingType.TensorWise]
        swizzle = [f.SwizzleType.SWIZZLE_32_4_4, f.SwizzleType.NO_SWIZZLE]
        return f.scaled_mm(a, b, [sa, inputs["ga"]], recipe, [sb, inputs["gb"]], recipe,
                           swizzle_a=swizzle, swizzle_b=swizzle, output_dtype=out.dtype,
                           use_fast_accum=False)
    res = torch._scaled_mm(a, b, sa, sb, out_dtype=out.dtype, use_fast_accum=False)
    return res.mul_(inputs["ga"] * inputs["gb"])


@functools.cache
def _torch_runs_on_cpu(dtype: str) -> str | None:
    """None if this torch multiplies `dtype` on the CPU, else torch's refusal (one line).
    Asked of torch itself, on a 32 x 32 x 64 product."""
    inputs = bs.make_inputs({"M": 32, "N": 32, "K": 64}, dtype, 0, "cpu")
    out = torch.empty(32, 32, dtype=torch.bfloat16)
    try:
        matmul_torch(inputs, out)
    except Exception as e:  # RuntimeError, ValueError, NotImplementedError: all a "no"
        lines = str(e).strip().splitlines()
        return lines[0] if lines else type(e).__name__
    return None


def torch_skip(dtype: str, target: Target) -> str | None:
    if target.kind != "cuda":
        refusal = _torch_runs_on_cpu(dtype)
        if refusal is None:
            return None
        # A dequantize-then-matmul stand-in would not be this format's GEMM: skipped.
        return (f"torch {torch.__version__.split('+')[0]} has no block-scaled GEMM on the "
                f"CPU (torch._scaled_mm: {refusal[:80]})")
    if not block_scaled_native(target):
        sm = "".join(map(str, target.capability or ()))
        return (f"torch._scaled_mm's {dtype} path (cuBLASLt block scaling) needs sm_100-class "
                f"tensor cores (device is sm_{sm})")
    return None


# ---- Triton: where it runs ----------------------------------------------------------------

@triton.jit
def _dot_scaled_probe_kernel(A, SA, B, SB, C, FORMAT: tl.constexpr, G: tl.constexpr,
                             PACK: tl.constexpr):
    # One 16 x 16 x 64 tl.dot_scaled, operands and plain (unblocked) scales row-major.
    r = tl.arange(0, 16)
    kb = tl.arange(0, 64 // PACK)
    ks = tl.arange(0, 64 // G)
    a = tl.load(A + r[:, None] * (64 // PACK) + kb[None, :])
    b = tl.load(B + r[None, :] * (64 // PACK) + kb[:, None])
    sa = tl.load(SA + r[:, None] * (64 // G) + ks[None, :])
    sb = tl.load(SB + r[:, None] * (64 // G) + ks[None, :])
    acc = tl.dot_scaled(a, sa, FORMAT, b, sb, FORMAT)
    tl.store(C + r[:, None] * 16 + r[None, :], acc)


@functools.cache
def _interpreter_runs(dtype: str) -> str | None:
    """None if this Triton's CPU interpreter computes tl.dot_scaled right for `dtype`,
    else why not.  Asked of the interpreter alone, on one 16 x 16 x 64 product against
    the dequantized float64 one, so that a fault of the matmul kernel is never mistaken
    for the interpreter's.  (triton 3.6's interpreter has no dot_scaled; 3.9's decodes
    every block scale as e8m0, which NVFP4's e4m3 scales are not.)"""
    d = DTYPES[dtype]
    g = torch.Generator().manual_seed(0)
    qa = bs.quantize(torch.randn(16, 64, generator=g), dtype)
    qb = bs.quantize(torch.randn(16, 64, generator=g), dtype)
    cols = 64 // d.block
    sa = bs.from_blocked(qa.scales, 16, cols).contiguous()
    sb = bs.from_blocked(qb.scales, 16, cols).contiguous()
    c = torch.full((16, 16), float("nan"))
    ver = f"the Triton {triton.__version__} interpreter"
    try:
        _dot_scaled_probe_kernel[(1,)](qa.elements, sa, qb.elements, sb, c,
                                       FORMAT=bs.element_format(dtype), G=d.block,
                                       PACK=8 // d.element_bits)
    except Exception as e:  # the interpreter wraps the error: name its cause
        cause = e.__cause__ or e
        return (f"{ver} cannot run tl.dot_scaled ({type(cause).__name__}: "
                f"{str(cause)[:60]}): checked on a GPU only")
    qa.tensor_scale = qb.tensor_scale = torch.ones(())  # the probe leaves them out
    ref = bs.dequantize(qa, dtype) @ bs.dequantize(qb, dtype).t()
    err = (torch.linalg.vector_norm(c.double() - ref) / torch.linalg.vector_norm(ref)).item()
    if not err <= 1e-6:  # fp32 sums of 64 exact products
        return (f"{ver} gets tl.dot_scaled wrong for {dtype} (rel_err {err:.2g} on one "
                f"{d.scale and str(d.scale).removeprefix('torch.')}-scaled tile): checked "
                "on a GPU only")
    return None


def _triton_version() -> tuple[int, int]:
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


def triton_skip(dtype: str, target: Target) -> str | None:
    if target.kind == "cuda":
        sm = "".join(map(str, target.capability or ()))
        if (target.capability or (0, 0)) < (9, 0):
            # Compiled with triton 3.6: mxfp8 fails for sm_80 (no fp8) and in ptxas for
            # sm_89, nvfp4 fails in both; mxfp4 compiles to mma.sync with thousands of
            # spilled registers.
            return (f"Triton's block-scaled matmul targets sm_90 (emulated) and sm_100 "
                    f"(native); its sm_{sm} code does not compile or spills")
        if DTYPES[dtype].tensor_scale and not block_scaled_native(target) \
                and _triton_version() < (3, 9):
            # triton 3.6: an assertion in TritonGPUAccelerateMatmul (DenseElementsAttr of
            # a float type) on e4m3 scales in the bf16 emulation; 3.9 compiles it.
            return (f"triton {triton.__version__} cannot compile NVFP4's tl.dot_scaled for "
                    f"sm_{sm} (its bf16 emulation fails on e4m3 scales; triton 3.9 can)")
        return None
    from kernels.spec import interpreter_enabled

    # Only a process whose kernels are interpreted can ask (a GPU process's compiled
    # kernels refuse CPU tensors); there the interpreter's rows do not run anyway.
    return _interpreter_runs(dtype) if interpreter_enabled() else None
