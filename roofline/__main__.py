"""`python -m roofline COMMAND ...`: the command line of the readers of saved runs (plot,
compare, promote, plan, targets, summary, check, finalize, history), which wires in the
harness where one measures (plan --measure, --retime).

argparse picks the command and writes the usage; each command's own parser, in its own
module, reads the command's arguments, so its flags, help and refusals live in one
place."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contract.cli import Parser, UsageError

if TYPE_CHECKING:
    from contract.record import RunRow
    from contract.run_meta import RunMeta
    from roofline.gate.rules import Retime

PROG = "python -m roofline"


def _retimer(device: str, meta: RunMeta, rows: Sequence[RunRow],
             budget_s: float | None = None) -> Retime:
    """`compare --retime [--retime-budget S]` and `history report --retime`: the
    harness's re-timing client (benches/sweep/retime.py), wired here as plan's
    measurements are."""
    from benches.sweep.retime import retimer_of_run

    return retimer_of_run(device, meta, rows, budget_s)


# Each command imports its module when it runs: `plan` pulls in the harness and torch,
# which `plot` or `--help` should not wait for.

def _plot(argv: list[str]) -> int:
    from roofline.report.plot_cli import main

    return main(argv)


def _compare(argv: list[str]) -> int:
    from roofline.gate.cli import main

    return main(["compare", *argv], retimer=_retimer)


def _promote(argv: list[str]) -> int:
    from roofline.gate.cli import main

    return main(["promote", *argv], retimer=_retimer)


def _plan(argv: list[str]) -> int:
    # The one place roofline/ reaches into benches/: the command line wires the
    # harness's measurements into the planner (docs/design.md, Layers).
    from benches.measured_ceilings import device_ceilings
    from benches.step.gemms import measure_gemms, measure_kernels
    from benches.step.measure import measure_step
    from roofline.plan.cli import main
    from roofline.plan.harness import Harness

    return main(argv, Harness(measure_gemms, measure_step, measure_kernels, device_ceilings))


def _targets(argv: list[str]) -> int:
    from roofline.report.targets_cli import main

    return main(argv)


def _summary(argv: list[str]) -> int:
    from roofline.report.summary_cli import main

    return main(argv)


def _check(argv: list[str]) -> int:
    from roofline.report.check_cli import main

    return main(argv)


def _finalize(argv: list[str]) -> int:
    from roofline.report.finalize_run import main

    return main(argv)


def _configs(argv: list[str]) -> int:
    from roofline.report.configs import main

    return main(argv)


def _history(argv: list[str]) -> int:
    from roofline.history.cli import main

    return main(argv, retimer=_retimer)


@dataclass(frozen=True)
class Command:
    """One `python -m roofline` command: its name, its line in --help, and what runs it
    (given the arguments after the name; returns the exit code)."""

    name: str
    summary: str
    run: Callable[[list[str]], int]


COMMAND_TABLE = (
    Command("plot", "re-plot a saved run, or several devices' runs on one figure", _plot),
    Command("compare", "the regression gate on saved runs: exit 1 on a regression",
            _compare),
    Command("promote", "make a run (or a pool of runs) its device's stored baseline",
            _promote),
    Command("plan", "model size, tokens, days, memory and MFU of a training run", _plan),
    Command("targets", "the performance targets: met, missed or not measured", _targets),
    Command("summary", "write a saved run's summary.md again from its rows", _summary),
    Command("check", "the physics check: values no device can produce", _check),
    Command("finalize", "write a killed run whole from its row journal", _finalize),
    Command("configs", "a device model's tuned configs, shipped so its runs tune nothing",
            _configs),
    Command("history", "every run kept per device: change points, report, dashboard",
            _history),
)
COMMANDS = tuple(c.name for c in COMMAND_TABLE)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: one subparser per command, which takes the command's
    arguments verbatim (its own parser reads them)."""
    parser = Parser(prog=PROG, allow_abbrev=False,
                    description="The readers of saved runs: figures, the regression gate "
                                "and baselines, plans, targets, the history store.",
                    epilog=f"A command's own options: {PROG} COMMAND --help.")
    sub = parser.add_subparsers(dest="command", required=True, title="commands",
                                metavar="COMMAND")
    for c in COMMAND_TABLE:
        # No prefix character can occur in an argument ("\0" ends a C string), so every
        # argument, --help included, is handed on untouched, in order, `--` too.
        p = sub.add_parser(c.name, help=c.summary, add_help=False, prefix_chars="\0")
        p.add_argument("args", nargs=argparse.REMAINDER)
        p.set_defaults(run=c.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m roofline ...`; returns the exit code: the command's, 2 for no command
    or an unknown one, 0 after --help."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 2
    try:
        args = parser.parse_args(argv)
    except UsageError:
        # Every argument after a known command goes to it, so only the first can be
        # refused here. One line, as every other refusal: what was wrong, and where the
        # usage is.
        print(f"error: unknown command '{argv[0]}' (choose from {', '.join(COMMANDS)}; "
              f"usage: {PROG} --help)", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help has printed
        return e.code if isinstance(e.code, int) else 0
    run: Callable[[list[str]], int] = args.run
    return run(args.args)


if __name__ == "__main__":
    sys.exit(main())
