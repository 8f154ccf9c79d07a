"""summary.md: run facts, ceilings side by side, best points, provider ratios, failures."""

from __future__ import annotations

import math
import re
from typing import Any

import pandas as pd
import pytest

from contract.devices import DEVICES, ROOF_CLASS
from contract.metrics import derive
from contract.record import Accounting, CaseId, RunRow, Timing
from contract.run_meta import parse_meta
from contract.schema import ALL_COLUMNS, SUMMARY_MD
from roofline.report import summary as report
from tests.run_docs import doc_of

H100 = DEVICES["h100"]
BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8e5": 1}


def meta(datasheet: bool = True) -> dict[str, Any]:
    ds = {"tflops": dict(H100.peaks_tflops), "hbm_gbps": 3350.0, "l2_gbps": None}
    ms = {"tflops": {k: v * 0.8 for k, v in H100.peaks_tflops.items()}, "hbm_gbps": 3000.0,
          "l2_gbps": 8000.0}
    return {"run_id": "r1", "created": "2025-03-04T05:06:07", "device_key": "h100",
            "device_name": "NVIDIA H100 80GB HBM3", "python": "3.11.9", "torch": "2.5.1",
            "triton": "3.1.0", "git_commit": "abc1234", "command": "python run_bench.py",
            "seed": 0, "timing": {"rep_ms": 100},
            "ceilings": {"datasheet": ds if datasheet else None, "measured": ms}}


def row(kernel: str, provider: str, dtype: str, shape: str, ms: float | None,
        status: str = "ok", reason: str | None = None, rel_err: float = 1e-4) -> dict[str, Any]:
    """A row made consistent by contract.metrics.derive (H100 datasheet + 0.8x measured)."""
    dims = [int(p.split("=")[1]) for p in shape.split(",")]
    b = BYTES[dtype]
    if kernel == "matmul":
        m, n, k = dims
        flops, nbytes = 2 * m * n * k, (m * k + k * n + m * n) * b
    else:
        flops, nbytes = dims[0], 3 * dims[0] * b
    cls = ROOF_CLASS[dtype] if kernel == "matmul" else "fp32"
    peak = H100.peaks_tflops[cls]
    r = {c: None for c in ALL_COLUMNS}
    r.update(derive(flops, nbytes, ms, peak, 3350.0, peak * 0.8, 3000.0))
    r.update(kernel=kernel, provider=provider, dtype=dtype, shape=shape, flops=flops,
             bytes=nbytes, ms_median=ms, status=status, reason=reason, rel_err=rel_err,
             tolerance=1e-2, roof_class=cls, correct=status == "ok")
    return r


def rows() -> list[dict[str, Any]]:
    out = []
    for dtype in BYTES:
        # matmul: torch faster at 8192, Triton faster at 1024
        out.append(row("matmul", "torch", dtype, "M=8192,N=8192,K=8192", 1.5))
        out.append(row("matmul", "triton", dtype, "M=8192,N=8192,K=8192", 2.0))
        out.append(row("matmul", "torch", dtype, "M=1024,N=1024,K=1024", 0.02))
        out.append(row("matmul", "triton", dtype, "M=1024,N=1024,K=1024", 0.01))
        if dtype != "tf32":
            for n, ms in ((2**20, 0.01), (2**26, 0.3)):
                out.append(row("add", "torch", dtype, f"n={n}", ms))
                out.append(row("add", "triton", dtype, f"n={n}", ms * 0.9))
    # A wrong kernel that looks fast: must not be the best point nor enter the ratios.
    out.append(row("matmul", "triton", "bf16", "M=4096,N=4096,K=4096", 0.01, status="failed",
                   reason="rel_err 0.5 > tol 0.01", rel_err=0.5))
    out.append(row("add", "triton", "fp8", "n=1024", None, status="skipped",
                   reason="fp8 needs sm_89"))
    out.append(row("matmul", "triton", "fp8", "M=64,N=64,K=64", None, status="skipped",
                   reason="fp8 needs sm_89"))
    out.append(row("matmul", "torch", "fp32", "M=65536,N=65536,K=65536", None,
                   status="skipped", reason="out of memory | 80 GB"))
    return out


@pytest.fixture
def df() -> pd.DataFrame:
    return pd.DataFrame(rows())


