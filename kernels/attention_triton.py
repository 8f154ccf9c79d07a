"""FlashAttention-style Triton kernels for kernels/attention.py (forward and backward).

Layout: q, k, v, o, dO, dq, dk, dv are contiguous (B, H, S, D); program (i, b H + h)
works on tile i of head (b, h).  Softmax runs in base 2: scores are scaled by
sm_scale log2(e) and exponentiated with exp2, and the log-sum-exp kept for the backward
is in the same units, lse = m + log2(l) per query row (fp32, (B, H, S)).

Forward (one program per BLOCK_M query rows): online softmax over BLOCK_N key/value tiles
(running max m, running sum l, the fp32 accumulator rescaled by exp2(m_old - m_new)), P
cast to the storage dtype for the P V product, as FlashAttention does.  Causal: the key
tiles entirely below the diagonal run without any mask, the BLOCK_M / BLOCK_N tiles on
it with the mask, and those above it not at all (tile skipping: half the work).  fp8
(e4m3, forward only, SCALED): q's and k's per-tensor scales fold into the score scale,
P is rounded to e4m3 (PBITS) for P V with V read sequence-major (stride_vs = 1, the
K-major B operand fp8 wgmma needs), and v's scale multiplies o, written in bf16.

Backward (FlashAttention-2): `delta = rowsum(dO o)` first, then one kernel per key tile
for dK and dV (walking the query tiles at and below the diagonal) and one per query tile
for dQ (walking the key tiles at and left of it), each recomputing P = exp2(s - lse) from
q, k and the saved lse instead of storing the S x S probabilities:
  dV = P^T dO,  dP = dO V^T,  dS = P (dP - delta),  dQ = dS K sm_scale,  dK = dS^T Q sm_scale.
No atomics: every output element is written by one program, so results are
deterministic.

The CPU interpreter (seen with triton 3.9) multiplies bf16 tiles wrongly in tl.dot and
truncates fp32 -> bf16 casts.  UPCAST (interpreter + bf16 only) widens both operands of
every tl.dot to fp32, and MBITS / PBITS round to the output / storage format before
each narrowing cast (kernels.triton_utils.round_for_store; e4m3 loses its exponent carry
there too), so the interpreter computes what the tensor
cores do: bf16 products of bf16-exact values summed in fp32.  Compiled kernels get
UPCAST = False, MBITS = PBITS = 0 and carry neither.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention_configs import DELTA_BLOCK_M, INTERP_CONFIGS, configs_for
from kernels.dot import FP8
from kernels.spec import (
    Inputs,
    Target,
    TritonLaunch,
    UnsupportedShape,
    interpreter_enabled,
    launch_capability,
)
from kernels.triton_utils import round_for_store, run_launch, store_round_bits

LOG2E = 1.4426950408889634


@triton.jit
def _mm(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a b with fp32 accumulation (tensor cores on a GPU; see UPCAST above)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _narrow(x, dtype: tl.constexpr, MBITS: tl.constexpr):
    return round_for_store(x, MBITS).to(dtype)


@triton.jit
def _tile(ptrs, idx, S, MASKED: tl.constexpr):
    """A tile load, bounds-masked (idx < S) only in the loop that may cross the end."""
    if MASKED:  # noqa: SIM108 (a constexpr branch: the unmasked load has no mask at all)
        x = tl.load(ptrs, mask=idx < S, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _row_values(ptrs, idx, S, MASKED: tl.constexpr):
    """_tile for the fp32 values per query row (lse, delta): a load of its own line, which
    --inspect tells from the tiles' 128-bit copies (a 32-row vector gives each of 128
    threads a word at most)."""
    if MASKED:  # noqa: SIM108 (as in _tile)
        x = tl.load(ptrs, mask=idx < S, other=0.0)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _fwd_tiles(acc, l_i, m_i, q, K, V, offs_m, lo, hi, S, stride_s, stride_vs, stride_vd,
               qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               PRECISION: tl.constexpr, UPCAST: tl.constexpr, PBITS: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        kv = cols.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
        k = _tile(K + kv, cols[:, None], S, MASKED)
        qk = _mm(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                 PRECISION, UPCAST)
        if MASKED:
            keep = cols[None, :] < S
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            # Every row keeps key 0 in its first tile, so m_i is finite from then on and
            # exp2(-inf - m) = 0 for the masked entries (never inf - inf).
            qk = tl.where(keep, qk, float("-inf")) * qk_scale
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            p = tl.math.exp2(qk - m_new[:, None])
        else:
            # The row max of the raw scores, scaled once a row (qk_scale > 0), the scale in
            # exp2's FFMA: one FMUL less a score.  (In the masked tiles too, triton 3.9's
            # ptxas spills 40 bytes at 128 x 128, D = 128.)
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = cols.to(tl.int64)[:, None] * stride_vs + offs_d[None, :] * stride_vd
        v = _tile(V + vt, cols[:, None], S, MASKED)
        acc = _mm(_narrow(p, V.dtype.element_ty, PBITS), v, acc * alpha[:, None],
                  PRECISION, UPCAST)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def attn_fwd_kernel(Q, K, V, O, LSE, SQ, SK, SV, sm_scale, S, stride_h, stride_s,
                    stride_vs, stride_vd,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, SCALED: tl.constexpr, PRECISION: tl.constexpr,
                    UPCAST: tl.constexpr, MBITS: tl.constexpr, PBITS: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * stride_h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
    q = tl.load(Q + base + rows, mask=offs_m[:, None] < S, other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e): exp(x) = exp2(x log2 e)
    if SCALED:  # fp8: q and k carry per-tensor scales (v's is applied to o at the end)
        qk_scale = qk_scale * tl.load(SQ) * tl.load(SK)
    if CAUSAL:
        # Key tiles left of the query tile: all kept.  The BLOCK_M keys of the diagonal:
        # masked.  Keys past the query tile's last row: never loaded.
        diag = pid_m * BLOCK_M
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K + base, V + base, offs_m, 0, diag,
                                   S, stride_s, stride_vs, stride_vd, qk_scale,
                                   HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, PRECISION,
                                   UPCAST, PBITS)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K + base, V + base, offs_m, diag,
                                   tl.minimum(diag + BLOCK_M, S), S, stride_s, stride_vs,
                                   stride_vd, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, True,
                                   CAUSAL, PRECISION, UPCAST, PBITS)
    else:
        full = S // BLOCK_N * BLOCK_N  # whole key tiles: no bounds mask
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K + base, V + base, offs_m, 0, full,
                                   S, stride_s, stride_vs, stride_vd, qk_scale,
                                   HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL, PRECISION,
                                   UPCAST, PBITS)
        acc, l_i, m_i = _fwd_tiles(acc, l_i, m_i, q, K + base, V + base, offs_m, full, S,
                                   S, stride_s, stride_vs, stride_vd, qk_scale,
                                   HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, PRECISION,
                                   UPCAST, PBITS)
    o = acc / l_i[:, None]
    if SCALED:
        o = o * tl.load(SV)
    tl.store(O + base + rows, _narrow(o, O.dtype.element_ty, MBITS),
             mask=offs_m[:, None] < S)
    tl.store(LSE + bh * S + offs_m, m_i + tl.math.log2(l_i), mask=offs_m < S)


@triton.jit
def attn_bwd_delta_kernel(O, DO, DELTA, S, stride_h, stride_s,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta = rowsum(dO o) in fp32: the softmax backward's row term, from the stored o."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    at = bh * stride_h + offs_m.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
    o = tl.load(O + at, mask=offs_m[:, None] < S, other=0.0).to(tl.float32)
    do = tl.load(DO + at, mask=offs_m[:, None] < S, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * S + offs_m, tl.sum(o * do, 1), mask=offs_m < S)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q, DO, LSE, DELTA, offs_n, lo, hi, S, stride_s, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                UPCAST: tl.constexpr, MBITS: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_M):
        rows = start + offs_m
        at = rows.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
        q = _tile(Q + at, rows[:, None], S, MASKED)
        lse = _row_values(LSE + rows, rows, S, MASKED)
        # P^T, recomputed: (BLOCK_N keys) x (BLOCK_M queries)
        s_t = _mm(k, tl.trans(q), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32),
                  PRECISION, UPCAST)
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
        if MASKED:
            keep = rows[None, :] < S
            if CAUSAL:
                keep = keep & (rows[None, :] >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)
        do = _tile(DO + at, rows[:, None], S, MASKED)
        delta = _row_values(DELTA + rows, rows, S, MASKED)
        dv = _mm(_narrow(p_t, DO.dtype.element_ty, MBITS), do, dv, PRECISION, UPCAST)
        dp_t = _mm(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32),
                   PRECISION, UPCAST)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _mm(_narrow(ds_t, Q.dtype.element_ty, MBITS), q, dk, PRECISION, UPCAST)
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, S, stride_h, stride_s,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                         PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                         MBITS: tl.constexpr):
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * stride_h
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    at = offs_n.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
    k = tl.load(K + base + at, mask=offs_n[:, None] < S, other=0.0)
    v = tl.load(V + base + at, mask=offs_n[:, None] < S, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    Qh, DOh, LSEh, DELTAh = Q + base, DO + base, LSE + bh * S, DELTA + bh * S
    body = 0
    if CAUSAL:
        # Only queries at or below the key tile's diagonal see it: the BLOCK_N rows of
        # the diagonal masked, the ones below without the causal mask.
        diag = pid_n * BLOCK_N
        dk, dv = _dkdv_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, offs_n, diag,
                             tl.minimum(diag + BLOCK_N, S), S, stride_s, qk_scale,
                             HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL, PRECISION, UPCAST,
                             MBITS)
        body = diag + BLOCK_N
    full = S // BLOCK_M * BLOCK_M  # whole query tiles: no bounds mask
    dk, dv = _dkdv_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, offs_n, body, full, S,
                         stride_s, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL,
                         PRECISION, UPCAST, MBITS)
    dk, dv = _dkdv_tiles(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, offs_n,
                         tl.maximum(body, full), S, S, stride_s, qk_scale, HEAD_DIM,
                         BLOCK_M, BLOCK_N, True, CAUSAL, PRECISION, UPCAST, MBITS)
    tl.store(DK + base + at, _narrow(dk * sm_scale, DK.dtype.element_ty, MBITS),
             mask=offs_n[:, None] < S)
    tl.store(DV + base + at, _narrow(dv, DV.dtype.element_ty, MBITS),
             mask=offs_n[:, None] < S)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, K, V, offs_m, lo, hi, S, stride_s, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
              UPCAST: tl.constexpr, MBITS: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        at = cols.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
        k = _tile(K + at, cols[:, None], S, MASKED)
        v = _tile(V + at, cols[:, None], S, MASKED)
        s = _mm(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                PRECISION, UPCAST)
        p = tl.math.exp2(s * qk_scale - lse[:, None])
        if MASKED:
            keep = cols[None, :] < S
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= cols[None, :])
            p = tl.where(keep, p, 0.0)
        dp = _mm(do, tl.trans(v), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32),
                 PRECISION, UPCAST)
        ds = p * (dp - delta[:, None])
        dq = _mm(_narrow(ds, K.dtype.element_ty, MBITS), k, dq, PRECISION, UPCAST)
    return dq


@triton.jit
def attn_bwd_dq_kernel(Q, K, V, DO, DQ, LSE, DELTA, sm_scale, S, stride_h, stride_s,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                       MBITS: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * stride_h
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    at = offs_m.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
    q = tl.load(Q + base + at, mask=offs_m[:, None] < S, other=0.0)
    do = tl.load(DO + base + at, mask=offs_m[:, None] < S, other=0.0)
    lse = tl.load(LSE + bh * S + offs_m, mask=offs_m < S, other=0.0)
    delta = tl.load(DELTA + bh * S + offs_m, mask=offs_m < S, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    if CAUSAL:
        diag = pid_m * BLOCK_M
        dq = _dq_tiles(dq, q, do, lse, delta, K + base, V + base, offs_m, 0, diag, S,
                       stride_s, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL,
                       PRECISION, UPCAST, MBITS)
        dq = _dq_tiles(dq, q, do, lse, delta, K + base, V + base, offs_m, diag,
                       tl.minimum(diag + BLOCK_M, S), S, stride_s, qk_scale, HEAD_DIM,
                       BLOCK_M, BLOCK_N, True, CAUSAL, PRECISION, UPCAST, MBITS)
    else:
        full = S // BLOCK_N * BLOCK_N
        dq = _dq_tiles(dq, q, do, lse, delta, K + base, V + base, offs_m, 0, full, S,
                       stride_s, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, False, CAUSAL,
                       PRECISION, UPCAST, MBITS)
        dq = _dq_tiles(dq, q, do, lse, delta, K + base, V + base, offs_m, full, S, S,
                       stride_s, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, True, CAUSAL,
                       PRECISION, UPCAST, MBITS)
    tl.store(DQ + base + at, _narrow(dq * sm_scale, DQ.dtype.element_ty, MBITS),
             mask=offs_m[:, None] < S)


# Triton's NVIDIA backend (min_dot_size) rejects an 8-bit tl.dot with K < 32 at compile
# time; q k^T has K = D.  The CPU interpreter accepts any K, so this is checked here.
FP8_MIN_HEAD_DIM = 32


def head_dim_ok(d: int) -> bool:
    """Head dims the kernels tile: a power of two from 16 (tl.dot's minimum) to 256."""
    return 16 <= d <= 256 and d & (d - 1) == 0


def _flags(x: torch.Tensor) -> dict[str, object]:
    """Precision and interpreter-emulation constexprs for tensors like `x`."""
    return {
        "PRECISION": "ieee" if x.dtype == torch.float32 else "tf32",  # 16-bit ignores it
        "UPCAST": interpreter_enabled() and x.dtype == torch.bfloat16,
        "MBITS": store_round_bits(x),
    }


def _geometry(q: torch.Tensor) -> tuple[int, int, int, int, int]:
    b, h, s, d = q.shape
    if not head_dim_ok(d):
        raise UnsupportedShape(f"the Triton attention kernels tile head dims that are "
                               f"powers of two from 16 to 256, not D={d}")
    return b, h, s, d, b * h


def _launch(fn, args: tuple, consts: dict, part: str, x: torch.Tensor, s: int, bh: int,
            by: str, tuner: str, operands: dict,
            capability: tuple[int, int] | None) -> TritonLaunch:
    """A tiled launch: programs over `by` tiles of the sequence, times B H heads."""
    return TritonLaunch(
        fn=fn, args=args, constexprs=consts, configs=tuple(configs_for(part, capability)),
        grid=lambda meta: (triton.cdiv(s, meta[by]), bh),
        tune_key=("S", "HEAD_DIM", "CAUSAL"), tuner=tuner,
        operands=operands, matrix_unit=True, interp_config=INTERP_CONFIGS[part])


def forward_launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                   lse: torch.Tensor, causal: bool,
                   scales: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                   target: Target | None = None) -> TritonLaunch:
    """The forward kernel, o and the log-sum-exp per query row.  One kernel for both
    families (one compile, one tuning): the forward alone writes the log-sum-exp too,
    as FlashAttention's and SDPA's flash forward do (4 bytes a row, 0.4% of the bytes
    at D = 128, uncounted).  fp8: `scales` are q's, k's and v's per-tensor scales, and v
    is stored sequence-major (a transposed (B, H, D, S) tensor), the K-major B operand
    that sm_90's fp8 wgmma needs for P v.  `target`: the GPU the configs are for (None:
    the one holding q; see kernels.spec.launch_capability)."""
    _, _, s, d, bh = _geometry(q)
    for t in (q, k, o):
        if not t.is_contiguous() or t.shape != q.shape:
            raise ValueError("attention kernels need contiguous (B, H, S, D) tensors")
    if v.shape != q.shape or not (v.is_contiguous() or v.transpose(-1, -2).is_contiguous()):
        raise ValueError("attention kernels need v as (B, H, S, D), row- or column-major")
    one = scales is None
    if not one and d < FP8_MIN_HEAD_DIM:
        raise UnsupportedShape(f"the Triton fp8 attention forward tiles head dims from "
                               f"{FP8_MIN_HEAD_DIM}, not D={d} (an 8-bit tl.dot sums at "
                               f"least 32 terms on NVIDIA GPUs)")
    sq, sk, sv = (lse, lse, lse) if one else scales  # unread when SCALED is off
    consts = {"HEAD_DIM": d, "CAUSAL": causal, "SCALED": not one, **_flags(q),
              "MBITS": store_round_bits(o), "PBITS": store_round_bits(v)}
    return _launch(attn_fwd_kernel,
                   (q, k, v, o, lse, sq, sk, sv, d ** -0.5, s, s * d, d, v.stride(2),
                    v.stride(3)), consts, "fwd", q, s, bh, "BLOCK_M", "fwd",
                   {"Q": ("stride_s", 1), "K": ("stride_s", 1),
                    "V": ("stride_vs", "stride_vd")}, launch_capability(target, q))


