"""`plan --measure step --explain`: the step's own kernels derived from the model (counts
and shapes pinned against what the step really runs), the profiled step split by kernel
family and pass (on event lists as torch builds them, and on a real CPU step: the parts
add up to the profiled step), and the report's arithmetic on recorded rows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from benches.step.kernel_split import EXPLAIN_CATEGORIES as PROFILED_CATEGORIES
from benches.step.kernel_split import PASSES as PROFILED_PASSES
from benches.step.kernel_split import span_ms, split_explained
from benches.step.measure import ModelMeasured, measure_model
from benches.step.profile import SPAN, split_ms
from contract.models import ModelShape
from kernels import REGISTRY
from roofline.__main__ import main as roofline_main
from roofline.plan.explain import (
    EXPLAIN_CATEGORIES,
    PASSES,
    ExplainReport,
    KernelsTimed,
    StepKernel,
    explain_report,
    explain_sections,
    step_kernels,
)
from roofline.plan.plan_record import Plan
from roofline.plan.step_plot import plot_step
from tests.test_plan import ROOT

# Llama-style: RMSNorm, gated MLP, grouped-query attention (6 query heads, 2 k/v heads).
GQA = ModelShape("gqa", 96, 2, 200, 500, 16, 6, 2, tied=True, gated=True)
GPT = ModelShape("gpt", 64, 2, 256, 300, 16, 4, 4, tied=True, bias=True, learned_pos=True,
                 norm_params=2)
BATCH = 2


def test_the_profilers_categories_are_the_reports():
    assert PROFILED_CATEGORIES == EXPLAIN_CATEGORIES
    assert PROFILED_PASSES == PASSES


def _by_kernel(kernels: list[StepKernel]) -> dict[str, list[StepKernel]]:
    out: dict[str, list[StepKernel]] = {}
    for k in kernels:
        out.setdefault(k.kernel, []).append(k)
    return out


def test_the_step_kernels_of_a_llama_style_model():
    ks = _by_kernel(step_kernels(GQA, BATCH, "bf16"))
    t = BATCH * GQA.seq_len
    # GQA runs H = 6 query heads: k and v are repeated to 6 heads before SDPA.
    attn = {"B": BATCH, "H": 6, "S": 16, "D": 16, "causal": 1}
    [bwd], [fwd] = ks["attention_bwd"], ks["attention"]
    assert (bwd.shape, bwd.count, bwd.passes, bwd.in_total, bwd.dtype) == \
        (attn, 2, ("forward", "backward"), True, "bf16")
    assert (fwd.shape, fwd.count, fwd.passes, fwd.in_total) == (attn, 2, ("forward",), False)
    # Two RMSNorms per block and the final one, over the fp32 residual stream.
    [norm] = ks["rmsnorm"]
    assert (norm.shape, norm.count, norm.dtype, norm.category) == \
        ({"M": t, "N": 96}, 5, "fp32", "norm")
    assert "layernorm" not in ks
    [loss] = ks["softmax"]
    assert (loss.shape, loss.count, loss.dtype, loss.category) == \
        ({"M": t, "N": 500}, 1, "fp32", "loss/softmax")
    # Five weights (qkv, out, gate_up, down, head), three GEMMs each.
    assert len(ks["matmul"]) == 15
    assert sum(k.count for k in ks["matmul"]) == 3 * (4 * 2 + 1)
    assert {k.passes for k in ks["matmul"]} == {("forward",), ("backward",)}
    assert all(k.dtype == "bf16" for k in ks["matmul"])


def test_a_gpt_style_model_has_layernorms():
    ks = _by_kernel(step_kernels(GPT, BATCH, "fp32"))
    [norm] = ks["layernorm"]
    assert (norm.shape, norm.count) == ({"M": BATCH * 16, "N": 64}, 5)
    assert "rmsnorm" not in ks


@pytest.fixture(scope="module")
def gqa_step() -> ModelMeasured:
    return measure_model(GQA, GQA.n_layers, BATCH, "cpu", "fp32", steps=1, warmup=1)


def _kernel_flops(kernels: list[StepKernel], family: str, passes: tuple[str, ...]) -> int:
    spec = REGISTRY[family]
    return sum(k.count * spec.flops(k.shape, k.dtype) for k in kernels
               if k.kernel == family and k.passes == passes)


def _matches_the_step(kernels: list[StepKernel], m: ModelMeasured) -> bool:
    """The step kernels' FLOPs (count x the family's own formula at the shape) against
    FlopCounterMode's count of the real step: GEMMs forward and backward exactly; the
    attention (counted on a CPU by the counter's SDPA formulas, halved for the causal
    mask) exactly, as the family counts a causal mask."""
    gemm = (_kernel_flops(kernels, "matmul", ("forward",)) == m.flops_forward["gemm"]
            and _kernel_flops(kernels, "matmul", ("backward",))
            == m.flops_backward["gemm"])
    attn_counted = m.flops_forward["attention"] + m.flops_backward["attention"]
    attn = (_kernel_flops(kernels, "attention_bwd", ("forward", "backward"))
            == attn_counted
            and _kernel_flops(kernels, "attention", ("forward",))
            == m.flops_forward["attention"])
    return gemm and attn


def test_the_step_kernels_are_the_ops_the_step_counts(gqa_step):
    assert _matches_the_step(step_kernels(GQA, BATCH, "fp32"), gqa_step)


@pytest.mark.parametrize("break_it", [
    lambda k: replace(k, count=2 * k.count),  # an op count 2x
    lambda k: replace(k, shape={**k.shape, list(k.shape)[0]: 2 * list(k.shape.values())[0]}),
])
@pytest.mark.parametrize("family", ["matmul", "attention_bwd", "attention"])
def test_a_2x_error_in_a_count_or_a_shape_is_caught(gqa_step, break_it, family):
    kernels = step_kernels(GQA, BATCH, "fp32")
    i = next(i for i, k in enumerate(kernels) if k.kernel == family)
    kernels[i] = break_it(kernels[i])
    assert not _matches_the_step(kernels, gqa_step)


def test_the_categories_add_up_to_the_profiled_step(gqa_step):
    """Every op's self time lands in one category and pass: the split adds up to the
    step's coarse split exactly (the same events).  Against the profiled step's span the
    rest is the time in no op: the interpreter between ops and the profiler's recording
    of each event, a few us per op x ~1,300 events (measured on the 2-core VM: 1-3% of
    this ~7 ms CPU step in a quiet minute, 15-22% in the least of five steps while one
    other process ran).  30% bounds that overhead while still failing if the optimizer,
    over a third of this step, went missing; the other categories are held nonzero
    below."""
    explained = gqa_step.profile_explain_ms
    total = sum(ms for cat in explained.values() for ms in cat.values())
    assert total == pytest.approx(sum(gqa_step.profile_ms.values()), rel=1e-9)
    span = gqa_step.profile_span_ms
    assert total <= span * (1 + 1e-9)
    # Preemption only ever adds to the gap (this step is ~7 ms, one scheduler slice on a
    # loaded 2-core VM): the least gap of a few profiled steps is the overhead's.
    gaps = [(span - total) / span]
    while min(gaps) > 0.30 and len(gaps) < 5:
        again = measure_model(GQA, GQA.n_layers, BATCH, "cpu", "fp32", steps=1, warmup=1)
        done = sum(ms for cat in again.profile_explain_ms.values() for ms in cat.values())
        gaps.append((again["profile_span_ms"] - done) / again["profile_span_ms"])
    assert min(gaps) <= 0.30, gaps
    # The optimizer step is its own pass; a composite RMSNorm's backward is the norm's.
    assert explained["optimizer/elementwise"]["optimizer"] == \
        pytest.approx(gqa_step.profile_ms["optimizer"])
    assert explained["norm"]["backward"] > 0 and explained["norm"]["forward"] > 0
    assert explained["gemm"]["backward"] > 0 and explained["attention"]["backward"] > 0


class Events:
    """A profiler event list as torch builds one: ops nested by cpu_parent, backward
    ops under autograd::engine::evaluate_function ranges whose sequence number is the
    one recorded on the forward op that made the node; on a GPU each kernel a device
    event of its own and an entry in its launching op's `kernels`."""

    def __init__(self, gpu: bool = False) -> None:
        self.events: list[FunctionEvent] = []
        self.t = 0.0
        self.gpu = gpu

    def op(self, name: str, parent: FunctionEvent | None = None, us: float = 10.0,
           seq: int = -1, start: float | None = None) -> FunctionEvent:
        self.t += 1
        t0 = self.t if start is None else start
        ev = FunctionEvent(len(self.events) + 1, name, thread=1, start_us=t0, end_us=t0 + us,
                           sequence_nr=seq, use_device="cuda" if self.gpu else None)
        if parent is not None:
            ev.set_cpu_parent(parent)
            parent.append_cpu_child(ev)
        self.events.append(ev)
        return ev

    def kernel(self, name: str, us: float, launcher: FunctionEvent | None, at: float
               ) -> None:
        if launcher is not None:
            launcher.append_kernel(name, 0, us)
        self.events.append(FunctionEvent(len(self.events) + 1, name, thread=7,
                                         start_us=at, end_us=at + us,
                                         device_type=DeviceType.CUDA, use_device="cuda"))


