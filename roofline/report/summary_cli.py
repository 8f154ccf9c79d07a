"""`python -m roofline summary RUN [RUN ...]`: a saved run's summary.md written again
from its results.json, as today's readers see it (the physics check applied by
schema.load_doc).  Only summary.md is written; the figures stay as they are (`plot`
redraws them) and results.json and results.csv are only read."""

from __future__ import annotations

import sys
from pathlib import Path

from contract.cli import Parser
from contract.schema import RunLoadError, load_doc, resolve_results_json
from roofline.report.summary import write_summary


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m roofline summary",
               description="Write a saved run's summary.md again from its rows (each run "
                           "folder's own); exit 2 on bad input.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folder or results.json")
    args = p.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        # Every run read before any summary is written: a bad one refuses them all.
        loaded = [(resolve_results_json(run).parent, load_doc(run)) for run in args.runs]
    except (RunLoadError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for folder, doc in loaded:
        try:
            print(write_summary(Path(folder), doc))
        except OSError as e:
            print(f"error: cannot write {folder}'s summary: {e}", file=sys.stderr)
            return 2
    return 0
