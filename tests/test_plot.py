"""Roofline/scaling figures and `python -m roofline plot`, checked through matplotlib
objects (gids, labels, offsets), never pixels."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from contract.ceilings import no_roofs
from contract.devices import DEVICES, ROOF_CLASS
from contract.metrics import derive
from contract.schema import ALL_COLUMNS
from roofline.report import plot, plot_cli
from roofline.report.plot_scaling import plot_scaling
from roofline.report.style import fmt_tflops
from tests.run_docs import doc_of

H100 = DEVICES["h100"]
BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "fp8e5": 1}
MEAS_FRACTION = 0.85  # measured compute ceilings as a fraction of the datasheet
MEAS_HBM, MEAS_L2 = 3000.0, 9000.0


def counts(kernel: str, dtype: str, dims: dict[str, int]) -> tuple[float, float]:
    """FLOPs and compulsory bytes per docs/design.md."""
    b = BYTES[dtype]
    if kernel == "matmul":
        m, n, k = dims["M"], dims["N"], dims["K"]
        out_b = 2 if dtype.startswith("fp8") else b  # fp8 GEMMs write bf16
        return 2 * m * n * k, (m * k + k * n) * b + m * n * out_b
    if kernel == "matvec":
        m, k = dims["M"], dims["K"]
        return 2 * m * k, (m * k + k) * b + m * b
    n = dims["n"]
    if kernel in ("add", "mul"):
        return n, 3 * n * b
    if kernel in ("gelu", "gelu_erf"):
        return 8 * n, 2 * n * b
    return 2 * n, 2 * n * b + 4  # dot


def h100_meta(**over: Any) -> dict[str, Any]:
    meta = {
        "run_id": "20250101-120000-test", "created": "2025-01-01T12:00:00+00:00",
        "device_key": "h100", "device_name": "NVIDIA H100 80GB HBM3", "python": "3.11.9",
        "torch": "2.5.1", "triton": "3.1.0", "git_commit": "0123456789abcdef",
        "command": "python run_bench.py --device h100", "seed": 0, "l2_mb": 50,
        "timing": {"warmup_ms": 25, "rep_ms": 100},
        "ceilings": {
            "datasheet": {"tflops": dict(H100.peaks_tflops), "hbm_gbps": H100.hbm_gbps,
                          "l2_gbps": None},
            "measured": {"tflops": {k: v * MEAS_FRACTION for k, v in H100.peaks_tflops.items()},
                         "hbm_gbps": MEAS_HBM, "l2_gbps": MEAS_L2},
        },
    }
    meta.update(over)
    return meta


def cpu_meta() -> dict[str, Any]:
    return {
        "run_id": "cpu-run", "created": "2025-01-02T08:00:00", "device_key": "cpu",
        "device_name": "AMD EPYC 7B13", "python": "3.11.9", "torch": "2.5.1", "triton": None,
        "ceilings": {"datasheet": None,
                     # bf16 above fp32 (a CPU with bf16 units): a roof of its own
                     "measured": {"tflops": {"fp32": 1.2, "bf16": 2.4}, "hbm_gbps": 20.0,
                                  "l2_gbps": None}},
    }


def make_row(kernel: str, provider: str, dtype: str, shape: str, eff: float,
             meta: dict[str, Any], status: str = "ok", reason: str = "") -> dict[str, Any]:
    """One result row made consistent through contract.metrics.derive."""
    dims = {k: int(v) for k, v in (p.split("=") for p in shape.split(","))}
    flops, nbytes = counts(kernel, dtype, dims)
    cls = ROOF_CLASS[dtype] if kernel == "matmul" else "fp32"
    ds, ms_ = meta["ceilings"]["datasheet"], meta["ceilings"]["measured"]
    # A measured class that is no roof gives its rows none (contract.ceilings.no_roofs).
    mpeak = None if cls in no_roofs(ms_["tflops"]) else ms_["tflops"].get(cls)
    peak = ds["tflops"].get(cls) if ds else mpeak
    gbps = (ds or ms_)["hbm_gbps"]
    mgbps = ms_["hbm_gbps"]
    roof = derive(flops, nbytes, 1.0, peak, gbps)["roof_tflops"]
    # Achieved = eff x roof, but never faster than a 4 us launch allows (the small-size
    # regime the scaling figure should show).
    ms = max(flops / (eff * roof * 1e12) * 1e3, 0.004) if status != "skipped" else None
    row = {c: None for c in ALL_COLUMNS}
    row.update(derive(flops, nbytes, ms, peak, gbps, mpeak, mgbps))
    row.update(kernel=kernel, provider=provider, dtype=dtype, shape=shape, flops=flops,
               bytes=nbytes, ms_median=ms, ms_p20=ms and ms * 0.98, ms_p80=ms and ms * 1.02,
               n_samples=50 if ms else 0, status=status, reason=reason or None,
               correct=status == "ok" if status != "skipped" else None,
               rel_err=0.3 if status == "failed" else (1e-4 if ms else None),
               tolerance=1e-2, roof_class=cls, device=meta["device_key"],
               gpu_name=meta["device_name"], timer="do_bench")
    if status == "skipped":
        for c in ("tflops", "gbps", "mfu", "pct_roof", "pct_meas_roof"):
            row[c] = None
    return row


def h100_rows(meta: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every kernel x both providers x every dtype it has, a few sizes each, plus failed and
    skipped rows (the failed ones carry timings, to prove they are not plotted)."""
    meta = meta or h100_meta()
    rows = []
    for dtype in BYTES:
        for provider in ("torch", "triton"):
            pe = 0.9 if provider == "triton" else 0.85
            if dtype != "tf32":
                for kernel in ("add", "mul", "gelu", "gelu_erf", "dot"):
                    for n in (2**12, 2**18, 2**24, 2**28):
                        rows.append(make_row(kernel, provider, dtype, f"n={n}", pe, meta))
                for mk in (1024, 8192):
                    rows.append(make_row("matvec", provider, dtype, f"M={mk},K={mk}", pe, meta))
            for s in (256, 1024, 4096, 8192):
                rows.append(make_row("matmul", provider, dtype, f"M={s},N={s},K={s}",
                                     pe * (0.3 if s == 256 else 0.8), meta))
    rows.append(make_row("matmul", "triton", "fp8e5", "M=512,N=512,K=512", 0.9, meta,
                         status="failed", reason="rel_err 0.3 > tolerance 0.01"))
    rows.append(make_row("add", "triton", "bf16", "n=1000", 0.9, meta, status="failed"))
    rows.append(make_row("dot", "triton", "fp8", "n=777", 0.9, meta, status="skipped",
                         reason="fp8 dot needs sm_89"))
    rows.append(make_row("matmul", "torch", "fp32", "M=65536,N=65536,K=65536", 0.9, meta,
                         status="skipped", reason="does not fit in memory"))
    return rows


