"""attention and attention_bwd: scaled-dot-product attention, o = softmax(q k^T / sqrt(D)) v.

Shapes: B (batch), H (heads; q, k and v all have H), S (sequence length of q and of
k/v), D (head dim), causal (0 or 1: query i sees keys 0..i).  Tensors are (B, H, S, D),
contiguous (fp8's v sequence-major, see make_inputs).  `attention` is the forward;
`attention_bwd` is forward + backward as one case (o, then dq, dk, dv for a given dO),
what a training step runs per layer.

FLOPs: as torch's FlopCounterMode counts SDPA (torch/utils/flop_counter.py): the forward
is two batched GEMMs, q k^T and P v, 2 S^2 D each per head: 4 B H S^2 D.  Its backward
(sdpa_backward_flop) is five: the recomputed q k^T, dO v^T, P^T dO, dS k and dS^T q,
10 B H S^2 D, so attention_bwd counts 14 B H S^2 D.  The counter ignores the causal mask
("NB: We aren't accounting for causal attention here"); causal rows count half, the
multiply-adds that are done, as FlashAttention's own benchmarks count them.  Softmax's
exponentials and sums (O(S^2) per head, not O(S^2 D)) are left out, as by the counter.

Bytes: compulsory traffic, each tensor once: q, k, v read and o written (4 B H S D b;
fp8: 3 B H S D + 2 B H S D, o in bf16); attention_bwd adds dO read and dq, dk, dv
written (8 B H S D b in all) and the fp32 log-sum-exp per query row (4 B H S) that the
forward keeps for the backward.  (The Triton forward writes that log-sum-exp in
`attention` too, as SDPA's flash forward does; left out of its bytes there: 4 per row
against 8 D of q, k, v, o, 0.4% at D = 128.)

Tolerance: the dtype's (kernels.spec.DTYPES), held by each of o, dq, dk, dv alone
(PartwiseSpec).  Both providers round P (and the backward's dS) to the storage dtype for
the tensor-core products and the outputs once, sums in fp32: about the unit roundoff of
the format normwise, never a cancellation (the scores are N(0, 1)), so fp16's 5e-3
(u = 4.9e-4) and bf16's 2e-2 (u = 3.9e-3) hold with margin: measured 2.4e-4..4.4e-4 and
1.9e-3..3.6e-3 on the CPU; fp32 2e-5 against 2-4e-7.  A dq 2% off fails fp16 (tested).
fp8 (Triton forward): q, k, v quantized with per-tensor scales, the reference computed
from the dequantized values, so only the kernel's own rounding counts, dominated by P
rounded to e4m3 (u = 2^-4) for P v: measured 1.3e-2..2.2e-2 against fp8's 0.1.

Providers: torch is F.scaled_dot_product_attention (its backward through autograd), and
the row's reason says which backend SDPA ran (flash, efficient, cuDNN, math; on a CPU
its own flash kernel, aten._scaled_dot_product_flash_attention_for_cpu, for every
dtype); Triton is kernels/attention_triton.py.  Held against the dtype's tensor-core roof
(matrix_unit): both providers' work is GEMMs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.attention_sdpa import sdpa_providers
from kernels.attention_triton import (
    attention_bwd_triton,
    attention_triton,
    triton_launches_bwd,
    triton_launches_fwd,
)
from kernels.dot import product_out_dtype
from kernels.shape_groups import ATTENTION
from kernels.spec import (
    DTYPES,
    Inputs,
    KernelSpec,
    Provider,
    Shape,
    Target,
    dequantize,
    fp8_accum,
    quantize,
    randn,
)

DIMS = ("B", "H", "S", "D", "causal")
# torch: fp32 too (on a GPU SDPA's efficient or math backend: flash has no fp32); fp8 is
# listed so that its rows say why they cannot run (_torch_skip).  Triton: the 16-bit
# tensor-core dtypes, and e4m3 for the forward (per-tensor scales, P rounded to e4m3 for
# P v, o written in bf16); no fp8 backward.  IEEE fp32 (CUDA cores) would add a third set
# of compiles for a dtype no attention kernel runs in.
TORCH_DTYPES = ("fp32", "fp16", "bf16", "fp8")
TRITON_DTYPES = ("fp16", "bf16", "fp8")
TRITON_BWD_DTYPES = ("fp16", "bf16")


def _heads(shape: Shape) -> int:
    return shape["B"] * shape["H"]


def _causal_factor(shape: Shape) -> float:
    return 0.5 if shape["causal"] else 1.0


def flops_fwd(shape: Shape, dtype: str) -> int:
    return int(4 * _heads(shape) * shape["S"] ** 2 * shape["D"] * _causal_factor(shape))


def flops_bwd(shape: Shape, dtype: str) -> int:
    """Forward (4) + FlopCounterMode's sdpa backward (10): 14 B H S^2 D, halved causal."""
    return int(14 * _heads(shape) * shape["S"] ** 2 * shape["D"] * _causal_factor(shape))


