"""`python -m roofline targets RUN [RUN ...] [--steps TSV] [--same-rows PLAIN FLEET]
[--md PATH]`: the targets' verdicts (roofline/report/targets.py) as a summary, with the GPU
job's steps and whether its fleet run has the plain sweep's rows.  A missed target is a
finding, not an error: the exit code is 0 then, 1 only when --same-rows finds the
fleet's rows differ, 2 on a usage error."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from contract.cli import Parser
from contract.record import RunRow
from contract.request import stored_selection
from contract.schema import RunLoadError, atomic_write_text
from roofline.gate.cli import check_outputs
from roofline.gate.rules import CompareError
from roofline.report.cells import md_table
from roofline.report.targets import (
    MET,
    MISSED,
    NOT_MEASURED,
    STEP_FIELDS,
    STEP_STATUSES,
    UNEQUAL,
    VERDICTS,
    Run,
    TargetsError,
    checks,
    headline,
    load,
)


def same_rows(plain: Run, fleet: Run) -> tuple[bool, str]:
    """Whether a fleet run has the plain run's rows (same keys, same statuses).  A run
    that is incomplete (cut short, interrupted) lacks the rows it never reached: rows
    only in the other run are then not a difference, and the two are compared on the
    rows both hold, which the answer says."""
    def keyed(run: Run) -> dict[tuple[str, ...], str]:
        # A case's cold and warm rows are two rows (schema.ROW_ID): one must not hide
        # the other.  Keyed by mode_tag ("" for the device's native mode, which a row
        # without a `cache` cell has), so a native row's name reads as it always did.
        return {(*_case(r), r.mode_tag): r.status for r in run.rows}

    asked = [sel for run in (plain, fleet) if (sel := stored_selection(run.meta))]

    def asked_of_both(key: tuple[str, ...]) -> bool:
        # The GPU job's fleet step runs a few kernels of the plain sweep, and its own
        # collectives (rows no sweep has): only the cases both runs asked for are compared.
        kernel, provider, dtype = key[:3]
        return all((not sel.kernels or kernel in sel.kernels)
                   and (not sel.dtypes or dtype in sel.dtypes)
                   and (not sel.providers or provider in sel.providers) for sel in asked)

    a_all, b_all = keyed(plain), keyed(fleet)
    a = {k: v for k, v in a_all.items() if asked_of_both(k)}
    b = {k: v for k, v in b_all.items() if asked_of_both(k)}
    outside = len(a_all) - len(a) + len(b_all) - len(b)
    only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    status = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    cut = [f"the {what} run is incomplete ({'; '.join(run.incomplete)})"
           for run, what in ((plain, "plain"), (fleet, "fleet")) if run.incomplete]
    unexplained_a = only_a if not fleet.incomplete else []  # the fleet never reached them
    unexplained_b = only_b if not plain.incomplete else []
    aside = (f"; {outside} rows of cases only one run asked for (its kernels, dtypes, "
             "providers, the fleet's collectives) are not compared") if outside else ""
    if not (unexplained_a or unexplained_b or status):
        if not cut:
            return True, f"same {len(a)} rows, same statuses{aside}"
        return True, (f"the {len(a.keys() & b.keys())} rows both hold have the same "
                      f"statuses; {', '.join(cut)}: {len(only_a)} rows only in the plain "
                      f"run and {len(only_b)} only in the fleet run are not compared{aside}")
    groups = ((unexplained_a, "only in the plain run"), (unexplained_b, "only in the fleet run"),
              (status, "with another status"))
    parts = [f"{len(keys)} {what} (first: {' '.join(k for k in keys[0] if k)})"
             for keys, what in groups if keys]
    return False, "; ".join(parts + cut) + aside


def _case(r: RunRow) -> tuple[str, str, str, str]:
    """kernel, provider, dtype, shape: a row's name without its cache mode."""
    return (r.case.kernel, r.case.provider, r.case.dtype, r.case.shape)


