"""A real decoder-only Transformer built from the planner's ModelShape, for measuring a
training step (`python -m roofline plan --measure step`).

Token embedding (and a learned position table where the shape has one), L pre-norm
blocks (causal attention through F.scaled_dot_product_attention, grouped-query when
kv_heads < heads; an MLP, or a gated SwiGLU MLP), a final norm, the LM head (tied to the
embedding or not) and the cross-entropy loss.  Every weight the planner itemizes is a
parameter here and nothing else is, so its parameter count equals ModelShape.params
exactly (tested): q, k and v are one fused matrix and so are the gated MLP's gate and up,
as the planner names its GEMMs.  `n_blocks` builds a slice of the model: k blocks with
the embedding and head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from contract.models import ModelShape
from roofline.plan.model import PlanError


class StepError(PlanError):
    """A model or step that cannot be measured (one-line message, exit 2, like every
    other bad plan input)."""


def check_shape(shape: ModelShape, micro_batch: int, n_blocks: int | None = None) -> None:
    """StepError for a shape no Transformer can have, before anything is allocated."""
    if shape.heads < 1 or shape.d_model % shape.heads:
        raise StepError(f"heads ({shape.heads}) must divide d_model ({shape.d_model})")
    if shape.kv_heads < 1 or shape.heads % shape.kv_heads:
        raise StepError(f"kv-heads ({shape.kv_heads}) must divide heads ({shape.heads})")
    if shape.seq_len < 1:
        raise StepError(f"seq-len must be at least 1, got {shape.seq_len}")
    if micro_batch < 1:
        raise StepError(f"micro-batch must be at least 1, got {micro_batch}")
    if n_blocks is not None and not 0 <= n_blocks <= shape.n_layers:
        raise StepError(f"--measure-layers {n_blocks} is not between 1 and the model's "
                        f"{shape.n_layers} layers")


def _norm(shape: ModelShape) -> nn.Module:
    # norm_params 2: LayerNorm with weight and bias (GPT-2/3); 1: RMSNorm, weight only.
    if shape.norm_params == 2:
        return nn.LayerNorm(shape.d_model)
    return nn.RMSNorm(shape.d_model)


class Block(nn.Module):
    """Pre-norm: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        d, kv = shape.d_model, shape.kv_dim
        self.shape = shape
        self.norm1 = _norm(shape)
        self.qkv = nn.Linear(d, d + 2 * kv, bias=shape.bias)
        self.out = nn.Linear(d, d, bias=shape.bias)
        self.norm2 = _norm(shape)
        up = 2 * shape.d_ff if shape.gated else shape.d_ff
        self.up = nn.Linear(d, up, bias=shape.bias)
        self.down = nn.Linear(shape.d_ff, d, bias=shape.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.shape
        b, t, d = x.shape
        hd, kv = s.head_dim, s.kv_dim
        q, k, v = self.qkv(self.norm1(x)).split([d, kv, kv], dim=-1)
        q = q.view(b, t, s.heads, hd).transpose(1, 2)
        k = k.view(b, t, s.kv_heads, hd).transpose(1, 2)
        v = v.view(b, t, s.kv_heads, hd).transpose(1, 2)
        if s.kv_heads != s.heads:
            # Grouped-query attention: each k/v head serves heads / kv_heads query heads.
            k = k.repeat_interleave(s.heads // s.kv_heads, dim=1)
            v = v.repeat_interleave(s.heads // s.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        u = self.up(self.norm2(x))
        if s.gated:
            gate, u = u.chunk(2, dim=-1)
            u = F.silu(gate) * u
        else:
            u = F.gelu(u, approximate="tanh")
        return x + self.down(u)


class Transformer(nn.Module):
    def __init__(self, shape: ModelShape, n_blocks: int | None = None) -> None:
        super().__init__()
        check_shape(shape, 1, n_blocks)
        self.shape = shape
        self.tok = nn.Embedding(shape.vocab, shape.d_model)
        self.pos = nn.Embedding(shape.seq_len, shape.d_model) if shape.learned_pos else None
        n = shape.n_layers if n_blocks is None else n_blocks
        self.blocks = nn.ModuleList(Block(shape) for _ in range(n))
        self.norm = _norm(shape)
        self.head = None if shape.tied else nn.Linear(shape.d_model, shape.vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        weight = self.tok.weight if self.head is None else self.head.weight
        logits = F.linear(x, weight)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
