"""The row-op families (softmax, layernorm, rmsnorm): their FLOP and byte conventions,
float64 references, Triton kernels (one block, several rows a program, looped) in the
interpreter, shape presets, and a small CPU run through the list, figures, summary and
gate."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from benches.sweep.shapes import CPU_PRESETS, GPU_PRESETS, parse_sizes, preset_shapes, shapes_for
from kernels import REGISTRY
from kernels import rowops as ro
from tests.run_docs import doc_of

NAMES = ("softmax", "layernorm", "rmsnorm")
# Unit roundoff of the output formats: both providers compute in fp32 and round y once,
# so their normwise error stays below u (measured ~0.5 u); a kernel that computed in the
# storage format, or rounded twice, would not.  fp32: a few fp32 ulps of exp/sqrt/sums.
U = {"fp32": 1e-6, "fp16": 2.0**-11, "bf16": 2.0**-8}


def run(name: str, provider: str, dtype: str, shape: dict, inputs=None) -> tuple:
    spec = REGISTRY[name]
    inputs = inputs or spec.make_inputs(shape, dtype, 0, "cpu")
    out = spec.alloc_out(inputs, dtype).fill_(float("nan"))
    got = spec.providers[provider].fn(inputs, out)
    return spec.check(got, inputs, dtype), got, inputs


# ---- the registry and the accounting --------------------------------------------------------

def test_registered_with_the_agreed_interface():
    for name in NAMES:
        spec = REGISTRY[name]
        assert spec.dims == ("M", "N")
        assert spec.dtypes == ("fp32", "fp16", "bf16")
        assert set(spec.providers) == {"torch", "triton", "compile", "compile-max"}
        assert spec.roof_class("bf16") == "fp32" and not spec.matrix_unit


@pytest.mark.parametrize("name,shape,dtype,flops,nbytes", [
    # softmax: 5 FLOPs an element; x in, y out.
    ("softmax", {"M": 3, "N": 10}, "fp32", 5 * 30, 2 * 30 * 4),
    ("softmax", {"M": 4096, "N": 1024}, "bf16", 5 * 4096 * 1024, 2 * 4096 * 1024 * 2),
    # layernorm: 7 an element; x, y and the weight and bias vectors.
    ("layernorm", {"M": 3, "N": 10}, "fp16", 7 * 30, (2 * 30 + 2 * 10) * 2),
    ("layernorm", {"M": 2, "N": 5}, "fp32", 70, (20 + 10) * 4),
    # rmsnorm: 4 an element; x, y and the weight.
    ("rmsnorm", {"M": 3, "N": 10}, "bf16", 4 * 30, (2 * 30 + 10) * 2),
    ("rmsnorm", {"M": 16384, "N": 16384}, "fp32", 4 * 16384**2, (2 * 16384 + 1) * 16384 * 4),
])
def test_counts(name, shape, dtype, flops, nbytes):
    spec = REGISTRY[name]
    assert spec.flops(shape, dtype) == flops
    assert spec.nbytes(shape, dtype) == nbytes


def test_formulas_as_listed():
    got = {n: (REGISTRY[n].flops_formula.split("  ")[0], REGISTRY[n].bytes_formula)
           for n in NAMES}
    assert got == {"softmax": ("5 M N", "2 M N b"), "layernorm": ("7 M N", "2 M N b + 2 N b"),
                   "rmsnorm": ("4 M N", "2 M N b + N b")}


def test_flop_counter_counts_none_of_them():
    """The module's own convention stands in for FlopCounterMode, which has no formula
    for these ops: if it ever counts them, the convention must be checked against it."""
    from torch.utils.flop_counter import FlopCounterMode

    for name in NAMES:
        spec = REGISTRY[name]
        inputs = spec.make_inputs({"M": 8, "N": 64}, "fp32", 0, "cpu")
        with FlopCounterMode(display=False) as counter:
            spec.providers["torch"].fn(inputs, spec.alloc_out(inputs, "fp32"))
        assert counter.get_total_flops() == 0, name
        assert spec.flops({"M": 8, "N": 64}, "fp32") > 0


# ---- references and correctness -------------------------------------------------------------

def test_references_match_torch_in_float64():
    """The explicit float64 formulas are the ops torch names: softmax over the last dim,
    F.layer_norm (biased variance, weight and bias), F.rms_norm, eps 1e-5."""
    x = torch.randn(5, 33, dtype=torch.float64) * 3 + 2
    w = torch.randn(33, dtype=torch.float64)
    b = torch.randn(33, dtype=torch.float64)
    torch.testing.assert_close(ro.OPS["softmax"].math(x), torch.softmax(x, -1))
    torch.testing.assert_close(ro.OPS["layernorm"].math(x, w, b),
                               F.layer_norm(x, (33,), w, b, 1e-5))
    torch.testing.assert_close(ro.OPS["rmsnorm"].math(x, w), F.rms_norm(x, (33,), w, 1e-5))
    assert ro.EPS == 1e-5


def test_inputs_have_row_offsets_and_nontrivial_parameters():
    inputs = REGISTRY["layernorm"].make_inputs({"M": 64, "N": 256}, "fp32", 0, "cpu")
    # Rows sit at different levels (a mean the norms must remove) ...
    assert inputs["x"].mean(dim=1).std() > 1.0
    # ... and the weight and bias are not 1 and 0, so ignoring either fails the check.
    assert 0.1 < inputs["w"].std() < 0.5 and inputs["b"].abs().mean() > 0.1
    assert set(REGISTRY["rmsnorm"].make_inputs({"M": 2, "N": 8}, "fp32", 0, "cpu")) == {"x", "w"}
    assert set(REGISTRY["softmax"].make_inputs({"M": 2, "N": 8}, "fp32", 0, "cpu")) == {"x"}


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_torch_within_one_rounding(name, dtype):
    err, _, _ = run(name, "torch", dtype, {"M": 37, "N": 1000})
    assert err <= U[dtype]


@pytest.mark.interpreter
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_triton_within_one_rounding_one_block_and_looped(name, dtype):
    # 1000: several rows a program; 16500: past MAX_BLOCK_N, the looped kernel.
    for shape in ({"M": 37, "N": 1000}, {"M": 2, "N": 16500}):
        err, _, _ = run(name, "triton", dtype, shape)
        assert err <= U[dtype], (shape, err)


def test_plan_by_width():
    # (looped, ROWS, BLOCK_N, num_warps): 4096-element tiles at small widths ...
    assert ro.plan(1000) == (False, 4, 1024, 8)
    assert ro.plan(64) == (False, 64, 64, 8)
    assert ro.plan(4096) == (False, 1, 4096, 8)
    # ... whole rows up to 16384 (16 warps, 32 fp32 values a thread) ...
    assert ro.plan(8192) == (False, 1, 8192, 16)
    assert ro.plan(16384) == (False, 1, 16384, 16)
    # ... and a loop over 4096-wide chunks past it.
    assert ro.plan(16385) == (True, 1, 4096, 8)
    assert ro.plan(128256) == (True, 1, 4096, 8)


@pytest.mark.interpreter
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("max_block", [None, 32])
def test_triton_writes_its_rows_and_nothing_else(name, max_block):
    """Strided output inside a NaN buffer: every element of y written, none outside it
    (rows past M in the last program, columns past N), in the one-block kernel and,
    with 32-wide blocks, the looped one (N = 100: a partial last chunk)."""
    spec = REGISTRY[name]
    m, n = 7, 100
    inputs = spec.make_inputs({"M": m, "N": n}, "fp32", 1, "cpu")
    buf = torch.full((m + 3, n + 28), float("nan"))
    out = buf[:m, :n]
    launch = ro.rowop_launch(ro.OPS[name], inputs, out, max_block or ro.MAX_BLOCK_N)
    assert launch.name == ("rowop_loop_kernel" if max_block else "rowop_kernel")
    from kernels.triton_utils import run_launch

    run_launch(launch)
    assert spec.check(out, inputs, "fp32") <= U["fp32"]
    assert buf[m:].isnan().all() and buf[:, n:].isnan().all()


@pytest.mark.interpreter
@pytest.mark.parametrize("max_block", [None, 64])
def test_softmax_subtracts_the_row_max(max_block):
    """Rows around 1000: exp(x) overflows fp32, so only a kernel that subtracts the
    row's max (one block) or rescales its running sums (looped) is finite."""
    spec = REGISTRY["softmax"]
    inputs = spec.make_inputs({"M": 4, "N": 200}, "fp32", 2, "cpu")
    inputs["x"] = inputs["x"] + 1000.0
    out = torch.full((4, 200), float("nan"))
    from kernels.triton_utils import run_launch

    run_launch(ro.rowop_launch(ro.OPS["softmax"], inputs, out, max_block or ro.MAX_BLOCK_N))
    assert spec.check(out, inputs, "fp32") <= U["fp32"]


