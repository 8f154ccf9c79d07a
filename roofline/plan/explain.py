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

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from contract.ceilings import Ceilings
from contract.models import ModelShape
from contract.record import RunRow, parse_row
from roofline.plan.arithmetic import over_peak, rate_text, step_gemms
from roofline.plan.harness import KernelRequest

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

    def request(self) -> KernelRequest:
        return KernelRequest(kernel=self.kernel, dtype=self.dtype, shape=dict(self.shape))


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


@dataclass(frozen=True)
class KernelsTimed:
    """measure_kernels' answer (benches/step/gemms.py), read once: per request, in the
    requests' order, its sweep row (contract.record's loader) or why it was not run;
    the ceilings the rows are held to and where they ran."""

    ceilings: Ceilings
    rows: tuple[RunRow | None, ...]
    whys: tuple[str | None, ...]
    device_name: str | None
    provider: str | None
    peak_source: str | None

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> KernelsTimed:
        """The one reading of the harness's document (benches writes it, this reads
        it; kept whole in plan.json's `explain_measurement`)."""
        results = doc["results"]
        return cls(Ceilings(**doc["ceilings"]),
                   tuple(parse_row(res["row"]) if res.get("row") is not None else None
                         for res in results),
                   tuple(res.get("why") for res in results), doc.get("device_name"),
                   doc.get("provider"), doc.get("peak_source"))


@dataclass(frozen=True)
class Rates:
    """A rate in TFLOP/s and GB/s (None where a time, FLOPs or bytes is missing)."""

    tflops: float | None = None
    gbps: float | None = None


@dataclass(frozen=True)
class Comparison:
    """Profiled time over some passes against the same kernels alone, their FLOPs,
    bytes and place on the roofline; `why` a kernel of them was not timed (then no
    figure).  Its fields in the plan.json's order."""

    passes: tuple[str, ...]
    step_ms: float
    alone_ms: float | None = None
    ratio: float | None = None
    flops: float | None = None
    bytes: float | None = None
    intensity: float | None = None
    roof_class: str | None = None
    bound: str | None = None
    ceiling_tflops: float | None = None
    ceiling_gbps: float | None = None
    alone: Rates = Rates()
    in_step: Rates = Rates()
    why: str | None = None


@dataclass(frozen=True)
class PassGroup:
    """One group of passes of a category (gemm forward, attention forward+backward...)
    and its comparison."""

    group: str
    comparison: Comparison


@dataclass(frozen=True)
class KernelTimed:
    """A step kernel with its measurement: its median `ms`, count x it, count x its
    FLOPs and bytes; `why` it has none."""

    kernel: StepKernel
    ms: float | None
    alone_ms: float | None
    flops: float | None
    bytes: float | None
    roof_class: str | None
    why: str | None


@dataclass(frozen=True)
class CategoryExplained:
    """One category: the profiled time by pass and in all, the comparison over the
    kernels `in_total`, the same by group of passes, and its kernels."""

    category: str
    profiled_ms: dict[str, float]
    profiled_total_ms: float
    comparison: Comparison
    by_pass: tuple[PassGroup, ...]
    kernels: tuple[KernelTimed, ...]


@dataclass(frozen=True)
class Uncovered:
    """Profiled time of a category's pass no harness kernel covers, and why."""

    category: str
    pass_: str
    ms: float
    why: str | None


@dataclass(frozen=True)
class ExplainReport:
    """explain_report's answer; plan.json's `step_measured.explain` (to_json)."""

    categories: tuple[CategoryExplained, ...]
    uncovered: tuple[Uncovered, ...]
    profiled_ms: float
    span_ms: float | None
    between_ops_ms: float | None
    device_name: str | None
    provider: str | None
    peak_source: str | None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "categories": [_category_json(c) for c in self.categories],
                "uncovered": [{"category": u.category, "pass": u.pass_, "ms": u.ms,
                               "why": u.why} for u in self.uncovered]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ExplainReport:
        """The report back from plan.json (to_json's), for its renderers."""
        return cls(tuple(_category_of(c) for c in doc["categories"]),
                   tuple(Uncovered(u["category"], u["pass"], u["ms"], u["why"])
                         for u in doc["uncovered"]),
                   doc["profiled_ms"], doc["span_ms"], doc["between_ops_ms"],
                   doc["device_name"], doc["provider"], doc["peak_source"])