def cpu_rows(meta: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for dtype in ("fp32", "bf16"):
        for kernel in ("add", "gelu", "dot"):
            for n in (2**10, 2**16, 2**22):
                rows.append(make_row(kernel, "torch", dtype, f"n={n}", 0.7, meta))
        for s in (64, 256, 1024):
            rows.append(make_row("matmul", "torch", dtype, f"M={s},N={s},K={s}", 0.6, meta))
        rows.append(make_row("add", "triton", dtype, "n=1024", 0.0, meta, status="skipped",
                             reason="triton needs a GPU"))
    return rows


def write_run(folder: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps({"metadata": meta, "rows": rows}))
    return folder


# ------------------------------------------------------------------------ figure probes


def gids(fig: Any, prefix: str, kind: str = "any") -> list[Any]:
    found = []
    for ax in fig.axes:
        pools = {"lines": ax.lines, "texts": ax.texts, "collections": ax.collections}
        for name, pool in pools.items():
            if kind in ("any", name):
                found += [a for a in pool if (a.get_gid() or "").startswith(prefix)]
    return found


def n_points(fig: Any, prefix: str = "points:") -> int:
    return sum(len(c.get_offsets()) for c in gids(fig, prefix, "collections"))


def plotted_xy(fig: Any) -> set[tuple[float, float]]:
    return {(round(math.log(x), 6), round(math.log(y), 6))
            for c in gids(fig, "points:", "collections") for x, y in c.get_offsets()}


def number(text: str, after: str) -> float:
    m = re.search(after + r"\s*([0-9.]+)", text)
    assert m, f"no '{after} <number>' in {text!r}"
    return float(m.group(1))


@pytest.fixture(scope="module")
def h100_run() -> tuple[dict[str, Any], pd.DataFrame]:
    return h100_meta(), pd.DataFrame(h100_rows())


@pytest.fixture(scope="module")
def h100_fig(h100_run):
    return plot.plot_roofline(doc_of(*h100_run))


# ------------------------------------------------------------------------------- roofline


def test_one_panel_per_dtype_with_its_roofs(h100_fig):
    titles = [ax.get_title().split(":")[0] for ax in h100_fig.axes]
    assert titles == ["fp32", "tf32", "fp16", "bf16", "fp8", "fp8e5"]
    labels = {ln.get_label() for ln in gids(h100_fig, "roof:", "lines")}
    for cls in ("fp32", "tf32", "fp16", "bf16", "fp8"):
        peak = H100.peaks_tflops[cls]
        assert f"{cls} datasheet {fmt_tflops(peak)} TFLOP/s" in labels
        assert f"{cls} measured {fmt_tflops(peak * MEAS_FRACTION)} TFLOP/s" in labels
    assert "bf16 datasheet 989.4 TFLOP/s" in labels
    assert "HBM datasheet 3350 GB/s" in labels and "HBM measured 3000 GB/s" in labels
    assert "L2 measured 9000 GB/s" in labels
    # The bf16 panel holds elementwise rows (fp32 vector roof) and GEMMs (bf16 roof) only.
    bf16_ax = next(ax for ax in h100_fig.axes if ax.get_title().startswith("bf16"))
    assert {ln.get_gid() for ln in bf16_ax.lines if ln.get_gid().startswith("roof:datasheet")} \
        == {"roof:datasheet:hbm", "roof:datasheet:fp32", "roof:datasheet:bf16"}


def test_datasheet_solid_measured_dashed(h100_fig):
    lines = gids(h100_fig, "roof:", "lines")
    for ln in lines:
        source = ln.get_gid().split(":")[1]
        if ln.get_gid().endswith(":l2"):
            assert ln.get_linestyle() == ":"
        else:
            assert ln.get_linestyle() == ("-" if source == "datasheet" else "--"), ln.get_gid()


def test_ridge_annotations_carry_values(h100_fig):
    texts = {t.get_gid(): t.get_text() for t in gids(h100_fig, "ridge:", "texts")}
    assert number(texts["ridge:datasheet:bf16"], "ridge") == pytest.approx(295, abs=1)
    assert number(texts["ridge:datasheet:fp32"], "ridge") == pytest.approx(66.9 / 3.35, abs=0.5)
    assert number(texts["ridge:datasheet:fp8"], "ridge") == pytest.approx(1978.9 / 3.35, abs=1)
    meas = number(texts["ridge:measured:bf16"], "ridge")
    assert meas == pytest.approx(989.4 * MEAS_FRACTION * 1e3 / MEAS_HBM, abs=1)
    assert "989.4 TFLOP/s" in texts["ridge:datasheet:bf16"]
    markers = gids(h100_fig, "ridge-marker:", "lines")
    bf16 = [m for m in markers if m.get_gid() == "ridge-marker:datasheet:bf16"][0]
    assert bf16.get_xdata()[0] == pytest.approx(989.4 / 3.35 * 1e3 / 1e3, rel=1e-6)


def test_points_are_the_ok_rows_only(h100_run, h100_fig):
    meta, df = h100_run
    ok = df[df["status"] == "ok"]
    assert n_points(h100_fig) == len(ok)
    failed = df[df["status"] == "failed"]
    xy = plotted_xy(h100_fig)
    for _, r in failed.iterrows():
        assert (round(math.log(r["intensity"]), 6), round(math.log(r["tflops"]), 6)) not in xy
    # Per (kernel, provider) collections with readable labels, coloured by kernel.
    coll = gids(h100_fig, "points:bf16:matmul:triton", "collections")
    assert len(coll) == 1 and coll[0].get_label() == "matmul triton"
    # Points are drawn above every ceiling line.
    ax = h100_fig.axes[0]
    assert min(c.get_zorder() for c in ax.collections) > max(ln.get_zorder() for ln in ax.lines)


def test_titles_and_legend(h100_fig):
    title = h100_fig._suptitle.get_text()
    for bit in ("NVIDIA H100 80GB HBM3", "2025-01-01", "torch 2.5.1", "triton 3.1.0"):
        assert bit in title
    legend = h100_fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert {"add", "matmul", "torch", "triton"} <= set(labels)
    assert "datasheet roof\nHBM 3350 GB/s" in labels and "measured roof\nHBM 3000 GB/s" in labels
    # Failed rows are counted in the panel title, not plotted.
    fp8e5 = next(ax for ax in h100_fig.axes if ax.get_title().startswith("fp8e5"))
    assert "1 failed" in fp8e5.get_title()


def test_cpu_metadata_measured_only():
    meta = cpu_meta()
    df = pd.DataFrame(cpu_rows(meta))
    fig = plot.plot_roofline(doc_of(meta, df))
    lines = gids(fig, "roof:", "lines")
    assert lines and all(ln.get_gid().split(":")[1] == "measured" for ln in lines)
    assert all(ln.get_linestyle() == "--" for ln in lines)
    texts = {t.get_gid(): t.get_text() for t in gids(fig, "ridge:", "texts")}
    assert number(texts["ridge:measured:fp32"], "ridge") == pytest.approx(1.2e3 / 20, rel=0.01)
    assert number(texts["ridge:measured:bf16"], "ridge") == pytest.approx(2.4e3 / 20, rel=0.01)
    assert n_points(fig) == (df["status"] == "ok").sum()


def test_a_cpu_class_with_no_roof_says_so_in_its_panel(cpu_ceilings):
    """On each CPU (tests/conftest.py) a class measured under 0.1x fp32's rate gets no
    roof line, and its panel says why with the rate, not "no ceiling recorded"."""
    meta = {**cpu_meta(), "ceilings": {"datasheet": None, "measured": cpu_ceilings.measured}}
    rows = [make_row("matmul", "torch", dt, "M=64,N=64,K=64", 0.5, meta)
            for dt in cpu_ceilings.measured["tflops"]]
    fig = plot.plot_roofline(doc_of(meta, pd.DataFrame(rows)))
    texts = {t.get_gid(): t.get_text() for t in gids(fig, "ridge:", "texts")}
    lines = {ln.get_gid() for ln in gids(fig, "roof:", "lines")}
    assert cpu_ceilings.no_roofs
    for rc, tflops in cpu_ceilings.measured["tflops"].items():
        if rc in cpu_ceilings.no_roofs:
            assert texts[f"ridge:none:{rc}"] == \
                f"{rc}: no roof (measured {tflops:.3g} TFLOP/s, under 0.1x fp32's)"
            assert f"roof:measured:{rc}" not in lines
        else:
            assert f"ridge:measured:{rc}" in texts and f"roof:measured:{rc}" in lines
    assert n_points(fig) == len(rows)  # every row is plotted, with a roof or without


def test_missing_dtypes_and_zero_ok_rows(tmp_path):
    meta = h100_meta()
    only_bf16 = pd.DataFrame([r for r in h100_rows(meta) if r["dtype"] == "bf16"])
    fig = plot.plot_roofline(doc_of(meta, only_bf16))
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["bf16"]

    failed = pd.DataFrame([make_row("matmul", "triton", "bf16", "M=64,N=64,K=64", 0.5, meta,
                                    status="failed")])
    fig = plot.plot_roofline(doc_of(meta, failed))
    assert n_points(fig) == 0
    assert gids(fig, "note:no-ok-rows", "texts")
    assert gids(fig, "roof:datasheet:bf16", "lines")

    empty = pd.DataFrame(columns=ALL_COLUMNS)
    fig = plot.plot_roofline(doc_of(meta, empty))
    assert gids(fig, "note:no-ok-rows", "texts")
    # With no rows at all every known roof is drawn (fp16 and bf16 share one line).
    assert {ln.get_gid() for ln in gids(fig, "roof:datasheet", "lines")} >= {
        "roof:datasheet:fp32", "roof:datasheet:tf32", "roof:datasheet:fp16/bf16",
        "roof:datasheet:fp8", "roof:datasheet:hbm"}
    fig = plot_scaling(doc_of(meta, empty), tmp_path / "s.png")
    assert gids(fig, "note:no-ok-rows", "texts") and (tmp_path / "s.png").exists()


def test_baseline_overlay_arrows():
    meta = h100_meta()
    new = pd.DataFrame(h100_rows(meta))
    old = new.copy()
    ok = old["status"] == "ok"
    old.loc[ok, "tflops"] = old.loc[ok, "tflops"] * 0.9  # the new run is 11% faster...
    slower = ok & (old["kernel"] == "dot")
    old.loc[slower, "tflops"] = new.loc[slower, "tflops"] * 1.5  # ...except dot
    fig = plot.plot_roofline(doc_of(meta, new), baseline=doc_of(h100_meta(run_id="old"), old))
    arrows = gids(fig, "arrow:", "texts")
    assert len(arrows) == ok.sum()
    n_slower = sum(a.arrow_patch.get_edgecolor()[0] > 0.5 for a in arrows)  # red
    assert n_slower == slower.sum()
    assert n_points(fig, "baseline:") == ok.sum()
    assert "vs baseline old" in fig._suptitle.get_text()


# -------------------------------------------------------------------------------- scaling


def test_scaling_panels_lines_and_l2(h100_run):
    meta, df = h100_run
    fig = plot_scaling(doc_of(meta, df))
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["add", "mul", "gelu", "gelu_erf", "dot", "matvec", "matmul"]
    lines = gids(fig, "scaling:", "lines")
    ok = df[df["status"] == "ok"]
    assert len(lines) == ok.groupby(["kernel", "provider", "dtype"]).ngroups
    assert sum(len(ln.get_xdata()) for ln in lines) == len(ok)
    add_bf16 = next(ln for ln in lines if ln.get_gid() == "scaling:add:triton:bf16")
    assert list(add_bf16.get_xdata()) == sorted(add_bf16.get_xdata())  # by size
    l2 = gids(fig, "l2-size", "lines")
    assert len(l2) == 6  # every memory-bound panel, not matmul
    assert l2[0].get_xdata()[0] == pytest.approx(50 * 2**20)
    matmul_ax = fig.axes[-1]
    ceil = {ln.get_gid() for ln in matmul_ax.lines if (ln.get_gid() or "").startswith("ceiling:")}
    assert "ceiling:datasheet:fp16/bf16" in ceil and "ceiling:measured:fp8" in ceil


def test_scaling_close_ceilings_share_a_label():
    # A CPU's fp16 and bf16 roofs differ by 5%: separate labels would print on each other.
    meta = cpu_meta()
    meta["ceilings"]["measured"]["tflops"] = {"fp32": 0.36, "fp16": 1.46, "bf16": 1.38}
    rows = [make_row("matmul", "torch", dt, f"M={s},N={s},K={s}", 0.5, meta)
            for dt in ("fp32", "fp16", "bf16") for s in (64, 256)]
    fig = plot_scaling(doc_of(meta, pd.DataFrame(rows)))
    labels = {t.get_gid(): t.get_text() for t in gids(fig, "ceiling-label:", "texts")}
    assert labels == {"ceiling-label:fp16;bf16": "fp16 meas. 1.46; bf16 meas. 1.38",
                      "ceiling-label:fp32": "fp32 meas. 0.36"}


# ------------------------------------------------------------------------------------ CLI


def small_run(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """A few rows, so CLI tests (which render real PNGs) stay fast."""
    return [r for r in h100_rows(meta) if r["dtype"] == "bf16" and r["kernel"] in
            ("add", "matmul")]


def test_cli_replots_from_folder(tmp_path, capsys):
    from roofline.__main__ import main as module_main  # the `python -m roofline` entry

    run = write_run(tmp_path / "run", h100_meta(), small_run(h100_meta()))
    assert module_main(["plot", str(run)]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(run / "roofline.png"), str(run / "scaling.png")]
    for p in out:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in run.iterdir()) == ["results.json", "roofline.png",
                                                     "scaling.png"]  # no temp files left


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)],
                         ids=["umask022", "umask027"])