def _step_events(gpu: bool = False) -> tuple[Events, FunctionEvent]:
    """A forward and backward: a composite RMSNorm (pow, mean, rsqrt, mul on a CPU), a
    linear, SDPA, a residual add, the loss; then the backward of each, linked by
    sequence number."""
    ev = Events(gpu)
    span = ev.op(SPAN, us=1000, start=0)
    rms = ev.op("aten::rms_norm", span, us=40, seq=10)
    ev.op("aten::pow", rms, us=10, seq=10)
    ev.op("aten::rsqrt", rms, us=10, seq=11)
    lin = ev.op("aten::linear", span, us=30, seq=12)
    mm = ev.op("aten::mm", lin, us=25, seq=12)
    sdpa = ev.op("aten::scaled_dot_product_attention", span, us=50, seq=13)
    ev.op("aten::_scaled_dot_product_flash_attention_for_cpu", sdpa, us=45, seq=13)
    add = ev.op("aten::add", span, us=5, seq=14)
    ce = ev.op("aten::cross_entropy_loss", span, us=20, seq=15)
    ev.op("aten::_log_softmax", ce, us=15, seq=15)

    def node(name: str, seq: int, us: float) -> FunctionEvent:
        rng = ev.op(f"autograd::engine::evaluate_function: {name}", span, us=us, seq=seq)
        return ev.op(name, rng, us=us - 1)
    ev.op("aten::mul", node("RsqrtBackward0", 11, 30), us=20)  # the norm's, by its link
    ev.op("aten::mul", node("PowBackward0", 10, 20), us=10)
    ev.op("aten::mm", node("MmBackward0", 12, 60), us=50)
    ev.op("aten::_scaled_dot_product_flash_attention_for_cpu_backward",
          node("ScaledDotProductFlashAttentionForCpuBackward0", 13, 90), us=80)
    ev.op("aten::clone", node("AddBackward0", 14, 8), us=4)
    ev.op("aten::_log_softmax_backward_data", node("LogSoftmaxBackward0", 15, 12), us=9)
    if gpu:
        ev.kernel("rms_norm_kernel", 3.0, rms.cpu_children[0], 2000)
        ev.kernel("nvjet_hsh_128x256", 7.0, mm, 2010)
        ev.kernel("flash_fwd_kernel", 11.0, sdpa.cpu_children[0], 2020)
        ev.kernel("elementwise_kernel", 1.0, add, 2040)
        ev.kernel("nvjet_hsh_64x8_64x16", 5.0, None, 2050)  # no op claims it
    return ev, span