def _category_json(c: CategoryExplained) -> dict[str, Any]:
    """A category as plan.json has it: its comparison's fields inline, each kernel's
    StepKernel fields beside its measurement."""
    return {"category": c.category, "profiled_ms": c.profiled_ms,
            "profiled_total_ms": c.profiled_total_ms, **asdict(c.comparison),
            "by_pass": [{**asdict(g.comparison), "group": g.group} for g in c.by_pass],
            "kernels": [{**asdict(k.kernel), "passes": list(k.kernel.passes), "ms": k.ms,
                         "alone_ms": k.alone_ms, "flops": k.flops, "bytes": k.bytes,
                         "roof_class": k.roof_class, "why": k.why} for k in c.kernels]}


_COMPARED = [f.name for f in fields(Comparison)]
_KERNEL = [f.name for f in fields(StepKernel)]


def _comparison_of(d: dict[str, Any]) -> Comparison:  # plan.json's, as _category_json
    return Comparison(**{**{k: d[k] for k in _COMPARED}, "passes": tuple(d["passes"]),
                         "alone": Rates(**d["alone"]), "in_step": Rates(**d["in_step"])})


def _category_of(d: dict[str, Any]) -> CategoryExplained:
    """_category_json's inverse."""
    kernels = tuple(
        KernelTimed(StepKernel(**{**{f: k[f] for f in _KERNEL}, "passes": tuple(k["passes"])}),
                    k["ms"], k["alone_ms"], k["flops"], k["bytes"], k["roof_class"], k["why"])
        for k in d["kernels"])
    return CategoryExplained(d["category"], d["profiled_ms"], d["profiled_total_ms"],
                             _comparison_of(d),
                             tuple(PassGroup(g["group"], _comparison_of(g))
                                   for g in d["by_pass"]), kernels)


def _ceiling(intensity: float | None, roof_class: str | None, ceilings: Ceilings
             ) -> tuple[str | None, float | None, float | None]:
    """(the bound, the compute peak, the memory bandwidth): which roof bounds a kernel
    of this FLOP/byte, the compute peak above the ridge, memory bandwidth below it (or
    whichever one is known)."""
    tflops = ceilings.peak_tflops(roof_class) if roof_class else None
    gbps = ceilings.peak_gbps()
    if intensity is None or (tflops is None and gbps is None):
        return None, tflops, gbps
    ridge = tflops * 1e3 / gbps if tflops and gbps else None
    memory = tflops is None or (ridge is not None and intensity < ridge)
    return "memory" if memory else "compute", tflops, gbps


def _rates(flops: float | None, nbytes: float | None, ms: float | None) -> Rates:
    if not ms or flops is None or nbytes is None:
        return Rates()
    return Rates(flops / ms / 1e9, nbytes / ms / 1e6)


def _item(k: StepKernel, row: RunRow | None, why: str | None) -> KernelTimed:
    """One step kernel with its measurement: count x the row's median, FLOPs, bytes;
    `why` it has none."""
    ok = row is not None and row.status == "ok" and bool(row.timing.ms_median)
    if row is None or not ok:
        return KernelTimed(k, None, None, None, None,
                           row.accounting.roof_class if row is not None else None,
                           why or (row.reason or row.status if row is not None else None)
                           or "not run")
    ms = float(row.timing.ms_median)  # type: ignore[arg-type]
    return KernelTimed(k, ms, k.count * ms, k.count * row.accounting.flops,
                       k.count * row.accounting.bytes, row.accounting.roof_class, None)


