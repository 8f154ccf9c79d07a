"""A plan as text: the terminal tables (rich) and plan.md, read from the Plan record."""

from __future__ import annotations

import sys

from roofline.plan.arithmetic import fraction_text, rate_text
from roofline.plan.comm import Communication, Scheme
from roofline.plan.plan_record import Plan, PlanModel


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


Section = tuple[str, list[str], list[list[str]]]


def sections(plan: Plan) -> list[Section]:
    """(title, header, rows) of every table: shared by the terminal and plan.md."""
    out = _model_section(plan.model)
    out.append(("Compute and time", ["", "value", "note"],
                _compute_rows(plan) + _budget_rows(plan)))
    out += _versus_section(plan)
    out.append((f"Memory ({plan.policy})", ["", "value", "note"], _memory_rows(plan)))
    out += _gemms_section(plan)
    out += _communication_section(plan.communication)
    if plan.step_measured is not None:
        from roofline.plan.step import step_sections

        out += step_sections(plan.step_measured.report, si, gb)
        if plan.step_measured.explain is not None:
            from roofline.plan.explain import explain_sections

            out += explain_sections(plan.step_measured.explain)
    return out


def _model_section(m: PlanModel | None) -> list[Section]:
    """The model's parameters itemized (a shape), or the count given (--params)."""
    if m and m.shape is not None:
        s = m.shape
        rows = [[k, f"{v:,}", si(v)] for k, v in s.param_items().items() if v]
        rows.append(["total (exact)", f"{m.params:,}", si(m.params)])
        rows.append(["12 d^2 L (approximation)", f"{s.approx_12d2l:,}",
                     f"{si(s.approx_12d2l)} ({s.approx_12d2l / m.params:.0%} of "
                     "exact)"])
        gated = " (gated MLP: 3 d d_ff per layer)" if s.gated else " (2 d d_ff per layer)"
        return [(f"Model {m.name}: {s.describe()}{gated}",
                 ["parameters", "count", ""], rows)]
    if m:
        return [("Model", ["parameters", "count", ""],
                 [["given (--params)", f"{m.params:,.0f}", si(m.params)]])]
    return []


def _compute_rows(plan: Plan) -> list[list[str]]:
    """The run's FLOPs, the devices, their peak and MFU, and the days."""
    p, rows = plan, []
    if p.train_flops:
        rows += [["tokens D", si(p.tokens), p.tokens_source or ""],
                 ["forward 2 N D", f"{p.flops_forward:.3e}", "FLOPs"],
                 ["backward 4 N D", f"{p.flops_backward:.3e}", "FLOPs"],
                 ["training 6 N D", f"{p.train_flops:.3e}", "FLOPs"]]
        if p.attention_flops is not None:
            rows.append(["attention scores (not in 6 N D)", f"{p.attention_flops:.3e}",
                         f"+{p.attention_flops / p.train_flops:.1%} (12 L S d D)"])
    rows += [["device", f"{p.gpus} x {p.device_name}", p.device],
             [f"peak {p.dtype} per device", f"{p.peak_tflops:.4g} TFLOP/s", p.peak_source],
             ["MFU", fraction_text(p.mfu, p.peak_source), f"{p.mfu_source} ({p.mfu_from})"]]
    if p.days is not None:
        rows.append(["days = 6ND / (G x peak x MFU)", f"{p.days:.1f}",
                     f"{p.days_with_attention:.1f} with attention scores"
                     if p.days_with_attention is not None else ""])
    return rows


def _budget_rows(plan: Plan) -> list[list[str]]:
    """--days: what the budget buys, whether its model fits, this model's tokens."""
    b = plan.budget
    if not b:
        return []
    rows = [["budget", f"{b.days:g} days", f"{b.flops:.3e} FLOPs"],
            ["largest compute-optimal model", si(b.max_params_compute_optimal),
             f"on {si(b.tokens_compute_optimal)} tokens (D = 20 N)"]]
    if b.static_bytes_compute_optimal is not None:
        fits = "fits" if b.fits_compute_optimal else "does NOT fit"
        rows.append(["its static memory", gb(b.static_bytes_compute_optimal),
                     f"{fits} in {plan.gpus} x {gb(plan.gpu_memory_bytes)} at "
                     f"{plan.bytes_per_param:g} B/param"])
    if b.tokens_for_this_model is not None:
        rows.append(["tokens this model gets in the budget",
                     si(b.tokens_for_this_model), ""])
    return rows


def _versus_section(plan: Plan) -> list[Section]:
    """--vs: the days on each device."""
    if not plan.versus:
        return []
    v0 = plan.versus[0]
    rows = [[v.name, v.device, f"{v.peak_tflops:.4g}", f"{v.days:.1f}",
             "-" if v.days_with_attention is None else f"{v.days_with_attention:.1f}",
             f"{v.vs_plan:.2f}x"] for v in plan.versus]
    return [(f"Days by device: the same tokens, {plan.gpus} GPU(s) and MFU "
             f"{_pct(plan.mfu)} on each (from {v0.device}; another device's "
             f"MFU may differ), {plan.dtype} datasheet peaks",
             ["device", "key", "peak TFLOP/s", "days", "with attention",
              f"days / {v0.device}'s"], rows)]


