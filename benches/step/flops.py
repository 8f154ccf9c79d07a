"""The training step's FLOPs, counted as what ran: torch's FlopCounterMode, with causal
attention counted as what a causal kernel computes, half the square.

torch.utils.flop_counter counts the fused scaled_dot_product_attention ops (flash,
memory-efficient, cuDNN; forward and backward) as the full S x S square whatever their
is_causal (its source: "We aren't accounting for causal attention here"), while a causal
kernel skips the masked half: on an H200 a Llama-3-8B step's attention came out at
1.06e3 TFLOP/s, above the 989 TFLOP/s bf16 peak.  flop_counter() reads each such call's
is_causal from the op's schema and counts a causal call as CAUSAL_SHARE (half) of the
counter's own count (roofline/plan/arithmetic.py says why half).  SDPA's math backend is
no such op: it multiplies the whole square and masks it, and the counter sees its
batched matmuls, the full square, which is what it computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from contract.models import ModelShape
from roofline.plan.arithmetic import CAUSAL_SHARE

# The fused SDPA ops FlopCounterMode sees (queries, keys and values laid out
# [batch, heads, seq, head_dim]); those this torch lacks are skipped.
FUSED_SDPA = tuple(f"_scaled_dot_product_{kind}_attention{part}"
                   for kind in ("flash", "efficient", "cudnn") for part in ("", "_backward"))


def _causal_count(packet: Any, full: Callable[..., int]) -> Callable[..., int]:
    """`full` (the counter's formula for `packet`, taking the op's own arguments), halved
    for a causal call."""
    at = [a.name for a in packet.default._schema.arguments].index("is_causal")

    def count(*a: Any, out_val: Any = None, **kw: Any) -> int:
        n = full(*a, out_val=out_val, **kw)
        causal = a[at] if len(a) > at else kw.get("is_causal", False)
        return int(n * CAUSAL_SHARE) if causal else n

    count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode: raw arguments
    return count


def causal_mapping() -> dict[Any, Callable[..., int]]:
    """FlopCounterMode's custom_mapping: each fused SDPA op this torch has, counted
    causal where its call is."""
    out = {}
    for name in FUSED_SDPA:
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or packet not in flop_registry:
            continue
        if "is_causal" not in [a.name for a in packet.default._schema.arguments]:
            continue
        out[packet] = _causal_count(packet, flop_registry[packet])
    return out


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode that counts causal attention as computed."""
    return FlopCounterMode(display=False, custom_mapping=causal_mapping())


def attention_formula(shape: ModelShape, n_blocks: int, batch: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of the blocks' causal SDPA by the flop counter's own
    formulas (the backward recomputing the scores, as FlashAttention does), halved for
    the causal mask: for a device whose fused kernel the counter does not count (the
    CPU's flash kernel, which skips the masked blocks too)."""
    q = (batch, shape.heads, shape.seq_len, shape.head_dim)
    fwd = int(sdpa_flop_count(q, q, q) * CAUSAL_SHARE)
    bwd = int(sdpa_backward_flop_count(q, q, q, q) * CAUSAL_SHARE)
    return n_blocks * fwd, n_blocks * bwd