def section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"no section {title!r}"
    return m.group(1)


def table_rows(text: str) -> list[list[str]]:
    """Body cells of the first markdown table in `text` (header and rule dropped)."""
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in lines[2:]]


def test_best_points_pick_highest_pct_roof_of_ok_rows(df):
    best = report.best_points(df)
    # Rows above their roof are findings, never best points.
    within = df[(df["status"] == "ok") & ~(df["pct_roof"] > 100)]
    assert len(best) == within.groupby(["kernel", "dtype"]).ngroups
    assert (best["pct_roof"] <= 100).all()
    bf16 = best[(best["kernel"] == "matmul") & (best["dtype"] == "bf16")].iloc[0]
    assert bf16["shape"] == "M=8192,N=8192,K=8192" and bf16["provider"] == "torch"
    ok = df[(df["status"] == "ok") & (df["kernel"] == "matmul") & (df["dtype"] == "bf16")]
    assert bf16["pct_roof"] == pytest.approx(ok["pct_roof"].max())
    assert list(best["kernel"].unique()) == ["add", "matmul"]  # canonical order
    assert list(best[best["kernel"] == "matmul"]["dtype"]) == \
        [d for d in BYTES if d in set(within[within["kernel"] == "matmul"]["dtype"])]
    assert report.best_points(pd.DataFrame(columns=ALL_COLUMNS)).empty


def test_provider_ratios(df):
    ratios = report.provider_ratios(df)
    mm = ratios[(ratios["kernel"] == "matmul") & (ratios["dtype"] == "bf16")]
    by_shape = dict(zip(mm["shape"], mm["ratio"], strict=True))
    assert by_shape == {"M=1024,N=1024,K=1024": pytest.approx(2.0),
                        "M=8192,N=8192,K=8192": pytest.approx(0.75)}  # failed 4096 absent
    summary = report.ratio_summary(ratios)
    s = summary[(summary["kernel"] == "matmul") & (summary["dtype"] == "bf16")].iloc[0]
    assert s["largest_shape"] == "M=8192,N=8192,K=8192"
    assert s["ratio_at_largest"] == pytest.approx(0.75)
    assert s["median"] == pytest.approx(1.375) and s["n_shapes"] == 2


def test_write_summary(tmp_path, df):
    path = report.write_summary(tmp_path, doc_of(meta(), df))
    assert path == tmp_path / SUMMARY_MD
    assert [p.name for p in tmp_path.iterdir()] == [SUMMARY_MD]  # atomic: no temp file left
    text = path.read_text()
    head = text.split("## ")[0]
    for bit in ("NVIDIA H100 80GB HBM3", "2025-03-04", "torch 2.5.1", "triton 3.1.0",
                "`python run_bench.py`", "abc1234"):
        assert bit in head
    assert "![roofline](roofline.png)" in text and "![scaling](scaling.png)" in text

    ceil = {r[0]: r for r in table_rows(section(text, "Ceilings"))}
    assert ceil["bf16"][1] == "989.4 TFLOP/s (ridge 295 FLOP/B)"
    assert ceil["bf16"][2].startswith(f"{989.4 * 0.8:.1f} TFLOP/s")
    assert ceil["HBM"][1:] == ["3350 GB/s", "3000 GB/s", "89.6%"]
    assert ceil["L2"][1:3] == ["-", "8000 GB/s"]

    n_ok, n_failed, n_skipped = (int((df["status"] == s).sum()) for s in
                                 ("ok", "failed", "skipped"))
    assert f"{n_ok} ok, {n_failed} failed, {n_skipped} skipped" in section(text, "Rows")

    best = table_rows(section(text, "Best point"))
    assert len(best) == len(report.best_points(df))
    bf16 = next(r for r in best if r[:2] == ["matmul", "bf16"])
    assert bf16[2:4] == ["torch", "`M=8192,N=8192,K=8192`"]
    assert bf16[6].endswith("%") and bf16[7].endswith("%") and bf16[8].endswith("%")
    tflops = 2 * 8192**3 / 1.5e-3 / 1e12
    assert float(bf16[4]) == pytest.approx(tflops, rel=1e-3)
    assert float(bf16[6].rstrip("%")) == pytest.approx(100 * tflops / 989.4, abs=0.05)

    ratios = section(text, "Triton vs torch")
    mm = next(r for r in table_rows(ratios.split("<details>")[0]) if r[:2] == ["matmul", "bf16"])
    # shapes, of them at unequal clocks (none: no clocks here), median, min, max, ...
    assert mm[2:] == ["2", "0", "1.38x", "0.75x", "2.00x", "`M=8192,N=8192,K=8192`", "0.75x"]

    failed = table_rows(section(text, "Failed rows"))
    assert failed == [["matmul", "triton", "bf16", "`M=4096,N=4096,K=4096`", "0.5", "0.01",
                       "rel_err 0.5 > tol 0.01"]]
    skipped = table_rows(section(text, "Skipped rows"))
    assert skipped[0][:2] == ["fp8 needs sm_89", "2"]
    assert skipped[1][:2] == ["out of memory \\| 80 GB", "1"]  # pipe escaped in the cell