@pytest.mark.interpreter
@pytest.mark.parametrize("max_block", [None, 64])
def test_layernorm_variance_does_not_cancel(max_block):
    """Rows at a mean of 1000 with unit spread in fp32: E[x^2] - E[x]^2 cancels there
    (measured: 9e-2 normwise); two passes (one block) and sums shifted by x[0] (looped)
    leave only the fp32 mean's own error (about 4e-5, F.layer_norm's too)."""
    spec = REGISTRY["layernorm"]
    inputs = spec.make_inputs({"M": 4, "N": 300}, "fp32", 3, "cpu")
    inputs["x"] = inputs["x"] + 1000.0
    out = torch.full((4, 300), float("nan"))
    from kernels.triton_utils import run_launch

    run_launch(ro.rowop_launch(ro.OPS["layernorm"], inputs, out, max_block or ro.MAX_BLOCK_N))
    assert spec.check(out, inputs, "fp32") <= 1e-3


def test_launches_declare_what_inspect_needs():
    """The declared launch for the GPU: no interpreter rounding, x's rows walked with
    contiguous columns (128-bit loads), the parameters named only where the op reads
    them, and the grid covering every row."""
    for name in NAMES:
        spec = REGISTRY[name]
        for n, fn, programs in ((1024, "rowop_kernel", 1024), (16384, "rowop_kernel", 4096),
                                (128256, "rowop_loop_kernel", 4096)):
            inputs = spec.make_inputs({"M": 4096, "N": n}, "bf16", 0, "meta")
            (launch,) = spec.triton_launches(inputs, spec.alloc_out(inputs, "bf16"), 132)
            assert launch.name == fn
            assert launch.operands["X"] == ("stride_xm", 1)
            assert ("W" in launch.operands) == (name != "softmax")
            assert ("B" in launch.operands) == (name == "layernorm")
            cfg = launch.configs[0]
            assert launch.grid(dict(cfg.kwargs)) == (programs,)
            # Whole 16384-wide rows (32 elements a thread at 16 warps) are also tried
            # with 32 warps; narrower and looped rows have one config.
            warps = [c.num_warps for c in launch.configs]
            assert warps == ([16, ro.WIDE_WARPS] if n == 16384 else [cfg.num_warps]), n
            assert launch.tuner == name  # softmax and rmsnorm never share a tuned config


