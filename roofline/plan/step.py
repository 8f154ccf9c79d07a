"""What a measured training step says about the lectures' claims (DESIGN.md section 12):
counted FLOPs per token against 6 N and 6 N + the attention term, backward against
forward, MFU and HFU of the step beside its GEMMs' own MFU, bytes per parameter of the
training state, activations per token and layer against an analytic estimate, and the
step's time split by kind of work, with each kind's FLOPs and bytes where known (the
points of step.png).  The measurements come from benches/step.py.

Conventions, stated once:
- model FLOPs per token = 6 N + 12 L H Q T (PaLM appendix B, nanoGPT's estimate_mfu):
  N counts every parameter (embeddings too), the attention term the full T x T square
  (no causal halving), forward 4 L H Q T, backward twice that;
- MFU = model FLOPs per second / peak; HFU = counted FLOPs per second / peak (what ran,
  the backward's recomputed attention scores included);
- GEMMs' MFU = the step's counted GEMM FLOPs over the GEMMs' own profiled time / peak;
- bytes: a GEMM moves (M K + K N + M N) elements of the compute dtype (the planner's
  step_gemms list: forward, input- and weight-gradient GEMMs); attention as
  FlashAttention does, 4 B T d elements going forward (q, k, v, o) and 8 B T d back
  (q, k, v, o, dO in, dq, dk, dv out) per layer;
- activations, estimated: Korthikanti et al. 2022 (table 2, no parallelism, no
  recomputation) store 34 s b h + 5 a s^2 b bytes per layer in 16-bit; SDPA keeps no
  score matrix, so 34 h bytes per token and layer, times (activation bytes / 2); the same
  estimate sizes the memory check before a step is measured (step_memory_estimate).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from roofline.plan.arithmetic import attention_score_flops, step_gemms
from roofline.plan.model import ModelShape

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


def _total(d: dict[str, float] | None) -> float:
    return float(sum((d or {}).values()))


def _pct(x: float) -> str:
    return f"{x:.1%}"


def step_report(shape: ModelShape, m: dict[str, Any], peak_tflops: float,
                policy_bytes_per_param: float) -> dict[str, Any]:
    """The report's numbers from benches.step.measure_step's result `m`."""
    n, tokens, L = float(shape.params), float(m["tokens"]), shape.n_layers
    fwd, bwd = _total(m["flops_forward"]), _total(m["flops_backward"])
    opt = _total(m["flops_optimizer"])
    counted = fwd + bwd + opt
    attn = attention_score_flops(shape, 1.0)  # per token, 12 L H Q T
    model_per_token = 6 * n + attn
    t_s = m["time_ms"]["median"] / 1e3
    peak = peak_tflops * 1e12
    gemm_flops = m["flops_forward"].get("gemm", 0) + m["flops_backward"].get("gemm", 0)
    prof = m["profile_ms"]
    prof_total = sum(prof.values()) or float("nan")
    b = DTYPE_BYTES.get(m["dtype"], 4)
    gemm_bytes = sum(g.count * (g.M * g.K + g.K * g.N + g.M * g.N) * b
                     for g in step_gemms(shape, m["micro_batch"]))
    attn_bytes = 12 * m["micro_batch"] * shape.seq_len * shape.d_model * b * L
    mem = m["memory"]
    state = mem["parameters"] + mem["gradients"] + mem["optimizer_state"]
    act_blocks = mem.get("activations_in_blocks") or 0.0
    act_est = activation_bytes_per_token_layer(shape, m["dtype"])
    ratio_6n = (fwd + bwd) / tokens / (6 * n)
    categories = []
    for cat, ms in prof.items():
        flops = {"gemm": gemm_flops,
                 "attention": m["flops_forward"].get("attention", 0)
                 + m["flops_backward"].get("attention", 0)}.get(cat)
        nbytes = {"gemm": gemm_bytes, "attention": attn_bytes}.get(cat)
        categories.append({"category": cat, "ms": ms, "share": ms / prof_total,
                           "flops": flops, "bytes": nbytes,
                           "tflops": flops / (ms / 1e3) / 1e12 if flops and ms else None,
                           "intensity": flops / nbytes if flops and nbytes else None})
    gemm_ms = prof.get("gemm", 0.0)
    return {
        "params": n, "tokens_per_step": tokens, "step_ms": m["time_ms"]["median"],
        "step_ms_p20": m["time_ms"]["p20"], "step_ms_p80": m["time_ms"]["p80"],
        "tokens_per_s": tokens / t_s,
        "flops_forward": fwd, "flops_backward": bwd, "flops_optimizer": opt,
        "counted_per_token": (fwd + bwd) / tokens,
        "six_n_per_token": 6 * n, "attention_per_token": attn,
        "counted_over_6n": ratio_6n,
        "counted_over_6n_attn": (fwd + bwd) / tokens / model_per_token,
        "six_n_holds": abs(ratio_6n - 1) <= SIX_N_TOLERANCE,
        "backward_over_forward": bwd / fwd if fwd else None,
        "gemm_backward_over_forward": (m["flops_backward"].get("gemm", 0)
                                       / m["flops_forward"]["gemm"])
        if m["flops_forward"].get("gemm") else None,
        "mfu": model_per_token * tokens / t_s / peak,
        "hfu": counted / t_s / peak,
        "gemm_mfu": gemm_flops / (gemm_ms / 1e3) / peak if gemm_ms else None,
        "peak_tflops": peak_tflops,
        "bytes_per_param_measured": state / n if mem["parameters"] else None,
        "bytes_per_param_policy": policy_bytes_per_param,
        "optimizer_bytes_per_param": mem["optimizer_state"] / n,
        "activations_per_token_per_layer": act_blocks / tokens / L if L else None,
        "activations_estimate_per_token_per_layer": act_est,
        "memory": mem, "categories": categories, "notes": list(m.get("notes") or []),
        "slice": m.get("measured_layers") != L,
    }


def step_sections(r: dict[str, Any], si: Any, gb: Any) -> list[tuple[str, list[str],
                                                                      list[list[str]]]]:
    """(title, header, rows) tables of the report, for the terminal and plan.md."""
    holds = ("yes" if r["six_n_holds"] else "no") + \
        f" (within {SIX_N_TOLERANCE:.0%}: counted / 6N = {r['counted_over_6n']:.3f})"
    claims = [
        ["FLOPs per token, counted (fwd + bwd)", si(r["counted_per_token"]), ""],
        ["6 N", si(r["six_n_per_token"]), f"counted / 6N = {r['counted_over_6n']:.3f}"],
        ["6 N + 12 L H Q T", si(r["six_n_per_token"] + r["attention_per_token"]),
         f"counted / (6N + attn) = {r['counted_over_6n_attn']:.3f}"],
        ["6 N D holds here", holds, ""],
        ["backward / forward, counted", f"{r['backward_over_forward']:.3f}",
         "lecture: 2 (attention backward recomputes the scores: 2.5 for it)"],
        ["backward / forward, GEMMs", f"{r['gemm_backward_over_forward']:.3f}",
         "input and weight gradients: exactly 2"],
        ["optimizer FLOPs counted", si(r["flops_optimizer"]),
         "AdamW is elementwise: FlopCounterMode counts matmul-like ops only"],
    ]
    speed = [
        ["step time", f"{r['step_ms']:.4g} ms", f"p20 {r['step_ms_p20']:.4g}, "
                                                 f"p80 {r['step_ms_p80']:.4g}"],
        ["tokens / s per device", si(r["tokens_per_s"]), ""],
        ["MFU (6N + attention)", _pct(r["mfu"]), f"of {r['peak_tflops']:.4g} TFLOP/s"],
        ["HFU (counted FLOPs)", _pct(r["hfu"]), "recomputation included"],
        ["GEMMs' own MFU", _pct(r["gemm_mfu"]) if r["gemm_mfu"] else "-",
         "counted GEMM FLOPs over their profiled time"],
    ]
    mem = r["memory"]
    memory = [
        ["parameters", gb(mem["parameters"]), ""],
        ["gradients", gb(mem["gradients"]), ""],
        ["optimizer state (AdamW m, v)", gb(mem["optimizer_state"]),
         f"{r['optimizer_bytes_per_param']:.3g} B per parameter"],
        ["activations saved for backward", gb(mem["activations"]),
         f"{gb(mem.get('activations_in_blocks'))} in the blocks; what the forward "
         "computes"],
        ["weight casts saved for backward", gb(mem.get("weight_casts") or 0),
         "autocast's 16-bit copies of the matmul weights" if mem.get("weight_casts")
         else "none (no autocast)"],
        ["bytes per parameter (params + grads + optimizer)",
         f"{r['bytes_per_param_measured']:.3g}",
         f"the plan's policy: {r['bytes_per_param_policy']:g}"],
        ["activations per token per layer",
         gb(r["activations_per_token_per_layer"]),
         f"estimate (34 h bytes in 16-bit, Korthikanti et al.): "
         f"{gb(r['activations_estimate_per_token_per_layer'])}"],
        ["peak allocated", gb(mem["peak_allocated"]) if mem.get("peak_allocated")
         else "-", "torch.cuda.max_memory_allocated" if mem.get("peak_allocated")
         else "GPU only"],
    ]
    split = [[c["category"], f"{c['ms']:.3g}", _pct(c["share"]),
              si(c["flops"]) if c["flops"] else "-", gb(c["bytes"]) if c["bytes"] else "-",
              f"{c['tflops']:.3g}" if c["tflops"] else "-"]
             for c in sorted(r["categories"], key=lambda c: -c["ms"])]
    return [
        ("Training step: FLOPs against the lecture's accounting", ["", "value", "note"],
         claims),
        ("Training step: speed", ["", "value", "note"], speed),
        ("Training step: memory", ["", "value", "note"], memory),
        ("Training step: time by kind of work (one profiled step)",
         ["category", "ms", "share", "FLOPs", "bytes", "TFLOP/s"], split),
    ]
