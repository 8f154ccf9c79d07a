"""The version check: installed dependencies against the declared (tested) bounds, the
one-line warning a run prints and the run's `version_warnings` metadata."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import run_bench
from contract import versions

ROOT = Path(__file__).resolve().parent.parent
BOUNDS = [Requirement("torch>=2.11"), Requirement("triton>=3.6; sys_platform == 'linux'")]


def _installed(**have: str):
    return lambda name: have.get(name)


def test_a_version_below_its_bound_is_a_problem_with_a_one_line_warning():
    problems = versions.check_versions(BOUNDS, _installed(torch="2.10.0", triton="3.5.1"))
    assert [(p.package, p.installed, p.declared) for p in problems] == [
        ("torch", "2.10.0", ">=2.11"), ("triton", "3.5.1", ">=3.6")]
    line = versions.warning_line(problems)
    assert line is not None and "\n" not in line
    assert "torch 2.10.0 is outside torch>=2.11" in line
    assert "triton 3.5.1 is outside triton>=3.6" in line


@pytest.mark.parametrize("torch_v", ["2.11.0+cu130", "2.13.0+cpu", "2.12.0.dev20260101"])
def test_versions_in_range_give_no_warning(torch_v):
    # the GPU machines' CUDA build, CI's CPU build, a nightly of an in-range release
    problems = versions.check_versions(BOUNDS, _installed(torch=torch_v, triton="3.6.0"))
    assert problems == [] and versions.warning_line(problems) is None


def test_a_package_not_installed_or_unversioned_is_not_reported_but_garbage_is():
    assert versions.check_versions(BOUNDS + [Requirement("rich")],
                                   _installed(rich="1.0")) == []
    (p,) = versions.check_versions(BOUNDS, _installed(torch="not a version"))
    assert p.package == "torch"


def test_bounds_come_from_the_installed_metadata_without_extras(monkeypatch):
    lines = ["torch>=2.11", 'triton>=3.6; sys_platform == "linux"',
             "numpy>=1.24; python_version < '3'", 'pytest>=7.4; extra == "dev"']
    monkeypatch.setattr(versions.md, "requires",
                        lambda dist: lines if dist == "gpubench" else None)
    names = [r.name for r in versions.declared_requirements("gpubench")]
    assert names == (["torch", "triton"] if sys.platform == "linux" else ["torch"])


def test_bounds_fall_back_to_pyproject_when_not_installed(tmp_path):
    pytest.importorskip("tomllib")
    toml = tmp_path / "pyproject.toml"
    toml.write_text('[project]\ndependencies = ["torch>=9.1", "rich"]\n'
                    '[project.optional-dependencies]\ndev = ["pytest>=99"]\n')
    reqs = versions.declared_requirements("no-such-distribution-here", toml)
    assert [str(r) for r in reqs] == ["torch>=9.1", "rich"]


def test_declared_triton_bound_is_the_oldest_triton_ci_tests():
    """Bounds = oldest versions tested: .ci/run's oldest leg pins triton at the bound, and
    torch's bound is no newer than the torch CI installs (docs/versions.md)."""
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = {r.name: r.specifier for r in map(Requirement, deps)}
    ci = (ROOT / ".ci" / "run").read_text()
    (triton_oldest,) = re.findall(r"^OLDEST_TRITON=([\d.]+)", ci, flags=re.M)
    assert re.search(r'^pip install .*"triton==\$OLDEST_TRITON"', ci, flags=re.M)
    (torch_ci,) = set(re.findall(r"torch==([\d.]+)", ci))
    assert str(spec["triton"]) == f">={triton_oldest.removesuffix('.0')}"
    assert spec["torch"].contains(torch_ci)


def _tiny_run(out: Path, run_id: str) -> int:
    return run_bench.main(["--device", "cpu", "--sizes", "n=1024", "--kernels", "add",
                           "--dtypes", "fp32", "--providers", "torch", "--out", str(out),
                           "--run-id", run_id, "--no-plots"])


@pytest.mark.parametrize("torch_v, warned", [("2.10.0", True), ("2.11.0", False)])
def test_a_run_warns_once_and_records_it(torch_v, warned, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(versions, "declared_requirements", lambda: BOUNDS)
    monkeypatch.setattr(versions, "installed_version",
                        _installed(torch=torch_v, triton="3.6.0"))
    assert _tiny_run(tmp_path, "v") == 0
    said = [ln for ln in capsys.readouterr().out.splitlines() if "is outside" in ln]
    meta = json.loads((tmp_path / "cpu" / "v" / "results.json").read_text())["metadata"]
    if warned:
        assert len(said) == 1 and said[0].startswith("warning: torch 2.10.0 is outside")
        assert meta["version_warnings"] == ["torch 2.10.0 is outside torch>=2.11"]
    else:
        assert said == [] and meta["version_warnings"] == []
    # summary.md says it beside the versions, where a reader of the run looks.
    summary = (tmp_path / "cpu" / "v" / "summary.md").read_text()
    assert ("torch 2.10.0 is outside torch>=2.11" in summary) is warned


def test_the_oldest_leg_selects_the_files_naming_triton_s_internals(tmp_path):
    """.ci/run's SELECT pattern (grep -E) picks a file that imports triton's compiler or
    names from triton, and leaves one that merely mentions triton."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci" / "run")]).returncode == 0
    (select,) = re.findall(r"^SELECT='([^']+)'", ci, flags=re.M)
    # split literals: this file must not match the pattern itself
    files = {"a.py": "from triton" ".compiler import ASTSource\n",
             "b.py": "from triton" " import knobs\n",
             "c.py": "x = triton" ".runtime.driver.active\n",
             "d.py": "# triton kernels run in the interpreter\nimport triton.language\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    found = subprocess.run(["grep", "-lE", select, *sorted(files)], cwd=tmp_path,
                           capture_output=True, text=True).stdout.split()
    assert found == ["a.py", "b.py", "c.py"]


def test_the_fallback_reads_this_repository_s_pyproject():
    """A checkout never installed reads the bounds from its own pyproject.toml (the
    default path, wherever the module lives in the tree)."""
    pytest.importorskip("tomllib")
    reqs = {r.name: str(r.specifier) for r in
            versions.declared_requirements("no-such-distribution-here")}
    assert reqs["torch"] == ">=2.11" and "numpy" in reqs
