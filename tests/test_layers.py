"""The layer map in docs/design.md is the imports' map: drawn from every import of the
project's modules (function-level ones included), package by package, it must equal the
documented table both ways; the one upward arrow crosses only where listed here; and no
two modules import each other, however indirectly."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "contract", "benches", "roofline")
ENTRY = "entry"  # the command lines: run_bench.py and roofline/__main__.py
ENTRY_MODULES = {"run_bench", "roofline.__main__"}

# benches -> roofline: the documented upward arrow, module by module (docs/design.md).
UPWARD = {
    # a sweep's end: its figures, summary.md, --compare's gate, the time split line
    ("benches.sweep.job", "roofline.gate.rules"),
    ("benches.sweep.job", "roofline.gate.runs"),
    ("benches.sweep.job", "roofline.gate.render"),
    ("benches.sweep.job", "roofline.report.plot"),
    ("benches.sweep.job", "roofline.report.plot_scaling"),
    ("benches.sweep.job", "roofline.report.summary"),
    ("benches.sweep.job", "roofline.report.run_time"),
    # a fleet run's end: its report, the time split lines, the finalize of killed ranks
    ("benches.fleet.run", "roofline.report.run_time"),
    ("benches.fleet.folder", "roofline.report.fleet"),
    ("benches.fleet.acceptance_report", "roofline.report.style"),
    ("benches.fleet.finalize", "roofline.report.finalize_run"),
    # the training step measures the planner's model
    ("benches.step.transformer", "roofline.plan.model"),
    ("benches.step.flops", "roofline.plan.arithmetic"),
    ("benches.step.kernel_split", "roofline.plan.arithmetic"),
    ("benches.step.gemms", "roofline.plan.arithmetic"),
    ("benches.step.gemms", "roofline.plan.model"),
    ("benches.step.gemms", "roofline.plan.sources"),
    ("benches.step.measure", "roofline.plan.step"),
}


def modules() -> dict[str, Path]:
    """Every module of the packages and the command lines (the pytest-benchmark suites
    and conftest under benches/ are test code, not the harness)."""
    out = {"run_bench": ROOT / "run_bench.py"}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            rel = p.relative_to(ROOT).with_suffix("")
            if rel.name.startswith("test_") or rel.name == "conftest":
                continue
            name = ".".join(rel.parts)
            out[name.removesuffix(".__init__")] = p
    return out


def imports() -> dict[str, set[str]]:
    """module -> the project modules it imports (the nearest module of a dotted name)."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for n in names:
                r = resolve(n)
                # A module's own package (its __init__) is not an arrow.
                if r and r != m and not m.startswith(r + "."):
                    edges[m].add(r)
    return edges


def layer(module: str) -> str:
    return ENTRY if module in ENTRY_MODULES else module.split(".")[0]


def documented() -> dict[str, set[str]]:
    """docs/design.md's layer table: package -> the packages it imports."""
    text = (ROOT / "docs/design.md").read_text()
    section = text[text.index("## Layers"):text.index("## The result contract")]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([\w./]+)`", cells[0])
        who = ENTRY if "run_bench.py" in names else names[0]
        table[who] = set(re.findall(r"`(\w+)`", cells[1]))
    return table


def test_the_documented_map_is_the_imports_map():
    drawn: dict[str, set[str]] = {}
    for m, targets in imports().items():
        for t in targets:
            a, b = layer(m), layer(t)
            if a != b:
                drawn.setdefault(a, set()).add(b)
    doc = documented()
    assert set(doc) == {*PACKAGES, ENTRY}
    for who in doc:
        assert drawn.get(who, set()) == doc[who], (
            f"{who}: the imports reach {sorted(drawn.get(who, set()))}, docs/design.md "
            f"says {sorted(doc[who])}")


def test_the_upward_arrow_crosses_only_where_documented():
    crossings = {(m, t) for m, targets in imports().items() for t in targets
                 if layer(m) == "benches" and layer(t) == "roofline"}
    assert crossings <= UPWARD, f"new crossings: {sorted(crossings - UPWARD)}"
    # The list is kept short: a crossing that no import makes any more is struck off.
    assert crossings >= UPWARD, f"stale entries: {sorted(UPWARD - crossings)}"


def test_no_import_circle():
    edges = imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    assert not circles


def test_the_map_finds_what_it_must():
    """The reader above sees function-level imports and the command lines' wiring (a
    map that saw nothing would pass the tests above vacuously)."""
    edges = imports()
    assert "benches.fleet.listing" in edges["run_bench"]  # imported inside a function
    assert "contract.devices" in edges["benches.sweep.job"]
    assert any(t.startswith("benches.") for t in edges["roofline.__main__"])