def backward_launches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                      do: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
                      lse: torch.Tensor, causal: bool, target: Target | None = None
                      ) -> list[TritonLaunch]:
    """delta, dK/dV and dQ, after a forward that wrote `o` and `lse`, with `target`'s
    configs (as forward_launch)."""
    _, _, s, d, bh = _geometry(q)
    cc = launch_capability(target, q)
    delta = torch.empty_like(lse)
    flags = {"HEAD_DIM": d, "CAUSAL": causal, **_flags(q)}
    scale = d ** -0.5
    seq = {"Q": ("stride_s", 1), "K": ("stride_s", 1), "V": ("stride_s", 1),
           "DO": ("stride_s", 1)}
    return [
        TritonLaunch(
            fn=attn_bwd_delta_kernel, args=(o, do, delta, s, s * d, d),
            constexprs={"HEAD_DIM": d, "BLOCK_M": DELTA_BLOCK_M},
            configs=tuple(configs_for("delta", cc)),
            grid=lambda meta: (triton.cdiv(s, DELTA_BLOCK_M), bh),
            operands={"O": ("stride_s", 1), "DO": ("stride_s", 1)}),
        _launch(attn_bwd_dkdv_kernel, (q, k, v, do, dk, dv, lse, delta, scale, s, s * d, d),
                flags, "dkdv", q, s, bh, "BLOCK_N", "dkdv", seq, cc),
        _launch(attn_bwd_dq_kernel, (q, k, v, do, dq, lse, delta, scale, s, s * d, d),
                flags, "dq", q, s, bh, "BLOCK_M", "dq", seq, cc),
    ]


