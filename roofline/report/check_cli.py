"""`python -m roofline check RUN [RUN ...]`: the physics check (contract/physics.py) over
saved runs, one line per withheld value (run, row, column, value, bound, kind and why),
then a count by kind.  The runs are read as every reader reads them (schema.load_doc,
which applies the check), so the lines are what summary.md, the targets, the gate and
the figures leave out; nothing is written.  Exit 0 when it ran (withheld values are
findings, not errors), 2 on bad input."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from contract.cli import Parser
from contract.physics import Withheld, counts, value_text
from contract.schema import RunLoadError, load_doc


@dataclass(frozen=True)
class Found:
    """One withheld value of a saved run: the run as given, its row's name, the record."""

    run: str
    row: str
    record: Withheld

    def line(self) -> str:
        w = self.record
        return (f"{self.run}: {self.row}: {w.column} {value_text(w.value, w.column)}, "
                f"bound {w.bound_text()} ({w.kind}: {w.reason})")


def run_findings(run: str) -> list[Found]:
    """Every withheld value of a run, in row order (RunLoadError for a run that cannot
    be read)."""
    return [Found(run, r.label(), w) for r in load_doc(run).rows for w in r.withheld]


def count_line(found: list[Found]) -> str:
    """'N values withheld: power P, energy E, ...', every kind named; the values taken
    along with another (energy with its power) are counted under that one's kind."""
    by_kind = counts(f.record for f in found)
    derived = sum(f.record.derived_from is not None for f in found)
    rows = len({(f.run, f.row) for f in found})
    return (f"{len(found)} values withheld: "
            + ", ".join(f"{k} {n}" for k, n in by_kind.items())
            + f" ({rows} rows; {derived} of the values computed from another withheld one)")


def main(argv: list[str]) -> int:
    p = Parser(prog="python -m roofline check",
               description="The physics check over saved runs: each value no device can "
                           "produce (power above the limit, a kernel faster than memory, "
                           "providers timed at unequal clocks, ...), and a count by kind. "
                           "Exit 0 when it ran, 2 on bad input.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folder or results.json")
    args = p.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        found = [f for run in args.runs for f in run_findings(run)]
    except (RunLoadError, OSError) as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for f in found:
        print(f.line())
    print(count_line(found))
    return 0