# ---- shapes -------------------------------------------------------------------------------

def _bf16_bytes(shape: dict) -> int:
    return REGISTRY["softmax"].nbytes(shape, "bf16")


def test_gpu_presets_cross_the_l2_and_reach_a_gigabyte():
    spec = REGISTRY["layernorm"]
    shapes = preset_shapes(spec, "default", on_gpu=True)
    widths = {s["N"] for s in shapes}
    assert {1024, 2048, 4096, 8192, 16384} <= widths
    footprints = [_bf16_bytes(s) for s in shapes]
    assert min(footprints) <= 2**20 * 1.01 and max(footprints) >= 2**30
    l2 = 50e6
    for w in (1024, 4096, 16384):  # each of these widths on both sides of the L2
        sizes = [_bf16_bytes(s) for s in shapes if s["N"] == w]
        assert min(sizes) < l2 < max(sizes), w
    # A width past one block, so inspect compiles the looped kernel too.
    assert max(widths) > ro.MAX_BLOCK_N
    assert preset_shapes(spec, "full", True)[:len(shapes)] == shapes
    assert all(GPU_PRESETS[p]["rowop"] for p in GPU_PRESETS)


def test_cpu_presets_stay_small():
    # The default CPU run times 2 shapes x 3 dtypes x 3 families of torch rows: at most
    # 8 MiB of fp32 each (eager F.rms_norm takes five passes on a CPU).
    for preset in ("quick", "default"):
        assert all(REGISTRY["rmsnorm"].nbytes(s, "fp32") <= 8 * 2**20 + 2**16
                   for s in CPU_PRESETS[preset]["rowop"]), preset
    assert len(CPU_PRESETS["default"]["rowop"]) == 2


