"""Shape presets per kernel family and parsing of explicit `--sizes`.

GPU presets span cache-resident to HBM-bound sizes (the H100's L2 is 50 MB, so vectors
from 2^12 to 2^28 elements cross it) and matmul intensities on both sides of the ridge.
CPU presets shrink so the default CPU run takes about a minute on two cores.
"""

from __future__ import annotations

from kernels.spec import KernelSpec, Shape

PRESETS = ("quick", "default", "full")


class ShapeError(ValueError):
    """A malformed --sizes value (one-line message)."""


def _vec(exps: range | list[int]) -> list[Shape]:
    return [{"n": 1 << e} for e in exps]


def _mv(pairs: list[tuple[int, int]]) -> list[Shape]:
    return [{"M": m, "K": k} for m, k in pairs]


def _mm(triples: list[tuple[int, int, int]]) -> list[Shape]:
    return [{"M": m, "N": n, "K": k} for m, n, k in triples]


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

GPU_PRESETS: dict[str, dict[str, list[Shape]]] = {
    "quick": {
        "vector": _vec([12, 20, 24, 26]),
        "matvec": _mv([(4096, 4096), (8192, 8192)]),
        "matmul": _mm(_squares([1024, 4096])),
    },
    "default": {
        "vector": _vec(range(12, 29, 2)),  # 2^12 .. 2^28
        "matvec": _mv([(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192),
                       (16384, 16384), (14336, 4096), (4096, 14336), (28672, 4096),
                       (8192, 28672)]),
        "matmul": _mm(_squares([256, 512, 1024, 2048, 4096, 8192]) + _LLM_8B + _WAVES),
    },
    "full": {
        "vector": _vec(range(10, 31)),  # every power of two, 2^10 .. 2^30
        "matvec": _mv([(s, s) for s in (512, 1024, 2048, 4096, 8192, 16384, 32768)]
                      + [(14336, 4096), (4096, 14336), (28672, 4096), (8192, 28672),
                         (28672, 8192), (128256, 4096)]),
        "matmul": _mm(_squares([256, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384])
                      + _LLM_8B + _LLM_70B + _WAVES),
    },
}

CPU_PRESETS: dict[str, dict[str, list[Shape]]] = {
    "quick": {
        "vector": _vec([12, 18]),
        "matvec": _mv([(512, 512)]),
        "matmul": _mm(_squares([128, 256])),
    },
    "default": {
        # 2^22: 48 MiB for fp32 add, past a 32 MiB LLC.  Not 2^24: torch's eager fp8 paths
        # on a CPU take ~1 s per call there (fp8 gelu), 25 samples each would triple the run.
        "vector": _vec([12, 16, 20, 22]),
        "matvec": _mv([(256, 256), (1024, 1024), (2048, 2048), (4096, 1024)]),
        # Non-square (256, 512, 128), not (512, 1024, 256): fp16 GEMM on a CPU without
        # native fp16 runs at ~3 GFLOP/s, 0.25 s per call there.
        "matmul": _mm(_squares([64, 128, 256, 512]) + [(256, 512, 128)]),
    },
    "full": {
        "vector": _vec(range(10, 27, 2)),
        "matvec": _mv([(256, 256), (1024, 1024), (4096, 4096), (8192, 8192), (14336, 4096)]),
        "matmul": _mm(_squares([64, 128, 256, 512, 1024, 2048]) + [(2048, 4096, 1024)]),
    },
}


def _group(spec: KernelSpec) -> str:
    return {("n",): "vector", ("M", "K"): "matvec", ("M", "N", "K"): "matmul"}[spec.dims]


def preset_shapes(spec: KernelSpec, preset: str, on_gpu: bool) -> list[Shape]:
    table = GPU_PRESETS if on_gpu else CPU_PRESETS
    return [dict(s) for s in table[preset][_group(spec)]]


def parse_sizes(text: str) -> list[Shape]:
    """Explicit shapes: entries separated by ';' (or spaces), each either a full shape
    ('n=1048576', 'M=4096,K=4096', 'M=4096,N=4096,K=4096') or one integer meaning that
    size in every dimension ('4096' -> n=4096, M=K=4096, M=N=K=4096)."""
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
            if name == "N" and "n" in shape or name not in ("n", "M", "N", "K") or not eq:
                raise ShapeError(f"bad shape '{entry}': use n=..., M=...,K=... or "
                                 "M=...,N=...,K=...")
            try:
                v = int(value)
            except ValueError:
                raise ShapeError(f"bad shape '{entry}': '{value}' is not an integer") from None
            if v < 1:
                raise ShapeError(f"bad shape '{entry}': dimensions must be >= 1")
            if name in shape:
                raise ShapeError(f"bad shape '{entry}': {name} given twice")
            shape[name] = v
        if set(shape) not in ({"n"}, {"M", "K"}, {"M", "N", "K"}):
            raise ShapeError(f"bad shape '{entry}': use n=..., M=...,K=... or M=...,N=...,K=...")
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
            out.append({d: s["*"] for d in spec.dims})
        elif set(s) == set(spec.dims):
            out.append({d: s[d] for d in spec.dims})
    return out
