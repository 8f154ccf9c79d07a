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
  score matrix, so 34 h bytes per token and layer, times (activation bytes / 2).
"""

from __future__ import annotations

from typing import Any

from roofline.plan.arithmetic import attention_score_flops, step_gemms
from roofline.plan.model import ModelShape

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
SIX_N_TOLERANCE = 0.05  # "6 N D holds" when counted/6N is within 5%


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
    act_est = 34 * shape.d_model * b / 2
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
         f"{gb(mem.get('activations_in_blocks'))} in the blocks"],
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
