"""What every command line of the suite shares: bad input is one `error:` line and exit
2, never argparse's usage block nor a traceback."""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn


class UsageError(ValueError):
    """A command line's bad input: its message is the one line printed after `error:`."""


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError where it would print its usage and exit, so every
    refusal of every command is the same single line (subparsers inherit the class)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def parse_or_exit_code(self, argv: list[str]) -> argparse.Namespace | int:
        """The parsed arguments, or the exit code the command returns instead: 2 after
        one `error:` line on stderr, or --help's own (0) once it has printed."""
        try:
            return self.parse_args(argv)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except SystemExit as e:  # --help
            return e.code if isinstance(e.code, int) else 0


def positive_problem(flag: str, value: float | None, unit: str = "",
                     infinite_ok: bool = False) -> str | None:
    """Why `value` given to `flag` is not a positive number (None when it is, or was not
    given).  NaN fails; infinity too unless `infinite_ok` (a budget of 'inf': none)."""
    if value is None or (value > 0 and (infinite_ok or math.isfinite(value))):
        return None
    return f"{flag} must be a positive number{f' of {unit}' if unit else ''}, got {value:g}"


def one_path_and_plots(argv: list[str], noun: str, usage: str) -> tuple[str, bool]:
    """The arguments of a command that takes one path (named `noun` in the error) and an
    optional --no-plots: (the path, whether to plot).  UsageError (one line, with the
    usage) for an unknown option or another number of paths."""
    args = [a for a in argv if a != "--no-plots"]
    bad = [a for a in args if a.startswith("-")]
    if bad or len(args) != 1:
        what = f"unknown option {bad[0]}" if bad else f"expected one {noun}, got {len(args)}"
        raise UsageError(f"{what} (usage: {usage})")
    return args[0], "--no-plots" not in argv
