"""What a measured training step says about the lectures' claims (docs/step.md):
counted FLOPs per token against 6 N and 6 N + the attention term, backward against
forward, MFU and HFU of the step beside its GEMMs' own MFU, bytes per parameter of the
training state, activations per token and layer against an analytic estimate, and the
step's time split by kind of work, with each kind's FLOPs and bytes where known (the
points of step.png).  The measurements come from benches/step/measure.py.

Conventions, stated once:
- model FLOPs per token = 6 N + 12 L H Q T (PaLM appendix B, nanoGPT's estimate_mfu):
  N counts every parameter (embeddings too), the attention term the full T x T square
  (no causal halving), forward 4 L H Q T, backward twice that; MFU beside it with the
  attention term causal, 6 N + 6 L H Q T, half the square, what a causal model needs;
- MFU = model FLOPs per second / peak; HFU = counted FLOPs per second / peak (what ran:
  causal attention as half the square, the backward's recomputed attention scores
  included; benches/step/flops.py);
- GEMMs' MFU = the step's counted GEMM FLOPs over the GEMMs' own profiled time / peak;
- a rate above a datasheet peak is an accounting error (over_peak), flagged, never
  printed as a figure;
- bytes: a GEMM moves (M K + K N + M N) elements of the compute dtype (the planner's
  step_gemms list: forward, input- and weight-gradient GEMMs); attention as
  FlashAttention does, 4 B T d elements going forward (q, k, v, o) and 8 B T d back
  (q, k, v, o, dO in, dq, dk, dv out) per layer;
- activations, estimated: Korthikanti et al. 2022 (table 2, no parallelism, no
  recomputation) store 34 s b h + 5 a s^2 b bytes per layer in 16-bit; SDPA keeps no
  score matrix, so 34 h bytes per token and layer, times (activation bytes / 2); the same
  estimate sizes the memory check before a step is measured (step_memory_estimate);
- memory: the step's peak allocated (extrapolated from a slice where one was measured)
  against the device's memory, and what would fit (memory_fit).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from contract.models import ModelShape
from roofline.plan.arithmetic import (
    Gemm,
    attention_score_flops,
    fraction_text,
    over_peak,
    rate_text,
    step_gemms,
)
from roofline.plan.step_records import (
    MemoryFit,
    StepCategory,
    StepMeasurement,
    StepReport,
)

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
SIX_N_TOLERANCE = 0.05  # "6 N D holds" when counted/6N is within 5%
# Bytes per parameter of the step's training state: fp32 weights, gradients and AdamW's
# m and v (autocast keeps the parameters in fp32 and casts them for the matmuls).
STATE_BYTES_PER_PARAM = 16
# The sizes suggested for a step that does not fit keep their estimate within this share
# of the memory: the estimate is a lower bound, and the peak of the steps measured on a
# 2-core CPU ran 1.2x it (d 2048, 16k tokens) to 2x (small models, where the runtime's
# own allocations weigh most): allocator caching and the backward's temporaries.
ADVICE_HEADROOM = 0.75


def activation_bytes_per_token_layer(shape: ModelShape, dtype: str) -> float:
    """Korthikanti et al. 2022 (table 2, no parallelism, no recomputation): 34 s b h bytes
    per layer in 16-bit, plus 5 a s^2 b for the score matrix that SDPA does not keep: 34 h
    bytes per token and layer, times (activation bytes / 2)."""
    return 34 * shape.d_model * DTYPE_BYTES.get(dtype, 4) / 2


def step_memory_estimate(shape: ModelShape, n_blocks: int, micro_batch: int,
                         dtype: str) -> dict[str, float]:
    """What a training step of a slice of `n_blocks` blocks (with the embedding and head)
    needs at least, itemized: its training state, the activations by the estimate above,
    the logits in fp32 twice (values and gradient: the largest single tensors) and, under
    16-bit autocast, the 16-bit copies of the matmul weights the backward keeps."""
    per_block = (shape.params - shape.vocab * shape.d_model * (1 if shape.tied else 2)
                 - (shape.seq_len * shape.d_model if shape.learned_pos else 0)
                 - shape.d_model * shape.norm_params) / shape.n_layers
    params = shape.params - shape.n_layers * per_block + n_blocks * per_block
    block_matmul = (shape.matmul_params - shape.d_model * shape.vocab) / shape.n_layers
    tokens = micro_batch * shape.seq_len
    return {
        "training state": STATE_BYTES_PER_PARAM * params,
        "activations": activation_bytes_per_token_layer(shape, dtype) * tokens * n_blocks,
        "logits": tokens * shape.vocab * 4 * 2,
        "weight casts": (DTYPE_BYTES[dtype] * (shape.d_model * shape.vocab
                                               + n_blocks * block_matmul)
                         if DTYPE_BYTES.get(dtype, 4) < 4 else 0.0),
    }


def _fits(shape: ModelShape, n_blocks: int, micro_batch: int, dtype: str,
          limit: float) -> bool:
    return sum(step_memory_estimate(shape, n_blocks, micro_batch, dtype).values()) <= limit


def _largest(lo: int, hi: int, fits: Any) -> int | None:
    """The largest n in [lo, hi] with fits(n), for a fits that holds up to some n and
    not after (memory grows with each of the step's sizes); None when none does."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def what_fits(shape: ModelShape, n_blocks: int, micro_batch: int, dtype: str,
              limit: float) -> dict[str, int | None]:
    """For a step that does not fit in `limit` bytes, the largest size that brings it
    under, the others kept: the slice (blocks); when not even one block fits, the
    micro-batch and the sequence length at one block.  None where nothing does."""
    blocks = _largest(1, n_blocks - 1,
                      lambda k: _fits(shape, k, micro_batch, dtype, limit))
    if blocks is not None:
        return {"measure_layers": blocks, "micro_batch": None, "seq_len": None}
    batch = _largest(1, micro_batch - 1, lambda b: _fits(shape, 1, b, dtype, limit))
    seq = _largest(1, shape.seq_len - 1, lambda s: _fits(replace(shape, seq_len=s), 1,
                                                         micro_batch, dtype, limit))
    return {"measure_layers": None, "micro_batch": batch, "seq_len": seq}


