"""The GPU CI workflow: schema-valid, and it keeps the job's essentials.

Schema validation uses check-jsonschema's vendored GitHub-workflow schema (no network);
the structural checks parse the YAML with ruamel.yaml (a check-jsonschema dependency,
YAML 1.2, so the `on:` key stays a string) or PyYAML as a fallback.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "gpu-bench.yml"


def load_yaml(path: Path) -> dict[str, Any]:
    """A workflow file as a dict (ruamel.yaml or PyYAML; tests/test_workflows.py too)."""
    try:
        from ruamel.yaml import YAML

        return YAML(typ="safe", pure=True).load(path.read_text())
    except ImportError:
        pass
    yaml = pytest.importorskip("yaml", reason="needs ruamel.yaml or PyYAML to parse YAML")
    doc = yaml.safe_load(path.read_text())
    # PyYAML reads YAML 1.1, where a bare `on` key is the boolean True.
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


@pytest.fixture(scope="module")
def workflow() -> dict[str, Any]:
    assert WORKFLOW.is_file(), f"{WORKFLOW} is missing"
    return load_yaml(WORKFLOW)


@pytest.fixture(scope="module")
def job(workflow: dict[str, Any]) -> dict[str, Any]:
    jobs = workflow["jobs"]
    assert len(jobs) == 1, "expected a single benchmark job"
    return next(iter(jobs.values()))


def _steps(job: dict[str, Any], pattern: str, key: str = "run") -> list[dict[str, Any]]:
    return [s for s in job["steps"] if re.search(pattern, str(s.get(key, "")))]


def test_schema_valid_offline() -> None:
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema not installed (pip install -e '.[dev]')")
    # The builtin schema ships inside the package, so this needs no network.
    proc = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema",
         "vendor.github-workflows", str(WORKFLOW)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_triggers(workflow: dict[str, Any]) -> None:
    on = workflow["on"]
    assert "main" in on["push"]["branches"]
    assert "pull_request" in on
    assert "workflow_dispatch" in on


def test_runs_on_self_hosted_gpu(job: dict[str, Any]) -> None:
    labels = job["runs-on"]
    labels = [labels] if isinstance(labels, str) else list(labels)
    assert "self-hosted" in labels and "gpu" in labels


def test_checkout_and_install(job: dict[str, Any]) -> None:
    assert str(job["steps"][0].get("uses", "")).startswith("actions/checkout@")
    assert _steps(job, r"python -m pip install -e \.")


def test_device_detection_snippet_is_valid_python(job: dict[str, Any]) -> None:
    (step,) = _steps(job, r"contract\.devices")
    code = re.search(r'python -c "([^"]+)"', step["run"])
    assert code, "device detection should be a `python -c \"...\"` call"
    assert "detect()" in code.group(1) and ".key" in code.group(1)
    compile(code.group(1), "<workflow>", "exec")


def test_bench_step_runs_the_gpu_script(job: dict[str, Any]) -> None:
    """The job is .ci/gpu, which compares with the baseline (tests/test_gpu_ci.py)."""
    steps = _steps(job, r"\.ci/gpu ")
    assert len(steps) == 1
    step = steps[0]
    run = step["run"]
    assert ".ci/gpu results/ci" in run and "rm -rf results/ci" in run
    # The job fails on a regression only if the script's exit code reaches the runner.
    assert not step.get("continue-on-error")
    assert "|| true" not in run and "set +e" not in run


def test_uploads_artifacts_always(job: dict[str, Any]) -> None:
    steps = _steps(job, r"^actions/upload-artifact@", key="uses")
    assert len(steps) == 1
    step = steps[0]
    assert "always()" in str(step.get("if", ""))
    path = step["with"]["path"]
    for wanted in (".png", ".csv", ".json", "summary.md"):
        assert wanted in path, f"artifact path lacks {wanted}"
    assert "results/ci/" in path
    # Upload comes after the benchmark step, so it sees its output.
    order = [i for i, s in enumerate(job["steps"]) if ".ci/gpu " in str(s.get("run", ""))]
    assert job["steps"].index(step) > order[0]
