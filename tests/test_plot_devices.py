"""`python -m roofline plot RUN_A RUN_B ... --devices`: several devices' roofs and points
on one figure, checked through matplotlib objects (gids, data, colours), never pixels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.colors import to_rgba

from contract.devices import DEVICES
from roofline.report import plot_cli
from roofline.report.plot_devices import plot_devices
from tests.run_docs import doc_of
from tests.test_plot import (
    cpu_meta,
    cpu_rows,
    gids,
    h100_meta,
    make_row,
    n_points,
    number,
    small_run,
    write_run,
)

H200, B200 = DEVICES["h200"], DEVICES["b200"]
H200_MEAS_HBM = 4300.0


def h200_meta() -> dict[str, Any]:
    return h100_meta(
        run_id="h200-run", device_key="h200", device_name="NVIDIA H200",
        ceilings={"datasheet": {"tflops": dict(H200.peaks_tflops), "hbm_gbps": H200.hbm_gbps,
                                "l2_gbps": None},
                  "measured": {"tflops": {k: v * 0.8 for k, v in H200.peaks_tflops.items()},
                               "hbm_gbps": H200_MEAS_HBM, "l2_gbps": None}})


def b200_meta() -> dict[str, Any]:
    """A B200 run: measured bf16 near mamf-finder's 1,745 of 2,250 (docs/design.md)."""
    return h100_meta(
        run_id="b200-run", device_key="b200", device_name="NVIDIA B200",
        ceilings={"datasheet": {"tflops": dict(B200.peaks_tflops), "hbm_gbps": B200.hbm_gbps,
                                "l2_gbps": None},
                  "measured": {"tflops": {k: v * 0.78 for k, v in B200.peaks_tflops.items()},
                               "hbm_gbps": 7000.0, "l2_gbps": None}})


def fp4_row(meta: dict[str, Any]) -> dict[str, Any]:
    """A block-scaled 4-bit GEMM row held against the fp4 roof (the row says so, as
    rows written by the harness do)."""
    row = make_row("matmul", "triton", "bf16", "M=8192,N=8192,K=8192", 0.7, meta)
    row.update(dtype="mxfp4", roof_class="fp4")
    return row


@pytest.fixture(scope="module")
def three():
    """H100, H200 and a CPU, as `plot A B C --devices` loads them."""
    metas = [h100_meta(), h200_meta(), cpu_meta()]
    rows = [small_run(metas[0]), small_run(metas[1]), cpu_rows(metas[2])]
    return [doc_of(m, r) for m, r in zip(metas, rows, strict=True)]


@pytest.fixture(scope="module")
def three_fig(three):
    return plot_devices(three)


def panel(fig: Any, dtype: str) -> Any:
    return next(ax for ax in fig.axes if ax.get_title().startswith(f"{dtype}:"))


def line(ax: Any, gid: str) -> Any:
    found = [ln for ln in ax.lines if ln.get_gid() == gid]
    assert len(found) == 1, (gid, sorted(str(ln.get_gid()) for ln in ax.lines))
    return found[0]


def test_each_device_has_its_hbm_slope_and_compute_roofs(three_fig):
    ax = panel(three_fig, "bf16")
    # Slopes: y = x * bandwidth, each device's own.
    for gid, gbps in [("roof:h100:datasheet:hbm", 3350.0), ("roof:h100:measured:hbm", 3000.0),
                      ("roof:h200:datasheet:hbm", 4800.0),
                      ("roof:h200:measured:hbm", H200_MEAS_HBM),
                      ("roof:cpu:measured:hbm", 20.0)]:
        ln = line(ax, gid)
        x, y = ln.get_xdata(), ln.get_ydata()
        assert y[0] / x[0] == pytest.approx(gbps / 1e3), gid
    # Flat roofs of the classes this dtype's rows use (elementwise on fp32, GEMMs on bf16).
    for gid, peak in [("roof:h100:datasheet:bf16", 989.4), ("roof:h200:datasheet:bf16", 989.4),
                      ("roof:h200:measured:bf16", 989.4 * 0.8), ("roof:h100:datasheet:fp32", 66.9),
                      ("roof:cpu:measured:bf16", 2.4), ("roof:cpu:measured:fp32", 1.2)]:
        assert list(line(ax, gid).get_ydata()) == pytest.approx([peak, peak]), gid
    # A CPU has no datasheet: nothing drawn as one.
    assert not [ln for ln in ax.lines if (ln.get_gid() or "").startswith("roof:cpu:datasheet")]
    # Datasheet solid, measured dashed, as in roofline.png.
    assert line(ax, "roof:h200:datasheet:bf16").get_linestyle() == "-"
    assert line(ax, "roof:h200:measured:bf16").get_linestyle() == "--"