def test_cpu_self_times_by_family_and_pass():
    ev, span = _step_events()
    ms = split_explained(ev.events, on_gpu=False)
    us = {c: {p: round(v * 1e3, 6) for p, v in d.items() if v} for c, d in ms.items()
          if any(d.values())}
    assert us == {
        # rms_norm 40 (pow 10 and rsqrt 10 in it); backward: the two nodes' ranges
        # (1 us each), their ops (29 - 20, 19 - 10) and the muls (20, 10).
        "norm": {"forward": 40, "backward": 50},
        # mm 25 (aten::linear's own 5 is no kind of work, as in the coarse split); the
        # MmBackward0 node's own time is its forward mm's kind.
        "gemm": {"forward": 25, "backward": 60},
        "other": {"forward": 5},
        "attention": {"forward": 50, "backward": 90},
        "optimizer/elementwise": {"forward": 5, "backward": 8},
        "loss/softmax": {"forward": 20, "backward": 12},
    }
    # The same events as the coarse split, each once; the span's own time is in no op.
    total = sum(v for d in ms.values() for v in d.values())
    assert total == pytest.approx(sum(split_ms(ev.events, on_gpu=False).values()))
    assert span.cpu_time_total / 1e3 - total == pytest.approx(span.self_cpu_time_total / 1e3)


