"""`python -m roofline plan`: how big a model, how many tokens, how many days, how much
memory, with the efficiency measured on the device rather than assumed (DESIGN.md 11).

The arithmetic (Kaplan et al. 2020, Hoffmann et al. 2022, Stanford CS336 lecture 2):

- parameters of a decoder-only Transformer: per layer attention q, k, v, o (4 d^2 with as
  many key/value heads as query heads) and an MLP of 2 d d_ff (3 d d_ff when gated, as in
  Llama's SwiGLU), plus embeddings, norms and biases; 12 d^2 L is the classic shorthand
  (4 d^2 + 2 d 4d per layer, embeddings left out);
- training FLOPs = 6 N D: every parameter is one multiply-add (2 FLOPs) per token in the
  forward pass and two in the backward pass (gradients of the input and of the weight);
  the attention scores (Q K^T and the weighted sum of V, 4 S d per token and layer going
  forward) are not parameters, so 6 N D leaves them out: they are shown beside it;
- days = FLOPs / (G x peak x MFU) / 86400, MFU assumed (--mfu) or measured: the model's
  own GEMMs timed on the device (--measure) or read from a saved run (--from-run);
- compute-optimal (Chinchilla): D = 20 N, so a budget C = 6 N D = 120 N^2 trains at most
  N = sqrt(C / 120) parameters on 20 N tokens;
- static memory = N x bytes per parameter (weights, gradients, optimizer state; the
  activations come on top and depend on batch size, recomputation and parallelism).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from roofline.devices import DEVICES, ROOF_CLASS, DeviceError

SECONDS_PER_DAY = 86400.0
CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022: compute-optimal D ~ 20 N
DEFAULT_VOCAB = 50257  # GPT-2's BPE vocabulary, the default for shape-only models
DEFAULT_SEQ_LEN = 2048
DEFAULT_MFU = 0.5  # the customary assumption this tool exists to replace
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8e5": 1}

# Memory per GPU in GB (1e9 bytes) as sold, keyed like roofline.devices.DEVICES.  The
# worked examples use these nominal sizes (8 x 80 GB at 12 B/param ~ 53B parameters);
# what an allocator can actually hand out is a few percent less.
GPU_MEMORY_GB: dict[str, float] = {
    "h100": 80.0,
    "h100-pcie": 80.0,
    "h100-nvl": 94.0,
    "h200": 141.0,
    "h200-nvl": 141.0,
    "a100": 80.0,
    "l40s": 48.0,
    "l4": 24.0,
}

# Bytes per parameter of the static training state, itemized per precision policy.
MEMORY_POLICIES: dict[str, dict[str, int]] = {
    # Everything in fp32: weights, gradients, AdamW's first and second moments.
    "fp32-adamw": {"weights fp32": 4, "gradients fp32": 4, "AdamW m fp32": 4,
                   "AdamW v fp32": 4},
    # bf16 weights and gradients, AdamW moments kept in fp32 (no master copy).
    "bf16-mixed": {"weights bf16": 2, "gradients bf16": 2, "AdamW m fp32": 4,
                   "AdamW v fp32": 4},
    # The usual mixed-precision recipe: bf16 weights and gradients for the matmuls, an
    # fp32 master copy that the optimizer updates, fp32 moments.
    "bf16-master": {"weights bf16": 2, "gradients bf16": 2, "master weights fp32": 4,
                    "AdamW m fp32": 4, "AdamW v fp32": 4},
}
DEFAULT_POLICY = "bf16-master"


class PlanError(ValueError):
    """Bad plan input (one-line message, exit 2)."""


# ---- the model ----------------------------------------------------------------------------

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


# ---- arithmetic -----------------------------------------------------------------------------

def train_flops(params: float, tokens: float) -> dict[str, float]:
    """6 N D, itemized: forward 2 N D, backward 4 N D (input and weight gradients)."""
    return {"forward": 2 * params * tokens, "backward": 4 * params * tokens,
            "total": 6 * params * tokens}


def attention_score_flops(shape: ModelShape, tokens: float) -> float:
    """Training FLOPs of the attention scores, which 6 N D leaves out.

    Per token and layer going forward: Q K^T is 2 S d_attn and the weighted sum of V
    another 2 S d_attn (d_attn = heads x head_dim = d_model), the full S x S square as in
    Chinchilla's appendix F; backward is twice forward.  A causal kernel that skips the
    masked half (FlashAttention) does about half of this."""
    d_attn = shape.heads * shape.head_dim
    return 3 * 4 * shape.n_layers * shape.seq_len * d_attn * tokens


def days_for(flops: float, gpus: int, peak_tflops: float, mfu: float) -> float:
    """days = FLOPs / (G x peak x MFU)."""
    return flops / (gpus * peak_tflops * 1e12 * mfu) / SECONDS_PER_DAY


def budget_flops(gpus: int, peak_tflops: float, mfu: float, days: float) -> float:
    return gpus * peak_tflops * 1e12 * mfu * days * SECONDS_PER_DAY


def compute_optimal(flops: float) -> tuple[float, float]:
    """Largest (N, D) with D = 20 N that `flops` trains: 6 N (20 N) = C."""
    n = math.sqrt(flops / (6 * CHINCHILLA_TOKENS_PER_PARAM))
    return n, CHINCHILLA_TOKENS_PER_PARAM * n


def max_params_fit(gpus: int, gpu_bytes: float, bytes_per_param: float) -> float:
    """Most parameters whose static training state fits in the GPUs' memory."""
    return gpus * gpu_bytes / bytes_per_param


