"""The one markdown table helper (contract/markdown.py) every report's tables go through:
its exact text, which the reports' own tests pin in their outputs."""

from __future__ import annotations

from contract.markdown import md_table_lines


def test_a_table_is_its_header_its_rule_and_a_line_per_row():
    assert md_table_lines(["kernel", "ms", "note"], [["add", 1.5, "x"], ["mul", 2, ""]],
                          "lrl") == [
        "| kernel | ms | note |",
        "| --- | ---: | --- |",
        "| add | 1.5 | x |",
        "| mul | 2 |  |"]


def test_alignment_defaults_to_left_and_a_short_align_leaves_the_rest_left():
    assert md_table_lines(["a", "b", "c"], [])[1] == "| --- | --- | --- |"
    assert md_table_lines(["a", "b", "c"], [], "r")[1] == "| ---: | --- | --- |"


def test_a_tight_rule_and_cells_as_given():
    """The tight rule (acceptance.md, the fleet's report), and cells written as str()
    gives them: escaping is the caller's (a pipe stays a pipe)."""
    assert md_table_lines(["check", "verdict"], [["`gpu`", "**OK**"], ["a|b", None]],
                          tight=True) == [
        "| check | verdict |", "|---|---|", "| `gpu` | **OK** |", "| a|b | None |"]


def test_no_rows_is_a_header_and_its_rule():
    assert md_table_lines(["x"], iter([])) == ["| x |", "| --- |"]