def test_gpu_kernels_by_family_once_each():
    ev, _ = _step_events(gpu=True)
    ms = split_explained(ev.events, on_gpu=True)
    assert ms["norm"]["forward"] == pytest.approx(0.003)
    assert ms["gemm"]["forward"] == pytest.approx(0.007)
    assert ms["attention"]["forward"] == pytest.approx(0.011)
    assert ms["optimizer/elementwise"]["forward"] == pytest.approx(0.001)
    # A kernel no op launched: its category by its name, its pass unknown.
    assert ms["gemm"]["unattributed"] == pytest.approx(0.005)
    total = sum(v for d in ms.values() for v in d.values())
    assert total == pytest.approx(0.027)
    assert total == pytest.approx(sum(split_ms(ev.events, on_gpu=True).values()))
    assert span_ms(ev.events, on_gpu=True) == pytest.approx(0.055)  # 2000 to 2055 us


def _measured(kernels: list[StepKernel], ms: dict[str, float | None],
              why: dict[str, str] | None = None) -> dict:
    """measure_kernels' answer as the sweep gives it: a row per request with the
    family's own FLOPs and bytes; `ms` per family (None: no such family).  Read as the
    planner reads it with KernelsTimed.from_json."""
    results = []
    for k in kernels:
        t = ms.get(k.kernel)
        if t is None:
            results.append({**k.request(), "row": None,
                            "why": (why or {}).get(k.kernel, f"no '{k.kernel}' family")})
            continue
        spec = REGISTRY[k.kernel]
        results.append({**k.request(), "why": None, "row": {
            "kernel": k.kernel, "provider": "torch", "dtype": k.dtype,
            "shape": ",".join(f"{d}={v}" for d, v in k.shape.items()), "status": "ok",
            "ms_median": t, "flops": spec.flops(k.shape, k.dtype),
            "bytes": spec.nbytes(k.shape, k.dtype), "roof_class": "fp32"}})
    return {"results": results, "device_name": "test CPU", "provider": "torch",
            "ceilings": {"datasheet": None,
                         "measured": {"tflops": {"fp32": 1.0}, "hbm_gbps": 100.0}}}


PROFILE = {"gemm": {"forward": 3.0, "backward": 6.0},
           "attention": {"forward": 1.0, "backward": 2.0},
           "norm": {"forward": 0.5, "backward": 1.0},
           "loss/softmax": {"forward": 0.2, "backward": 0.1},
           "optimizer/elementwise": {"forward": 0.3, "backward": 0.4, "optimizer": 4.0},
           "other": {"forward": 0.05}}


def _explained(kernels: list[StepKernel], measured: dict, span: float | None = 20.0
               ) -> ExplainReport:
    return explain_report(kernels, KernelsTimed.from_json(measured), PROFILE, span_ms=span)


def test_the_report_sums_count_x_time_over_the_steps_ops():
    kernels = step_kernels(GQA, BATCH, "fp32")
    times = {"matmul": 0.01, "attention_bwd": 0.2, "attention": 0.05, "rmsnorm": 0.02,
             "softmax": 0.03}
    x = _explained(kernels, _measured(kernels, times))
    cats = {c.category: c for c in x.categories}
    gemm = cats["gemm"].comparison
    assert gemm.alone_ms == pytest.approx(0.01 * 27)  # 27 GEMMs a step
    assert gemm.step_ms == pytest.approx(9.0)
    assert gemm.ratio == pytest.approx(9.0 / 0.27)
    assert gemm.flops == _kernel_flops(kernels, "matmul", ("forward",)) + \
        _kernel_flops(kernels, "matmul", ("backward",))
    # Attention: forward + backward (attention_bwd, per block) against both passes; the
    # forward alone beside the forward pass only.
    attn = cats["attention"].comparison
    assert (attn.alone_ms, attn.step_ms) == (pytest.approx(0.4), pytest.approx(3.0))
    assert {g.group: (g.comparison.step_ms, g.comparison.alone_ms)
            for g in cats["attention"].by_pass} == \
        {"forward": (pytest.approx(1.0), pytest.approx(0.1)),
         "forward+backward": (pytest.approx(3.0), pytest.approx(0.4))}
    # Norms: 5 forward, against the forward pass; the backward has no kernel.
    norm = cats["norm"].comparison
    assert (norm.alone_ms, norm.step_ms) == (pytest.approx(0.1), pytest.approx(0.5))
    assert norm.passes == ("forward",)
    # The norm's place: memory-bound (FLOP/byte far under the ridge of 10), in GB/s.
    assert norm.bound == "memory" and norm.ceiling_gbps == 100.0
    assert norm.alone.gbps == pytest.approx(norm.bytes / 0.1e-3 / 1e9)
    # The GEMMs' FLOP/byte (about 11) against the ridge at 100 GB/s: under it at
    # 10 TFLOP/s (ridge 100, memory bound), over it at 0.1 TFLOP/s (ridge 1: compute
    # bound, in TFLOP/s).
    assert 1 < gemm.intensity < 100
    for peak, bound in ((10.0, "memory"), (0.1, "compute")):
        m = _measured(kernels, times)
        m["ceilings"]["measured"]["tflops"]["fp32"] = peak
        g = _explained(kernels, m).categories[0].comparison
        assert (g.bound, g.ceiling_tflops) == (bound, peak)
    assert g.alone.tflops == pytest.approx(g.flops / 0.27e-3 / 1e12)
    gaps = {(u.category, u.pass_): u for u in x.uncovered}
    assert set(gaps) == {("norm", "backward"), ("loss/softmax", "backward"),
                         ("optimizer/elementwise", "forward"),
                         ("optimizer/elementwise", "backward"),
                         ("optimizer/elementwise", "optimizer"), ("other", "forward")}
    assert cats["optimizer/elementwise"].comparison.alone_ms is None
    assert x.between_ops_ms == pytest.approx(20.0 - 18.55)
    # plan.json's form reads back as the same report.
    assert ExplainReport.from_json(json.loads(json.dumps(x.to_json()))) == x
    # A 2x error in one kernel's count moves the category's time alone.
    doubled = [replace(k, count=2 * k.count) if k.kernel == "rmsnorm" else k
               for k in kernels]
    y = _explained(doubled, _measured(doubled, times))
    assert {c.category: c for c in y.categories}["norm"].comparison.alone_ms == \
        pytest.approx(0.2)