def test_figures_get_the_umask_mode_like_other_files(tmp_path, capsys, umask, mode):
    """PNGs were written through mkstemp (0600 whatever the umask) while results.json and
    summary.md were 0644: figures get the mode open() gives, read at the write."""
    from contract.schema import atomic_write_text

    run = write_run(tmp_path / "run", h100_meta(), small_run(h100_meta()))
    old = os.umask(umask)
    try:
        assert plot_cli.main([str(run)]) == 0
        atomic_write_text(run / "summary.md", "x\n")
    finally:
        os.umask(old)
    for name in ("roofline.png", "scaling.png", "summary.md"):
        assert oct((run / name).stat().st_mode & 0o777) == oct(mode), name


def test_cli_replots_from_json_with_out_and_baseline(tmp_path, capsys):
    meta = h100_meta()
    run = write_run(tmp_path / "run", meta, small_run(meta))
    base = write_run(tmp_path / "base", h100_meta(run_id="base"), small_run(meta))
    target = tmp_path / "elsewhere" / "fig.png"
    code = plot_cli.main([str(run / "results.json"), "--out", str(target), "--baseline", str(base)])
    assert code == 0
    scaling = tmp_path / "elsewhere" / "fig-scaling.png"
    assert capsys.readouterr().out.split() == [str(target), str(scaling)]
    assert target.exists() and scaling.exists()
    assert not (run / "roofline.png").exists()


