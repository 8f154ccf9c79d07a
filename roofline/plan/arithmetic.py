"""The arithmetic of a training run (docs/design.md): 6 N D and the attention term,
days for a FLOP budget and back, compute-optimal sizes, memory per parameter and what
fits, and one step's GEMMs with their share of the time."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import TypedDict

from contract.models import ModelShape
from kernels.spec import DTYPES

SECONDS_PER_DAY = 86400.0

CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022: compute-optimal D ~ 20 N

DEFAULT_MFU = 0.5  # the customary assumption this tool exists to replace

DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8e5": 1}

# Memory per GPU in GB (1e9 bytes) as sold, keyed like contract.devices.DEVICES.  The
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

# Bytes per parameter of weights held in each format, block scales included (element bits
# plus one scale byte per block, kernels.spec.DType.bytes_per_element): fp8 1 (its one
# fp32 scale per tensor is nothing per parameter), mxfp8 8 + 8/32 = 8.25 bits = 1.03125,
# mxfp4 4 + 8/32 = 4.25 bits = 0.53125, nvfp4 4 + 8/16 = 4.5 bits = 0.5625 (plus 4 bytes
# per tensor).
WEIGHT_FORMATS: dict[str, float] = {
    name: DTYPES[name].bytes_per_element
    for name in ("fp32", "bf16", "fp16", "fp8", "mxfp8", "mxfp4", "nvfp4")
}


def policy_items(policy: str, weight_format: str | None = None) -> dict[str, float]:
    """Bytes per parameter of `policy`, itemized, with the weights the GEMMs read held
    in `weight_format`.  Quantized weights are a copy: the optimizer updates the policy's
    master weights, so a policy that has a master copy (bf16-master) trades its bf16
    weights for the format, and one whose weights are the only copy keeps them, as the
    master, beside the format's copy.  The format's item comes first ("weights ..."):
    it is what FSDP gathers (roofline.plan.comm.policy_bytes)."""
    items: dict[str, float] = dict(MEMORY_POLICIES[policy])
    if weight_format is None:
        return items
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format '{weight_format}' "
                         f"(choose from {', '.join(WEIGHT_FORMATS)})")
    has_master = any(k.startswith("master weights") for k in items)
    out: dict[str, float] = {f"weights {weight_format}": WEIGHT_FORMATS[weight_format]}
    for k, v in items.items():
        if k.startswith("weights"):
            if has_master:
                continue
            k = "master " + k
        out[k] = v
    return out


def train_flops(params: float, tokens: float) -> dict[str, float]:
    """6 N D, itemized: forward 2 N D, backward 4 N D (input and weight gradients)."""
    return {"forward": 2 * params * tokens, "backward": 4 * params * tokens,
            "total": 6 * params * tokens}


# The share of the S x S square of attention scores a causal mask keeps, as
# FlashAttention's benchmarks and the harness's attention kernels (kernels/attention.py)
# count it: half.  The diagonal's S / 2 more pairs, and the whole diagonal tiles a causal
# kernel computes, are left out: under 2% at S = 8192 and 128-wide tiles.
CAUSAL_SHARE = 0.5


def attention_score_flops(shape: ModelShape, tokens: float, causal: bool = False) -> float:
    """Training FLOPs of the attention scores, which 6 N D leaves out.

    Per token and layer going forward: Q K^T is 2 S d_attn and the weighted sum of V
    another 2 S d_attn (d_attn = heads x head_dim = d_model), the full S x S square as in
    Chinchilla's appendix F and PaLM's 12 L H Q T; backward is twice forward.  `causal`:
    CAUSAL_SHARE of it, what a causal kernel that skips the masked half (FlashAttention)
    computes."""
    d_attn = shape.heads * shape.head_dim
    full = 3 * 4 * shape.n_layers * shape.seq_len * d_attn * tokens
    return full * CAUSAL_SHARE if causal else full


def over_peak(tflops: float | None, peak_tflops: float | None) -> bool:
    """A rate above its device's peak.  Against a datasheet peak no kernel runs that
    fast: the FLOPs count work that did not run, or the time misses work that did."""
    return bool(tflops and peak_tflops and tflops > peak_tflops)


def rate_text(tflops: float | None, peak_tflops: float | None, peak_source: str = "datasheet",
              fmt: str = ".3g") -> str:
    """A TFLOP/s figure as a table prints it: one above a datasheet peak is flagged as
    an accounting error, never printed as a plain figure; above a measured peak (the
    best of a few square GEMMs, no hardware limit) it says so."""
    if tflops is None:
        return "-"
    if not over_peak(tflops, peak_tflops):
        return format(tflops, fmt)
    if peak_source == "datasheet":
        return f"accounting error: {tflops:{fmt}} > peak {peak_tflops:.4g}"
    return f"{tflops:{fmt}} (above the measured peak {peak_tflops:.4g})"


def fraction_text(x: float | None, peak_source: str = "datasheet") -> str:
    """An MFU-like fraction of the peak: over 100% of a datasheet peak is an accounting
    error, as rate_text."""
    if x is None:
        return "-"
    if x <= 1:
        return f"{x:.1%}"
    if peak_source == "datasheet":
        return f"accounting error: {x:.1%} of peak"
    return f"{x:.1%} (of a measured peak)"


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


class GemmJson(TypedDict):
    """A GEMM as plan.json holds it (Gemm.to_json)."""

    name: str
    phase: str
    M: int
    N: int
    K: int
    count: int
    tflops: float | None
    ms: float | None
    mfu: float | None
    share: float | None
    measured_shape: str | None
    note: str
    shape: str
    flops: int
    flops_per_step: int


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
        return 2 * self.M * self.N * self.K  # as kernels/matmul.py counts it

    @property
    def key(self) -> str:
        return gemm_key("forward" if self.phase == "forward" else "backward",
                        self.M, self.N, self.K)

    def to_json(self) -> GemmJson:
        """A GEMM in the plan's `gemms` (plan.json): its fields, then its shape and FLOPs."""
        return GemmJson(**asdict(self), shape=self.shape,  # type: ignore[typeddict-item]
                        flops=self.flops, flops_per_step=self.flops * self.count)

    @classmethod
    def from_json(cls, doc: GemmJson) -> Gemm:
        return cls(**{f.name: doc[f.name] for f in fields(cls)})  # type: ignore[literal-required]