def test_a_family_the_harness_lacks_gets_no_figure():
    kernels = step_kernels(GQA, BATCH, "fp32")
    times = {"matmul": 0.01, "attention": 0.05, "rmsnorm": 0.02, "softmax": 0.03}
    x = _explained(kernels, _measured(kernels, times,
                                      {"attention_bwd": "no 'attention_bwd' family"}), None)
    cat = {c.category: c for c in x.categories}["attention"]
    attn = cat.comparison
    assert attn.alone_ms is None and attn.ratio is None
    assert "no 'attention_bwd' family" in attn.why
    assert any(u.category == "attention" and "attention_bwd" in u.why
               for u in x.uncovered)
    # The forward alone is still set beside the forward pass.
    assert cat.by_pass[0].comparison.alone_ms == pytest.approx(0.1)
    tables = explain_sections(x)
    main = {r[0]: r for r in tables[0][2]}
    assert main["attention"][3] == "-" and main["attention"][4] == "-"


def test_explain_goes_with_measure_step(capsys):
    code = roofline_main(["plan", "--d-model", "64", "--layers", "2", "--device", "cpu",
                          "--measure", "--explain", "--no-save"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "--explain goes with --measure step" in err


def test_the_cli_explains_a_step(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the CPU ceilings cache of results/.ceilings
    code = roofline_main(["plan", "--d-model", "32", "--layers", "1", "--heads", "2",
                          "--d-ff", "64", "--vocab", "64", "--seq-len", "16", "--device",
                          "cpu", "--measure", "step", "--micro-batch", "2", "--steps", "1",
                          "--explain", "--rep-ms", "2", "--json", "--out",
                          str(tmp_path / "p")])
    out = capsys.readouterr()
    assert code == 0, out.err
    plan = json.loads(out.out)
    x = plan["step_measured"]["explain"]
    assert json.loads(json.dumps(ExplainReport.from_json(x).to_json())) == x
    cats = {c["category"]: c for c in x["categories"]}
    assert list(cats) == list(EXPLAIN_CATEGORIES)
    assert cats["gemm"]["alone_ms"] > 0 and cats["gemm"]["ratio"] > 0
    assert cats["norm"]["passes"] == ["forward"]
    assert cats["optimizer/elementwise"]["alone_ms"] is None
    assert x["span_ms"] >= x["profiled_ms"]
    md = (tmp_path / "p" / "plan.md").read_text()
    assert "Training step against its own kernels" in md
    assert (tmp_path / "p" / "step.png").stat().st_size > 0
    # step.png: per category the profiled bar, and the bar alone only where timed.
    fig = plot_step(Plan.from_json(plan))
    gids = {a.get_gid() for ax in fig.axes for a in ax.get_children() + ax.patches
            if a.get_gid()}
    for cat in ("gemm", "attention", "norm", "loss/softmax"):
        assert {f"explain:bar:step:{cat}", f"explain:bar:alone:{cat}",
                f"explain:step:{cat}", f"explain:alone:{cat}"} <= gids
    assert "explain:bar:step:optimizer/elementwise" in gids
    assert "explain:bar:alone:optimizer/elementwise" not in gids