def test_ridges_are_each_devices_own(three_fig):
    ax = panel(three_fig, "bf16")
    texts = {t.get_gid(): t.get_text() for t in ax.texts
             if (t.get_gid() or "").startswith("ridge:")}
    assert number(texts["ridge:h100:bf16"], "ridge") == pytest.approx(295, abs=1)
    assert number(texts["ridge:h200:bf16"], "ridge") == pytest.approx(206, abs=1)
    assert number(texts["ridge:cpu:bf16"], "ridge") == pytest.approx(2.4e3 / 20, rel=0.01)
    assert texts["ridge:h100:bf16"].startswith("h100 bf16 989.4 TFLOP/s")
    assert "measured 2.4 TFLOP/s" in texts["ridge:cpu:bf16"]
    marker = line(ax, "ridge-marker:h200:datasheet:bf16")
    assert marker.get_xdata()[0] == pytest.approx(989.4e3 / 4800)


def test_points_per_device_in_its_colour(three, three_fig):
    colours = {}
    for tag, doc in zip(("h100", "h200", "cpu"), three, strict=True):
        assert n_points(three_fig, f"points:{tag}:") == sum(r.ok for r in doc.rows), tag
        roof = [ln for ax in three_fig.axes for ln in ax.lines
                if (ln.get_gid() or "").startswith(f"roof:{tag}:")]
        colour = {to_rgba(ln.get_color()) for ln in roof}
        assert len(colour) == 1, tag  # one colour per device...
        for c in gids(three_fig, f"points:{tag}:", "collections"):
            assert {tuple(fc[:3]) for fc in c.get_facecolors()} == {next(iter(colour))[:3]}
        colours[tag] = colour.pop()
    assert len(set(colours.values())) == 3  # ...and a different one for each


def test_legend_names_device_and_run(three_fig):
    labels = [t.get_text() for t in three_fig.legends[0].get_texts()]
    for bits in [("NVIDIA H100 80GB HBM3 (h100)", "run 20250101-120000-test"),
                 ("NVIDIA H200 (h200)", "run h200-run"), ("AMD EPYC 7B13 (cpu)", "run cpu-run")]:
        assert any(all(b in lab for b in bits) for lab in labels), bits
    assert {"torch", "triton", "datasheet roof", "measured roof"} <= set(labels)
    assert "h100 vs h200 vs cpu" in three_fig._suptitle.get_text()


