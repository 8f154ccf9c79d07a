"""Killed runs under a folder written whole (benches/fleet/finalize.py): a fleet killed
before rank 0 wrote its folder has journals only in its rank folders
(<fleet>/ranks/rank-<r>/<device>/<run-id>/rows.jsonl), which `.ci/gpu`'s glob for
<fleet>/rows.jsonl never found.  The runs are built from the H200's matmul-8192 rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benches.fleet import finalize as ff
from benches.fleet.folder import RANK_FILE
from contract.schema import RESULTS_JSON, ROWS_JOURNAL
from tests.run_docs import load_run

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "results" / "h200" / "2026-11-26" / "matmul-8192"
UUID = "GPU-d37cfc5e-b00f-d515-3c86-273ef85e6a34"  # the H200's, in its nvml_start


def _killed_run(folder: Path, rows: list[dict]) -> None:
    """A run as a SIGKILL leaves it: results.json with its metadata and no rows, every
    row it finished in its journal."""
    meta = dict(json.loads((H200 / RESULTS_JSON).read_text())["metadata"], complete=False)
    folder.mkdir(parents=True)
    (folder / RESULTS_JSON).write_text(json.dumps({"metadata": meta, "rows": []}))
    (folder / ROWS_JOURNAL).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _killed_fleet(out: Path, ranks: tuple[int, ...] = (0, 1), world: int = 2) -> Path:
    """<out>/fleet/quick: rank folders with journals and rank.json, no fleet files."""
    rows = json.loads((H200 / RESULTS_JSON).read_text())["rows"]
    fleet = out / "fleet" / "quick"
    for r in ranks:
        rank_dir = fleet / "ranks" / f"rank-{r}"
        _killed_run(rank_dir / "h200" / "quick", rows[: 2 + 2 * r])
        (rank_dir / RANK_FILE).write_text(json.dumps(
            {"rank": r, "world": world, "local_rank": r, "local_world": world,
             "host": "node-a", "backend": "nccl", "timeout_s": 120.0, "device": "cuda"}))
    return fleet


def test_a_killed_fleet_is_written_from_its_rank_journals(tmp_path: Path) -> None:
    fleet = _killed_fleet(tmp_path)
    plain = tmp_path / "runs" / "h200" / "matmul-8192"
    _killed_run(plain, json.loads((H200 / RESULTS_JSON).read_text())["rows"][:3])
    got = ff.finalize_tree(tmp_path, plots=False)
    assert not got.refused
    assert sorted((d.what, d.rows) for d in got.done) == [("fleet", 6), ("run", 2),
                                                         ("run", 3), ("run", 4)]
    assert not list(tmp_path.rglob(ROWS_JOURNAL))  # every journal written whole
    meta, df = load_run(fleet)
    assert meta["complete"] is False and "killed before rank 0" in meta["cut_short"]
    assert sorted(df["rank"].tolist()) == [0, 0, 1, 1, 1, 1]
    assert set(df["host"]) == {"node-a"} and set(df["gpu_uuid"]) == {UUID}
    assert [i["rank"] for i in meta["fleet"]["ranks"]] == [0, 1]
    assert meta["fleet"]["world"] == 2 and meta["fleet"]["missing_ranks"] == []
    assert "**Incomplete: the fleet was killed" in (fleet / "fleet.md").read_text()
    assert (fleet / "summary.md").exists()
    for r, n in ((0, 2), (1, 4)):  # each rank's own run: whole, still incomplete
        rmeta, rdf = load_run(fleet / "ranks" / f"rank-{r}" / "h200" / "quick")
        assert len(rdf) == n and rmeta["complete"] is False
    # Finalizing again changes nothing.
    before = (fleet / RESULTS_JSON).read_bytes()
    again = ff.finalize_tree(tmp_path, plots=False)
    assert again.done == [] and again.refused == []
    assert (fleet / RESULTS_JSON).read_bytes() == before


def test_a_rank_that_never_started_is_missing(tmp_path: Path) -> None:
    fleet = _killed_fleet(tmp_path, ranks=(0,), world=2)
    (fleet / "ranks" / "rank-1").mkdir()  # made, killed before its run folder existed
    got = ff.finalize_tree(tmp_path, plots=False)
    assert [(d.what, d.rows) for d in got.done] == [("run", 2), ("fleet", 2)]
    meta, _ = load_run(fleet)
    assert meta["fleet"]["missing_ranks"] == [1]


def test_rows_gathered_from_another_node_are_kept(tmp_path: Path) -> None:
    """Rank 0 had gathered rank 1's rows (its folder is on another node's disk) and
    written the fleet's results.json, then was killed before fleet.md: rank 1's rows
    and the collective rows it held stay."""
    fleet = _killed_fleet(tmp_path, ranks=(0,))
    rows = json.loads((H200 / RESULTS_JSON).read_text())["rows"]
    theirs = [dict(r, rank=1, host="node-b", gpu_uuid="GPU-b") for r in rows]
    coll = [dict(rows[0], kernel="all_reduce", provider="nccl", rank=None, host="fleet",
                 shape="bytes=4096,ranks=2", bytes=4096, algbw_gbps=1.5, busbw_gbps=1.5)]
    meta = dict(json.loads((H200 / RESULTS_JSON).read_text())["metadata"], complete=False,
                fleet={"world": 2, "backend": "nccl", "problem": None, "ranks": [
                    {"rank": 1, "host": "node-b", "exit_code": 0, "gpu_uuid": "GPU-b"}]})
    (fleet / RESULTS_JSON).write_text(json.dumps({"metadata": meta, "rows": theirs + coll}))
    got = ff.finalize_tree(tmp_path, plots=False)
    assert ("fleet", 2 + 4 + 1) in [(d.what, d.rows) for d in got.done]
    _, df = load_run(fleet)
    assert sorted(df["host"].tolist()) == ["fleet"] + ["node-a"] * 2 + ["node-b"] * 4


def test_the_command_line(tmp_path: Path, capsys) -> None:
    fleet = _killed_fleet(tmp_path)
    assert ff.main([str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"{fleet}: 6 rows written whole from its rank folders; still incomplete" in out
    assert ff.main([str(tmp_path), "--no-plots"]) == 0
    assert capsys.readouterr().out == f"nothing to finalize under {tmp_path}\n"
    # A journal beside no results.json cannot be written whole: one error line, exit 1.
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / ROWS_JOURNAL).write_text("")
    assert ff.main([str(tmp_path), "--no-plots"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'odd'}: no results")


@pytest.mark.parametrize("argv, says", [
    ([], "usage: "), (["a", "b"], "expected one DIR, got 2"), (["--all"], "unknown option"),
    (["/nonexistent-dir"], "is not a folder")])
def test_usage_errors_are_one_line(argv: list[str], says: str, capsys) -> None:
    code = ff.main(argv)
    assert code == 2
    captured = capsys.readouterr()
    if argv:
        (line,) = captured.err.strip().splitlines()
        assert line.startswith("error: ") and says in line
    else:
        assert captured.out.startswith(says)
