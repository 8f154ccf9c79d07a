"""A decoder-only Transformer's shape (ModelShape), the published shapes (PRESETS), a
Hugging Face-style config.json read from disk, and the kernel shapes one forward pass
of such a model runs at a number of tokens (step_shapes): the planner (roofline/plan)
counts with the first three, the sweep's `--sizes model:NAME[:tokens=N]` measures the
last."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from kernels.spec import Shape

DEFAULT_VOCAB = 50257  # GPT-2's BPE vocabulary, the default for shape-only models

DEFAULT_SEQ_LEN = 2048

MODEL_SIZES = "model:"  # --sizes model:NAME[:tokens=N] or model:path/config.json[:tokens=N]


class ModelConfigError(ValueError):
    """A model that cannot be read or sized (one-line message, exit 2)."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only Transformer, enough of it to count parameters and name its GEMMs."""

    name: str
    d_model: int
    n_layers: int
    d_ff: int
    vocab: int
    seq_len: int
    heads: int
    kv_heads: int  # < heads: grouped-query attention (Llama 3), smaller k and v
    tied: bool  # the LM head reuses the token embedding
    gated: bool = False  # SwiGLU MLP: gate, up and down, 3 d x d_ff matrices
    bias: bool = False  # GPT-2/3 have biases on every linear layer
    learned_pos: bool = False  # GPT-2/3: a learned S x d position table; rotary has none
    norm_params: int = 1  # per norm and channel: 1 (RMSNorm), 2 (LayerNorm with bias)
    # A config's own head_dim where heads x head_dim != d_model (Qwen3, Gemma); 0: d / heads
    head_size: int = 0

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    def weight_matrices(self) -> list[tuple[str, int, int, int]]:
        """(name, in features, out features, how many) of every matmul weight.

        q, k and v are one fused matrix and so are the gated MLP's gate and up, as most
        training code runs them: one GEMM each, whose shape is what the device sees."""
        d, L = self.d_model, self.n_layers
        up = 2 * self.d_ff if self.gated else self.d_ff
        return [
            ("attn.qkv", d, self.q_dim + 2 * self.kv_dim, L),
            ("attn.out", self.q_dim, d, L),
            ("mlp.gate_up" if self.gated else "mlp.up", d, up, L),
            ("mlp.down", self.d_ff, d, L),
            ("lm_head", d, self.vocab, 1),
        ]

    def param_items(self) -> dict[str, int]:
        d, L, V = self.d_model, self.n_layers, self.vocab
        # q and o are d x q_dim, k and v d x kv_dim (q_dim = d unless the config says)
        attn = L * (2 * d * self.q_dim + 2 * d * self.kv_dim)
        mlp = L * (3 if self.gated else 2) * d * self.d_ff
        norms = (2 * L + 1) * d * self.norm_params  # two per block and a final one
        biases = 0
        if self.bias:
            up = 2 * self.d_ff if self.gated else self.d_ff
            biases = L * ((self.q_dim + 2 * self.kv_dim) + d + up + d)
        items = {
            "attention": attn,
            "mlp": mlp,
            "token embedding": V * d,
            "lm head": 0 if self.tied else V * d,
            "position embedding": self.seq_len * d if self.learned_pos else 0,
            "norms and biases": norms + biases,
        }
        return items

    @property
    def params(self) -> int:
        return sum(self.param_items().values())

    @property
    def matmul_params(self) -> int:
        """Parameters that are GEMM weights (the LM head included even when tied)."""
        return sum(k * n * c for _, k, n, c in self.weight_matrices())

    @property
    def approx_12d2l(self) -> int:
        return 12 * self.d_model**2 * self.n_layers

    def describe(self) -> str:
        mlp = f"gated d_ff {self.d_ff}" if self.gated else f"d_ff {self.d_ff}"
        kv = f", {self.kv_heads} kv heads" if self.kv_heads != self.heads else ""
        return (f"d_model {self.d_model}, {self.n_layers} layers, {mlp}, {self.heads} heads"
                f"{kv}, vocab {self.vocab}, seq {self.seq_len}, "
                f"{'tied' if self.tied else 'untied'} embeddings")


