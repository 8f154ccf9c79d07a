"""Row-wise ops over the last dimension of an M x N matrix x (forward only):

  softmax:   y = exp(x - max(x)) / sum(exp(x - max(x)))        (torch.softmax(x, -1))
  layernorm: y = (x - mean(x)) / sqrt(var(x) + eps) * w + b    (F.layer_norm with weight
             and bias, biased variance, as F.layer_norm computes it)
  rmsnorm:   y = x / sqrt(mean(x^2) + eps) * w                 (F.rms_norm with weight)

with eps = 1e-5 and w, b of length N.  M is the number of rows, N the row width (the
normalized dimension).  x, w, b and y share one dtype (fp32, fp16 or bf16); both providers
compute in fp32 and round y once.  fp8 is left out: no eager PyTorch op takes fp8 here
and no model normalizes in it.

FLOPs per element of x, one per arithmetic operation (exp counts as one, as in
kernels/gelu.py); the per-row scalar work (1/N, + eps, sqrt, reciprocal) is O(M) and
left out:
  softmax   5: max (a compare), subtract the max, exp, sum (an add), divide
  layernorm 7: sum for the mean, subtract the mean, square, sum for the variance,
               times 1/std, times w, plus b
  rmsnorm   4: square, sum, times 1/rms, times w
torch.utils.flop_counter.FlopCounterMode counts 0 for all three (it registers formulas
for matrix products, convolutions and attention only), so these counts are this
module's convention, not the counter's.

Bytes are the compulsory traffic: x read once and y written once (2 M N b), plus the
weight (N b) and layernorm's bias (N b).  F.layer_norm on a GPU also writes a float32
mean and 1/std per row for the backward (8 bytes a row); they are not needed for the
forward result and not counted.

Checked against float64 formulas of the same rounded inputs with the dtype's tolerance
(kernels.spec.DTYPES: fp32 2e-5, fp16 5e-3, bf16 2e-2).  Why they hold with room: y is
rounded once from fp32, which bounds the normwise error by the output's unit roundoff
(fp16 2^-11, bf16 2^-8; measured about half that), and the fp32 work before it (sums of
N <= 128k terms, exp, sqrt, division) adds about 1e-7 (measured 1e-7 in fp32).  A wrong
kernel (a missing mean, weight or bias, a row mixed up) lands near 1.

Triton: one kernel for the three ops (OP selects the math at compile time).  A row
that fits in one block of BLOCK_N = next_pow2(N) <= MAX_BLOCK_N columns is loaded once
into registers, reduced and written: x is read from memory exactly once.  At small widths
one program takes ROWS rows (a ROWS x BLOCK_N tile of about ROW_TILE elements), so that
each program moves enough bytes.  Wider rows take the looped kernel: one row per
program, a first pass over BLOCK_N-wide chunks for the row's statistics (online
max/sum for softmax, shifted sums for layernorm) and a second that re-reads x and
writes y.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.shape_groups import ROWOP
from kernels.spec import DTYPES, Inputs, KernelSpec, Provider, Shape, TritonLaunch, randn
from kernels.triton_utils import round_for_store, run_launch, store_round_bits

EPS = 1e-5
ROWOP_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")

# Widest row kept whole in registers: 16384 fp32 values over 16 warps are 32 registers a
# thread, far from spilling; wider rows loop (LOOP_BLOCK_N columns a step).
MAX_BLOCK_N = 16384
LOOP_BLOCK_N = 4096
# Elements per program at small widths (rows per program = ROW_TILE // BLOCK_N): 4096
# elements over 8 warps are 16 per thread, four 128-bit loads of fp32 or two of 16-bit.
ROW_TILE = 4096
MAX_WARPS = 16
# A second candidate for rows that give a thread more than 16 elements at MAX_WARPS (a
# whole 16384-wide row): 32 warps, 16 elements a thread.  On sm_90 that is 31-32
# registers instead of 53-59, so two such rows fill an SM's 64 warps where the 16-warp
# program leaves half of them empty; which one keeps more bytes in flight is timed by the
# autotuner (docs/hopper.md).
WIDE_WARPS = 32
# The CPU interpreter runs programs one after another at a fixed cost each (about 15 ms
# for a 4096-wide bf16 row), so there one program takes up to 65536 elements.
INTERP_TILE = 65536

SOFTMAX, LAYERNORM, RMSNORM = 0, 1, 2  # the OP constexpr
LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = 2^(x log2 e)


@triton.jit
def _softmax_rows(x, cmask):
    """softmax of each row of a [ROWS, BLOCK_N] fp32 tile whose columns past N are
    masked.  Each exponential is taken once and kept for the output: tl.math.exp2 of
    (x - max) log2 e is ex2.approx.ftz.f32, one MUFU.EX2 (tl.exp adds ptxas's four-
    instruction subnormal fix-up).  (x log2 e - max log2 e, one FFMA less, loses the low
    bits of x - max when the row sits far from 0: 2e-5 normwise at x ~ 1000.)"""
    xm = tl.where(cmask, x, float("-inf"))
    e = tl.math.exp2((xm - tl.max(xm, axis=1)[:, None]) * LOG2E)
    return e * (1.0 / tl.sum(e, axis=1))[:, None]


@triton.jit
def _stats(x, cmask, N, eps, OP: tl.constexpr):
    """Per-row (a, c) of a [ROWS, BLOCK_N] fp32 tile whose columns past N are masked:
    layernorm: the mean and 1 / sqrt(var + eps); rmsnorm: 1 / sqrt(mean(x^2) + eps)
    twice (a is unused)."""
    if OP == 1:
        a = tl.sum(x, axis=1) / N  # masked columns were loaded as 0
        # Two passes over the registers (mean, then squares of x - mean): exact where
        # E[x^2] - E[x]^2 would cancel away the digits of a row with a large mean.
        d = tl.where(cmask, x - a[:, None], 0.0)
        c = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / N + eps)
    else:
        c = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / N + eps)
        a = c
    return a, c


@triton.jit
def _apply(x, a, c, W, B, cols, cmask, OP: tl.constexpr):
    """y from x and its rows' (a, c) (see _stats), broadcast against x; the parameters
    are loaded at `cols` (the shape of a row of x)."""
    if OP == 0:
        y = tl.exp(x - a) * c
    else:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if OP == 1:
            y = (x - a) * c * w + tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)
        else:
            y = x * c * w
    return y


@triton.jit
def rowop_kernel(X, W, B, Y, M, N, stride_xm, stride_ym, eps, OP: tl.constexpr,
                 MBITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # ROWS whole rows per program, each read once.  Rows past M repeat row M - 1 (their
    # stores are masked), so every loaded row is finite and no lane computes 0/0.
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rows_in = tl.minimum(rows, M - 1).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)[None, :]
    cmask = cols < N
    # Upcast before any arithmetic: exact for every input format, and the interpreter's
    # bf16 arithmetic is wrong without it.
    x = tl.load(X + rows_in[:, None] * stride_xm + cols, mask=cmask, other=0.0).to(tl.float32)
    if OP == 0:
        y = _softmax_rows(x, cmask)
    else:
        a, c = _stats(x, cmask, N, eps, OP)
        y = _apply(x, a[:, None], c[:, None], W, B, cols, cmask, OP)
    tl.store(Y + rows_in[:, None] * stride_ym + cols,
             round_for_store(y, MBITS).to(Y.dtype.element_ty),
             mask=(rows < M)[:, None] & cmask)


@triton.jit
def rowop_loop_kernel(X, W, B, Y, N, stride_xm, stride_ym, eps, OP: tl.constexpr,
                      MBITS: tl.constexpr, BLOCK_N: tl.constexpr):
    # One row per program, wider than one block: pass 1 gathers per-lane statistics over
    # the row's chunks, pass 2 re-reads x (from L2 when the rows in flight fit) and writes.
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_xm
    y_row = Y + row * stride_ym
    cols = tl.arange(0, BLOCK_N)
    if OP == 0:
        # Online softmax per lane: running max m and sum s of exp(x - m).
        m = tl.full([BLOCK_N], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in range(0, N, BLOCK_N):
            x = tl.load(x_row + k + cols, mask=k + cols < N, other=float("-inf"))
            m_new = tl.maximum(m, x.to(tl.float32))
            # A lane with no column yet (m_new = -inf) keeps s = 0, not exp(-inf + inf).
            s = tl.where(m_new > float("-inf"),
                         s * tl.exp(m - m_new) + tl.exp(x.to(tl.float32) - m_new), 0.0)
            m = m_new
        a = tl.max(m, axis=0)
        c = 1.0 / tl.sum(tl.where(m > float("-inf"), s * tl.exp(m - a), 0.0), axis=0)
    else:
        # Sums of d and d^2.  layernorm: d = x - x[0]; shifted by a value of the row, the
        # variance E[d^2] - E[d]^2 does not cancel away the digits of a large mean.
        # rmsnorm: d = x.
        shift = tl.load(x_row).to(tl.float32) if OP == 1 else 0.0
        s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
        s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in range(0, N, BLOCK_N):
            x = tl.load(x_row + k + cols, mask=k + cols < N, other=0.0).to(tl.float32)
            d = tl.where(k + cols < N, x - shift, 0.0)
            if OP == 1:
                s1 += d
            s2 += d * d
        if OP == 1:
            d_mean = tl.sum(s1, axis=0) / N
            a = shift + d_mean
            var = tl.maximum(tl.sum(s2, axis=0) / N - d_mean * d_mean, 0.0)
            c = 1.0 / tl.sqrt(var + eps)
        else:
            c = 1.0 / tl.sqrt(tl.sum(s2, axis=0) / N + eps)
            a = c
    for k in range(0, N, BLOCK_N):
        cmask = k + cols < N
        x = tl.load(x_row + k + cols, mask=cmask, other=0.0).to(tl.float32)
        y = _apply(x, a, c, W + k, B + k, cols, cmask, OP)
        tl.store(y_row + k + cols, round_for_store(y, MBITS).to(Y.dtype.element_ty),
                 mask=cmask)


def plan(n: int, max_block_n: int = MAX_BLOCK_N) -> tuple[bool, int, int, int]:
    """(looped, ROWS, BLOCK_N, num_warps) for rows of width n: the whole row in one block
    when it fits, ROWS rows a program at small widths, about 16 elements a thread, up
    to MAX_WARPS warps (16 warps x 32 threads hold a 16384-wide row at 32 a thread)."""
    block = max(16, triton.next_power_of_2(n))
    if block > max_block_n:
        block = min(LOOP_BLOCK_N, max_block_n)
        return True, 1, block, min(MAX_WARPS, max(4, block // 512))
    rows = max(1, ROW_TILE // block)
    return False, rows, block, min(MAX_WARPS, max(4, rows * block // 512))


@dataclass(frozen=True)
class RowOp:
    """What tells the three families apart."""

    name: str
    code: int  # the OP constexpr
    params: tuple[str, ...]  # per-column parameters besides x: ("w",) or ("w", "b")
    flops_per_element: int
    flops_note: str
    torch_fn: Callable[[Inputs, torch.Tensor], torch.Tensor]
    math: Callable[..., torch.Tensor]  # float64 reference from x and the params
    torch_note: str
    description: str


def _softmax64(x: torch.Tensor) -> torch.Tensor:
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def _layernorm64(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    d = x - x.mean(dim=-1, keepdim=True)
    return d / torch.sqrt((d * d).mean(dim=-1, keepdim=True) + EPS) * w + b


def _rmsnorm64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + EPS) * w


OPS: dict[str, RowOp] = {op.name: op for op in [
    RowOp("softmax", SOFTMAX, (), 5, "max, subtract, exp, sum, divide per element",
          lambda i, out: torch.softmax(i["x"], -1, out=out), _softmax64,
          "torch.softmax(x, -1)", "row-wise softmax over the last dim"),
    RowOp("layernorm", LAYERNORM, ("w", "b"), 7,
          "sum, subtract mean, square, sum, x 1/std, x w, + b per element",
          lambda i, out: F.layer_norm(i["x"], (i["x"].shape[-1],), i["w"], i["b"], EPS),
          _layernorm64, "F.layer_norm with weight and bias",
          "LayerNorm forward over the last dim, weight and bias, eps 1e-5"),
    RowOp("rmsnorm", RMSNORM, ("w",), 4, "square, sum, x 1/rms, x w per element",
          lambda i, out: F.rms_norm(i["x"], (i["x"].shape[-1],), i["w"], EPS),
          _rmsnorm64, "F.rms_norm with weight",
          "RMSNorm forward over the last dim, weight, eps 1e-5"),
]}


def rowop_launch(op: RowOp, inputs: Inputs, out: torch.Tensor,
                 max_block_n: int = MAX_BLOCK_N) -> TritonLaunch:
    """The one launch of a row op: a config chosen by the width, autotuned only between
    plan's warps and WIDE_WARPS for rows of more than 16 elements a thread."""
    x = inputs["x"]
    m, n = x.shape
    w = inputs.get("w", x)  # softmax has no parameters: x stands in, never read
    b = inputs.get("b", w)
    looped, rows, block, warps = plan(n, max_block_n)
    # The ops share kernels; tunings are kept per op all the same: OP is in the tuner's
    # key, in memory and on disk (kernels/tuning.py).
    common = dict(constexprs={"OP": op.code, "MBITS": store_round_bits(out)}, tuner=op.name,
                  operands={"X": ("stride_xm", 1), **({"W": (1,)} if op.params else {}),
                            **({"B": (1,)} if "b" in op.params else {})})
    if looped:
        return TritonLaunch(
            fn=rowop_loop_kernel, args=(x, w, b, out, n, x.stride(0), out.stride(0), EPS),
            configs=(triton.Config({"BLOCK_N": block}, num_warps=warps),),
            grid=lambda meta: (m,), **common)
    interp_rows = min(max(1, INTERP_TILE // block), triton.next_power_of_2(m))
    candidates = [warps]
    if rows * block > 16 * 32 * warps and warps < WIDE_WARPS:
        candidates.append(WIDE_WARPS)
    return TritonLaunch(
        fn=rowop_kernel, args=(x, w, b, out, m, n, x.stride(0), out.stride(0), EPS),
        configs=tuple(triton.Config({"ROWS": rows, "BLOCK_N": block}, num_warps=nw)
                      for nw in candidates),
        grid=lambda meta: (triton.cdiv(m, meta["ROWS"]),),
        tune_key=("M", "N"),
        interp_config=triton.Config({"ROWS": max(rows, interp_rows), "BLOCK_N": block}),
        **common)


def rowop_spec(op: RowOp) -> KernelSpec:
    """The spec of one row op; the three differ only in their RowOp."""

    def make_inputs(shape: Shape, dtype: str, seed: int, device: str) -> Inputs:
        m, n = shape["M"], shape["N"]
        storage = DTYPES[dtype].storage
        # Rows with offsets of a few units: a norm that forgets the mean, or a
        # variance formula that cancels, is far off; softmax sees rows of any level.
        x = randn((m, n), seed, device) + randn((m, 1), seed + 1, device, 3.0)
        inputs: Inputs = {"x": x.to(storage)}
        if "w" in op.params:  # weights near 1, as trained norms have; never 0
            inputs["w"] = (1.0 + randn((n,), seed + 2, device, 0.25)).to(storage)
        if "b" in op.params:
            inputs["b"] = randn((n,), seed + 3, device, 0.5).to(storage)
        return inputs

    def reference(inputs: Inputs, dtype: str) -> torch.Tensor:
        return op.math(inputs["x"].double(), *(inputs[p].double() for p in op.params))

    def run_triton(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
        run_launch(rowop_launch(op, inputs, out))
        return out

    def nbytes(shape: Shape, dtype: str) -> int:
        # x read once, y written once, each parameter vector read once.
        return (2 * shape["M"] + len(op.params)) * shape["N"] * DTYPES[dtype].itemsize

    params_bytes = f" + {len(op.params)} N b" if len(op.params) > 1 else \
        (" + N b" if op.params else "")
    return KernelSpec(
        name=op.name,
        family=op.name,
        dims=("M", "N"),
        flops=lambda shape, dtype: op.flops_per_element * shape["M"] * shape["N"],
        nbytes=nbytes,
        flops_formula=f"{op.flops_per_element} M N  ({op.flops_note})",
        bytes_formula=f"2 M N b{params_bytes}",
        make_inputs=make_inputs,
        alloc_out=lambda inputs, dtype: torch.empty_like(inputs["x"]),
        reference=reference,
        providers={
            "torch": Provider("torch", op.torch_fn, ROWOP_DTYPES, note=op.torch_note),
            "triton": Provider("triton", run_triton, ROWOP_DTYPES,
                               note="rows whole in registers (several a program at small "
                                    "widths), fp32 math; looped past 16384"),
        },
        description=op.description,
        triton_launches=lambda inputs, out, sms: [rowop_launch(op, inputs, out)],
        shape_group=ROWOP,
    )


SOFTMAX_SPEC = rowop_spec(OPS["softmax"])
LAYERNORM_SPEC = rowop_spec(OPS["layernorm"])
RMSNORM_SPEC = rowop_spec(OPS["rmsnorm"])