def _memory_rows(plan: Plan) -> list[list[str]]:
    """The state's bytes per parameter, on the devices' memory, and what fits."""
    p = plan
    rows = [[k, f"{v:g}", ""] for k, v in p.bytes_per_param_itemized.items()]
    rows.append(["bytes per parameter", f"{p.bytes_per_param:g}", p.policy])
    if p.static_bytes is not None:
        fits = {True: "fits", False: "does NOT fit", None: "?"}[p.fits]
        note = f"{fits} in {p.gpus} x {gb(p.gpu_memory_bytes)}"
        step_fit = p.step_measured.report.memory_fit if p.step_measured else None
        if step_fit:
            note += (f" (the state alone; the measured step peaks at {gb(step_fit.peak)}: "
                     f"{'fits' if step_fit.fits else 'does NOT fit'})")
        rows.append(["static bytes (N x B)", gb(p.static_bytes), note])
    rows.append(["memory", f"{p.gpus} x {gb(p.gpu_memory_bytes)}", p.gpu_memory_source])
    rows.append(["most parameters that fit", si(p.max_params_fit),
                 "static state only: activations come on top"])
    lm = p.model.largest_matrix if p.model else None
    if lm:
        rows.append([f"largest matrix {lm.name} {lm.shape}", gb(lm.bytes_fp32), "in fp32"])
    return rows


def _gemms_section(plan: Plan) -> list[Section]:
    """The step's GEMMs, timed or not, and the step they make."""
    if not plan.gemms:
        return []
    st, peak, src = plan.step, plan.peak_tflops, plan.peak_source
    rows = []
    for g in plan.gemms:
        meas = g.measured_shape if g.measured_shape and g.note != "exact" else ""
        rows.append([g.name, g.phase, g.shape, str(g.count), f"{g.flops:.3g}",
                     rate_text(g.tflops, peak, src, ".4g"), fraction_text(g.mfu, src),
                     "-" if g.ms is None else f"{g.ms:.4g}", _pct(g.share), meas])
    if st.ms is not None:
        rows.append(["step (matmuls only)", "", f"{st.tokens} tokens", "",
                     f"{st.gemm_flops:.3g}", rate_text(st.tflops, peak, src, ".4g"),
                     fraction_text(st.mfu, src), f"{st.ms:.4g}", "100%", ""])
    timed = plan.gemms_timed or ""
    return [(f"GEMMs of one step ({plan.micro_batch} x seq per GPU, {plan.dtype}"
             f"{'; ' + timed if timed else ''})",
             ["weight", "pass", "shape", "x", "FLOPs", "TFLOP/s", "MFU", "ms", "share",
              "run shape"], rows)]


def _communication_section(c: Communication | None) -> list[Section]:
    """The step's communication per scheme (--busbw, --busbw-run)."""
    if not c:
        return []

    def row(name: str, sch: Scheme, how: str) -> list[str]:
        days = (f"{sch.days_overlap:.1f} / {sch.days_serial:.1f}"
                if sch.days_overlap is not None and sch.days_serial is not None else "-")
        return [name, f"{sch.comm_s * 1e3:.4g} ms", "yes" if sch.hides else "no",
                f"{sch.step_s_overlap * 1e3:.4g} / {sch.step_s_serial * 1e3:.4g} ms",
                days, how]
    return [(
        f"Communication per step: {c.gpus} devices, busbw {c.busbw_gbps:.4g} GB/s "
        f"({c.busbw_source}); compute {c.compute_s * 1e3:.4g} ms per step "
        f"({c.compute_basis} FLOPs per token; days on the same basis)",
        ["scheme", "comm", "hides", "step (overlap / serial)",
         "days (overlap / serial)", "formula"],
        [row("data parallel", c.data_parallel,
             f"all_reduce 2(G-1)/G x N x {c.grad_bytes_per_param:g} B / busbw; hides "
             "under the backward"),
         row("fully sharded", c.fsdp,
             f"2 x all_gather (G-1)/G x N x {c.weight_bytes_per_param:g} B + "
             f"reduce_scatter (G-1)/G x N x {c.grad_bytes_per_param:g} B; hides "
             "under the step")])]


def render_markdown(plan: Plan, png: str | None) -> str:
    lines = ["# Training plan", ""]
    for title, header, rows in sections(plan):
        lines += [f"## {title}", "", "| " + " | ".join(h or " " for h in header) + " |",
                  "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]
        lines.append("")
    for w in plan.warnings:
        lines.append(f"> warning: {w}")
    if png:
        lines += ["", f"![step GEMMs on the roofline]({png})", ""]
    if plan.step_measured is not None:
        lines += ["", "![the measured training step on the roofline](step.png)", ""]
    comm = plan.communication
    basis = (f" The communication table's steps and days count {comm.compute_basis} "
             "FLOPs per token." if comm else "")
    lines += [f"Days use 6 N D; the attention scores are shown apart.{basis} MFU is "
              f"{plan.mfu_source} ({plan.mfu_from}). Memory counts parameters, "
              "gradients and optimizer state only.", ""]
    return "\n".join(lines)


def _looks_numeric(cell: str) -> bool:
    return cell[:1].isdigit() or cell[:1] in "-+."


def print_tables(plan: Plan) -> None:
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
    for w in plan.warnings:
        # soft_wrap: a suggested command line must stay copyable, not folded by rich.
        console.print(f"[yellow]warning[/yellow]: {w}", soft_wrap=True)