def gemm_key(pass_: str, m: int, n: int, k: int) -> str:
    """A GEMM as a profiled step tells it apart: its pass (forward or backward), the two
    sides of its output in either order (a linear layer's weight gradient comes out as
    dW^T = dY^T X, N x K where the planner says K x N) and its reduction length."""
    a, b = sorted((m, n))
    return f"{pass_} {a}x{b} K={k}"


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


@dataclass(frozen=True)
class StepSummary:
    """The step the GEMMs make (summarize_step): its tokens, GEMM FLOPs and, once every
    GEMM is timed, its time, rate and MFU; how many of its GEMMs are timed.  The plan's
    `step` (asdict), its fields in the document's order."""

    tokens: int | None
    gemm_flops: int
    ms: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    timed: int = 0
    total: int = 0


def summarize_step(gemms: list[Gemm], peak_tflops: float) -> StepSummary:
    """Step time and MFU the matmuls alone allow: sum of count x time, and the step's
    GEMM FLOPs over that time and the peak (attention scores, norms, activations and
    communication come on top, so a real step is slower)."""
    flops = sum(g.flops * g.count for g in gemms)
    timed = [g for g in gemms if g.ms is not None]
    out = StepSummary(gemms[0].M if gemms else None, flops, timed=len(timed),
                      total=len(gemms))
    if not gemms or len(timed) != len(gemms):
        return out
    ms = sum(g.ms * g.count for g in gemms)  # type: ignore[operator]
    for g in gemms:
        g.share = g.ms * g.count / ms  # type: ignore[operator]
    tflops = flops / (ms * 1e-3) / 1e12
    return replace(out, ms=ms, tflops=tflops, mfu=tflops / peak_tflops)


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
        return GPU_MEMORY_GB[key] * 1e9, "datasheet (roofline/plan/arithmetic.py GPU_MEMORY_GB)"
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
