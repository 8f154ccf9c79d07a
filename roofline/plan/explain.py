"""`plan --measure step --explain`: the measured training step held against its own
kernels.  The step's kernel shapes come from the model stepped (`step_kernels`), are
timed alone through the harness on the same device (benches.step.gemms.measure_kernels,
wired in by the command line), and each category's time in the profiled step is set
beside what the same ops take alone: sum over the step's op instances of count x the
measured time at that shape (`explain_report`).

Categories (benches/step/kernel_split.py files the profiled time in the same ones): gemm,
attention, norm, loss/softmax, optimizer/elementwise, other.  The harness has forward
kernels only for the norms and the softmax, and no kernel for the optimizer, elementwise
work and the rest: such passes and categories say so and get no figure.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from contract.ceilings import Ceilings
from contract.models import ModelShape
from roofline.plan.arithmetic import over_peak, rate_text, step_gemms

EXPLAIN_CATEGORIES = ("gemm", "attention", "norm", "loss/softmax", "optimizer/elementwise",
                      "other")
PASSES = ("forward", "backward", "optimizer", "unattributed")
# Under 16-bit autocast the norms run on the residual stream, which stays fp32 (the
# embedding is fp32 and x + a 16-bit output is fp32; autocast also lists layer_norm as
# an fp32 op), and the loss on logits.float() (benches/step/transformer.py): both are fp32
# kernels whatever the step's dtype.  GEMMs and attention take the step's dtype.
ROW_OP_DTYPE = "fp32"
# What the profiled time of a category is that no harness kernel covers.
NO_KERNEL = {
    "optimizer/elementwise": "no kernel in the harness for AdamW or the step's "
                             "elementwise ops (adds, activations, casts, copies)",
    "other": "no kernel: ops filed under no kind of work",
}
_UNATTRIBUTED = ("GPU kernels no op the profiler saw launched (filed by their name): "
                 "their pass is unknown")


@dataclass(frozen=True)
class StepKernel:
    """One kind of op instance of a training step: `count` runs of harness family
    `kernel` at `shape` in `dtype`, covering `passes` of category `category`.
    `in_total`: part of the category's time alone; False for a kernel that repeats
    part of another's work (attention's forward, which attention_bwd runs too), shown
    by its own passes only."""

    category: str
    passes: tuple[str, ...]
    what: str
    kernel: str
    shape: dict[str, int] = field(hash=False)
    dtype: str
    count: int
    in_total: bool = True

    def request(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "dtype": self.dtype, "shape": dict(self.shape)}


def step_kernels(shape: ModelShape, micro_batch: int, dtype: str) -> list[StepKernel]:
    """The op instances of one training step of `shape` (the model benches/step/transformer.py
    builds) at `micro_batch` sequences, with T = micro_batch x seq_len tokens and L
    blocks:
    - GEMMs: the planner's step_gemms, per weight matrix the forward product and the two
      backward ones (input and weight gradient), each `count` times (L, the head once);
    - attention: L causal SDPAs over B = micro_batch, H = the query heads (grouped-query
      k and v are repeated to H heads before SDPA, so it runs H heads), S = seq_len,
      D = head_dim: attention_bwd is forward and backward in one case, the category's
      time alone; attention, the forward alone, is set beside the forward pass only;
    - norms: 2 L + 1 (two per block, the final one) over T rows of d_model, RMSNorm or
      LayerNorm as the model has (norm_params 1 or 2), forward;
    - loss: cross-entropy is a log-softmax over the vocabulary, a softmax row op of T
      rows of width V, forward."""
    L, t = shape.n_layers, micro_batch * shape.seq_len
    out = [StepKernel("gemm", ("forward",) if g.phase == "forward" else ("backward",),
                      f"{g.name} {g.phase}", "matmul", {"M": g.M, "N": g.N, "K": g.K},
                      dtype, g.count)
           for g in step_gemms(shape, micro_batch)]
    attn = {"B": micro_batch, "H": shape.heads, "S": shape.seq_len, "D": shape.head_dim,
            "causal": 1}
    out += [StepKernel("attention", ("forward", "backward"), "causal SDPA forward + "
                       "backward", "attention_bwd", attn, dtype, L),
            StepKernel("attention", ("forward",), "causal SDPA forward", "attention",
                       attn, dtype, L, in_total=False)]
    norm = "layernorm" if shape.norm_params == 2 else "rmsnorm"
    out.append(StepKernel("norm", ("forward",), f"{norm} (2 per block + final)", norm,
                          {"M": t, "N": shape.d_model}, ROW_OP_DTYPE, 2 * L + 1))
    out.append(StepKernel("loss/softmax", ("forward",), "cross-entropy's log-softmax "
                          "over the vocabulary", "softmax", {"M": t, "N": shape.vocab},
                          ROW_OP_DTYPE, 1))
    return out


def _ceiling(intensity: float | None, roof_class: str | None, ceilings: Ceilings
             ) -> dict[str, Any]:
    """Which roof bounds a kernel of this FLOP/byte: the compute peak above the ridge,
    memory bandwidth below it (or whichever one is known)."""
    tflops = ceilings.peak_tflops(roof_class) if roof_class else None
    gbps = ceilings.peak_gbps()
    if intensity is None or (tflops is None and gbps is None):
        return {"bound": None, "ceiling_tflops": tflops, "ceiling_gbps": gbps}
    ridge = tflops * 1e3 / gbps if tflops and gbps else None
    memory = tflops is None or (ridge is not None and intensity < ridge)
    return {"bound": "memory" if memory else "compute", "ceiling_tflops": tflops,
            "ceiling_gbps": gbps}


def _rates(flops: float | None, nbytes: float | None, ms: float | None
           ) -> dict[str, float | None]:
    if not ms or flops is None or nbytes is None:
        return {"tflops": None, "gbps": None}
    return {"tflops": flops / ms / 1e9, "gbps": nbytes / ms / 1e6}


def _item(k: StepKernel, r: dict[str, Any]) -> dict[str, Any]:
    """One step kernel with its measurement: count x the row's median, FLOPs, bytes;
    `why` it has none."""
    row = r.get("row")
    ok = row is not None and row.get("status") == "ok" and bool(row.get("ms_median"))
    why = None if ok else (r.get("why") or (row or {}).get("reason")
                           or (row or {}).get("status") or "not run")
    ms = float(row["ms_median"]) if ok else None  # type: ignore[index]
    return {**asdict(k), "passes": list(k.passes), "ms": ms,
            "alone_ms": k.count * ms if ms is not None else None,
            "flops": k.count * row["flops"] if ok else None,  # type: ignore[index]
            "bytes": k.count * row["bytes"] if ok else None,  # type: ignore[index]
            "roof_class": (row or {}).get("roof_class"), "why": why}


def _compare(items: list[dict[str, Any]], prof: dict[str, float], ceilings: Ceilings
             ) -> dict[str, Any]:
    """Profiled time over the items' passes against their time alone, their FLOPs and
    bytes, and their place on the roofline; no figure when one of them was not timed."""
    passes = [p for p in PASSES if any(p in it["passes"] for it in items)]
    step_ms = sum(prof[p] for p in passes)
    missing = [it for it in items if it["ms"] is None]
    out: dict[str, Any] = {"passes": passes, "step_ms": step_ms, "alone_ms": None,
                           "ratio": None, "flops": None, "bytes": None, "intensity": None,
                           "roof_class": None, "bound": None, "ceiling_tflops": None,
                           "ceiling_gbps": None, "alone": _rates(None, None, None),
                           "in_step": _rates(None, None, None),
                           "why": "; ".join(f"{it['kernel']} {it['dtype']}: {it['why']}"
                                            for it in missing) or None}
    if missing or not items:
        return out
    alone = sum(it["alone_ms"] for it in items)
    flops = sum(it["flops"] for it in items)
    nbytes = sum(it["bytes"] for it in items)
    intensity = flops / nbytes if nbytes else None
    rc = next((it["roof_class"] for it in items if it["roof_class"]), None)
    out.update(alone_ms=alone, ratio=step_ms / alone if alone else None, flops=flops,
               bytes=nbytes, intensity=intensity, roof_class=rc,
               alone=_rates(flops, nbytes, alone), in_step=_rates(flops, nbytes, step_ms),
               **_ceiling(intensity, rc, ceilings))
    return out


def explain_report(kernels: list[StepKernel], measured: dict[str, Any],
                   profile: dict[str, dict[str, float]], span_ms: float | None
                   ) -> dict[str, Any]:
    """Per category: the profiled step's time by pass; the same ops alone, the sum of
    count x the measured median at that shape over the category's kernels (those
    `in_total`); the ratio of the profiled time over the passes those kernels cover to
    it; FLOPs, bytes and the roof that bounds them.  Per category and group of passes
    (gemm forward and backward, attention forward and forward + backward...) the same
    comparison in `by_pass`.  Passes and categories no harness kernel covers say so in
    `uncovered`, with their profiled time, and get no figure.  `measured` is
    measure_kernels' answer to [k.request() for k in kernels], in order; `profile` the
    step's split (category -> pass -> ms, benches/step/kernel_split.py)."""
    ceilings = Ceilings(**measured["ceilings"])
    results = measured["results"]
    if len(results) != len(kernels):
        raise ValueError(f"{len(results)} measured results for {len(kernels)} step kernels")
    cats, uncovered = [], []
    for cat in EXPLAIN_CATEGORIES:
        prof = {p: float((profile.get(cat) or {}).get(p, 0.0)) for p in PASSES}
        items = [_item(k, r) for k, r in zip(kernels, results, strict=True)
                 if k.category == cat]
        groups = sorted({tuple(it["passes"]) for it in items},
                        key=lambda g: [PASSES.index(p) for p in g])
        by_pass = [{**_compare([it for it in items if tuple(it["passes"]) == g], prof,
                               ceilings), "group": "+".join(g)} for g in groups]
        total = [it for it in items if it["in_total"]]
        entry = {"category": cat, "profiled_ms": prof,
                 "profiled_total_ms": sum(prof.values()), **_compare(total, prof, ceilings),
                 "by_pass": by_pass, "kernels": items}
        cats.append(entry)
        have = {p for it in total for p in it["passes"]}
        kinds = "/".join(sorted({it["kernel"] for it in total}))
        for p in PASSES:
            if prof[p] and p not in have:
                why = (_UNATTRIBUTED if p == "unattributed" else NO_KERNEL.get(cat)
                       if not total else f"no {kinds} {p} kernel in the harness")
                uncovered.append({"category": cat, "pass": p, "ms": prof[p], "why": why})
        if entry["why"]:
            uncovered.append({"category": cat, "pass": "+".join(entry["passes"]),
                              "ms": entry["step_ms"], "why": entry["why"]})
    total_ms = sum(c["profiled_total_ms"] for c in cats)
    return {"categories": cats, "uncovered": uncovered, "profiled_ms": total_ms,
            "span_ms": span_ms,
            "between_ops_ms": span_ms - total_ms if span_ms is not None else None,
            "device_name": measured.get("device_name"), "provider": measured.get("provider"),
            "peak_source": measured.get("peak_source")}