# The residual stream a block takes in is fp32 under autocast (the embedding is fp32 and
# x + a 16-bit output is fp32): T x d_model x 4 bytes per block, what activation
# checkpointing keeps of a block.
RESIDUAL_BYTES = 4
# The most GPUs memory_fit looks at for FSDP.
FSDP_MAX_GPUS = 1024


def memory_fit(shape: ModelShape, m: StepMeasurement, device_bytes: float | None
               ) -> MemoryFit | None:
    """The step's peak allocated against the device's memory and, estimated from the
    same measurement, the peak under each way to bring it down (None without a peak,
    i.e. on a CPU, or without the device's memory):
    - activation checkpointing per block: the blocks' saved activations go, each block
      keeps its input (T d 4 B) and one block's activations live again while it is
      recomputed in the backward;
    - FSDP over N GPUs: parameters, gradients and optimizer state sharded N ways, the
      rest of the peak (activations, weight casts, temporaries) per GPU as it is: the
      fewest GPUs that fit;
    - a smaller micro-batch: the peak less the training state and the weight casts
      scales with the tokens of a step: the most tokens that fit, as a micro-batch of
      whole sequences or, under one sequence, the longest sequence at micro-batch 1."""
    mem = m.memory
    peak = mem.peak_allocated
    if not peak or not device_bytes:
        return None
    L, tokens, state = shape.n_layers, m.tokens, mem.state
    casts = mem.weight_casts or 0.0
    blocks = mem.activations_in_blocks or 0.0
    rest = peak - state
    ckpt = peak - blocks + L * tokens * shape.d_model * RESIDUAL_BYTES + blocks / L
    fsdp = next((n for n in range(2, FSDP_MAX_GPUS + 1) if state / n + rest <= device_bytes),
                None)
    per_token = (peak - state - casts) / tokens
    room = device_bytes - state - casts
    most = int(room / per_token) if per_token > 0 and room > 0 else 0
    batch = min(most // shape.seq_len, m.micro_batch - 1) or None
    seq = min(most, shape.seq_len - 1) if not batch and most else None
    smaller = batch * shape.seq_len if batch else seq
    return MemoryFit(peak, device_bytes, peak <= device_bytes, state, rest, ckpt,
                     ckpt <= device_bytes, fsdp, state / fsdp + rest if fsdp else None,
                     batch, seq, state + casts,
                     state + casts + per_token * smaller if smaller else None)


def _memory_rows(f: MemoryFit | None, gb: Any) -> list[list[str]]:
    """The verdict and, for a step that does not fit, what would."""
    if f is None:
        return []
    verdict = (f"yes: {gb(f.peak)} of {gb(f.device)}" if f.fits
               else f"NO: {gb(f.peak)} > {gb(f.device)}")
    rows = [["fits in the device's memory", verdict,
             "the peak allocated against the device's memory (the allocator reserves "
             "a little more)"]]
    if f.fits:
        return rows
    fits = {True: "fits", False: "does NOT fit"}
    rows.append(["with activation checkpointing", gb(f.checkpointing),
                 f"{fits[f.checkpointing_fits]} (estimate: each block keeps its "
                 "input and recomputes the rest in the backward)"])
    if f.fsdp_gpus:
        rows.append([f"with FSDP over {f.fsdp_gpus} GPUs", gb(f.fsdp_peak),
                     f"fits (estimate: the training state, {gb(f.state)}, sharded "
                     f"{f.fsdp_gpus} ways; the rest, {gb(f.rest)}, per GPU)"])
    else:
        rows.append(["with FSDP", "-", f"does NOT fit over any number of GPUs: the "
                     f"peak less the training state, {gb(f.rest)}, is more than "
                     "the memory"])
    scales = "the peak less the training state and weight casts scales with the tokens"
    if f.micro_batch:
        rows.append([f"with micro-batch {f.micro_batch}", gb(f.smaller_peak),
                     f"fits (estimate: {scales})"])
    elif f.seq_len:
        rows.append([f"with micro-batch 1 x {f.seq_len} tokens", gb(f.smaller_peak),
                     f"fits (estimate: {scales}; one sequence is the smallest micro-batch)"])
    else:
        rows.append(["with a smaller micro-batch", "-", "does NOT fit at any size: the "
                     f"training state and weight casts alone are {gb(f.fixed)}"])
    return rows


def _total(d: dict[str, float] | None) -> float:
    return float(sum((d or {}).values()))


def _pct(x: float) -> str:
    return f"{x:.1%}"


def gemms_from_step(gemms: list[Gemm], calls: dict[str, dict[str, float]] | None,
                    peak_tflops: float) -> str:
    """Give each of the step's GEMMs its time per call in the profiled step
    (measure_step's `gemm_calls`, by gemm_key), its TFLOP/s and MFU; says how they were
    timed, or why some are not (rows of the same key share their mean: the same shape)."""
    if not calls:
        return ("not timed one by one: this measurement has no GEMM times by shape "
                "(--measure times each alone)")
    missing = []
    for g in gemms:
        c = calls.get(g.key)
        if not c or not c["calls"] or not c["ms"]:
            missing.append(f"{g.name} {g.phase}")
            continue
        g.ms = c["ms"] / c["calls"]
        g.tflops = g.flops / (g.ms * 1e-3) / 1e12
        g.mfu = g.tflops / peak_tflops
        g.note = "profiled in the step"
    how = "ms per call, profiled inside the measured step"
    if missing:
        how += f"; not found in its profile: {', '.join(missing)}"
    return how


def _categories(shape: ModelShape, m: StepMeasurement, peak_tflops: float
                ) -> tuple[StepCategory, ...]:
    """The profiled time by kind of work, with the GEMMs' and attention's FLOPs and
    bytes (module docstring: the bytes as the planner's GEMMs and FlashAttention move
    them)."""
    b = DTYPE_BYTES.get(m.dtype, 4)
    fwd, bwd = m.flops_forward, m.flops_backward
    flops = {"gemm": fwd.get("gemm", 0) + bwd.get("gemm", 0),
             "attention": fwd.get("attention", 0) + bwd.get("attention", 0)}
    nbytes = {"gemm": sum(g.count * (g.M * g.K + g.K * g.N + g.M * g.N) * b
                          for g in step_gemms(shape, m.micro_batch)),
              "attention": 12 * m.micro_batch * shape.seq_len * shape.d_model * b
              * shape.n_layers}
    total = sum(m.profile_ms.values()) or float("nan")
    out = []
    for cat, ms in m.profile_ms.items():
        f, nb = flops.get(cat), nbytes.get(cat)
        tflops = f / (ms / 1e3) / 1e12 if f and ms else None
        out.append(StepCategory(cat, ms, ms / total, f, nb, tflops,
                                over_peak(tflops, peak_tflops),
                                f / nb if f and nb else None))
    return tuple(out)


def step_report(shape: ModelShape, m: StepMeasurement, peak_tflops: float,
                policy_bytes_per_param: float, device_bytes: float | None = None,
                peak_source: str = "datasheet") -> StepReport:
    """The report's numbers from benches.step.measure.measure_step's result `m`, on a
    device of `device_bytes` of memory whose peak is `peak_tflops` (from `peak_source`)."""
    n, tokens, L = float(shape.params), m.tokens, shape.n_layers
    fwd, bwd = _total(m.flops_forward), _total(m.flops_backward)
    opt = _total(m.flops_optimizer)
    attn = attention_score_flops(shape, 1.0)  # per token, 12 L H Q T
    attn_causal = attention_score_flops(shape, 1.0, causal=True)
    t_s, peak = m.ms_median / 1e3, peak_tflops * 1e12
    fwd_gemm = m.flops_forward.get("gemm", 0)
    gemm_flops = fwd_gemm + m.flops_backward.get("gemm", 0)
    gemm_ms = m.profile_ms.get("gemm", 0.0)
    mem = m.memory
    ratio_6n = (fwd + bwd) / tokens / (6 * n)
    return StepReport(
        params=n, tokens_per_step=tokens, step_ms=m.ms_median, step_ms_p20=m.ms_p20,
        step_ms_p80=m.ms_p80, tokens_per_s=tokens / t_s, flops_forward=fwd,
        flops_backward=bwd, flops_optimizer=opt, counted_per_token=(fwd + bwd) / tokens,
        six_n_per_token=6 * n, attention_per_token=attn,
        attention_causal_per_token=attn_causal, attention_counting=m.attention_counting,
        counted_over_6n=ratio_6n, counted_over_6n_attn=(fwd + bwd) / tokens / (6 * n + attn),
        counted_over_6n_attn_causal=(fwd + bwd) / tokens / (6 * n + attn_causal),
        six_n_holds=abs(ratio_6n - 1) <= SIX_N_TOLERANCE,
        backward_over_forward=bwd / fwd if fwd else None,
        gemm_backward_over_forward=(m.flops_backward.get("gemm", 0) / fwd_gemm)
        if fwd_gemm else None,
        mfu=(6 * n + attn) * tokens / t_s / peak,
        mfu_causal=(6 * n + attn_causal) * tokens / t_s / peak,
        hfu=(fwd + bwd + opt) / t_s / peak,
        gemm_mfu=gemm_flops / (gemm_ms / 1e3) / peak if gemm_ms else None,
        peak_tflops=peak_tflops, peak_source=peak_source,
        memory_fit=memory_fit(shape, m, device_bytes),
        bytes_per_param_measured=mem.state / n if mem.parameters else None,
        bytes_per_param_policy=policy_bytes_per_param,
        optimizer_bytes_per_param=mem.optimizer_state / n,
        activations_per_token_per_layer=(mem.activations_in_blocks or 0.0) / tokens / L
        if L else None,
        activations_estimate_per_token_per_layer=activation_bytes_per_token_layer(
            shape, m.dtype),
        memory=mem, categories=_categories(shape, m, peak_tflops), notes=m.notes,
        slice=m.measured_layers != L)


# What HFU's counted FLOPs hold of the attention, by the measurement's
# attention_counting (None: measured before the causal count, or no block measured).
_HFU = {
    "causal": "what ran: causal attention as half the square, the backward's "
              "recomputed scores included",
    "full square": "what ran: SDPA's math backend multiplies the full square before "
                   "masking it; recomputation included",
    None: "what FlopCounterMode counted: fused attention as the full square, causal or "
          "not; recomputation included",
}


def _claims_rows(r: StepReport, si: Any) -> list[list[str]]:
    """Counted FLOPs against 6 N, 6 N + the attention term, backward against forward."""
    holds = ("yes" if r.six_n_holds else "no") + \
        f" (within {SIX_N_TOLERANCE:.0%}: counted / 6N = {r.counted_over_6n:.3f})"
    return [
        ["FLOPs per token, counted (fwd + bwd)", si(r.counted_per_token), ""],
        ["6 N", si(r.six_n_per_token), f"counted / 6N = {r.counted_over_6n:.3f}"],
        ["6 N + 12 L H Q T", si(r.six_n_per_token + r.attention_per_token),
         f"PaLM's, the full attention square: counted / it = "
         f"{r.counted_over_6n_attn:.3f}"],
        ["6 N + 6 L H Q T", si(r.six_n_per_token + r.attention_causal_per_token),
         f"causal attention, half the square: counted / it = "
         f"{r.counted_over_6n_attn_causal:.3f}"],
        ["6 N D holds here", holds, ""],
        ["backward / forward, counted", f"{r.backward_over_forward:.3f}",
         "lecture: 2 (attention backward recomputes the scores: 2.5 for it)"],
        ["backward / forward, GEMMs", f"{r.gemm_backward_over_forward:.3f}",
         "input and weight gradients: exactly 2"],
        ["optimizer FLOPs counted", si(r.flops_optimizer),
         "AdamW is elementwise: FlopCounterMode counts matmul-like ops only"],
    ]


def _speed_rows(r: StepReport, si: Any) -> list[list[str]]:
    """The step's time, throughput, MFU and HFU each with its convention."""
    src = r.peak_source
    return [
        ["step time", f"{r.step_ms:.4g} ms", f"p20 {r.step_ms_p20:.4g}, "
                                              f"p80 {r.step_ms_p80:.4g}"],
        ["tokens / s per device", si(r.tokens_per_s), ""],
        ["MFU (PaLM: 6N + 12 L H Q T)", fraction_text(r.mfu, src),
         f"of {r.peak_tflops:.4g} TFLOP/s; its attention term counts the full T x T "
         "square, of which a causal step computes half"],
        ["MFU (6N + causal attention)", fraction_text(r.mfu_causal, src),
         "6 N + 6 L H Q T: the attention term over the half of the square a causal "
         "mask keeps"],
        ["HFU (counted FLOPs)", fraction_text(r.hfu, src),
         _HFU.get(r.attention_counting, _HFU[None])],
        ["GEMMs' own MFU", fraction_text(r.gemm_mfu, src),
         "counted GEMM FLOPs over their profiled time"],
    ]


def _memory_table_rows(r: StepReport, gb: Any) -> list[list[str]]:
    """The memory by category, bytes per parameter, activations against the estimate,
    the peak and whether it fits."""
    mem = r.memory
    peak = mem.peak_allocated
    return [
        ["parameters", gb(mem.parameters), ""],
        ["gradients", gb(mem.gradients), ""],
        ["optimizer state (AdamW m, v)", gb(mem.optimizer_state),
         f"{r.optimizer_bytes_per_param:.3g} B per parameter"],
        ["activations saved for backward", gb(mem.activations),
         f"{gb(mem.activations_in_blocks)} in the blocks; what the forward computes"],
        ["weight casts saved for backward", gb(mem.weight_casts or 0),
         "autocast's 16-bit copies of the matmul weights" if mem.weight_casts
         else "none (no autocast)"],
        ["bytes per parameter (params + grads + optimizer)",
         f"{r.bytes_per_param_measured:.3g}",
         f"the plan's policy: {r.bytes_per_param_policy:g}"],
        ["activations per token per layer", gb(r.activations_per_token_per_layer),
         f"estimate (34 h bytes in 16-bit, Korthikanti et al.): "
         f"{gb(r.activations_estimate_per_token_per_layer)}"],
        ["peak allocated", gb(peak) if peak else "-",
         ("torch.cuda.max_memory_allocated" + (", extrapolated from the slice"
                                               if r.slice else "")) if peak else "GPU only"],
        *_memory_rows(r.memory_fit, gb),
    ]


def _split_rows(r: StepReport, si: Any, gb: Any) -> list[list[str]]:
    """The profiled time by kind of work, longest first."""
    return [[c.category, f"{c.ms:.3g}", _pct(c.share), si(c.flops) if c.flops else "-",
             gb(c.bytes) if c.bytes else "-",
             rate_text(c.tflops, r.peak_tflops, r.peak_source)]
            for c in sorted(r.categories, key=lambda c: -c.ms)]


def step_sections(r: StepReport, si: Any, gb: Any) -> list[tuple[str, list[str],
                                                                 list[list[str]]]]:
    """(title, header, rows) tables of the report, for the terminal and plan.md."""
    return [
        ("Training step: FLOPs against the lecture's accounting", ["", "value", "note"],
         _claims_rows(r, si)),
        ("Training step: speed", ["", "value", "note"], _speed_rows(r, si)),
        ("Training step: memory", ["", "value", "note"], _memory_table_rows(r, gb)),
        ("Training step: time by kind of work (one profiled step)",
         ["category", "ms", "share", "FLOPs", "bytes", "TFLOP/s"], _split_rows(r, si, gb)),
    ]
