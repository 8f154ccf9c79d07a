"""`python -m roofline history {add,report,html}`: parsing, exit codes, one-line errors.

    add RUN [RUN ...] [--store DIR] [--allow-incomplete]
    report STORE [--since N] [--fail-on-new] [--md PATH] [--device KEY] [--retime] [...]
    html STORE --out DIR [--device KEY] [...]

Exit codes: 0 done; 1 (report --fail-on-new) a new slowdown; 2 a usage error (bad
arguments, a store that is not one, an empty store, a corrupt row, a run added twice, a
missing library), never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from contract.cli import Parser, UsageError
from contract.schema import RESULTS_JSON, atomic_write_text
from roofline.gate.render import append_step_summary
from roofline.gate.rules import RetimerFactory, cli_exit_code
from roofline.history.changepoints import (
    DEFAULT_ALPHA,
    DEFAULT_MIN_CHANGE,
    DEFAULT_MIN_SIZE,
    DEFAULT_WINDOW,
)
from roofline.history.errors import HistoryError, require
from roofline.history.series import DeviceSeries, Options, build_series
from roofline.history.store import DEFAULT_STORE, add_run, load_store, run_document


def _detection_options(p: argparse.ArgumentParser, window: int | None) -> None:
    p.add_argument("--min-change", type=float, default=DEFAULT_MIN_CHANGE * 100,
                   metavar="PCT", help="smallest step that counts, percent of the median "
                   f"(default {DEFAULT_MIN_CHANGE * 100:g})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance level of each change point (default {DEFAULT_ALPHA:g})")
    p.add_argument("--min-size", type=int, default=DEFAULT_MIN_SIZE, metavar="RUNS",
                   help=f"runs on each side of a change point (default {DEFAULT_MIN_SIZE})")
    p.add_argument("--window", type=int, default=window or 0, metavar="RUNS",
                   help=f"newest runs searched; 0 for all (default {window or 'all'})")
    p.add_argument("--device", metavar="KEY", help="only this device's history")


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m roofline history",
                description="Every run kept per device, change points per series, a "
                "report for CI and a static dashboard.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{add,report,html}")
    a = sub.add_parser("add", help="append runs to the store (once each)")
    a.add_argument("runs", nargs="+", metavar="RUN", help="run folder or results.json")
    a.add_argument("--store", default=DEFAULT_STORE,
                   help=f"store folder (default {DEFAULT_STORE}; made if absent)")
    a.add_argument("--allow-incomplete", action="store_true",
                   help="add an interrupted or aborted run as it is")
    r = sub.add_parser("report", help="change points of the newest runs; exit 1 with "
                       "--fail-on-new on a new slowdown")
    r.add_argument("store", help="store folder (or one <device>.sqlite)")
    r.add_argument("--since", type=int, default=1, metavar="N",
                   help="change points not found without the newest N runs are new "
                   "(default 1)")
    r.add_argument("--fail-on-new", action="store_true",
                   help="exit 1 when a new slowdown past --min-change was found")
    r.add_argument("--md", metavar="PATH", help="also write the markdown here")
    r.add_argument("--retime", action="store_true",
                   help="confirm each new slowdown by timing its row again on this machine "
                   "(the gate's rule: slower in every re-timed round)")
    _detection_options(r, DEFAULT_WINDOW)
    h = sub.add_parser("html", help="write the static dashboard")
    h.add_argument("store", help="store folder (or one <device>.sqlite)")
    h.add_argument("--out", required=True, metavar="DIR", help="dashboard folder")
    h.add_argument("--since", type=int, default=1, metavar="N",
                   help="change points of the newest N runs are marked new (default 1)")
    # Every run: the charts mark every change point, not only the report's window's.
    _detection_options(h, None)
    return p


def _options(args: argparse.Namespace) -> Options:
    return Options(min_change=args.min_change / 100.0, alpha=args.alpha,
                   min_size=args.min_size, window=args.window or None).check()


def _series(args: argparse.Namespace) -> list[DeviceSeries]:
    """Options and store checked first (their errors do not depend on the libraries),
    then the libraries, then the series."""
    options = _options(args)
    if args.since < 1:
        raise HistoryError(f"--since must be at least 1 run, got {args.since}")
    histories = load_store(args.store, args.device)
    require("ruptures", f"history {args.cmd}")
    if args.cmd == "html":
        require("plotly", "history html")
    return [build_series(h, options, args.since) for h in histories]


def _cmd_add(args: argparse.Namespace) -> int:
    for run in args.runs:
        added = add_run(run, args.store, allow_incomplete=args.allow_incomplete)
        print(f"added run {added.run_id or run} ({added.rows} rows) to {added.path} "
              f"as run #{added.seq}")
    return 0


def _check_md(path: str, store: str) -> None:
    p = Path(path)
    if p.name == RESULTS_JSON or p.suffix == ".sqlite" or \
            p.resolve() == Path(store).resolve():
        raise HistoryError(f"--md {path} would overwrite measured results: choose another "
                           "path")


def _cmd_report(args: argparse.Namespace, retimer: RetimerFactory | None) -> int:
    from roofline.history.report import confirm, exit_code, render

    if args.md:
        _check_md(args.md, args.store)
    devices = _series(args)
    confirmations = {}
    if args.retime:
        if retimer is None:
            raise HistoryError("--retime is not available here")
        for d in devices:
            if d.new_slower:
                doc = run_document(d.history.path, int(d.runs["seq"].iloc[-1]))
                try:
                    retime = retimer(d.device, doc.meta, doc.rows)
                except ValueError as e:  # a store of another device than this machine's
                    raise HistoryError(str(e)) from None
                confirmations[d.device] = confirm(d, retime)
    markdown = "\n".join(render([d], confirmations.get(d.device)) for d in devices)
    if args.md:
        try:
            atomic_write_text(args.md, markdown)
        except OSError as e:
            raise HistoryError(f"cannot write {args.md}: {e.strerror or e}") from None
    append_step_summary(markdown)
    print(markdown, end="")
    return exit_code(devices, args.fail_on_new, confirmations)


def _cmd_html(args: argparse.Namespace) -> int:
    from roofline.history.html import write_dashboard

    pages = write_dashboard(_series(args), args.out)
    print(f"dashboard: {pages[0]} ({len(pages) - 1} more files in {args.out})")
    return 0


def main(argv: list[str] | None = None, retimer: RetimerFactory | None = None) -> int:
    """The `history` command (argv without the word `history`); returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def command() -> int:
        args = _parser().parse_args(argv)
        if args.cmd == "add":
            return _cmd_add(args)
        if args.cmd == "report":
            return _cmd_report(args, retimer)
        return _cmd_html(args)

    return cli_exit_code(command, (UsageError,))