def read_steps(path: str) -> list[list[str]]:
    """.ci/gpu's steps file as [step, status, seconds, log, note] rows."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TargetsError(f"cannot read the steps file {path}: {e}") from None
    if not lines or lines[0].split("\t") != list(STEP_FIELDS):
        raise TargetsError(f"{path}: not a steps file (header {' '.join(STEP_FIELDS)})")
    rows = []
    for n, line in enumerate(lines[1:], 2):
        cells = line.split("\t")
        if len(cells) != len(STEP_FIELDS) or cells[1] not in STEP_STATUSES:
            raise TargetsError(f"{path}:{n}: expected {len(STEP_FIELDS)} tab-separated "
                               f"fields with a status of {', '.join(STEP_STATUSES)}")
        rows.append(cells)
    return rows


def render(runs: Sequence[Run], steps: list[list[str]] | None = None,
           fleet: tuple[bool, str] | None = None) -> str:
    found = checks(runs)
    counts = {v: sum(c.verdict == v for c in found) for v in VERDICTS}
    devices = sorted({str(r.meta.device.device_key or "?") for r in runs})
    lines = ["# Performance targets (docs/targets.md)", ""]
    lines += [f"- `{r.path}`: {r.label}, {r.meta.device.device_name or '?'}"
              + (f", fp8 accumulation {fp8}" if (fp8 := r.meta.settings.fp8_accum) else "")
              for r in runs]
    if not runs:
        lines.append("- No run to read: see the steps below.")
    elif devices != ["h100"]:
        lines.append(f"- The targets are set for an H100 SXM; these runs are on "
                     f"{', '.join(devices)}.")
    lines += ["", "## Headline figures", "",
              md_table(["figure", "value", "run"], headline(runs)), "",
              f"## Targets: {counts[MET]} met, {counts[MISSED]} missed, "
              + (f"{counts[UNEQUAL]} at unequal clocks, " if counts[UNEQUAL] else "")
              + f"{counts[NOT_MEASURED]} not measured", "",
              md_table(["Triton", "row", "measured", "needs", "verdict"],
                     [c.cells() for c in found])]
    if fleet is not None:
        lines += ["", "## One-rank fleet run against the plain run", "",
                  f"{'same rows' if fleet[0] else 'ROWS DIFFER'}: {fleet[1]}"]
    cut = [r for r in runs if r.incomplete]
    if cut:
        lines += ["", "## Incomplete runs", "",
                  *(f"- {r.name}: {'; '.join(r.incomplete)}: targets it did not reach "
                    "are not measured, not missed" for r in cut)]
    if steps is not None:
        failed = sum(s[1] in ("fail", "timeout") for s in steps)
        lines += ["", f"## Steps: {len(steps) - failed} of {len(steps)} passed or skipped", "",
                  md_table(list(STEP_FIELDS), steps, align="llr")]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """`python -m roofline targets ...`; returns the exit code."""
    p = Parser(prog="python -m roofline targets",
                description="The performance targets' ratios from saved runs: met, missed or "
                            "not measured (exit 0 either way).")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run folder or results.json")
    p.add_argument("--steps", metavar="TSV", help=".ci/gpu's steps file: each step's status")
    p.add_argument("--same-rows", nargs=2, metavar=("PLAIN", "FLEET"),
                   help="check that a fleet run has a plain run's rows (exit 1 if not)")
    p.add_argument("--md", metavar="PATH", help="also write the summary here")
    args = p.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    if not args.runs and not args.steps:
        print("error: give at least one RUN (or --steps)", file=sys.stderr)
        return 2
    try:
        inputs = [*args.runs, *(args.same_rows or [])]
        check_outputs({"--md": args.md}, inputs)
        folders = {(Path(i) if Path(i).is_dir() else Path(i).parent).resolve()
                   for i in inputs}
        if args.md and Path(args.md).resolve().parent in folders:
            raise TargetsError(f"--md {args.md} would write into a run folder: choose "
                               "another path")
        runs = [load(r) for r in args.runs]
        steps = read_steps(args.steps) if args.steps else None
        fleet = same_rows(load(args.same_rows[0]), load(args.same_rows[1])) \
            if args.same_rows else None
        text = render(runs, steps, fleet)
        if args.md:
            atomic_write_text(args.md, text)
    except (TargetsError, RunLoadError, CompareError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    return 1 if fleet is not None and not fleet[0] else 0