def bytes_fwd(shape: Shape, dtype: str) -> int:
    """q, k, v read (b each) and o written (b_out: bf16 for fp8, as matmul's)."""
    b_out = product_out_dtype(dtype).itemsize
    return (3 * DTYPES[dtype].itemsize + b_out) * _heads(shape) * shape["S"] * shape["D"]


def bytes_bwd(shape: Shape, dtype: str) -> int:
    rows = _heads(shape) * shape["S"]
    return 8 * rows * shape["D"] * DTYPES[dtype].itemsize + 4 * rows


def make_inputs(shape: Shape, dtype: str, seed: int, device: str, grad: bool = False
                ) -> Inputs:
    """q, k, v (and dO for the backward) ~ N(0, 1) in the storage dtype: the scores
    q k^T / sqrt(D) are then N(0, 1), softmax neither one-hot nor flat.  fp8: per-tensor
    scales sq, sk, sv (1 otherwise), and v stored sequence-major, a transposed
    (B, H, D, S) tensor: the K-major operand sm_90's fp8 wgmma needs for P v (as
    matmul's fp8 B)."""
    b, h, s, d = shape["B"], shape["H"], shape["S"], shape["D"]
    inputs: Inputs = {"causal": bool(shape["causal"]), "dtype": dtype}
    for i, name in enumerate(("q", "k", "v", "do") if grad else ("q", "k", "v")):
        if name == "v" and DTYPES[dtype].is_fp8:
            t, scale = quantize(randn((b, h, d, s), seed + i, device), dtype)
            t = t.transpose(-1, -2)
        else:
            t, scale = quantize(randn((b, h, s, d), seed + i, device), dtype)
        inputs[name], inputs["s" + name[0]] = t, scale
    return inputs


def _chunk(q: torch.Tensor) -> int:
    """Query rows per float64 reference step: its B H x rows x S scores stay near 2^25
    elements (256 MiB), whatever S (S = 16k at B H = 16 is 32 GiB at once)."""
    b, h, s, _ = q.shape
    return max(1, min(s, (1 << 25) // max(1, b * h * s)))


def _attend64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              first: int) -> torch.Tensor:
    """Explicit softmax(q k^T / sqrt(D)) v in float64 for query rows first.. of q."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        rows = torch.arange(first, first + q.shape[-2], device=q.device)[:, None]
        s = s.masked_fill(rows < torch.arange(k.shape[-2], device=q.device)[None, :],
                          float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def reference_fwd(inputs: Inputs, dtype: str) -> torch.Tensor:
    q, k, v = (dequantize(inputs[n], inputs["s" + n]) for n in ("q", "k", "v"))
    out = torch.empty_like(q)
    step = _chunk(q)
    for i in range(0, q.shape[-2], step):
        out[..., i:i + step, :] = _attend64(q[..., i:i + step, :], k, v, inputs["causal"], i)
    return out


def reference_bwd(inputs: Inputs, dtype: str) -> torch.Tensor:
    """stack(o, dq, dk, dv) in float64, the gradients by float64 autograd through the
    explicit formula, a chunk of query rows at a time (dk, dv summed over chunks)."""
    q, k, v, do = (inputs[n].double() for n in ("q", "k", "v", "do"))
    out = torch.zeros((4, *q.shape), dtype=torch.float64, device=q.device)
    kk, vv = k.requires_grad_(), v.requires_grad_()
    step = _chunk(q)
    with torch.enable_grad():
        for i in range(0, q.shape[-2], step):
            qc = q[..., i:i + step, :].detach().requires_grad_()
            oc = _attend64(qc, kk, vv, inputs["causal"], i)
            dq, dk, dv = torch.autograd.grad(oc, (qc, kk, vv), do[..., i:i + step, :])
            out[0, ..., i:i + step, :] = oc.detach()
            out[1, ..., i:i + step, :] = dq
            out[2] += dk
            out[3] += dv
    return out


def _decode_bwd(out: torch.Tensor | tuple[torch.Tensor, ...], inputs: Inputs,
                dtype: str) -> torch.Tensor:
    """Both providers' results as one float64 stack(o, dq, dk, dv): the Triton kernel
    writes the (4, B, H, S, D) output in place; torch returns autograd's own four
    tensors (gathering them into one would add copies to the timed call)."""
    if isinstance(out, torch.Tensor):
        return out.double()
    return torch.stack([t.double() for t in out])


@dataclass(frozen=True)
class PartwiseSpec(KernelSpec):
    """A spec whose output stacks several results (o, dq, dk, dv) of different sizes:
    each part is held to the tolerance on its own (the largest relative error counts),
    so that a wrong dq cannot hide behind a correct o."""

    def check(self, out: torch.Tensor, inputs: Inputs, dtype: str,
              ref: torch.Tensor | None = None) -> float:
        if ref is None:
            ref = self.reference(inputs, dtype)
        got = self.decode(out, inputs, dtype).reshape(ref.shape).to(ref.device)
        return max(KernelSpec.check(self, g, inputs, dtype, ref=r)
                   for g, r in zip(got.unbind(0), ref.unbind(0), strict=True))


# ---- torch: F.scaled_dot_product_attention, and which backend it ran ------------------

def attention_torch(inputs: Inputs, out: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(inputs["q"], inputs["k"], inputs["v"],
                                          is_causal=inputs["causal"])


def attention_bwd_torch(inputs: Inputs, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Forward, then dq, dk, dv for dO by autograd (SDPA's own backward kernel)."""
    q, k, v = (inputs[n].detach().requires_grad_() for n in ("q", "k", "v"))
    with torch.enable_grad():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=inputs["causal"])
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), inputs["do"])
    return o.detach(), dq, dk, dv


