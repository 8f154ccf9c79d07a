"""`python -m roofline finalize RUN`: a run killed before it wrote results.json whole
(SIGKILL, a lost machine, a job's hard time limit) made readable as any other run.

Its rows are those of its row journal (every row it finished); they go into results.json
and results.csv, then summary.md and the figures are drawn.  The run stays what it was:
incomplete (`complete` false, `cut_short` saying how it ended), so the gate and the
targets never take it for a whole run, and `run_bench.py --resume RUN` can still finish
it.  Its ceilings stay as measured: a run cut before they reached its metadata has them
in every row (meas_peak_*), where the readers find them (contract.rows.run_ceilings).
Nothing is lost: the journal is removed only once results.json holds each of its rows.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from contract import physics
from contract.cli import UsageError, one_path_and_plots
from contract.record import parse_row
from contract.run_meta import parse_meta
from contract.schema import (
    RESULTS_JSON,
    ROOFLINE_PNG,
    ROWS_JOURNAL,
    SCALING_PNG,
    RunDoc,
    RunLoadError,
    journal_rows,
    read_doc,
    resolve_results_json,
    write_results,
)
from contract.speedup import with_speedups

USAGE = "python -m roofline finalize RUN [--no-plots]"


class FinalizeError(ValueError):
    """A run that cannot be finalized (one-line message, exit 2)."""


def finalize(run: str | Path, plots: bool = True) -> tuple[Path, int]:
    """Write RUN's results.json and results.csv whole from its journal, then its
    summary and figures; (run folder, rows).  Refused where there is no journal (the
    run wrote results.json whole itself) or the journal holds fewer rows than
    results.json (something else rewrote it: nothing is replaced)."""
    path = resolve_results_json(run)
    folder = path.parent
    journal = folder / ROWS_JOURNAL
    if not journal.exists():
        raise FinalizeError(f"{folder} has no row journal ({ROWS_JOURNAL}): its results.json "
                            "is whole already")
    raw = read_doc(path)  # checked as any run; its rows are the journal's when longer
    rows = journal_rows(journal)
    written = len(json.loads(path.read_text())["rows"])
    if len(rows) < written:
        raise FinalizeError(f"{folder}: its journal holds {len(rows)} rows, results.json "
                            f"{written}: left as it is")
    meta = parse_meta(raw.get("metadata"))
    if meta.state.complete is True:
        raise FinalizeError(f"{folder}: the run says it is complete, yet has a journal: "
                            "left as it is")
    meta = meta.updated(state__complete=False, state__cut_short=(
        f"ended before it wrote {RESULTS_JSON} whole; finalized from its row journal "
        f"({len(rows)} rows) on {datetime.now(timezone.utc).isoformat(timespec='seconds')}"))
    # The speedups, then the physics check, as the sweep's writer applies them.
    records = physics.apply(with_speedups([parse_row(r) for r in rows],
                                          meta.baseline_provider), meta)
    write_results(folder, meta, records)
    doc = RunDoc(meta, tuple(records), path)
    journal.unlink()  # results.json holds every row it held
    from roofline.report.summary import write_summary

    if plots:
        import matplotlib.pyplot as plt

        from roofline.report.plot import plot_roofline
        from roofline.report.plot_scaling import plot_scaling

        plt.close(plot_roofline(doc, folder / ROOFLINE_PNG))
        plt.close(plot_scaling(doc, folder / SCALING_PNG))
    write_summary(folder, doc)
    return folder, len(rows)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {USAGE}\n{__doc__}")
        return 0 if argv else 2
    try:
        run, plots = one_path_and_plots(argv, "RUN", USAGE)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        folder, n = finalize(run, plots=plots)
    except (FinalizeError, RunLoadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{folder}: {n} rows written whole from its journal; still incomplete "
          f"(run_bench.py --resume {folder} finishes it)")
    return 0