def matrix_bytes(rows: int, cols: int, dtype: str) -> int:
    """A [49152, 12288] fp32 matrix (GPT-3's MLP) is 2.4 GB."""
    return rows * cols * DTYPE_BYTES[dtype]


@dataclass
class Gemm:
    """One GEMM of a training step: C[M, N] = A[M, K] B[K, N], run `count` times."""

    name: str  # the weight, e.g. attn.qkv
    phase: str  # forward, bwd-input (dX = dY W^T), bwd-weight (dW = X^T dY)
    M: int
    N: int
    K: int
    count: int
    tflops: float | None = None
    ms: float | None = None
    mfu: float | None = None
    share: float | None = None  # of the step's GEMM time
    measured_shape: str | None = None  # the run's row used (--from-run)
    note: str = ""

    @property
    def shape(self) -> str:
        return f"M={self.M},N={self.N},K={self.K}"

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K  # DESIGN.md section 4, as kernels/matmul.py

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "shape": self.shape, "flops": self.flops,
                "flops_per_step": self.flops * self.count}


def step_gemms(shape: ModelShape, micro_batch: int) -> list[Gemm]:
    """The GEMMs of one forward and backward pass over micro_batch sequences on one GPU.

    For a weight W (K_in x N_out) and T = micro_batch x seq_len tokens: forward
    Y = X W is T x N_out x K_in; the input gradient dX = dY W^T is T x K_in x N_out; the
    weight gradient dW = X^T dY is K_in x N_out x T.  Each is 2 T K_in N_out FLOPs, so the
    three make the 6 per parameter and token of 6 N D."""
    t = micro_batch * shape.seq_len
    out = []
    for name, k_in, n_out, count in shape.weight_matrices():
        out += [Gemm(name, "forward", t, n_out, k_in, count),
                Gemm(name, "bwd-input", t, k_in, n_out, count),
                Gemm(name, "bwd-weight", k_in, n_out, t, count)]
    return out


def summarize_step(gemms: list[Gemm], peak_tflops: float) -> dict[str, Any]:
    """Step time and MFU the matmuls alone allow: sum of count x time, and the step's
    GEMM FLOPs over that time and the peak (attention scores, norms, activations and
    communication come on top, so a real step is slower)."""
    flops = sum(g.flops * g.count for g in gemms)
    timed = [g for g in gemms if g.ms is not None]
    out: dict[str, Any] = {"tokens": gemms[0].M if gemms else None, "gemm_flops": flops,
                           "ms": None, "tflops": None, "mfu": None,
                           "timed": len(timed), "total": len(gemms)}
    if not gemms or len(timed) != len(gemms):
        return out
    ms = sum(g.ms * g.count for g in gemms)  # type: ignore[operator]
    for g in gemms:
        g.share = g.ms * g.count / ms  # type: ignore[operator]
    tflops = flops / (ms * 1e-3) / 1e12
    out.update(ms=ms, tflops=tflops, mfu=tflops / peak_tflops)
    return out


# ---- parsing ------------------------------------------------------------------------------

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """'70e9', '70B', '15T', '124M' -> a positive number."""
    s = text.strip().replace("_", "").replace(",", "")
    mult = 1.0
    if s and s[-1].lower() in _SUFFIX:
        mult, s = _SUFFIX[s[-1].lower()], s[:-1]
    try:
        v = float(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number (e.g. 70e9 or 70B)") \
            from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be positive")
    return v


def _positive_int(text: str) -> int:
    v = parse_count(text)
    if v != int(v):
        raise argparse.ArgumentTypeError(f"'{text}' must be a whole number")
    return int(v)


def _positive_float(text: str) -> float:
    return parse_count(text)