# SDPA's fused forward ops (aten) -> the backend names torch.nn.attention.SDPBackend uses.
# The math backend has no op of its own: it decomposes into matmuls and a softmax.
SDPA_BACKENDS = {
    "_scaled_dot_product_flash_attention": "flash",
    "_scaled_dot_product_flash_attention_for_cpu": "flash (CPU kernel)",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cuDNN",
    "_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


class _OpNames(TorchDispatchMode):
    """Records the aten ops a call dispatches (and runs them unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def sdpa_backend(call: Callable[[], object]) -> str:
    """Which SDPA backend `call` runs, from the aten ops it dispatches; SDPA picks one per
    call (dtype, head dim, device, causal), so a row's own call is the one run."""
    with _OpNames() as rec:
        call()
    ran = [name for op, name in SDPA_BACKENDS.items() if op in rec.names]
    return f"SDPA backend: {', '.join(ran) or 'math'}"


def _torch_skip(dtype: str, target: Target) -> str | None:
    if DTYPES[dtype].is_fp8:
        return ("F.scaled_dot_product_attention has no fp8 kernel (its flash, efficient, "
                "cuDNN and math backends reject float8 inputs)")
    return None


def _triton_skip(dtype: str, target: Target) -> str | None:
    if DTYPES[dtype].is_fp8 and fp8_accum() != "fast":
        return ("the Triton attention forward runs fp8 in the fast accumulation only "
                "(its products sum D or BLOCK_N terms a tile; --fp8-accum precise is "
                "matmul's)")
    return None


def _spec(name: str, description: str, flops: Callable[[Shape, str], int],
          nbytes: Callable[[Shape, str], int], flops_formula: str, bytes_formula: str,
          grad: bool) -> KernelSpec:
    cls = PartwiseSpec if grad else KernelSpec
    parts = (4,) if grad else ()  # attention_bwd: stack(o, dq, dk, dv)
    return cls(
        name=name,
        family="attention",
        dims=DIMS,
        flops=flops,
        nbytes=nbytes,
        flops_formula=flops_formula,
        bytes_formula=bytes_formula,
        make_inputs=lambda shape, dtype, seed, device: make_inputs(shape, dtype, seed,
                                                                   device, grad),
        alloc_out=lambda inputs, dtype: torch.empty(
            (*parts, *inputs["q"].shape), dtype=product_out_dtype(dtype),
            device=inputs["q"].device),
        reference=reference_bwd if grad else reference_fwd,
        decode=_decode_bwd if grad else (lambda out, inputs, dtype: out.double()),
        providers={
            "torch": Provider("torch", attention_bwd_torch if grad else attention_torch,
                              TORCH_DTYPES, skip=_torch_skip, backend=sdpa_backend,
                              note="F.scaled_dot_product_attention" + (
                                  " + autograd backward" if grad else "")
                              + "; the row's reason names the backend SDPA ran"),
            "triton": Provider("triton", attention_bwd_triton if grad else attention_triton,
                               TRITON_BWD_DTYPES if grad else TRITON_DTYPES,
                               skip=_triton_skip,
                               note="FlashAttention-2 style: online softmax over K/V tiles, "
                                    "causal tile skipping" + (
                                        "; backward recomputes P (delta, dK/dV, dQ kernels)"
                                        if grad else "; fp8: per-tensor scales, e4m3 P")),
            **sdpa_providers(attention_bwd_torch if grad else attention_torch, TORCH_DTYPES,
                             _torch_skip, sdpa_backend),
        },
        matrix_unit=True,
        description=description,
        triton_launches=triton_launches_bwd if grad else triton_launches_fwd,
        shape_group=ATTENTION,
    )


SPEC = _spec(
    "attention", "scaled-dot-product attention forward, softmax(q k^T / sqrt(D)) v",
    flops_fwd, bytes_fwd,
    "4 B H S^2 D, x 1/2 if causal  (q k^T and P v; FlopCounterMode's SDPA count)",
    "(3 b + b_out) B H S D  (q, k, v read, o written; b_out = b, bf16's 2 for fp8)",
    grad=False)
SPEC_BWD = _spec(
    "attention_bwd", "attention forward + backward (o, then dq, dk, dv for dO)",
    flops_bwd, bytes_bwd,
    "14 B H S^2 D, x 1/2 if causal  (forward 4 + FlopCounterMode's sdpa backward 10, "
    "which recomputes q k^T)",
    "8 B H S D b + 4 B H S  (q, k, v, dO read; o, dq, dk, dv written; fp32 log-sum-exp)",
    grad=True)