def test_fp4_roof_drawn_for_blackwell_only():
    """A B200 run's 4-bit GEMM held against its fp4 roof; the H100 beside it has none:
    the panel says so instead of drawing a roof the device lacks."""
    h100, b200 = h100_meta(), b200_meta()
    runs = [doc_of(h100, small_run(h100)), doc_of(b200, small_run(b200) + [fp4_row(b200)])]
    fig = plot_devices(runs)
    ax = panel(fig, "mxfp4")
    assert set(line(ax, "roof:b200:datasheet:fp4").get_ydata()) == {9000.0}
    assert not [ln for ln in ax.lines if (ln.get_gid() or "").startswith("roof:h100:")
                and not ln.get_gid().endswith(":hbm")]
    texts = {t.get_gid(): t.get_text() for t in ax.texts}
    assert texts["ridge:h100:none:fp4"] == "h100: no fp4 roof"
    assert number(texts["ridge:b200:fp4"], "ridge") == pytest.approx(1125)
    assert n_points(fig, "points:b200:mxfp4:") == 1
    # bf16 is on both devices: two bf16 roofs, B200's 2250 above H100's 989.4.
    bf16 = panel(fig, "bf16")
    assert set(line(bf16, "roof:b200:datasheet:bf16").get_ydata()) == {2250.0}
    assert set(line(bf16, "roof:h100:datasheet:bf16").get_ydata()) == {989.4}


def test_two_runs_of_one_device_get_their_own_tags():
    meta = h100_meta()
    again = h100_meta(run_id="again")
    fig = plot_devices([doc_of(meta, small_run(meta)), doc_of(again, small_run(again))])
    assert n_points(fig, "points:h100:") == n_points(fig, "points:h100-2:") == 16
    assert "h100 vs h100-2" in fig._suptitle.get_text()


# ------------------------------------------------------------------------------------ CLI


def runs_on_disk(tmp_path: Path) -> list[Path]:
    h100, h200 = h100_meta(), h200_meta()
    return [write_run(tmp_path / "h100", h100, small_run(h100)),
            write_run(tmp_path / "h200", h200, small_run(h200)),
            write_run(tmp_path / "cpu", cpu_meta(), cpu_rows(cpu_meta()))]


def test_cli_devices_figure(tmp_path, capsys):
    from roofline.__main__ import main as module_main  # the `python -m roofline` entry

    a, b, c = runs_on_disk(tmp_path)
    assert module_main(["plot", str(a), str(b / "results.json"), str(c), "--devices"]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(a / "devices.png")]
    assert Path(out[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (a / "roofline.png").exists()  # the per-run figures are not redrawn
    target = tmp_path / "figs" / "cmp.png"
    assert plot_cli.main([str(a), str(b), "--devices", "--out", str(target)]) == 0
    assert capsys.readouterr().out.split() == [str(target)] and target.exists()
    assert plot_cli.main([str(a), str(b), "--devices", "--out", str(tmp_path / "dir")]) == 0
    assert (tmp_path / "dir" / "devices.png").exists()


@pytest.mark.parametrize("case", ["one-run", "no-flag", "with-baseline", "missing",
                                  "bad-json", "bad-values", "same-run"])
def test_cli_devices_refusals_one_line_exit_2(tmp_path, capsys, case):
    a, b, _ = runs_on_disk(tmp_path)
    args: list[str]
    if case == "one-run":
        args = [str(a), "--devices"]
    elif case == "no-flag":  # two runs without --devices: which figure was meant?
        args = [str(a), str(b)]
    elif case == "with-baseline":
        args = [str(a), str(b), "--devices", "--baseline", str(b)]
    elif case == "missing":
        args = [str(a), str(tmp_path / "nope"), "--devices"]
    elif case == "bad-json":
        (b / "results.json").write_text("{not json")
        args = [str(a), str(b), "--devices"]
    elif case == "bad-values":
        doc = json.loads((b / "results.json").read_text())
        doc["rows"][0]["tflops"] = "fast"
        (b / "results.json").write_text(json.dumps(doc))
        args = [str(a), str(b), "--devices"]
    else:
        args = [str(a), str(a / "results.json"), "--devices"]
    code = plot_cli.main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    expect = {"one-run": "at least two runs", "no-flag": "only with --devices",
              "with-baseline": "does not combine with --devices", "missing": "no results",
              "bad-json": "cannot read", "bad-values": "'tflops' is 'fast'",
              "same-run": "same run"}[case]
    assert expect in err
    assert not list(tmp_path.rglob("devices.png"))  # nothing half-written
