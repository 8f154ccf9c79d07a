"""The shape groups the built-in families share: the shapes of each size preset (quick,
default, full) on a GPU and on a CPU.  A family names its group on its spec
(KernelSpec.shape_group); a family of new dimensions declares its own group in its own
module instead (docs/adding-a-kernel.md).

GPU presets span cache-resident to HBM-bound sizes (the H100's L2 is 50 MB, so vectors
from 2^12 to 2^28 elements cross it) and matmul intensities on both sides of the ridge.
CPU presets shrink so the default CPU run takes about a minute on two cores.
"""

from __future__ import annotations

from kernels.spec import Shape, ShapeGroup


def _vec(exps: range | list[int]) -> list[Shape]:
    return [{"n": 1 << e} for e in exps]


def _mv(pairs: list[tuple[int, int]]) -> list[Shape]:
    return [{"M": m, "K": k} for m, k in pairs]


def _mm(triples: list[tuple[int, int, int]]) -> list[Shape]:
    return [{"M": m, "N": n, "K": k} for m, n, k in triples]


def _rows(pairs: list[tuple[int, int]]) -> list[Shape]:
    return [{"M": m, "N": n} for m, n in pairs]


def _attn(seqs: list[int], head_dims: list[int], tokens: int = 16384, hidden: int = 2048
          ) -> list[Shape]:
    """Attention at `tokens` per batch (B = tokens / S) and `hidden` = H D, causal and
    not: the FLOPs grow with S at a fixed token count, the bytes do not, so the rows
    cross the ridge as S grows (FlashAttention's benchmark setting: 16k tokens, 2048)."""
    return [{"B": max(1, tokens // s), "H": hidden // d, "S": s, "D": d, "causal": c}
            for d in head_dims for c in (0, 1) for s in seqs]


def _squares(sizes: list[int]) -> list[tuple[int, int, int]]:
    return [(s, s, s) for s in sizes]


# LLM projection GEMMs, tokens x (out, in) of Llama-3-8B (qkv 6144x4096, o 4096x4096,
# fused gate/up 28672x4096, down 4096x14336) and Llama-3-70B (qkv 10240x8192, down
# 8192x28672).
_LLM_8B = [(4096, 6144, 4096), (4096, 4096, 4096), (4096, 28672, 4096), (4096, 4096, 14336)]
_LLM_70B = [(8192, 10240, 8192), (8192, 8192, 28672)]
# Wave quantization on 132 SMs with 128x128 tiles: 12x11 = 132 tiles is exactly one wave,
# 12x12 = 144 needs a second wave for 12 tiles; 33x33 = 1089 tiles is 8.25 waves.
_WAVES = [(1536, 1408, 8192), (1536, 1536, 8192), (4224, 4224, 4224)]
# Row ops (softmax, layernorm, rmsnorm), M rows x N wide: widths 1k..16k, M chosen so the
# bf16 footprint (x + y, 4 M N bytes) runs from 1 MiB to 1 GiB across the 50 MB L2, and
# one row as wide as Llama-3's vocabulary (128256: a loss's softmax; past 16384 the
# Triton kernel loops over the row).
_ROWOPS = [(256, 1024), (4096, 1024), (65536, 1024), (2048, 2048), (32768, 2048),
           (1024, 4096), (16384, 4096), (4096, 8192), (32768, 8192), (256, 16384),
           (4096, 16384), (16384, 16384), (1024, 128256)]

# Elementwise ops and dot: n elements.
VECTOR = ShapeGroup(
    "vector",
    gpu={"quick": _vec([12, 20, 24, 26]),
         "default": _vec(range(12, 29, 2)),  # 2^12 .. 2^28
         "full": _vec(range(10, 31))},  # every power of two, 2^10 .. 2^30
    # 2^22: 48 MiB for fp32 add, past a 32 MiB LLC.  Not 2^24: torch's eager fp8 paths
    # on a CPU take ~1 s per call there (fp8 gelu), 25 samples each would triple the run.
    cpu={"quick": _vec([12, 18]),
         "default": _vec([12, 16, 20, 22]),
         "full": _vec(range(10, 27, 2))},
)

# matvec: an M x K matrix times a K vector.
MATVEC = ShapeGroup(
    "matvec",
    gpu={"quick": _mv([(4096, 4096), (8192, 8192)]),
         "default": _mv([(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192),
                         (16384, 16384), (14336, 4096), (4096, 14336), (28672, 4096),
                         (8192, 28672)]),
         "full": _mv([(s, s) for s in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
                     + [(14336, 4096), (4096, 14336), (28672, 4096), (8192, 28672),
                        (28672, 8192), (128256, 4096)])},
    cpu={"quick": _mv([(512, 512)]),
         "default": _mv([(256, 256), (1024, 1024), (2048, 2048), (4096, 1024)]),
         "full": _mv([(256, 256), (1024, 1024), (4096, 4096), (8192, 8192),
                      (14336, 4096)])},
)

# matmul: (M x K) (K x N).
MATMUL = ShapeGroup(
    "matmul",
    gpu={"quick": _mm(_squares([1024, 4096])),
         "default": _mm(_squares([256, 512, 1024, 2048, 4096, 8192]) + _LLM_8B + _WAVES),
         "full": _mm(_squares([256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384])
                     + _LLM_8B + _LLM_70B + _WAVES)},
    cpu={"quick": _mm(_squares([128, 256])),
         # Non-square (256, 512, 128), not (512, 1024, 256): fp16 GEMM on a CPU without
         # native fp16 runs at ~3 GFLOP/s, 0.25 s per call there.
         "default": _mm(_squares([64, 128, 256, 512]) + [(256, 512, 128)]),
         "full": _mm(_squares([64, 128, 256, 512, 1024, 2048]) + [(2048, 4096, 1024)])},
)

# Row ops (softmax, layernorm, rmsnorm): M rows x N wide.
ROWOP = ShapeGroup(
    "rowop",
    gpu={"quick": _rows([(4096, 1024), (16384, 4096), (4096, 16384)]),
         "default": _rows(_ROWOPS),
         # Model widths besides the powers of two (5120, 12288) and 2 GiB bf16 footprints.
         "full": _rows(_ROWOPS + [(16384, 5120), (16384, 12288), (65536, 8192),
                                  (32768, 16384), (4096, 32768)])},
    # 0.5 and 8 MiB of fp32; F.rms_norm runs as five eager ops on a CPU (68 ms a call for
    # bf16 at 256 x 16384), so wider rows are left to "full".
    cpu={"quick": _rows([(64, 1024)]),
         "default": _rows([(64, 1024), (256, 4096)]),
         "full": _rows([(64, 1024), (256, 4096), (512, 4096), (256, 16384), (4096, 4096),
                        (64, 65536)])},
)

# Attention: batch, heads, sequence length, head dim, causal (0 or 1).
ATTENTION = ShapeGroup(
    "attention",
    gpu={"quick": _attn([1024, 4096, 16384], [128]),
         "default": _attn([512, 1024, 2048, 4096, 8192, 16384], [64, 128]),
         "full": _attn([512, 1024, 2048, 4096, 8192, 16384, 32768], [64, 128])},  # + 32k keys
    # 128 tokens, H D = 128, causal and not: the backward takes tens of milliseconds a
    # call on a CPU, fp16's emulated path the slowest (docs/measurement.md).
    cpu={"quick": [{"B": 1, "H": 2, "S": 128, "D": 64, "causal": 1}],
         "default": _attn([128], [64], tokens=128, hidden=128),
         "full": _attn([128, 256, 512, 1024], [64, 128], tokens=1024, hidden=256)},
    flags=("causal",),
)

GROUPS: tuple[ShapeGroup, ...] = (VECTOR, MATVEC, MATMUL, ROWOP, ATTENTION)
