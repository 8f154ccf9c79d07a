"""A decoder-only Transformer's shape, enough of it to count parameters and name its
GEMMs, and the published shapes (presets)."""


from dataclasses import dataclass

DEFAULT_VOCAB = 50257  # GPT-2's BPE vocabulary, the default for shape-only models

DEFAULT_SEQ_LEN = 2048


class PlanError(ValueError):
    """Bad plan input (one-line message, exit 2)."""


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

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def weight_matrices(self) -> list[tuple[str, int, int, int]]:
        """(name, in features, out features, how many) of every matmul weight.

        q, k and v are one fused matrix and so are the gated MLP's gate and up, as most
        training code runs them: one GEMM each, whose shape is what the device sees."""
        d, L = self.d_model, self.n_layers
        up = 2 * self.d_ff if self.gated else self.d_ff
        return [
            ("attn.qkv", d, d + 2 * self.kv_dim, L),
            ("attn.out", d, d, L),
            ("mlp.gate_up" if self.gated else "mlp.up", d, up, L),
            ("mlp.down", self.d_ff, d, L),
            ("lm_head", d, self.vocab, 1),
        ]

    def param_items(self) -> dict[str, int]:
        d, L, V = self.d_model, self.n_layers, self.vocab
        attn = L * (2 * d * d + 2 * d * self.kv_dim)  # q and o are d x d, k and v d x kv_dim
        mlp = L * (3 if self.gated else 2) * d * self.d_ff
        norms = (2 * L + 1) * d * self.norm_params  # two per block and a final one
        biases = 0
        if self.bias:
            up = 2 * self.d_ff if self.gated else self.d_ff
            biases = L * ((d + 2 * self.kv_dim) + d + up + d)
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