def _mfu(text: str) -> float:
    v = parse_count(text)
    if v > 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a fraction in (0, 1] (0.5 = 50%)")
    return v


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints a usage block and exits 2; the contract is one line.
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _ArgError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m roofline plan",
                description="How big a model, on how many tokens, in how many days, in how "
                            "much memory; MFU assumed or measured (DESIGN.md section 11).")
    m = p.add_argument_group("model (--params, or a shape, or a preset; shape flags "
                             "override a preset's)")
    m.add_argument("--preset", help=f"published shape: {', '.join(PRESETS)}")
    m.add_argument("--params", type=_positive_float, metavar="N",
                   help="parameter count, e.g. 70e9 or 70B (no shape: no GEMMs)")
    m.add_argument("--d-model", type=_positive_int)
    m.add_argument("--layers", type=_positive_int)
    m.add_argument("--d-ff", type=_positive_int, help="MLP width (default 4 d_model)")
    m.add_argument("--vocab", type=_positive_int, help=f"default {DEFAULT_VOCAB}")
    m.add_argument("--seq-len", type=_positive_int, help=f"default {DEFAULT_SEQ_LEN}")
    m.add_argument("--heads", type=_positive_int, help="default d_model / 64")
    m.add_argument("--kv-heads", type=_positive_int,
                   help="key/value heads (grouped-query attention; default = heads)")
    m.add_argument("--gated", action=argparse.BooleanOptionalAction, default=None,
                   help="SwiGLU MLP with 3 d x d_ff matrices (default: not gated)")
    tie = m.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None,
                     help="LM head shares the token embedding")
    tie.add_argument("--untied", dest="tied", action="store_false",
                     help="separate LM head (default for shape-only models)")
    m.add_argument("--micro-batch", type=_positive_int, default=1,
                   help="sequences per GPU per step: GEMM M = micro-batch x seq-len "
                        "(default 1)")
    d = p.add_argument_group("data")
    dd = d.add_mutually_exclusive_group()
    dd.add_argument("--tokens", type=_positive_float, metavar="D", help="e.g. 15e12 or 15T")
    dd.add_argument("--chinchilla", action="store_true", help="D = 20 N")
    h = p.add_argument_group("hardware")
    h.add_argument("--device", help="device key (roofline.devices): default h100, or the "
                                    "device present with --measure, or the run's with "
                                    "--from-run")
    h.add_argument("--gpus", type=_positive_int, default=1, metavar="G")
    h.add_argument("--days", type=_positive_float, metavar="T",
                   help="time budget: the largest compute-optimal model it trains")
    h.add_argument("--gpu-memory-gb", type=_positive_float,
                   help="memory per device in GB (default: table in roofline/plan.py)")
    e = p.add_argument_group("efficiency (one of)")
    ee = e.add_mutually_exclusive_group()
    ee.add_argument("--mfu", type=_mfu, help=f"assumed MFU (default {DEFAULT_MFU})")
    ee.add_argument("--from-run", metavar="RUN",
                    help="MFU of a saved run's matmul rows at or near the model's GEMMs")
    ee.add_argument("--measure", action="store_true",
                    help="time the model's GEMMs now on the device present")
    e.add_argument("--dtype", default="bf16", choices=sorted(ROOF_CLASS),
                   help="GEMM dtype (peak and measurements; default bf16)")
    e.add_argument("--provider", default="torch", choices=("torch", "triton"),
                   help="GEMM implementation measured (default torch)")
    e.add_argument("--rep-ms", type=_positive_float,
                   help="timing budget per GEMM in ms (default: the suite's TimingConfig)")
    mem = p.add_argument_group("memory")
    mm = mem.add_mutually_exclusive_group()
    mm.add_argument("--policy", choices=tuple(MEMORY_POLICIES), default=DEFAULT_POLICY,
                    help=f"precision policy (default {DEFAULT_POLICY})")
    mm.add_argument("--bytes-per-param", type=_positive_float, metavar="B")
    o = p.add_argument_group("output")
    o.add_argument("--out", metavar="DIR",
                   help="folder for plan.md, plan.json, plan.png (default "
                        "results/plans/<timestamp>/; never overwritten)")
    o.add_argument("--no-save", action="store_true", help="write no files")
    o.add_argument("--json", action="store_true", help="print the plan as JSON on stdout")
    return p


_SHAPE_FLAGS = ("d_model", "layers", "d_ff", "vocab", "seq_len", "heads", "kv_heads",
                "gated", "tied")