def _lse(q: torch.Tensor) -> torch.Tensor:
    b, h, s, _ = q.shape
    return torch.empty((b, h, s), dtype=torch.float32, device=q.device)


def triton_launches_fwd(inputs: Inputs, out: torch.Tensor, sms: int,
                        target: Target | None = None) -> list[TritonLaunch]:
    """The forward launch of a GPU run on `target` (None: the GPU holding the inputs)."""
    del sms
    q = inputs["q"]
    scales = (inputs["sq"], inputs["sk"], inputs["sv"]) if q.dtype in FP8 else None
    return [forward_launch(q, inputs["k"], inputs["v"], out, _lse(q), inputs["causal"],
                           scales, target)]


def triton_launches_bwd(inputs: Inputs, out: torch.Tensor, sms: int,
                        target: Target | None = None) -> list[TritonLaunch]:
    """Forward (o and the log-sum-exp) then backward, into out = stack(o, dq, dk, dv),
    with `target`'s configs (as triton_launches_fwd)."""
    del sms
    q, k, v, do, causal = inputs["q"], inputs["k"], inputs["v"], inputs["do"], inputs["causal"]
    lse = _lse(q)
    o, dq, dk, dv = out.unbind(0)
    return [forward_launch(q, k, v, o, lse, causal, target=target),
            *backward_launches(q, k, v, o, do, dq, dk, dv, lse, causal, target)]


def attention_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    for launch in triton_launches_fwd(inputs, out, 0):
        run_launch(launch)
    return out


def attention_bwd_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    for launch in triton_launches_bwd(inputs, out, 0):
        run_launch(launch)
    return out