def _compare(items: list[KernelTimed], prof: dict[str, float], ceilings: Ceilings
             ) -> Comparison:
    """Profiled time over the items' passes against their time alone, their FLOPs and
    bytes, and their place on the roofline; no figure when one of them was not timed."""
    passes = tuple(p for p in PASSES if any(p in it.kernel.passes for it in items))
    step_ms = sum(prof[p] for p in passes)
    missing = [it for it in items if it.ms is None]
    out = Comparison(passes, step_ms,
                     why="; ".join(f"{it.kernel.kernel} {it.kernel.dtype}: {it.why}"
                                   for it in missing) or None)
    if missing or not items:
        return out
    alone = sum(it.alone_ms or 0.0 for it in items)
    flops = sum(it.flops or 0 for it in items)
    nbytes = sum(it.bytes or 0 for it in items)
    intensity = flops / nbytes if nbytes else None
    rc = next((it.roof_class for it in items if it.roof_class), None)
    bound, tflops, gbps = _ceiling(intensity, rc, ceilings)
    return replace(out, alone_ms=alone, ratio=step_ms / alone if alone else None,
                   flops=flops, bytes=nbytes, intensity=intensity, roof_class=rc,
                   bound=bound, ceiling_tflops=tflops, ceiling_gbps=gbps,
                   alone=_rates(flops, nbytes, alone),
                   in_step=_rates(flops, nbytes, step_ms))


def _explain_category(cat: str, kernels: list[StepKernel], timed: KernelsTimed,
                      profile: dict[str, dict[str, float]]
                      ) -> tuple[CategoryExplained, list[Uncovered]]:
    """One category of explain_report, and its passes no kernel covers."""
    prof = {p: float((profile.get(cat) or {}).get(p, 0.0)) for p in PASSES}
    items = [_item(k, row, why)
             for k, row, why in zip(kernels, timed.rows, timed.whys, strict=True)
             if k.category == cat]
    groups = sorted({it.kernel.passes for it in items},
                    key=lambda g: [PASSES.index(p) for p in g])
    by_pass = tuple(PassGroup("+".join(g), _compare(
        [it for it in items if it.kernel.passes == g], prof, timed.ceilings))
        for g in groups)
    total = [it for it in items if it.kernel.in_total]
    entry = CategoryExplained(cat, prof, sum(prof.values()),
                              _compare(total, prof, timed.ceilings), by_pass, tuple(items))
    have = {p for it in total for p in it.kernel.passes}
    kinds = "/".join(sorted({it.kernel.kernel for it in total}))
    uncovered = []
    for p in PASSES:
        if prof[p] and p not in have:
            why = (_UNATTRIBUTED if p == "unattributed" else NO_KERNEL.get(cat)
                   if not total else f"no {kinds} {p} kernel in the harness")
            uncovered.append(Uncovered(cat, p, prof[p], why))
    c = entry.comparison
    if c.why:
        uncovered.append(Uncovered(cat, "+".join(c.passes), c.step_ms, c.why))
    return entry, uncovered


def explain_report(kernels: list[StepKernel], measured: KernelsTimed,
                   profile: dict[str, dict[str, float]], span_ms: float | None
                   ) -> ExplainReport:
    """Per category: the profiled step's time by pass; the same ops alone, the sum of
    count x the measured median at that shape over the category's kernels (those
    `in_total`); the ratio of the profiled time over the passes those kernels cover to
    it; FLOPs, bytes and the roof that bounds them.  Per category and group of passes
    (gemm forward and backward, attention forward and forward + backward...) the same
    comparison in `by_pass`.  Passes and categories no harness kernel covers say so in
    `uncovered`, with their profiled time, and get no figure.  `measured` is
    measure_kernels' answer to [k.request() for k in kernels], in order; `profile` the
    step's split (category -> pass -> ms, benches/step/kernel_split.py)."""
    if len(measured.rows) != len(kernels):
        raise ValueError(f"{len(measured.rows)} measured results for {len(kernels)} "
                         "step kernels")
    cats, uncovered = [], []
    for cat in EXPLAIN_CATEGORIES:
        entry, gaps = _explain_category(cat, kernels, measured, profile)
        cats.append(entry)
        uncovered += gaps
    total_ms = sum(c.profiled_total_ms for c in cats)
    return ExplainReport(tuple(cats), tuple(uncovered), total_ms, span_ms,
                         span_ms - total_ms if span_ms is not None else None,
                         measured.device_name, measured.provider, measured.peak_source)


