"""Shape presets per kernel family and parsing of explicit `--sizes`.

GPU presets span cache-resident to HBM-bound sizes (the H100's L2 is 50 MB, so vectors
from 2^12 to 2^28 elements cross it) and matmul intensities on both sides of the ridge.
CPU presets shrink so the default CPU run takes about a minute on two cores.
"""

from __future__ import annotations

from kernels.spec import KernelSpec, Shape

PRESETS = ("quick", "default", "full")


SIZE_NAMES = ("n", "M", "N", "K")
# Attention's shape: batch, heads, sequence length, head dim, causal (0 or 1).
ATTN_DIMS = ("B", "H", "S", "D", "causal")


class ShapeError(ValueError):
    """A malformed --sizes value (one-line message)."""


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

GPU_PRESETS: dict[str, dict[str, list[Shape]]] = {
    "quick": {
        "vector": _vec([12, 20, 24, 26]),
        "matvec": _mv([(4096, 4096), (8192, 8192)]),
        "matmul": _mm(_squares([1024, 4096])),
        "rowop": _rows([(4096, 1024), (16384, 4096), (4096, 16384)]),
        "attention": _attn([1024, 4096, 16384], [128]),
    },
    "default": {
        "vector": _vec(range(12, 29, 2)),  # 2^12 .. 2^28
        "matvec": _mv([(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192),
                       (16384, 16384), (14336, 4096), (4096, 14336), (28672, 4096),
                       (8192, 28672)]),
        "matmul": _mm(_squares([256, 512, 1024, 2048, 4096, 8192]) + _LLM_8B + _WAVES),
        "rowop": _rows(_ROWOPS),
        "attention": _attn([512, 1024, 2048, 4096, 8192, 16384], [64, 128]),
    },
    "full": {
        "vector": _vec(range(10, 31)),  # every power of two, 2^10 .. 2^30
        "matvec": _mv([(s, s) for s in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
                      + [(14336, 4096), (4096, 14336), (28672, 4096), (8192, 28672),
                         (28672, 8192), (128256, 4096)]),
        "matmul": _mm(_squares([256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384])
                      + _LLM_8B + _LLM_70B + _WAVES),
        # Model widths besides the powers of two (5120, 12288) and 2 GiB bf16 footprints.
        "rowop": _rows(_ROWOPS + [(16384, 5120), (16384, 12288), (65536, 8192),
                                  (32768, 16384), (4096, 32768)]),
        # ... and 32k keys (B = 1: 32k tokens).
        "attention": _attn([512, 1024, 2048, 4096, 8192, 16384, 32768], [64, 128]),
    },
}

CPU_PRESETS: dict[str, dict[str, list[Shape]]] = {
    "quick": {
        "vector": _vec([12, 18]),
        "matvec": _mv([(512, 512)]),
        "matmul": _mm(_squares([128, 256])),
        "rowop": _rows([(64, 1024)]),
        "attention": [{"B": 1, "H": 2, "S": 128, "D": 64, "causal": 1}],
    },
    "default": {
        # 2^22: 48 MiB for fp32 add, past a 32 MiB LLC.  Not 2^24: torch's eager fp8 paths
        # on a CPU take ~1 s per call there (fp8 gelu), 25 samples each would triple the run.
        "vector": _vec([12, 16, 20, 22]),
        "matvec": _mv([(256, 256), (1024, 1024), (2048, 2048), (4096, 1024)]),
        # Non-square (256, 512, 128), not (512, 1024, 256): fp16 GEMM on a CPU without
        # native fp16 runs at ~3 GFLOP/s, 0.25 s per call there.
        "matmul": _mm(_squares([64, 128, 256, 512]) + [(256, 512, 128)]),
        # Row ops: 0.5 and 8 MiB of fp32; F.rms_norm runs as five eager ops on a CPU
        # (68 ms a call for bf16 at 256 x 16384), so wider rows are left to "full".
        "rowop": _rows([(64, 1024), (256, 4096)]),
        # Attention: 128 tokens, H D = 128, causal and not (the backward takes 10-35 ms a
        # call on the 2-core VM beside other jobs, fp16's emulated path the slowest).
        "attention": _attn([128], [64], tokens=128, hidden=128),
    },
    "full": {
        "vector": _vec(range(10, 27, 2)),
        "matvec": _mv([(256, 256), (1024, 1024), (4096, 4096), (8192, 8192), (14336, 4096)]),
        "matmul": _mm(_squares([64, 128, 256, 512, 1024, 2048]) + [(2048, 4096, 1024)]),
        "rowop": _rows([(64, 1024), (256, 4096), (512, 4096), (256, 16384), (4096, 4096),
                        (64, 65536)]),
        "attention": _attn([128, 256, 512, 1024], [64, 128], tokens=1024, hidden=256),
    },
}


def _group(spec: KernelSpec) -> str:
    return {("n",): "vector", ("M", "K"): "matvec", ("M", "N", "K"): "matmul",
            ("M", "N"): "rowop", ("B", "H", "S", "D", "causal"): "attention"}[spec.dims]


def preset_shapes(spec: KernelSpec, preset: str, on_gpu: bool) -> list[Shape]:
    table = GPU_PRESETS if on_gpu else CPU_PRESETS
    return [dict(s) for s in table[preset][_group(spec)]]


def parse_sizes(text: str) -> list[Shape]:
    """Explicit shapes: entries separated by ';' (or spaces), each either a full shape
    ('n=1048576', 'M=4096,K=4096', 'M=4096,N=4096,K=4096', rows 'M=4096,N=4096') or one
    integer meaning that size in every dimension ('4096' -> n=4096, M=K=4096, M=N=K=4096,
    M=N=4096)."""
    entries = [e for e in text.replace(";", " ").split() if e]
    if not entries:
        raise ShapeError("--sizes is empty")
    shapes: list[Shape] = []
    for entry in entries:
        if "=" not in entry:
            try:
                v = int(entry)
            except ValueError:
                raise ShapeError(f"bad size '{entry}': expected {', '.join(PRESETS)}, "
                                 "an integer or a shape like M=4096,N=4096,K=4096") from None
            if v < 1:
                raise ShapeError(f"bad size '{entry}': must be >= 1")
            shapes.append({"*": v})
            continue
        shape: Shape = {}
        for part in entry.split(","):
            name, eq, value = part.partition("=")
            name = name.strip()
            if name == "N" and "n" in shape or name not in (*SIZE_NAMES, *ATTN_DIMS) \
                    or not eq:
                raise ShapeError(f"bad shape '{entry}': use n=..., M=...,K=..., "
                                 "M=...,N=..., M=...,N=...,K=... or B=,H=,S=,D=,causal=")
            try:
                v = int(value)
            except ValueError:
                raise ShapeError(f"bad shape '{entry}': '{value}' is not an integer") from None
            if name == "causal" and v not in (0, 1):
                raise ShapeError(f"bad shape '{entry}': causal is 0 or 1")
            if v < 1 and name != "causal":
                raise ShapeError(f"bad shape '{entry}': dimensions must be >= 1")
            if name in shape:
                raise ShapeError(f"bad shape '{entry}': {name} given twice")
            shape[name] = v
        if set(shape) not in ({"n"}, {"M", "K"}, {"M", "N"}, {"M", "N", "K"}, set(ATTN_DIMS)):
            raise ShapeError(f"bad shape '{entry}': use n=..., M=...,K=..., M=...,N=..., "
                             "M=...,N=...,K=... or B=,H=,S=,D=,causal=")
        shapes.append(shape)
    return shapes


def shapes_for(spec: KernelSpec, sizes: str, on_gpu: bool,
               explicit: list[Shape] | None = None) -> list[Shape]:
    """The shapes a kernel runs at: a preset's, or the explicit ones that fit its dims."""
    if explicit is None:
        return preset_shapes(spec, sizes, on_gpu)
    out = []
    for s in explicit:
        if "*" in s:
            if spec.dims != ATTN_DIMS:  # attention takes whole B,H,S,D,causal shapes only
                out.append({d: s["*"] for d in spec.dims})
        elif set(s) == set(spec.dims):
            out.append({d: s[d] for d in spec.dims})
    return out