def test_summary_cpu_style_and_empty(tmp_path, df):
    text = report.write_summary(tmp_path, doc_of(meta(datasheet=False), df)).read_text()
    ceil = {r[0]: r for r in table_rows(section(text, "Ceilings"))}
    assert ceil["bf16"][1] == "-" and ceil["bf16"][2].endswith("FLOP/B)")
    assert "No datasheet" in section(text, "Ceilings")

    empty = report.render_summary(doc_of({}, pd.DataFrame(columns=ALL_COLUMNS)))
    assert "0 rows: 0 ok, 0 failed, 0 skipped" in empty
    assert "No ok rows." in empty and "No ceilings" in empty


def test_summary_without_both_providers(df):
    torch_only = df[df["provider"] == "torch"]
    text = report.render_summary(doc_of(meta(), torch_only))
    assert "No (kernel, dtype, shape) has ok rows from both providers." in text
    assert report.provider_ratios(torch_only).empty
    assert not math.isnan(report.best_points(torch_only)["pct_roof"].iloc[0])


def test_summary_flags_partial_runs_and_cache_resident_points(df):
    m = meta()
    m.update(interrupted=True, complete=False, device_model="NVIDIA H100 SXM5 80GB")
    within = df.assign(pct_roof=df["pct_roof"].clip(upper=99.0),
                       pct_meas_roof=df["pct_meas_roof"].clip(upper=99.0), above_roof=False)
    text = report.render_summary(doc_of(m, within))
    assert "- **status**: **interrupted**" in text.split("## ")[0]
    assert "- **device model**: NVIDIA H100 SXM5 80GB" in text
    assert "Above 100% of roof" not in text
    within.loc[0, "pct_roof"] = 250.0  # a footprint that fit in cache
    assert "Above 100% of roof" in report.render_summary(doc_of(meta(), within))


def cpu_meta() -> dict[str, Any]:
    return {"device_key": "cpu", "device_kind": "cpu", "device_name": "AMD EPYC",
            "llc_mb": 32.0, "fp8_accum": "fast",
            "ceilings": {"datasheet": None,
                         "measured": {"tflops": {"fp32": 0.1}, "hbm_gbps": 10.0,
                                      "l2_gbps": 100.0}}}


def cpu_row(n: int, ms: float) -> dict[str, Any]:
    """An fp32 add of n elements on the CPU of cpu_meta (no datasheet)."""
    flops, nbytes = n, 12 * n
    r = {c: None for c in ALL_COLUMNS}
    r.update(derive(flops, nbytes, ms, 0.1, 10.0, 0.1, 10.0))
    r.update(kernel="add", provider="torch", dtype="fp32", shape=f"n={n}", flops=flops,
             bytes=nbytes, ms_median=ms, status="ok", reason="", rel_err=0.0, tolerance=2e-5,
             roof_class="fp32", correct=True, timer="torch.utils.benchmark")
    return r