def _place(c: Comparison, peak_source: str | None) -> tuple[str, str, str]:
    """(alone, in the step, ceiling) in the bound's unit: TFLOP/s against a compute
    peak, GB/s against memory bandwidth; each rate with its fraction of the ceiling, a
    rate above the compute peak flagged (arithmetic.rate_text)."""
    if c.bound is None:
        return "-", "-", "-"
    compute = c.bound == "compute"
    peak = (c.ceiling_tflops if compute else c.ceiling_gbps) or float("nan")
    unit = "TFLOP/s" if compute else "GB/s"
    ceiling = f"{c.roof_class} {peak:.3g} {unit}" if compute else f"memory {peak:.3g} {unit}"

    def fmt(x: float | None) -> str:
        if compute and over_peak(x, peak):
            return rate_text(x, peak, peak_source or "datasheet")
        return "-" if x is None else f"{x:.3g} ({x / peak:.0%})"

    def rate(r: Rates) -> float | None:
        return r.tflops if compute else r.gbps
    return fmt(rate(c.alone)), fmt(rate(c.in_step)), ceiling


_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "unattributed": "?"}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _ratio(c: Comparison) -> str:
    return f"{c.ratio:.3g}" if c.ratio else "-"


def _main_rows(x: ExplainReport) -> tuple[list[list[str]], list[list[str]]]:
    """Per category the step against its kernels alone; the same by pass."""
    main, by_pass = [], []
    for cat in x.categories:
        if not cat.profiled_total_ms and not cat.kernels:
            continue
        c = cat.comparison
        alone, in_step, ceiling = _place(c, x.peak_source)
        covered = "+".join(_SHORT[p] for p in c.passes) if c.alone_ms is not None else "-"
        main.append([cat.category, _ms(cat.profiled_total_ms),
                     f"{_ms(c.step_ms)} ({covered})" if c.alone_ms is not None else "-",
                     _ms(c.alone_ms), _ratio(c),
                     f"{c.intensity:.3g}" if c.intensity else "-", alone, in_step, ceiling])
        by_pass += [[cat.category, g.group, _ms(g.comparison.step_ms),
                     _ms(g.comparison.alone_ms), _ratio(g.comparison)] for g in cat.by_pass]
    if x.span_ms is not None:
        main.append(["in no op", _ms(x.between_ops_ms)] + [""] * 7)
        main.append(["step (profiled)", _ms(x.span_ms)] + [""] * 7)
    return main, by_pass


def explain_sections(x: ExplainReport) -> list[tuple[str, list[str], list[list[str]]]]:
    """The --explain tables: per category the step against its kernels alone, the same
    by pass, what no kernel covers, and each kernel's own time."""
    main, by_pass = _main_rows(x)
    header = ["category", "profiled ms", "covered ms", "alone ms", "step / alone",
              "FLOP/byte", "alone", "in the step", "ceiling"]
    gaps = [[u.category, u.pass_, _ms(u.ms), u.why or ""] for u in x.uncovered]
    if x.span_ms is not None:
        gaps.append(["in no op", "", _ms(x.between_ops_ms),
                     "the step's span minus its ops: the interpreter between ops, the "
                     "profiler's recording (GPU: idle between kernels)"])
    kernels = []
    for c in x.categories:
        for k in c.kernels:
            shape = ",".join(f"{d}={v}" for d, v in k.kernel.shape.items())
            kernels.append([c.category, k.kernel.what, f"{k.kernel.kernel} {k.kernel.dtype}",
                            shape, str(k.kernel.count), _ms(k.ms), _ms(k.alone_ms),
                            k.why or ""])
    where = f"{x.provider} kernels alone on {x.device_name}"
    return [
        (f"Training step against its own kernels (ms per step; {where})", header, main),
        ("The same by pass", ["category", "passes", "profiled ms", "alone ms",
                              "step / alone"], by_pass),
        ("Profiled time no kernel of the harness covers (no figure alone)",
         ["category", "pass", "ms", "why"], gaps),
        ("The step's kernels, each timed alone", ["category", "op", "kernel", "shape", "x",
                                                 "ms", "x * ms", "not timed"], kernels),
    ]