def test_sizes_take_row_shapes():
    assert parse_sizes("M=4096,N=1024") == [{"M": 4096, "N": 1024}]
    explicit = parse_sizes("M=8,N=256;M=4,K=4;512")
    assert shapes_for(REGISTRY["softmax"], "default", False, explicit) == [
        {"M": 8, "N": 256}, {"M": 512, "N": 512}]
    assert shapes_for(REGISTRY["matvec"], "default", False, explicit) == [
        {"M": 4, "K": 4}, {"M": 512, "K": 512}]


# ---- a small CPU run: list, figures, summary, gate --------------------------------------------

@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    import run_bench

    out = tmp_path_factory.mktemp("rowop-results")
    code = run_bench.main(["--device", "cpu", "--kernels", ",".join(NAMES), "--dtypes",
                           "bf16", "--sizes", "M=16,N=256;M=8,N=2048", "--out",
                           str(out), "--run-id", "r", "--no-plots"])
    assert code == 0
    return out / "cpu" / "r"


def test_small_run_rows_figure_summary_and_gate(small_run, capsys):
    from roofline.__main__ import main as roofline_main
    from roofline.report import plot
    from tests.run_docs import load_run

    meta, df = load_run(small_run)
    ok = df[df.status == "ok"]
    # torch rows timed; Triton rows skipped in a timed CPU run.
    assert set(ok["kernel"]) == set(NAMES) and set(ok["provider"]) == {"torch"}
    assert len(ok) == 3 * 2 and ok.correct.all()
    row = ok[(ok.kernel == "layernorm") & (ok.dtype == "bf16") & (ok["shape"] == "M=8,N=2048")]
    assert int(row.flops.iloc[0]) == 7 * 8 * 2048
    assert int(row["bytes"].iloc[0]) == (2 * 8 + 2) * 2048 * 2
    assert math.isclose(row.gbps.iloc[0], row["bytes"].iloc[0] / row.ms_median.iloc[0] / 1e6,
                        rel_tol=1e-9)
    # The roofline figure: one point per ok row of each family.
    fig = plot.plot_roofline(doc_of(meta, df))
    for name in NAMES:
        pts = sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections
                  if f":{name}:" in (c.get_gid() or "") and (c.get_gid() or "")
                  .startswith("points:"))
        assert pts == len(ok[ok.kernel == name]), name
    summary = (small_run / "summary.md").read_text()
    assert all(name in summary for name in NAMES)
    # The gate: the run against itself keeps every row of the families, none regressed.
    report = small_run.parent / "gate.json"
    assert roofline_main(["compare", str(small_run), str(small_run), "--json",
                          str(report)]) == 0
    text = json.dumps(json.loads(report.read_text()))
    assert all(name in text for name in NAMES)


@pytest.mark.interpreter
def test_check_only_checks_the_triton_rows_in_the_interpreter(tmp_path):
    import run_bench

    code = run_bench.main(["--device", "cpu", "--check-only", "--kernels", ",".join(NAMES),
                           "--sizes", "M=5,N=300", "--out", str(tmp_path), "--run-id", "c",
                           "--no-plots"])
    assert code == 0
    df = pd.read_csv(tmp_path / "cpu" / "c" / "results.csv")
    tri = df[df.provider == "triton"]
    assert len(tri) == 9 and (tri.status == "ok").all() and tri.correct.all()