def test_cpu_cache_resident_rows_use_the_cache_roof():
    # 2^16 elements = 768 KiB (fits the 32 MiB LLC) at 50 GB/s: 500% of the 10 GB/s DRAM
    # roof, 50% of the 100 GB/s cache roof.  2^24 = 192 MiB at 3 GB/s: 30% of DRAM.
    small = cpu_row(1 << 16, 12 * (1 << 16) / 50e9 * 1e3)
    big = cpu_row(1 << 24, 12 * (1 << 24) / 3e9 * 1e3)
    assert small["above_roof"] is True and small["pct_roof"] == pytest.approx(500)
    df = pd.DataFrame([small, big])
    best = report.best_points(df, parse_meta(cpu_meta()))
    assert len(best) == 1
    r = best.iloc[0]
    assert r["shape"] == "n=65536" and r["roof"] == "cache"
    assert r["pct_roof"] == pytest.approx(50.0)
    # Without an LLC size (older runs) nothing is cache-resident: the DRAM row is best.
    no_llc = report.best_points(df, parse_meta({**cpu_meta(), "llc_mb": None}))
    assert list(no_llc["shape"]) == ["n=16777216"] and no_llc["roof"].iloc[0] == "DRAM"
    text = report.render_summary(doc_of(cpu_meta(), df))
    above = section(text, "Above 100% of roof")
    assert "`n=65536`" in above and "cache-resident footprint" in above
    assert "roof `cache`" in section(text, "Best point")


def _above(nbytes: int, ms: float, peak: float | None) -> RunRow:
    return RunRow(CaseId("add", "torch", "fp32", "n=1"),
                  Accounting(bytes=nbytes, peak_tflops=peak), timing=Timing(ms_median=ms))


def test_above_roof_causes():
    gpu = parse_meta({**meta(), "l2_mb": 50})
    # GPU, 64 MiB footprint (past the 50 MiB L2), 3 us: timer resolution
    r = _above(64 * 2**20, 0.003, 66.9)
    assert report.above_roof_cause(r, gpu).startswith("timer resolution")
    r = _above(1 * 2**20, 0.003, 66.9)
    assert report.above_roof_cause(r, gpu).startswith("cache-resident")
    r = _above(64 * 2**20, 1.0, 66.9)
    assert report.above_roof_cause(r, gpu).startswith("wrong FLOP or byte")
    r = _above(64 * 2**30, 10.0, None)
    assert "measured ceiling" in report.above_roof_cause(r, parse_meta(cpu_meta()))


def test_summary_states_fp8_accumulation_and_abort_reason():
    m = {**meta(), "fp8_accum": "precise", "aborted": True, "complete": False,
         "abort_reason": "matmul triton fp8 M=8192,N=8192,K=8192: CUDA error: an illegal "
                         "memory access was encountered"}
    head = report.render_summary(doc_of(m, pd.DataFrame(columns=ALL_COLUMNS))).split("## ")[0]
    assert "- **status**: **aborted**" in head and "illegal memory access" in head
    assert "- **fp8 accumulation**: precise" in head and "use_fast_accum=False" in head
    fast = report.render_summary(doc_of({**meta(), "fp8_accum": "fast"},
                                        pd.DataFrame(columns=ALL_COLUMNS)))
    assert "- **fp8 accumulation**: fast" in fast


def test_rows_without_a_roof_get_no_cache_roof():
    # fp8e5 matmul on a CPU: no roof was measured for it, the cache roof must not invent one
    r = cpu_row(1 << 10, 0.001)
    r.update(peak_tflops=None, peak_gbps=None, meas_peak_tflops=None, meas_peak_gbps=None,
             roof_tflops=None, meas_roof_tflops=None, pct_roof=None, pct_meas_roof=None,
             mfu=None, above_roof=None)
    best = report.best_points(pd.DataFrame([r]), parse_meta(cpu_meta()))
    assert len(best) == 1 and pd.isna(best.iloc[0]["pct_roof"]) and best.iloc[0]["roof"] is None


def test_largest_shape_ignores_the_causal_flag():
    """`causal=0` is a variant, not a size: the largest attention shape is the longest
    sequence whether or not it is causal."""
    shapes = ["B=8,H=16,S=4096,D=128,causal=0", "B=32,H=16,S=1024,D=128,causal=1"]
    ratios = pd.DataFrame({"kernel": ["attention"] * 2, "dtype": ["bf16"] * 2,
                           "shape": shapes, "torch_ms": [2.0, 1.0], "triton_ms": [1.0, 1.0],
                           "ratio": [2.0, 1.0]})
    s = report.ratio_summary(ratios).iloc[0]
    assert s["largest_shape"] == shapes[0] and s["ratio_at_largest"] == pytest.approx(2.0)
