"""The first GPU runs (H200, 2026-11-26), committed under results/h200/2026-11-26/, read
as the GPU job's summary reads them: a sweep cut short (its rows only in its journal,
no ceilings in its metadata), two incomplete runs side by side, a miss by 0.04 %."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import run_bench
from contract.schema import RESULTS_JSON, ROWS_JOURNAL
from roofline.__main__ import main as roofline_main
from roofline.report import targets, targets_cli
from roofline.report.finalize_run import finalize
from tests.run_docs import load_run

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "results" / "h200" / "2026-11-26"


def _cut_short(src: Path, dest: Path) -> Path:
    """`src` as the H200 left its quick sweep: results.json with no rows and no
    ceilings (`timeout` ended the process before either was written), every row in the
    journal."""
    doc = json.loads((src / RESULTS_JSON).read_text())
    meta = {k: v for k, v in doc["metadata"].items() if k != "cut_short"}
    meta.update(ceilings={"datasheet": None, "measured": None}, complete=False,
                interrupted=False)
    dest.mkdir(parents=True)
    (dest / RESULTS_JSON).write_text(json.dumps({"metadata": meta, "rows": []}))
    (dest / ROWS_JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in doc["rows"]))
    return dest


@pytest.fixture()
def cut(tmp_path: Path) -> Path:
    return _cut_short(H200 / "quick", tmp_path / "quick")


def test_a_cut_run_is_read_from_its_journal_with_its_rows_ceilings(cut: Path) -> None:
    run = targets.load(str(cut))
    assert len(run.rows) == 219
    assert run.copy_gbps == pytest.approx(4260.3, abs=0.5)  # every row's meas_peak_gbps
    assert run.incomplete and "journal" in run.incomplete[0]
    found = {c.target: c for c in targets.checks([run])}
    # What the H200 summary called "not measured: run quick has no measured copy
    # bandwidth", measured: the elementwise, dot and matvec ratios of the quick run.
    add = found["add fp32"]
    assert add.parts[0].value == pytest.approx(0.988, abs=0.001)
    assert found["dot bf16"].parts[0].value == pytest.approx(0.815, abs=0.001)
    assert found["matvec bf16"].parts[0].value == pytest.approx(0.700, abs=0.001)
    assert "incomplete run" in add.cells()[1]
    text = targets_cli.render([run])
    assert "no measured copy bandwidth" not in text
    assert "## Incomplete runs" in text and "quick (incomplete: " in text


def test_two_cut_runs_are_compared_on_the_rows_both_hold(cut: Path, tmp_path: Path,
                                                          capsys) -> None:
    """The plain quick sweep cut at 219 rows and the fleet's cut (interrupted) at 225:
    the H200 job failed on 'ROWS DIFFER'; the rows both hold agree."""
    doc = json.loads((H200 / "quick" / RESULTS_JSON).read_text())
    extra = [dict(r, shape=f"n={1 + i}") for i, r in enumerate(doc["rows"][:6])]
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    meta = dict(doc["metadata"], complete=False, interrupted=True, signal="SIGINT")
    meta.pop("cut_short", None)
    (fleet / RESULTS_JSON).write_text(json.dumps({"metadata": meta,
                                                  "rows": doc["rows"] + extra}))
    code = roofline_main(["targets", str(cut), "--same-rows", str(cut), str(fleet)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "same rows: the 219 rows both hold have the same statuses" in out
    assert "plain run is incomplete" in out and "fleet run is incomplete" in out
    # A status that differs on a row both hold still fails, incomplete or not.
    rows = [dict(r) for r in doc["rows"]] + extra
    rows[0]["status"] = "failed"
    (fleet / RESULTS_JSON).write_text(json.dumps({"metadata": meta, "rows": rows}))
    assert roofline_main(["targets", str(cut), "--same-rows", str(cut), str(fleet)]) == 1
    assert "ROWS DIFFER: 1 with another status" in capsys.readouterr().out


def test_rows_missing_from_a_complete_run_still_differ(tmp_path: Path) -> None:
    doc = json.loads((H200 / "matmul-8192" / RESULTS_JSON).read_text())
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, rows in ((a, doc["rows"]), (b, doc["rows"][:-1])):
        folder.mkdir()
        (folder / RESULTS_JSON).write_text(json.dumps({"metadata": doc["metadata"],
                                                       "rows": rows}))
    same, why = targets_cli.same_rows(targets.load(str(a)), targets.load(str(b)))
    assert not same and why.startswith("1 only in the plain run")


@pytest.mark.parametrize("value,need,measured,short", [
    (0.9496, 0.95, "0.9496", "0.04%"),  # the H200's fp8 matmul: "0.950x ... 0.0% short"
    (0.94999, 0.95, "0.94999", "0.001%"),
    (0.903, 0.95, "0.903", "4.9%"),
])
def test_a_miss_never_prints_like_a_hit(value: float, need: float, measured: str,
                                        short: str) -> None:
    check = targets.Check("t", parts=[targets.Part(need, "x", value)])
    cells = check.cells()
    assert cells[2] == f"{measured}x"
    assert cells[4] == f"missed: x: {short} short"


def test_a_met_target_keeps_three_decimals() -> None:
    cells = targets.Check("t", parts=[targets.Part(0.95, "x", 0.95004)]).cells()
    assert cells[2] == "0.950x" and cells[4] == "met"


def test_finalize_writes_a_cut_run_whole_and_keeps_it_incomplete(cut: Path) -> None:
    folder, n = finalize(cut, plots=False)
    assert n == 219 and not (cut / ROWS_JOURNAL).exists()
    meta, df = load_run(cut)
    assert len(df) == 219 and meta["complete"] is False and "journal" in meta["cut_short"]
    assert (cut / "summary.md").exists() and (cut / "results.csv").exists()
    # Once whole, there is nothing to finalize: refused, nothing rewritten.
    before = (cut / RESULTS_JSON).read_bytes()
    assert roofline_main(["finalize", str(cut)]) == 2
    assert (cut / RESULTS_JSON).read_bytes() == before


def test_finalize_never_replaces_more_rows_with_fewer(cut: Path, capsys) -> None:
    lines = (cut / ROWS_JOURNAL).read_text().splitlines(keepends=True)
    doc = json.loads((cut / RESULTS_JSON).read_text())
    doc["rows"] = [json.loads(x) for x in lines]
    (cut / RESULTS_JSON).write_text(json.dumps(doc))
    (cut / ROWS_JOURNAL).write_text("".join(lines[:10]))
    assert roofline_main(["finalize", str(cut)]) == 2
    assert "left as it is" in capsys.readouterr().err
    assert len(json.loads((cut / RESULTS_JSON).read_text())["rows"]) == 219


def test_a_finalized_cpu_run_can_still_be_resumed(tmp_path: Path) -> None:
    argv = ["--device", "cpu", "--sizes", "n=2048;n=4096", "--kernels", "add",
            "--dtypes", "fp32", "--providers", "torch", "--no-plots", "--out",
            str(tmp_path / "out"), "--run-id", "r"]
    assert run_bench.main(argv) == 0
    run = tmp_path / "out" / "cpu" / "r"
    doc = json.loads((run / RESULTS_JSON).read_text())
    first = doc["rows"][:1]  # killed after its first row
    (run / ROWS_JOURNAL).write_text(json.dumps(first[0]) + "\n")
    doc.update(rows=[])
    doc["metadata"].update(complete=False)
    (run / RESULTS_JSON).write_text(json.dumps(doc))
    assert roofline_main(["finalize", str(run), "--no-plots"]) == 0
    assert run_bench.main(["--resume", str(run), "--no-plots"]) == 0
    meta, df = load_run(run)
    assert len(df) == 2 and meta["complete"] is True


def test_the_committed_baseline_is_the_h200s_complete_quick_run() -> None:
    """The 2026-11-27 warm quick sweep, complete (the first baseline, cut short at 219
    rows, is kept in results/baselines/history/)."""
    base = json.loads((ROOT / "results" / "baselines" / "h200.json").read_text())
    run = "h200/2026-11-27/quick-warm2"
    quick = json.loads((ROOT / "results" / run / RESULTS_JSON).read_text())
    assert base["metadata"]["device_key"] == "h200" and base["metadata"]["complete"]
    assert len(base["rows"]) == len(quick["rows"]) == 406
    assert base["metadata"]["promoted_from"].endswith(f"{run}/results.json")
    first = list((ROOT / "results" / "baselines" / "history").glob("h200.*.json"))
    assert [len(json.loads(f.read_text())["rows"]) for f in first] == [219]


def test_copying_the_committed_runs_keeps_them_readable(tmp_path: Path) -> None:
    """Every committed H200 run loads and its summary reads what it measured."""
    for name in ("quick", "matmul-8192", "fp8-precise", "vectors-fp8", "step-kernels"):
        shutil.copytree(H200 / name, tmp_path / name)
    runs = [targets.load(str(tmp_path / n)) for n in ("quick", "vectors-fp8",
                                                      "matmul-8192", "fp8-precise")]
    text = targets_cli.render(runs)
    assert "| cuBLAS bf16 (torch.matmul) 8192^3 | 735 TFLOP/s at 1,575 MHz | matmul-8192 |" \
        in text
    # Triton and torch timed 0.5% apart in clock: a code ratio, judged (a miss by 0.04%).
    assert "0.9496x _scaled_mm (1,538 vs 1,530 MHz)" in text
