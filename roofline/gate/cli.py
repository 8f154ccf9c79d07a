"""`python -m roofline compare` and `python -m roofline promote`: parsing, refusals of
output paths that would overwrite measurements, exit codes."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from contract.cli import Parser, UsageError, positive_problem
from contract.devices import DeviceError
from contract.schema import (
    RESULTS_JSON,
    RunLoadError,
    load_doc,
)
from roofline.gate.promote import promote
from roofline.gate.render import (
    append_step_summary,
    benchmark_entries,
    json_text,
    render_markdown,
    write_report,
)
from roofline.gate.rules import (
    ALLOWABLE,
    DEFAULT_BASELINES_DIR,
    DEFAULT_THRESHOLDS,
    CompareError,
    RetimerFactory,
    check_threshold,
    cli_exit_code,
    status_of,
)
from roofline.gate.runs import compare_runs, confirm_slower


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m roofline", description="Compare benchmark runs.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{compare,promote}")
    c = sub.add_parser("compare", help="regression verdicts of RUN against BASELINE",
                       description="Regression verdicts of RUN against BASELINE; exit 1 "
                       "when the gate fails, 2 on a usage error.")
    c.add_argument("baseline", help="baseline run folder or results.json "
                   "(e.g. results/baselines/h100.json)")
    c.add_argument("run", help="run folder or results.json to judge")
    c.add_argument("--threshold", default=None, metavar="PCT",
                   help="percent change of the median time that counts (default: "
                   + threshold_help() + ")")
    c.add_argument("--allow", action="append", default=[], metavar="LIST",
                   help=f"comma list of gate failures to accept: {','.join(ALLOWABLE)}")
    c.add_argument("--allow-device-mismatch", action="store_true",
                   help="compare runs of different devices")
    c.add_argument("--md", metavar="PATH", help="also write the markdown report here")
    c.add_argument("--json", metavar="PATH",
                   help="write the run's results in github-action-benchmark "
                   "customBiggerIsBetter format here")
    c.add_argument("--retime", action="store_true",
                   help="re-time the rows that look slower on this machine (the run's "
                   "device) before calling them regressions, as run_bench.py --compare "
                   "does")
    c.add_argument("--retime-budget", type=float, default=None, metavar="SECONDS",
                   help="with --retime: bound the re-timing to about this many seconds; "
                   "the rows that look slower go worst first, each in as many rounds as "
                   "fit (3 to 5), and the report names the rows left out and why")
    pr = sub.add_parser("promote", help="make RUN the stored baseline of its device",
                        description="Copy RUN's results.json to <baselines>/<device>.json, "
                        "keeping the replaced one in <baselines>/history/.")
    pr.add_argument("run", nargs="+",
                    help="run folder or results.json; several runs of the same sweep are "
                    "pooled into one baseline (recommended on a noisy machine)")
    pr.add_argument("--device", metavar="KEY", help="device key (default: the run's own)")
    pr.add_argument("--baselines", metavar="DIR", default=DEFAULT_BASELINES_DIR,
                    help=f"baselines folder (default {DEFAULT_BASELINES_DIR})")
    pr.add_argument("--force", action="store_true",
                    help="promote an interrupted, aborted, incomplete or all-skipped run, or "
                    "one of another device")
    return p


def threshold_help() -> str:
    """The default thresholds, for --help."""
    return ", ".join(f"{v:g} on a {'GPU' if k == 'cuda' else k.upper()}"
                     for k, v in DEFAULT_THRESHOLDS.items())


def _holds_a_run(path: Path) -> bool:
    """Whether an existing file is a results document ({"rows": [...]}: a run's
    results.json or a stored baseline)."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(1)
            if head != "{":
                return False
            doc = json.loads(head + f.read())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("rows"), list)


def check_outputs(outputs: dict[str, str | None], inputs: Sequence[str]) -> None:
    """Refuse a report path that would overwrite what is measured: one of the inputs
    (a folder's results.json included), any file named results.json, or any existing
    results document (a run or a baseline).  CompareError, one line."""
    protected = set()
    for i in inputs:
        p = Path(i)
        protected.add(p.resolve())
        if p.is_dir():
            protected.add((p / RESULTS_JSON).resolve())
    for flag, out in outputs.items():
        if not out:
            continue
        p = Path(out)
        if p.resolve() in protected or p.name == RESULTS_JSON or \
                (p.is_file() and _holds_a_run(p)):
            raise CompareError(f"{flag} {out} would overwrite measured results (a run or a "
                               "baseline): choose another path")


def _cmd_compare(args: argparse.Namespace, retimer: RetimerFactory | None) -> int:
    threshold = check_threshold(args.threshold)
    check_outputs({"--md": args.md, "--json": args.json}, [args.baseline, args.run])
    if args.retime and retimer is None:
        raise CompareError("--retime needs the benchmark harness: run it as "
                           "python -m roofline compare")
    if args.retime_budget is not None and not args.retime:
        raise CompareError("--retime-budget goes with --retime")
    problem = positive_problem("--retime-budget", args.retime_budget, "seconds")
    if problem:
        raise CompareError(problem)
    result = compare_runs(args.baseline, args.run, threshold,
                          args.allow_device_mismatch, allow=args.allow)
    assert result.run_doc is not None
    if args.retime:
        assert retimer is not None
        bound = {} if args.retime_budget is None else {"budget_s": args.retime_budget}
        try:
            retime = retimer(str(result.run_meta.device.device_key), result.run_meta,
                             result.run_doc.rows, **bound)
        except ValueError as e:  # a run of another device than this machine's
            raise CompareError(str(e)) from None
        confirm_slower(result, retime)
    markdown = render_markdown(result)
    if args.md:
        write_report(args.md, markdown)
    if args.json:
        write_report(args.json, json_text(benchmark_entries(result.run_doc.rows,
                                                            result.rows)))
    append_step_summary(markdown)
    print(markdown)
    return result.exit_code


def _cmd_promote(args: argparse.Namespace) -> int:
    dest, kept = promote(args.run, args.device, args.baselines, force=args.force)
    failed = sum(status_of(row) == "failed" for row in load_doc(dest).rows)
    if failed:
        print(f"note: {failed} rows of this baseline failed correctness", file=sys.stderr)
    if kept is not None:
        print(f"note: the replaced baseline is kept at {kept} (copy it back to {dest} to "
              "undo)", file=sys.stderr)
    print(dest)
    return 0


def main(argv: list[str] | None = None, retimer: RetimerFactory | None = None) -> int:
    """`compare` / `promote` entry point (argv[0] is the command); returns the exit code.
    `retimer` (wired by the command line, see roofline/__main__.py) makes a Retime for
    a run's rows: compare --retime needs it."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def command() -> int:
        args = _parser().parse_args(argv)
        return _cmd_compare(args, retimer) if args.cmd == "compare" else _cmd_promote(args)

    return cli_exit_code(command, (UsageError, RunLoadError, DeviceError))


if __name__ == "__main__":
    sys.exit(main())