# Published shapes.  GPT-2 small: Radford et al. 2019 / the released checkpoint (124.4M).
# GPT-3 175B: Brown et al. 2020, table 2.1.  Llama 3: Meta's model cards and params.json
# (8B: 32 heads, 8 kv heads, d_ff 14336; 70B: 64 heads, 8 kv heads, d_ff 28672).
PRESETS: dict[str, ModelShape] = {
    "gpt2-small": ModelShape("gpt2-small", 768, 12, 3072, 50257, 1024, 12, 12, tied=True,
                             bias=True, learned_pos=True, norm_params=2),
    "gpt3-175b": ModelShape("gpt3-175b", 12288, 96, 49152, 50257, 2048, 96, 96, tied=True,
                            bias=True, learned_pos=True, norm_params=2),
    "llama3-8b": ModelShape("llama3-8b", 4096, 32, 14336, 128256, 8192, 32, 8, tied=False,
                            gated=True),
    "llama3-70b": ModelShape("llama3-70b", 8192, 80, 28672, 128256, 8192, 64, 8, tied=False,
                             gated=True),
}


# ---- a Hugging Face-style config.json ------------------------------------------------

class HfConfig(TypedDict, total=False):
    """The keys of a Hugging Face-style config.json that read_hf_config reads (any other
    is ignored), Llama-style names first, then GPT-2's; each is checked as it is read."""

    hidden_size: int
    n_embd: int
    d_model: int
    num_hidden_layers: int
    n_layer: int
    num_layers: int
    num_attention_heads: int
    n_head: int
    vocab_size: int
    intermediate_size: int
    n_inner: int
    ffn_dim: int
    num_key_value_heads: int
    max_position_embeddings: int
    n_positions: int
    head_dim: int
    hidden_act: str
    activation_function: str
    tie_word_embeddings: bool
    num_local_experts: int  # a mixture of experts: refused
    num_experts: int
    n_routed_experts: int


