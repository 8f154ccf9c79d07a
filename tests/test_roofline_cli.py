"""`python -m roofline`: argparse picks the command and writes the usage; each command's
own parser reads its arguments, handed on untouched."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from roofline.__main__ import COMMAND_TABLE, COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_lists_every_command_with_its_line(flag, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main([flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m roofline [-h] COMMAND ...\n")
    lines = out.splitlines()
    for c in COMMAND_TABLE:
        # The name and its whole description on one line of an 80-column terminal.
        assert any(re.fullmatch(rf"\s+{c.name}\s+{re.escape(c.summary)}", ln)
                   for ln in lines), c.name
    assert COMMANDS == ("plot", "compare", "promote", "plan", "targets", "summary", "check",
                        "finalize", "configs", "history")


def test_no_command_prints_the_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "commands:" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["bogus"], ["--plot"], ["Plot", "run"], ["--he"],
                                  ["bogus", "--help"]])
def test_an_unknown_command_is_one_error_line_exit_2(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"error: unknown command '{argv[0]}' (choose from {', '.join(COMMANDS)}; "
        "usage: python -m roofline --help)"]


def test_an_unknown_command_in_a_fresh_process_has_no_traceback():
    p = subprocess.run([sys.executable, "-m", "roofline", "bogus"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("error: ")


@pytest.mark.parametrize("argv, word", [
    (["plot", "--help"], "plot"), (["compare", "--help"], "compare"),
    (["promote", "--help"], "promote"), (["plan", "--help"], "plan"),
    (["targets", "--help"], "targets"), (["finalize", "--help"], "finalize"),
    (["check", "--help"], "check"), (["summary", "--help"], "summary"),
    (["history", "--help"], "history"), (["history", "add", "--help"], "add"),
])
def test_each_command_prints_its_own_help_exit_0(argv, word, capsys):
    assert main(argv) == 0
    usage = capsys.readouterr().out.splitlines()[0]
    # The command's own usage, not the top-level one.
    assert usage.startswith("usage: python -m roofline") and word in usage
    assert "COMMAND" not in usage


def test_every_command_gets_its_arguments_untouched():
    argv = ["RUN", "--out", "x.png", "-h", "--", "--devices", "-", "--a=b"]
    for name in COMMANDS:
        args = build_parser().parse_args([name, *argv])
        assert args.command == name and args.args == argv
    assert build_parser().parse_args(["plan"]).args == []


def test_a_command_runs_with_its_arguments_and_returns_its_exit_code(capsys, tmp_path):
    # targets' own refusal (one line, exit 2) comes back through the dispatcher.
    assert main(["targets", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "missing" in err[0]
