"""The providers beside torch and triton: torch.compile (compile_s, recompiles), the SDPA
backends one by one, the library a GPU kernel name comes from, each row's speedup against
the baseline provider, and the summary's provider table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

import run_bench
from benches.sweep import job
from benches.sweep.cases import Case, InputCache, build_cases
from benches.sweep.runner import run_case
from contract.ceilings import Ceilings
from contract.libraries import library_of, library_of_kernel
from contract.record import Accounting, CaseId, RunRow, Timing
from contract.request import RequestError, validated
from contract.run_meta import RunMeta
from contract.schema import RunDoc
from contract.speedup import with_speedups
from kernels import ALL_PROVIDERS, DEFAULT_PROVIDERS, REGISTRY
from kernels.compiled import Compiled, compile_count, compiled_fn
from roofline.report.providers import provider_tables
from tests.run_docs import load_run
from tests.test_measurement import cpu_cfg

TINY_ATTN = {"B": 1, "H": 1, "S": 16, "D": 16, "causal": 1}


@pytest.fixture
def fake_ceilings(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {"tflops": {"fp32": 1.0}, "hbm_gbps": 10.0, "l2_gbps": 50.0, "method": {}}
    monkeypatch.setattr(job, "get_ceilings", lambda *a, **k: Ceilings(None, fake))


# ---- the library of a kernel name ------------------------------------------------------

@pytest.mark.parametrize("name, lib", [
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT", "cublasLt"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16>", "cublasLt"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
     "execute_segment_k_off_kernel__5x_cublas", "cublas"),
    ("ampere_sgemm_128x64_nn", "cublas"),
    ("void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16>", "cublas"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>", "cutlass"),
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
     "cutlass"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1",
     "cudnn"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64>>", "flash"),
    ("triton_poi_fused_add_0", "triton"),
    ("triton_red_fused__softmax_0", "triton"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
     "aten"),
    ("_matmul_tiles", None),
])
def test_a_kernel_name_names_its_library(name: str, lib: str | None) -> None:
    assert library_of_kernel(name) == lib


def test_a_rows_library_leaves_aten_beside_a_library_out() -> None:
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    assert library_of([fill, "nvjet_tst_128x256_64x4_1x2_h_bz_TNT"]) == "cublasLt"
    assert library_of([fill]) == "aten"
    assert library_of(["triton_poi_fused_0", "ampere_sgemm_128x64_nn"]) == "triton+cublas"
    assert library_of([]) is None


# ---- speedup against the baseline provider ---------------------------------------------

def _row(provider: str, ms: float | None, status: str = "ok", cache: str = "warm",
         shape: str = "n=4") -> RunRow:
    return RunRow(CaseId("add", provider, "fp32", shape, cache), Accounting(device="cpu"),
                  status=status, timing=Timing(ms_median=ms))


def _speedups(rows: list[RunRow]) -> list[float | None]:
    return [r.comparison.speedup for r in rows]


def test_speedup_is_the_baseline_time_over_the_rows_per_case_and_cache_mode() -> None:
    rows = [_row("torch", 2.0), _row("compile", 0.5), _row("triton", 4.0),
            _row("torch", 8.0, cache="cold"), _row("compile", 2.0, cache="cold"),
            _row("compile", 1.0, shape="n=8"),  # no baseline row for this shape
            _row("torch", 3.0, shape="n=16", status="failed"), _row("compile", 1.0, shape="n=16")]
    assert _speedups(with_speedups(rows, "torch")) == [1.0, 4.0, 0.5, 1.0, 4.0, None, None,
                                                        None]
    by_compile = _speedups(with_speedups(rows, "compile"))
    assert by_compile[0] == 0.25 and by_compile[2] == 0.125


def test_a_row_appended_after_its_baseline_row_carries_its_speedup(tmp_path: Path) -> None:
    from benches.sweep.results import ResultWriter
    from contract.schema import read_doc

    w = ResultWriter(tmp_path / "run", RunMeta(request={
        "selection": {"baseline_provider": "torch"}}))
    w.flush()
    for r in (_row("compile", 1.0, shape="n=8"), _row("torch", 2.0), _row("compile", 0.5)):
        w.add(r)
    # Read from the journal and the appended CSV, before any flush: a row whose baseline
    # row came first has its speedup; one whose baseline is not measured yet has none.
    assert [r["speedup"] for r in read_doc(tmp_path / "run")["rows"]] == [None, 1.0, 4.0]
    csv = pd.read_csv(tmp_path / "run" / "results.csv")
    assert list(csv["speedup"].fillna(-1)) == [-1, 1.0, 4.0]


def test_an_unknown_baseline_provider_is_refused() -> None:
    from contract.request import RunRequest, Selection

    req = RunRequest(Selection(kernels=("add",), dtypes=("fp32",), providers=("torch",),
                               baseline_provider="cublas"))
    with pytest.raises(RequestError, match="unknown baseline provider 'cublas'"):
        validated(req)


# ---- which providers a selection means -------------------------------------------------

def test_all_leaves_compile_max_out_and_the_default_is_torch_and_triton() -> None:
    from contract.request import RunRequest, Selection

    def provs(sel: str) -> tuple[str, ...]:
        return validated(RunRequest(Selection(kernels=("add",), dtypes=("fp32",),
                                              providers=(sel,)))).selection.providers
    assert "compile-max" not in provs("all") and "compile" in provs("all")
    assert provs("all") == ALL_PROVIDERS and provs("default") == DEFAULT_PROVIDERS
    assert provs("compile-max") == ("compile-max",)


def test_every_family_has_compile_providers_and_attention_the_sdpa_backends() -> None:
    for spec in REGISTRY.values():
        assert {"compile", "compile-max"} <= set(spec.providers), spec.name
        assert spec.providers["compile"].dtypes == spec.providers["torch"].dtypes
    for name in ("attention", "attention_bwd"):
        assert {"sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math"} \
            <= set(REGISTRY[name].providers)
    assert "sdpa-math" not in REGISTRY["matmul"].providers


def test_a_provider_a_kernel_lacks_makes_no_case() -> None:
    cfg = cpu_cfg(kernels=["add", "attention"], providers=["torch", "sdpa-math"],
                  shapes=({"n": 64}, TINY_ATTN))
    got = [(c.spec.name, c.provider) for c in build_cases(cfg)]
    assert got == [("add", "torch"), ("attention", "torch"), ("attention", "sdpa-math")]


# ---- torch.compile ---------------------------------------------------------------------

def test_a_compiled_fn_compiles_once_per_signature() -> None:
    import torch

    fn = compiled_fn(lambda ins, out: torch.add(ins["x"], ins["x"], out=out), "default")
    x = torch.ones(8)
    start = compile_count()
    fn({"x": x}, torch.empty(8))
    first = compile_count()
    assert first > start  # compiled at the first call
    fn({"x": torch.full((8,), 2.0)}, torch.empty(8))  # same signature: nothing compiles
    assert compile_count() == first
    out = fn({"x": torch.ones(16)}, torch.empty(16))  # a new shape: its own compile
    assert compile_count() > first and out.sum().item() == 32.0


def test_a_bound_compiled_call_looks_its_graph_up_once() -> None:
    import torch

    comp = Compiled(lambda ins, out: torch.mul(ins["x"], 3.0, out=out), "default")
    ins, out = {"x": torch.ones(8)}, torch.empty(8)
    call = comp.bind(ins, out)
    call()  # compiles (torch.compile is lazy)
    comp.cache.clear()  # a lookup at each call would now compile again
    before = compile_count()
    out.zero_()
    call()
    assert compile_count() == before and not comp.cache and out.sum().item() == 24.0
    assert REGISTRY["add"].providers["compile"].bind is not None


def test_a_recompile_while_timed_is_said_in_the_row() -> None:
    # A provider whose counter moves at every call after its first: its check call
    # compiles (compile_s), and its timing "recompiles" every sample.
    calls = {"n": 0}
    spec = REGISTRY["add"]
    torch_fn = spec.providers["torch"].fn

    def fn(ins, out):
        calls["n"] += 1
        return torch_fn(ins, out)

    prov = dataclasses.replace(spec.providers["compile"], fn=fn, bind=None,
                               compiles=lambda: calls["n"])
    spec = dataclasses.replace(spec, providers={**spec.providers, "compile": prov})
    row = run_case(Case(spec, "compile", "fp32", {"n": 64}, "warm"),
                   cpu_cfg(cache=["warm"]), InputCache())
    assert row.status == "ok", row.reason
    assert row.build.compile_s is not None and row.build.compile_s >= 0
    assert "recompiled while timed" in row.reason
    assert row.profile.library is None  # a CPU row


def test_a_compile_run_has_compile_s_speedup_and_the_provider_table(
        tmp_path: Path, fake_ceilings: None) -> None:
    argv = ["--device", "cpu", "--kernels", "add", "--dtypes", "fp32", "--providers",
            "torch,compile,triton", "--sizes", "n=4096", "--cache", "warm", "--no-plots",
            "--out", str(tmp_path)]
    assert run_bench.main(argv) == 0
    (run,) = (tmp_path / "cpu").iterdir()
    meta, df = load_run(run)
    rows = {r["provider"]: r for r in df.to_dict("records")}
    assert rows["torch"]["status"] == rows["compile"]["status"] == "ok"
    assert rows["triton"]["status"] == "skipped"
    assert rows["compile"]["compile_s"] > 0 and pd.isna(rows["torch"]["compile_s"])
    assert rows["torch"]["speedup"] == 1.0
    assert rows["compile"]["speedup"] == pytest.approx(
        rows["torch"]["ms_median"] / rows["compile"]["ms_median"])
    text = (run / "summary.md").read_text()
    assert "## Providers (against torch)" in text
    assert "| shape | torch ms | compile ms | winner | winner vs torch |" in text


# ---- SDPA backends -------------------------------------------------------------------

@pytest.mark.parametrize("provider, status, says", [
    ("sdpa-flash", "skipped", "FlashAttention's CUDA kernel"),
    ("sdpa-cudnn", "skipped", "CUDNN_ATTENTION backend has no CPU kernel"),
    ("sdpa-efficient", "skipped", "EFFICIENT_ATTENTION backend has no CPU kernel"),
    ("sdpa-math", "ok", "SDPA backend: math"),
])
def test_each_sdpa_backend_runs_or_is_skipped_with_the_reason(provider: str, status: str,
                                                            says: str) -> None:
    row = run_case(Case(REGISTRY["attention"], provider, "fp32", TINY_ATTN, "warm"),
                   cpu_cfg(kernels=["attention"], cache=["warm"]), InputCache())
    assert row.status == status and says in row.reason, row.reason


# ---- the provider table ------------------------------------------------------------------

def test_the_provider_table_puts_providers_side_by_side_with_the_winner() -> None:
    rows = [_row("torch", 2.0), _row("compile", 0.5), _row("triton", 4.0),
            _row("torch", 1.0, shape="n=8"), _row("compile", 3.0, shape="n=8")]
    (table,) = provider_tables(RunDoc(RunMeta(), tuple(with_speedups(rows, "torch"))),
                               "torch")
    # baseline first, then kernels.PROVIDERS' order
    assert table.header == ["shape", "torch ms", "triton ms", "compile ms", "winner",
                            "winner vs torch"]
    # each time, then its speedup (with both rows' SM clocks where the rows have them)
    assert table.rows == [["`n=4`", "2", "4, 0.50x", "0.5, 4.00x", "compile", "4.00x"],
                          ["`n=8`", "1", "-", "3, 0.33x", "torch", "1.00x"]]


def test_every_provider_has_a_marker_of_its_own() -> None:
    from kernels import PROVIDERS
    from roofline.report.style import provider_marker

    marks = [provider_marker(p, list(PROVIDERS)) for p in PROVIDERS]
    assert len(set(marks)) == len(PROVIDERS)
    assert provider_marker("compile", ["torch", "compile"]) == "s"
    assert provider_marker("torch", ["torch"]) == "o"