def _place(c: dict[str, Any], peak_source: str | None) -> tuple[str, str, str]:
    """(alone, in the step, ceiling) in the bound's unit: TFLOP/s against a compute
    peak, GB/s against memory bandwidth; each rate with its fraction of the ceiling, a
    rate above the compute peak flagged (arithmetic.rate_text)."""
    if c["bound"] is None:
        return "-", "-", "-"
    compute = c["bound"] == "compute"
    peak = c["ceiling_tflops"] if compute else c["ceiling_gbps"]
    key, unit = ("tflops", "TFLOP/s") if compute else ("gbps", "GB/s")
    ceiling = f"{c['roof_class']} {peak:.3g} {unit}" if compute else f"memory {peak:.3g} {unit}"

    def fmt(x: float | None) -> str:
        if compute and over_peak(x, peak):
            return rate_text(x, peak, peak_source or "datasheet")
        return "-" if x is None else f"{x:.3g} ({x / peak:.0%})"
    return fmt(c["alone"][key]), fmt(c["in_step"][key]), ceiling


_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "unattributed": "?"}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def explain_sections(x: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The --explain tables: per category the step against its kernels alone, the same
    by pass, what no kernel covers, and each kernel's own time."""
    main, by_pass = [], []
    for c in x["categories"]:
        if not c["profiled_total_ms"] and not c["kernels"]:
            continue
        alone, in_step, ceiling = _place(c, x.get("peak_source"))
        covered = "+".join(_SHORT[p] for p in c["passes"]) if c["alone_ms"] is not None \
            else "-"
        main.append([c["category"], _ms(c["profiled_total_ms"]),
                     f"{_ms(c['step_ms'])} ({covered})" if c["alone_ms"] is not None
                     else "-", _ms(c["alone_ms"]),
                     f"{c['ratio']:.3g}" if c["ratio"] else "-",
                     f"{c['intensity']:.3g}" if c["intensity"] else "-", alone, in_step,
                     ceiling])
        for g in c["by_pass"]:
            by_pass.append([c["category"], g["group"], _ms(g["step_ms"]), _ms(g["alone_ms"]),
                            f"{g['ratio']:.3g}" if g["ratio"] else "-"])
    if x["span_ms"] is not None:
        main.append(["in no op", _ms(x["between_ops_ms"])] + [""] * 7)
        main.append(["step (profiled)", _ms(x["span_ms"])] + [""] * 7)
    header = ["category", "profiled ms", "covered ms", "alone ms", "step / alone",
              "FLOP/byte", "alone", "in the step", "ceiling"]
    gaps = [[u["category"], u["pass"], _ms(u["ms"]), u["why"]] for u in x["uncovered"]]
    if x["span_ms"] is not None:
        gaps.append(["in no op", "", _ms(x["between_ops_ms"]),
                     "the step's span minus its ops: the interpreter between ops, the "
                     "profiler's recording (GPU: idle between kernels)"])
    kernels = []
    for c in x["categories"]:
        for k in c["kernels"]:
            shape = ",".join(f"{d}={v}" for d, v in k["shape"].items())
            kernels.append([c["category"], k["what"], f"{k['kernel']} {k['dtype']}",
                            shape, str(k["count"]), _ms(k["ms"]), _ms(k["alone_ms"]),
                            k["why"] or ""])
    where = f"{x['provider']} kernels alone on {x['device_name']}"
    return [
        (f"Training step against its own kernels (ms per step; {where})", header, main),
        ("The same by pass", ["category", "passes", "profiled ms", "alone ms",
                              "step / alone"], by_pass),
        ("Profiled time no kernel of the harness covers (no figure alone)",
         ["category", "pass", "ms", "why"], gaps),
        ("The step's kernels, each timed alone", ["category", "op", "kernel", "shape", "x",
                                                 "ms", "x * ms", "not timed"], kernels),
    ]
