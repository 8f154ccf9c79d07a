"""Every third-party package the project imports is declared in pyproject.toml.

A machine with packages installed system-wide (scipy, say) hides a missing declaration:
the suite passes there and `pip install -e .` on a user's fresh environment ends in
ModuleNotFoundError.  This test reads every import of the project's modules (the
function-level ones too) and maps each to its distribution, so it fails wherever the
import is resolved, fresh environment or not.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("kernels", "contract", "benches", "roofline")
OWN_MODULES = {*PROJECT_PACKAGES, "run_bench", "tests", "conftest"}


def _norm(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(extra: str | None = None) -> set[str]:
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(doc["project"]["dependencies"])
    if extra:
        reqs += doc["project"]["optional-dependencies"][extra]
    # "triton>=3.0; sys_platform == 'linux'" -> "triton"
    return {_norm(re.split(r"[\s<>=!~;\[]", r.strip(), maxsplit=1)[0]) for r in reqs}


def _imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one file, wherever they stand."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _is_test_file(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def _project_files() -> list[Path]:
    files = [ROOT / "run_bench.py"]
    for pkg in PROJECT_PACKAGES:
        files += sorted((ROOT / pkg).rglob("*.py"))
    return files


def undeclared(files: list[Path], declared: set[str], dev: set[str]) -> list[str]:
    """'file: module (distribution)' for each third-party import not declared; the
    pytest-benchmark suites (test_*.py, conftest.py under benches/) may use dev extras."""
    dists = md.packages_distributions()
    problems = []
    for f in files:
        name = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
        allowed = dev if _is_test_file(f) else declared
        for mod in sorted(_imports(f)):
            if mod in sys.stdlib_module_names or mod in OWN_MODULES:
                continue
            owners = {_norm(d) for d in dists.get(mod, [])}
            if not owners:
                problems.append(f"{name}: {mod} (not installed, not declared)")
            elif not owners & allowed:
                problems.append(f"{name}: {mod} ({', '.join(sorted(owners))})")
    return problems


def test_every_third_party_import_is_declared():
    declared = _declared()
    problems = undeclared(_project_files(), declared, _declared("dev"))
    assert not problems, "imports not declared in pyproject.toml: " + "; ".join(problems)


def test_the_check_sees_an_undeclared_import(tmp_path):
    """The check itself: scipy imported inside a function, scipy not declared."""
    mod = tmp_path / "mod.py"
    mod.write_text("import os\n\ndef f():\n    from scipy import stats\n    return stats\n")
    assert _imports(mod) == {"os", "scipy"}
    declared = _declared() - {"scipy"}
    assert undeclared([mod], declared, declared) == [f"{mod}: scipy (scipy)"]
    assert undeclared([mod], declared | {"scipy"}, declared) == []


def test_scipy_is_declared():
    # the regression gate's rank test (roofline/gate/stats.py), once undeclared
    assert "scipy" in _declared()
