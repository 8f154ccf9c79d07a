"""Writing rows: a cost per row that does not grow with the run, and nothing lost.

ResultWriter.add appends one line to the row journal and one to results.csv; results.json
is rewritten only by flush().  What the tests pin: add() never rewrites a whole file
after the first CSV write, results.json is never touched by add(), readers (load_doc,
--resume) see every added row through the journal, a torn last line is dropped, and
close() leaves results.json whole and the journal gone.
"""

from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from benches.sweep import results
from benches.sweep.results import ResultWriter
from contract import schema
from contract.record import Accounting, CaseId, RunRow, Timing
from contract.run_meta import Provenance, RunMeta, RunState
from contract.schema import ALL_COLUMNS, ROWS_JOURNAL, SAMPLES, load_doc, read_doc
from tests.run_docs import load_run

META = RunMeta(provenance=Provenance(run_id="x"))


def written_row(i: int, n_samples: int = 50) -> RunRow:
    return RunRow(
        CaseId("add", "torch", "fp32", f"n={1024 * (i + 1)}"),
        Accounting(flops=1024 * (i + 1), bytes=12 * 1024 * (i + 1)), status="ok", reason="",
        timing=Timing(ms_median=0.5 + i, n_samples=n_samples, timer="torch.utils.benchmark",
                      samples_ms=tuple(0.5 + i + 0.001 * k for k in range(n_samples))))


def samples(row: RunRow) -> list[float]:
    return list(row.timing.samples_ms)


def test_add_never_rewrites_a_whole_file(tmp_path, monkeypatch):
    w = ResultWriter(tmp_path / "run", META)
    w.flush()
    json_stat = (tmp_path / "run" / "results.json").stat()
    rewrites: list[str] = []
    real = results.atomic_write_text
    monkeypatch.setattr(results, "atomic_write_text",
                        lambda p, t: (rewrites.append(str(p)), real(p, t)))
    sizes = []
    for _ in range(40):
        w.add(written_row(0))  # same row each time: every append must be the same size
        sizes.append((tmp_path / "run" / ROWS_JOURNAL).stat().st_size)
    assert rewrites == []
    steps = {b - a for a, b in zip(sizes, sizes[1:], strict=False)}
    assert len(steps) == 1, "each row appends a line of its own size, nothing more"
    after = (tmp_path / "run" / "results.json").stat()
    assert (after.st_ino, after.st_mtime_ns) == (json_stat.st_ino, json_stat.st_mtime_ns)


def test_readers_see_rows_added_since_the_last_flush(tmp_path):
    run = tmp_path / "run"
    w = ResultWriter(run, META)
    w.flush()
    rows = [written_row(i) for i in range(5)]
    for r in rows:
        w.add(r)
    assert json.loads((run / "results.json").read_text())["rows"] == []
    doc = load_doc(run)
    assert doc.meta.provenance.run_id == "x" and not doc.meta.state.complete
    assert [r.case.shape for r in doc.rows] == [r.case.shape for r in rows]
    assert read_doc(run)["rows"][3][SAMPLES] == samples(rows[3])
    csv = pd.read_csv(run / "results.csv")
    assert list(csv["shape"]) == [r.case.shape for r in rows]
    assert list(csv.columns) == ALL_COLUMNS
    # The appended CSV is the same text a whole rewrite gives.
    text = (run / "results.csv").read_text()
    w.flush()
    assert (run / "results.csv").read_text() == text


def test_a_torn_last_journal_line_is_dropped(tmp_path):
    run = tmp_path / "run"
    w = ResultWriter(run, META)
    w.flush()
    for i in range(3):
        w.add(written_row(i))
    with open(run / ROWS_JOURNAL, "a") as f:
        f.write(schema.journal_line(written_row(9))[:40])  # killed mid-write: cut JSON
    _, df = load_run(run)
    assert len(df) == 3


def test_close_writes_every_row_and_removes_the_journal(tmp_path):
    run = tmp_path / "run"
    w = ResultWriter(run, META)
    w.flush()
    for i in range(4):
        w.add(written_row(i))
    w.close()
    assert not (run / ROWS_JOURNAL).exists()
    doc = json.loads((run / "results.json").read_text())
    assert [r["shape"] for r in doc["rows"]] == [written_row(i).case.shape for i in range(4)]
    assert doc["rows"][2][SAMPLES] == samples(written_row(2))


def test_a_resumed_writer_journals_its_earlier_rows_first(tmp_path):
    run = tmp_path / "run"
    earlier = [written_row(i) for i in range(3)]
    w = ResultWriter(run, META, earlier)
    w.flush()
    w.add(written_row(7))
    lines = (run / ROWS_JOURNAL).read_text().splitlines()
    assert [json.loads(ln)["shape"] for ln in lines] == \
        [r.case.shape for r in earlier] + [written_row(7).case.shape]


def test_resume_reads_the_rows_of_a_killed_run(tmp_path):
    """A process killed between flushes: --resume starts from the journal's rows."""
    from benches.sweep.run_folder import read_run_doc

    run = tmp_path / "run"
    meta = RunMeta(provenance=Provenance(run_id="x"), state=RunState(complete=False),
                   request={"selection": {"kernels": ["add"], "dtypes": ["fp32"],
                                          "providers": ["torch"], "sizes": "quick"}})
    w = ResultWriter(run, meta)
    w.flush()
    for i in range(2):
        w.add(written_row(i))
    folder, _, rows = read_run_doc(str(run))
    assert folder == run
    assert rows == w.rows  # the records as written (each with its speedup, 1.0)
    assert [r.case.shape for r in rows] == ["n=1024", "n=2048"]


def test_journal_files_get_the_usual_mode(tmp_path):
    run = tmp_path / "run"
    old = os.umask(0o022)
    try:
        w = ResultWriter(run, META)
        w.add(written_row(0))
    finally:
        os.umask(old)
    assert (run / ROWS_JOURNAL).stat().st_mode & 0o777 == 0o644
    assert (run / "results.csv").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize("bad", ["[1, 2]\n", "{\"a\": 1}"])
def test_journal_reader_stops_at_a_non_row(tmp_path, bad):
    p = tmp_path / ROWS_JOURNAL
    p.write_text(json.dumps({"kernel": "add"}) + "\n" + bad + json.dumps({"k": 2}) + "\n")
    assert schema.journal_rows(p) == [{"kernel": "add"}]