def model_from_args(args: argparse.Namespace) -> ModelShape | None:
    given = [f for f in _SHAPE_FLAGS if getattr(args, f) is not None]
    if args.params is not None and (given or args.preset):
        raise PlanError("give --params or a shape (--preset, --d-model/--layers), not both")
    if args.preset:
        if args.preset not in PRESETS:
            raise PlanError(f"unknown preset '{args.preset}' (choose from "
                            f"{', '.join(PRESETS)})")
        base = PRESETS[args.preset]
    elif given:
        if args.d_model is None or args.layers is None:
            raise PlanError("a model shape needs --d-model and --layers")
        d = args.d_model
        heads = args.heads or (d // 64 if d % 64 == 0 else 1)
        base = ModelShape("custom", d, args.layers, 4 * d, DEFAULT_VOCAB, DEFAULT_SEQ_LEN,
                          heads, heads, tied=False)
    else:
        return None
    over = {"d_model": args.d_model, "n_layers": args.layers, "d_ff": args.d_ff,
            "vocab": args.vocab, "seq_len": args.seq_len, "heads": args.heads,
            "kv_heads": args.kv_heads, "gated": args.gated, "tied": args.tied}
    over = {k: v for k, v in over.items() if v is not None}
    if "d_model" in over and "d_ff" not in over and not args.preset:
        over["d_ff"] = 4 * over["d_model"]
    if "heads" in over and "kv_heads" not in over:
        over["kv_heads"] = over["heads"]
    shape = replace(base, **over)
    if args.preset and over:
        shape = replace(shape, name=f"{args.preset} (modified)")
    if shape.d_model % shape.heads:
        raise PlanError(f"--heads {shape.heads} does not divide d_model {shape.d_model}")
    if shape.heads % shape.kv_heads:
        raise PlanError(f"--kv-heads {shape.kv_heads} does not divide heads {shape.heads}")
    return shape


# ---- device peak and memory -----------------------------------------------------------------

def host_memory_bytes() -> float | None:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def device_memory_bytes(key: str, override_gb: float | None = None) -> tuple[float | None, str]:
    """(bytes per device, where the number comes from)."""
    if override_gb is not None:
        return override_gb * 1e9, "--gpu-memory-gb"
    if key in GPU_MEMORY_GB:
        return GPU_MEMORY_GB[key] * 1e9, "datasheet (roofline/plan.py GPU_MEMORY_GB)"
    if key == "cpu":
        return host_memory_bytes(), "host RAM"
    if key == "gpu":
        try:
            import torch

            if torch.cuda.is_available():
                return float(torch.cuda.get_device_properties(0).total_memory), "detected"
        except Exception:
            pass
    return None, "unknown (pass --gpu-memory-gb)"


def _ceilings_for(key: str, log: Any):
    """Ceilings of device `key` with the present device behind them (measured when the
    device has no datasheet, e.g. the CPU), and the Present and DeviceModel."""
    from roofline.ceilings import get_ceilings
    from roofline.devices import detect, host_cpu, resolve

    present = host_cpu() if key == "cpu" else detect()
    model, warnings = resolve(key, present)
    for w in warnings:
        log(f"warning: {w}")
    needs_measure = not model.peaks_tflops
    ceilings = get_ceilings(model, present, Path("results") / ".ceilings",
                            measure_ceilings=needs_measure, log=log)
    return model, present, ceilings


def peak_of(key: str, dtype: str, log: Any) -> tuple[float, str]:
    """(dense peak TFLOP/s of `dtype` on device `key`, source)."""
    model = DEVICES[key]
    rc = ROOF_CLASS[dtype]
    if model.peaks_tflops:
        peak = model.peak(dtype)
        if peak is None:
            raise PlanError(f"{model.name} has no {dtype} units (no {rc} peak in the table)")
        return peak, "datasheet"
    _, _, ceilings = _ceilings_for(key, log)
    peak = ceilings.peak_tflops(rc)
    if peak is None:
        raise PlanError(f"no {rc} ceiling could be measured on {model.name}")
    return peak, "measured (no datasheet)"


# ---- efficiency: measured GEMMs ---------------------------------------------------------------

def measure_gemms(gemms: list[Gemm], device: str, dtype: str, provider: str,
                  rep_ms: float | None, log: Any) -> dict[str, Any]:
    """Time the step's GEMM shapes on the device present through the suite's sweep
    (benches.runner), fill each Gemm's ms/tflops/mfu, and return what was used."""
    # The device first: a GPU asked for on a machine without one fails before any import.
    model, present, ceilings = _ceilings_for(device, log)
    from benches.runner import RunConfig, build_cases, iterate
    from benches.timing import TimingConfig
    from kernels.spec import Target, interpreter_enabled

    rc = ROOF_CLASS[dtype]
    peak = ceilings.peak_tflops(rc)
    if peak is None:
        raise PlanError(f"no {rc} peak for {model.name}")
    target = Target(present.kind, present.capability, interpreter_enabled(), present.name)
    timing = TimingConfig()
    if rep_ms is not None:
        # A smaller budget for quick looks (and tests); only the knobs this TimingConfig
        # has are touched, since benches/timing.py evolves on its own.
        want = {"rep_ms": rep_ms, "warmup_ms": min(getattr(timing, "warmup_ms", rep_ms), rep_ms),
                "min_samples": min(getattr(timing, "min_samples", 5), 5),
                "cpu_min_run_time_s": rep_ms / 1e3}
        have = {f.name for f in fields(timing)}
        timing = replace(timing, **{k: v for k, v in want.items() if k in have})
    shapes: dict[str, dict[str, int]] = {}
    for g in gemms:
        shapes.setdefault(g.shape, {"M": g.M, "N": g.N, "K": g.K})
    cfg = RunConfig(kernels=["matmul"], dtypes=[dtype], providers=[provider],
                    sizes="explicit", explicit_shapes=list(shapes.values()), seed=0,
                    check_only=False, model=model, present=present, target=target,
                    ceilings=ceilings, timing=timing)
    cases = build_cases(cfg)
    log(f"timing {len(cases)} GEMM shapes ({provider} {dtype}) on {present.name}")
    rows: dict[str, dict[str, Any]] = {}
    for case, row in iterate(cases, cfg):
        rows[case.shape_str] = row
    problems = []
    for g in gemms:
        row = rows.get(g.shape)
        if row is None or row.get("status") != "ok" or not row.get("tflops"):
            why = (row or {}).get("reason") or "not run"
            problems.append(f"{g.shape}: {why}")
            continue
        g.ms, g.tflops = float(row["ms_median"]), float(row["tflops"])
        g.mfu = g.tflops / peak
    if problems:
        raise PlanError(f"{len(problems)} GEMM(s) could not be timed, e.g. {problems[0]}")
    return {"device_key": model.key, "device_name": present.name, "peak_tflops": peak,
            "peak_source": "datasheet" if model.peaks_tflops else "measured (no datasheet)",
            "ceilings": ceilings.to_json(), "rows": list(rows.values())}


def _log_distance(a: dict[str, int], b: dict[str, int]) -> tuple[float, float]:
    """(Euclidean distance in log space, worst per-dimension ratio)."""
    logs = [math.log(a[k] / b[k]) for k in ("M", "N", "K")]
    return math.sqrt(sum(x * x for x in logs)), math.exp(max(abs(x) for x in logs))


def gemms_from_run(gemms: list[Gemm], run: str, dtype: str, provider: str) -> dict[str, Any]:
    """Give each step GEMM the TFLOP/s of the run's matmul row nearest its shape (in log
    space over M, N, K); MFU is that row's TFLOP/s over the peak the run held it to."""
    import pandas as pd

    from roofline.schema import load_run, parse_shape

    meta, df = load_run(run)
    if df.empty or "kernel" not in df.columns:
        raise PlanError(f"{run} has no rows")
    mm = df[(df["kernel"] == "matmul") & (df["status"] == "ok")].copy()
    mm["tflops"] = pd.to_numeric(mm["tflops"], errors="coerce")
    mm["peak_tflops"] = pd.to_numeric(mm["peak_tflops"], errors="coerce")
    mm = mm[(mm["tflops"] > 0) & (mm["peak_tflops"] > 0)]
    if mm.empty:
        raise PlanError(f"{run} has no timed (ok) matmul rows")
    sel = mm[mm["dtype"] == dtype]
    if sel.empty:
        have = ", ".join(sorted(mm["dtype"].unique()))
        raise PlanError(f"{run} has no ok {dtype} matmul rows (it has {have}; use --dtype)")
    sel2 = sel[sel["provider"] == provider]
    if sel2.empty:
        have = ", ".join(sorted(sel["provider"].unique()))
        raise PlanError(f"{run} has no ok {provider} {dtype} matmul rows (it has {have}; "
                        "use --provider)")
    cands = [(parse_shape(s), float(t), float(pk))
             for s, t, pk in zip(sel2["shape"], sel2["tflops"], sel2["peak_tflops"],
                                 strict=True)]
    worst = 1.0
    for g in gemms:
        want = {"M": g.M, "N": g.N, "K": g.K}
        shape, tflops, peak = min(cands, key=lambda c: _log_distance(want, c[0])[0])
        ratio = _log_distance(want, shape)[1]
        worst = max(worst, ratio)
        g.tflops, g.mfu = tflops, tflops / peak
        g.ms = g.flops / (tflops * 1e12) * 1e3
        g.measured_shape = ",".join(f"{k}={shape[k]}" for k in ("M", "N", "K"))
        g.note = "exact" if ratio == 1.0 else f"nearest, up to {ratio:.1f}x off"
    peaks = sorted(set(float(p) for p in sel2["peak_tflops"]))
    return {"device_key": meta.get("device_key"), "device_name": meta.get("device_name"),
            "peak_tflops": peaks[-1], "ceilings": meta.get("ceilings"),
            "worst_shape_ratio": worst, "run_id": meta.get("run_id")}


# ---- the plan ---------------------------------------------------------------------------------

def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def build_plan(args: argparse.Namespace, log: Any = _stderr) -> dict[str, Any]:
    """Everything the plan says, as a JSON-able dict (the --json document)."""
    shape = model_from_args(args)
    params: float | None = float(shape.params) if shape else args.params
    gemms = step_gemms(shape, args.micro_batch) if shape else []
    measured: dict[str, Any] | None = None
    warnings: list[str] = []

    if args.device is not None and args.device not in DEVICES:
        raise PlanError(f"unknown device '{args.device}' (choose from {', '.join(DEVICES)})")
    if (args.measure or args.from_run) and shape is None:
        raise PlanError("--measure and --from-run need the model's shape (--preset, or "
                        "--d-model and --layers), not just --params")

    # Efficiency and the peak it is a fraction of.
    if args.measure:
        device = args.device or "auto"
        if device == "auto":
            from roofline.devices import detect

            device = detect().key
        measured = measure_gemms(gemms, device, args.dtype, args.provider, args.rep_ms, log)
        device = measured["device_key"]
        peak, peak_source = measured["peak_tflops"], measured["peak_source"]
        mfu_source, mfu_from = "measured", f"--measure: timed now on {measured['device_name']}"
    elif args.from_run:
        measured = gemms_from_run(gemms, args.from_run, args.dtype, args.provider)
        run_key = measured["device_key"]
        device = args.device or run_key
        if device not in DEVICES:
            raise PlanError(f"{args.from_run} was measured on '{run_key}', which is not in "
                            "the device table (pass --device)")
        if device == run_key:
            peak = measured["peak_tflops"]
            peak_source = ("datasheet" if DEVICES[device].peaks_tflops
                           else f"measured (no datasheet), run {args.from_run}")
        else:
            peak, peak_source = peak_of(device, args.dtype, log)
            warnings.append(f"MFU measured on '{run_key}' applied to '{device}'")
        mfu_source, mfu_from = "measured", f"--from-run {args.from_run}"
        if measured["worst_shape_ratio"] > 2:
            sizes = ";".join(sorted({g.shape for g in gemms}))
            warnings.append(
                f"the run's nearest matmul shapes are up to {measured['worst_shape_ratio']:.1f}x "
                f"off the model's; time the exact ones with --measure, or "
                f"`python run_bench.py --kernels matmul --dtypes {args.dtype} "
                f"--sizes '{sizes}'`")
    else:
        device = args.device or "h100"
        peak, peak_source = peak_of(device, args.dtype, log)
        mfu_source, mfu_from = "assumed", "--mfu" if args.mfu else "default assumption"

    step = summarize_step(gemms, peak)
    mfu = step["mfu"] if measured is not None else (args.mfu or DEFAULT_MFU)
    if measured is not None and not mfu:
        raise PlanError("no measured MFU could be derived")
    if mfu > 1:
        warnings.append(f"MFU {mfu:.0%} is above 100%: the {peak:.4g} TFLOP/s peak is a "
                        "measurement (the best of a few square GEMMs; no datasheet), not a "
                        "hardware limit")

    # Data.
    tokens: float | None = args.tokens
    tokens_source = "--tokens" if tokens else None
    if args.chinchilla:
        if params is None:
            raise PlanError("--chinchilla needs a model (--params, --preset or a shape)")
        tokens, tokens_source = CHINCHILLA_TOKENS_PER_PARAM * params, "chinchilla (D = 20 N)"

    # Budget.
    budget = None
    if args.days:
        c = budget_flops(args.gpus, peak, mfu, args.days)
        n_opt, d_opt = compute_optimal(c)
        budget = {"days": args.days, "flops": c, "max_params_compute_optimal": n_opt,
                  "tokens_compute_optimal": d_opt}
        if params is not None and tokens is None:
            tokens, tokens_source = c / (6 * params), "the --days budget (6 N D = budget)"
        if params is not None:
            budget["tokens_for_this_model"] = c / (6 * params)

    flops = train_flops(params, tokens) if params and tokens else None
    attn = attention_score_flops(shape, tokens) if shape and tokens else None
    days = days_for(flops["total"], args.gpus, peak, mfu) if flops else None
    days_attn = days_for(flops["total"] + attn, args.gpus, peak, mfu) \
        if flops and attn is not None else None

    # Memory.
    if args.bytes_per_param is not None:
        policy, items = "explicit", {"--bytes-per-param": args.bytes_per_param}
    else:
        policy, items = args.policy, dict(MEMORY_POLICIES[args.policy])
    bpp = float(sum(items.values()))
    gpu_bytes, mem_source = device_memory_bytes(device, args.gpu_memory_gb)
    static = params * bpp if params else None
    total_mem = args.gpus * gpu_bytes if gpu_bytes else None
    fit_max = max_params_fit(args.gpus, gpu_bytes, bpp) if gpu_bytes else None
    largest = None
    if shape:
        # Per-layer matrices unfused (q, o: d x d; MLP: d_ff x d): GPT-3's MLP matrix,
        # [49152, 12288], is 2.4 GB in fp32.
        d, f = shape.d_model, shape.d_ff
        name, rows_, cols = ("mlp", f, d) if f >= d else ("attention", d, d)
        largest = {"name": name, "shape": [rows_, cols],
                   "bytes_fp32": matrix_bytes(rows_, cols, "fp32")}

    if budget is not None and total_mem:
        budget["static_bytes_compute_optimal"] = budget["max_params_compute_optimal"] * bpp
        budget["fits_compute_optimal"] = budget["static_bytes_compute_optimal"] <= total_mem

    model_doc: dict[str, Any] | None = None
    if shape:
        model_doc = {**asdict(shape), "description": shape.describe(),
                     "params_itemized": shape.param_items(), "params": shape.params,
                     "params_12d2l": shape.approx_12d2l, "matmul_params": shape.matmul_params,
                     "largest_matrix": largest}
    elif params:
        model_doc = {"name": "--params", "params": params}

    plan: dict[str, Any] = {
        "model": model_doc,
        "params": params,
        "tokens": tokens,
        "tokens_source": tokens_source,
        "train_flops": flops["total"] if flops else None,
        "flops_forward": flops["forward"] if flops else None,
        "flops_backward": flops["backward"] if flops else None,
        "attention_flops": attn,
        "device": device,
        "device_name": DEVICES[device].name if device in DEVICES else device,
        "dtype": args.dtype,
        "gpus": args.gpus,
        "peak_tflops": peak,
        "peak_source": peak_source,
        "mfu": mfu,
        "mfu_source": mfu_source,
        "mfu_from": mfu_from,
        "days": days,
        "days_with_attention": days_attn,
        "budget": budget,
        "policy": policy,
        "bytes_per_param_itemized": items,
        "bytes_per_param": bpp,
        "static_bytes": static,
        "gpu_memory_bytes": gpu_bytes,
        "gpu_memory_source": mem_source,
        "total_memory_bytes": total_mem,
        "fits": (static <= total_mem) if static is not None and total_mem else None,
        "max_params_fit": fit_max,
        "micro_batch": args.micro_batch,
        "step": step,
        "gemms": [g.as_dict() for g in gemms],
        "warnings": warnings,
    }
    if measured is not None:
        plan["measurement"] = {k: v for k, v in measured.items() if k != "rows"}
    return plan


# ---- rendering ----------------------------------------------------------------------------------

def si(x: float | None, unit: str = "") -> str:
    """124.4M, 70.6B, 15.0T, 6.30e+24 for FLOPs-sized numbers."""
    if x is None:
        return "-"
    for scale, s in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale and abs(x) < 1e15:
            return f"{x / scale:.3g}{s}{unit}"
    if abs(x) >= 1e15:
        return f"{x:.3g}{unit}"
    return f"{x:.3g}{unit}"


def gb(x: float | None) -> str:
    if x is None:
        return "-"
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB")):
        if x >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x / 1e3:.3g} kB"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def sections(plan: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table: shared by the terminal and plan.md."""
    out = []
    m = plan["model"]
    if m and "params_itemized" in m:
        rows = [[k, f"{v:,}", si(v)] for k, v in m["params_itemized"].items() if v]
        rows.append(["total (exact)", f"{m['params']:,}", si(m["params"])])
        rows.append(["12 d^2 L (approximation)", f"{m['params_12d2l']:,}",
                     f"{si(m['params_12d2l'])} ({m['params_12d2l'] / m['params']:.0%} of "
                     "exact)"])
        gated = " (gated MLP: 3 d d_ff per layer)" if m["gated"] else " (2 d d_ff per layer)"
        out.append((f"Model {m['name']}: {m['description']}{gated}",
                    ["parameters", "count", ""], rows))
    elif m:
        out.append(("Model", ["parameters", "count", ""],
                    [["given (--params)", f"{m['params']:,.0f}", si(m["params"])]]))
    rows = []
    if plan["train_flops"]:
        rows += [["tokens D", si(plan["tokens"]), plan["tokens_source"]],
                 ["forward 2 N D", f"{plan['flops_forward']:.3e}", "FLOPs"],
                 ["backward 4 N D", f"{plan['flops_backward']:.3e}", "FLOPs"],
                 ["training 6 N D", f"{plan['train_flops']:.3e}", "FLOPs"]]
        if plan["attention_flops"] is not None:
            rows.append(["attention scores (not in 6 N D)", f"{plan['attention_flops']:.3e}",
                         f"+{plan['attention_flops'] / plan['train_flops']:.1%} (12 L S d D)"])
    rows += [["device", f"{plan['gpus']} x {plan['device_name']}", plan["device"]],
             [f"peak {plan['dtype']} per device", f"{plan['peak_tflops']:.4g} TFLOP/s",
              plan["peak_source"]],
             ["MFU", _pct(plan["mfu"]), f"{plan['mfu_source']} ({plan['mfu_from']})"]]
    if plan["days"] is not None:
        rows.append(["days = 6ND / (G x peak x MFU)", f"{plan['days']:.1f}",
                     f"{plan['days_with_attention']:.1f} with attention scores"
                     if plan["days_with_attention"] is not None else ""])
    b = plan["budget"]
    if b:
        rows += [["budget", f"{b['days']:g} days", f"{b['flops']:.3e} FLOPs"],
                 ["largest compute-optimal model", si(b["max_params_compute_optimal"]),
                  f"on {si(b['tokens_compute_optimal'])} tokens (D = 20 N)"]]
        if "fits_compute_optimal" in b:
            fits = "fits" if b["fits_compute_optimal"] else "does NOT fit"
            rows.append(["its static memory", gb(b["static_bytes_compute_optimal"]),
                         f"{fits} in {plan['gpus']} x {gb(plan['gpu_memory_bytes'])} at "
                         f"{plan['bytes_per_param']:g} B/param"])
        if "tokens_for_this_model" in b:
            rows.append(["tokens this model gets in the budget",
                         si(b["tokens_for_this_model"]), ""])
    out.append(("Compute and time", ["", "value", "note"], rows))
    rows = [[k, f"{v:g}", ""] for k, v in plan["bytes_per_param_itemized"].items()]
    rows.append(["bytes per parameter", f"{plan['bytes_per_param']:g}", plan["policy"]])
    if plan["static_bytes"] is not None:
        fits = {True: "fits", False: "does NOT fit", None: "?"}[plan["fits"]]
        rows.append(["static bytes (N x B)", gb(plan["static_bytes"]),
                     f"{fits} in {plan['gpus']} x {gb(plan['gpu_memory_bytes'])}"])
    rows.append(["memory", f"{plan['gpus']} x {gb(plan['gpu_memory_bytes'])}",
                 plan["gpu_memory_source"]])
    rows.append(["most parameters that fit", si(plan["max_params_fit"]),
                 "static state only: activations come on top"])
    lm = (m or {}).get("largest_matrix")
    if lm:
        rows.append([f"largest matrix {lm['name']} {lm['shape']}", gb(lm["bytes_fp32"]),
                     "in fp32"])
    out.append((f"Memory ({plan['policy']})", ["", "value", "note"], rows))
    if plan["gemms"]:
        st = plan["step"]
        rows = []
        for g in plan["gemms"]:
            meas = g["measured_shape"] if g["measured_shape"] and g["note"] != "exact" else ""
            rows.append([g["name"], g["phase"], g["shape"], str(g["count"]),
                         f"{g['flops']:.3g}", "-" if g["tflops"] is None else f"{g['tflops']:.4g}",
                         _pct(g["mfu"]), "-" if g["ms"] is None else f"{g['ms']:.4g}",
                         _pct(g["share"]), meas])
        if st["ms"] is not None:
            rows.append(["step (matmuls only)", "", f"{st['tokens']} tokens", "",
                         f"{st['gemm_flops']:.3g}", f"{st['tflops']:.4g}", _pct(st["mfu"]),
                         f"{st['ms']:.4g}", "100%", ""])
        out.append((f"GEMMs of one step ({plan['micro_batch']} x seq per GPU, {plan['dtype']})",
                    ["weight", "pass", "shape", "x", "FLOPs", "TFLOP/s", "MFU", "ms", "share",
                     "run shape"], rows))
    return out