# Each ModelShape field and the config keys that hold it, Llama-style names first, then
# GPT-2's.
_KEYS: dict[str, tuple[str, ...]] = {
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _first(cfg: HfConfig, keys: tuple[str, ...], path: str) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    raise ModelConfigError(f"{path}: no positive integer {' or '.join(keys)}")


def read_hf_config(path: str | Path) -> ModelShape:
    """The ModelShape of a Hugging Face-style config.json (Llama, Mistral, Qwen or GPT-2
    key names).  A SwiGLU MLP (hidden_act silu/swish, not GPT-2) is gated; RMSNorm is
    assumed unless the config is GPT-2's (LayerNorm with biases)."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ModelConfigError(f"cannot read model config {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise ModelConfigError(f"{p} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ModelConfigError(f"{p}: a config.json holds one JSON object")
    cfg: HfConfig = raw
    moe = [k for k in _MOE_KEYS if cfg.get(k)]
    if moe:
        raise ModelConfigError(f"{p}: a mixture-of-experts config ({moe[0]}) is not "
                               "modelled (dense decoder-only Transformers only)")
    where = str(p)
    dims = {f: _first(cfg, keys, where) for f, keys in _KEYS.items()}
    gpt2 = "n_embd" in cfg
    inner = cfg.get("intermediate_size") or cfg.get("n_inner") or cfg.get("ffn_dim")
    d_ff = inner if isinstance(inner, int) and inner > 0 else 4 * dims["d_model"]
    kv = cfg.get("num_key_value_heads") or dims["heads"]
    seq = cfg.get("max_position_embeddings") or cfg.get("n_positions") or DEFAULT_SEQ_LEN
    head = cfg.get("head_dim")
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "")
    if dims["d_model"] % dims["heads"] and not head:
        raise ModelConfigError(f"{p}: hidden size {dims['d_model']} is not a multiple of "
                               f"{dims['heads']} heads and no head_dim is given")
    return ModelShape(
        name=p.parent.name or p.stem, d_model=dims["d_model"], n_layers=dims["n_layers"],
        d_ff=int(d_ff), vocab=dims["vocab"], seq_len=int(seq), heads=dims["heads"],
        kv_heads=int(kv), tied=bool(cfg.get("tie_word_embeddings", gpt2)),
        gated=not gpt2 and act in ("silu", "swish", "swiglu"), bias=gpt2,
        learned_pos=gpt2, norm_params=2 if gpt2 else 1,
        head_size=int(head) if isinstance(head, int) and head > 0 else 0)


# ---- the kernels of one forward pass ---------------------------------------------------

@dataclass(frozen=True)
class ModelSizes:
    """`--sizes model:NAME[:tokens=N]`: a model and the tokens of one step (default: one
    sequence of the model's own length)."""

    model: ModelShape
    tokens: int


@dataclass(frozen=True)
class LayerShape:
    """One kernel shape a model runs: the kernel, the layer it stands for, its shape and
    how many times one forward pass runs it (per layer kernels: n_layers).  Count 0: a
    kernel measured at the model's shape that the forward pass does not add to its time
    (attention_bwd is the backward; gelu_erf a second form of the one activation gelu
    already counts)."""

    kernel: str
    layer: str
    shape: Shape
    count: int


def parse_model_sizes(text: str) -> ModelSizes:
    """`model:llama3-8b`, `model:llama3-8b:tokens=8192` or `model:path/config.json[:tokens=N]`
    (a preset name of PRESETS, or a config.json read from disk); ModelConfigError."""
    if not text.startswith(MODEL_SIZES):
        raise ModelConfigError(f"not a model size: '{text}' (use model:NAME[:tokens=N])")
    body = text[len(MODEL_SIZES):]
    name, sep, tail = body.rpartition(":tokens=")
    if not sep:
        name, tail = body, ""
    if not name:
        raise ModelConfigError(f"--sizes {text}: no model named (use model:NAME, one of "
                               f"{', '.join(PRESETS)}, or model:path/to/config.json)")
    if name in PRESETS:
        model = PRESETS[name]
    elif name.endswith(".json") or "/" in name:
        model = read_hf_config(name)
    else:
        raise ModelConfigError(f"unknown model '{name}' (choose from {', '.join(PRESETS)}, "
                               "or give a path to a config.json)")
    if not tail:
        return ModelSizes(model, model.seq_len)
    try:
        tokens = int(tail)
    except ValueError:
        raise ModelConfigError(f"--sizes {text}: tokens '{tail}' is not an integer") from None
    if tokens < 1:
        raise ModelConfigError(f"--sizes {text}: tokens must be >= 1")
    return ModelSizes(model, tokens)


def step_shapes(sizes: ModelSizes) -> list[LayerShape]:
    """The kernel shapes one forward pass over `sizes.tokens` tokens runs, per kernel of
    the registry that stands for a part of the model: the projections' GEMMs (M = tokens,
    K = in features, N = out features), attention at the model's heads, head dim and
    sequence length (causal; batch = tokens / sequence), the model's norm at its width,
    the loss's softmax over the vocabulary, the activation and the gate's product at the
    FFN width, the residual adds at the model width."""
    m, t = sizes.model, sizes.tokens
    L = m.n_layers
    seq = min(m.seq_len, t)
    attn = {"B": max(1, t // seq), "H": m.heads, "S": seq, "D": m.head_dim, "causal": 1}
    norm = "rmsnorm" if m.norm_params == 1 else "layernorm"
    out = [LayerShape("matmul", name, {"M": t, "N": n, "K": k}, c)
           for name, k, n, c in m.weight_matrices()]
    out += [LayerShape("attention", "attn.sdpa", dict(attn), L),
            LayerShape("attention_bwd", "attn.sdpa", dict(attn), 0)]
    out += [LayerShape(norm, "norm", {"M": t, "N": m.d_model}, 2 * L + 1),
            LayerShape("softmax", "loss.softmax", {"M": t, "N": m.vocab}, 1),
            LayerShape("add", "residual", {"n": t * m.d_model}, 2 * L)]
    out += [LayerShape("gelu", "mlp.act", {"n": t * m.d_ff}, L),
            LayerShape("gelu_erf", "mlp.act", {"n": t * m.d_ff}, 0)]
    if m.gated:
        out.append(LayerShape("mul", "mlp.gate_mul", {"n": t * m.d_ff}, L))
    return _merged(out)


def _merged(shapes: list[LayerShape]) -> list[LayerShape]:
    """One entry per (kernel, shape): layers whose shapes coincide (a row is one shape)
    are named together and their counts added."""
    by: dict[tuple[str, tuple[tuple[str, int], ...]], LayerShape] = {}
    for s in shapes:
        key = (s.kernel, tuple(s.shape.items()))
        if key in by:
            old = by[key]
            by[key] = LayerShape(s.kernel, f"{old.layer}+{s.layer}", s.shape,
                                 old.count + s.count)
        else:
            by[key] = s
    return list(by.values())