def test_output_paths(tmp_path):
    run = write_run(tmp_path / "run", h100_meta(), [])
    assert plot_cli.figure_paths(str(run), None) == (run / "roofline.png", run / "scaling.png")
    assert plot_cli.figure_paths(str(run / "results.json"), None) == (run / "roofline.png",
                                                              run / "scaling.png")
    # --out naming a folder (existing, or without a suffix) keeps the default file names.
    assert plot_cli.figure_paths(str(run), str(tmp_path / "figs")) == (
        tmp_path / "figs" / "roofline.png", tmp_path / "figs" / "scaling.png")
    assert plot_cli.figure_paths(str(run), str(tmp_path / "a.png")) == (
        tmp_path / "a.png", tmp_path / "a-scaling.png")


@pytest.mark.parametrize("case", ["missing", "bad-json", "no-rows", "no-arg", "bad-flag",
                                  "bad-baseline", "bad-values", "bad-metadata"])
def test_cli_bad_input_one_line_exit_2(tmp_path, capsys, case):
    bad = tmp_path / "results.json"
    args: list[str]
    if case == "missing":
        args = [str(tmp_path / "nope")]
    elif case == "bad-json":
        bad.write_text("{not json")
        args = [str(bad)]
    elif case == "no-rows":
        bad.write_text(json.dumps({"metadata": {}}))
        args = [str(tmp_path)]
    elif case == "no-arg":
        args = []
    elif case == "bad-flag":
        args = [str(tmp_path), "--frobnicate"]
    elif case == "bad-baseline":
        run = write_run(tmp_path / "run", cpu_meta(), cpu_rows(cpu_meta()))
        args = [str(run), "--baseline", str(tmp_path / "missing")]
    elif case == "bad-metadata":  # metadata a list, not an object: a corrupt file, refused
        bad.write_text(json.dumps({"metadata": [1], "rows": cpu_rows(cpu_meta())[:2]}))
        args = [str(bad), "--out", str(tmp_path / "figs")]
    else:  # loads, but the ceilings are junk and a row's number is a string
        meta = cpu_meta()
        rows = cpu_rows(meta)[:4]
        rows[0]["tflops"] = "fast"
        meta["ceilings"] = "junk"
        args = [str(write_run(tmp_path / "odd", meta, rows))]
    code = plot_cli.main(args)
    err = capsys.readouterr().err
    if case == "bad-values":  # a metric that is not a number is refused, named
        assert "'tflops' is 'fast', not a number" in err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