def render_markdown(plan: dict[str, Any], png: str | None) -> str:
    lines = ["# Training plan", ""]
    for title, header, rows in sections(plan):
        lines += [f"## {title}", "", "| " + " | ".join(h or " " for h in header) + " |",
                  "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
        lines.append("")
    for w in plan["warnings"]:
        lines.append(f"> warning: {w}")
    if png:
        lines += ["", f"![step GEMMs on the roofline]({png})", ""]
    lines += ["Days use 6 N D; the attention scores are shown apart. MFU is "
              f"{plan['mfu_source']} ({plan['mfu_from']}). Memory counts parameters, "
              "gradients and optimizer state only.", ""]
    return "\n".join(lines)


def _looks_numeric(cell: str) -> bool:
    return cell[:1].isdigit() or cell[:1] in "-+."


def print_tables(plan: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
    for title, header, rows in sections(plan):
        t = Table(title=title, title_justify="left")
        for i, h in enumerate(header):
            numeric = i > 0 and all(_looks_numeric(r[i]) for r in rows if r[i])
            t.add_column(h, justify="right" if numeric else "left")
        for r in rows:
            t.add_row(*r)
        console.print(t)
    for w in plan["warnings"]:
        # soft_wrap: a suggested command line must stay copyable, not folded by rich.
        console.print(f"[yellow]warning[/yellow]: {w}", soft_wrap=True)


def out_dir(requested: str | None) -> Path:
    """The folder to write into; never one that already holds a plan."""
    if requested:
        p = Path(requested)
        if (p / "plan.md").exists() or (p / "plan.json").exists():
            raise PlanError(f"{p} already holds a plan (choose another --out)")
        return p
    base = Path("results") / "plans" / datetime.now().strftime("%Y%m%d-%H%M%S")
    p, i = base, 1
    while p.exists():
        i += 1
        p = base.with_name(f"{base.name}-{i}")
    return p


def main(argv: list[str]) -> int:
    """`python -m roofline plan ...`; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _ArgError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    from roofline.schema import RunLoadError, atomic_write_text

    dest = None
    try:
        if not args.no_save:
            dest = out_dir(args.out)
            # Made before any measurement, so an unwritable --out fails in a second, not
            # after minutes of timing.
            dest.mkdir(parents=True, exist_ok=True)
        plan = build_plan(args)
    except (PlanError, DeviceError, RunLoadError, OSError) as e:
        if dest is not None and dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()  # leave no empty plan folder behind
        what = f"cannot create {dest}: " if isinstance(e, OSError) else ""
        print(f"error: {what}{e}", file=sys.stderr)
        return 2
    png = None
    if dest is not None:
        try:
            if plan["step"]["ms"] is not None:
                from roofline.plan_plot import plot_plan

                plot_plan(plan, dest / "plan.png")
                png = "plan.png"
            plan["out_dir"] = str(dest)
            atomic_write_text(dest / "plan.json", json.dumps(plan, indent=1) + "\n")
            atomic_write_text(dest / "plan.md", render_markdown(plan, png))
        except OSError as e:
            print(f"error: cannot write the plan to {dest}: {e}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(plan, indent=1))
    else:
        print_tables(plan)
        if dest is not None:
            print(f"plan: {dest / 'plan.md'}" + (f", {dest / png}" if png else ""))
    return 0
