"""The workflows' security: zizmor's audit of .github/workflows/ (offline) finds nothing
above informational, every action is pinned to a commit, the checkout keeps no
credentials, a fork's pull request never runs on the self-hosted runner and only a push
to main writes the history store.  The job's `if` expressions are evaluated here on the
events' contexts (a small evaluator of GitHub's expression syntax: literals, context
paths, ! && || == != and the status functions), so a reworded condition is still
checked by what it does."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_workflow import load_yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def _workflows() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, load_yaml(p)) for p in sorted(WORKFLOWS.glob("*.y*ml"))]


def _zizmor() -> str | None:
    """The zizmor executable: beside this Python (a virtual environment's bin/) or on
    PATH; the PyPI package installs a binary, not a module."""
    here = Path(sys.executable).parent / "zizmor"
    return str(here) if here.is_file() else shutil.which("zizmor")


def test_zizmor_finds_nothing_above_informational():
    exe = _zizmor()
    if exe is None:
        pytest.skip("zizmor is not installed (pip install -e '.[dev]')")
    try:
        proc = subprocess.run([exe, "--offline", "--format", "json", str(WORKFLOWS)],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    except OSError as e:
        pytest.skip(f"zizmor cannot run here: {e}")
    try:
        findings = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"zizmor failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    serious = [f"{f['ident']} ({f['determinations']['severity']}): "
               f"{f['locations'][0]['concrete']['feature'].splitlines()[0]}"
               for f in findings if f["determinations"]["severity"] != "Informational"]
    assert not serious, serious


def test_every_action_is_pinned_to_a_commit():
    uses = [(p.name, s["uses"]) for p, doc in _workflows() for job in doc["jobs"].values()
            for s in job.get("steps", []) if "uses" in s]
    assert uses
    loose = [u for u in uses if not (u[1].startswith(("./", "docker://"))
                                     or PINNED.match(u[1]))]
    assert not loose, f"pin to a full commit hash (the tag in a comment): {loose}"


def test_checkouts_keep_no_credentials():
    for path, doc in _workflows():
        for job in doc["jobs"].values():
            for s in job.get("steps", []):
                if str(s.get("uses", "")).startswith("actions/checkout@"):
                    assert (s.get("with") or {}).get("persist-credentials") is False, path.name


def test_no_trigger_runs_untrusted_code_with_the_repository_s_rights():
    for path, doc in _workflows():
        assert "pull_request_target" not in doc["on"], path.name
        assert "workflow_run" not in doc["on"], path.name
        perms = doc.get("permissions")
        assert perms is not None and set(perms.values()) <= {"read", "none"}, path.name


# ---- the job's conditions, evaluated ----------------------------------------------------

TOKEN = re.compile(r"\s*(?:('(?:[^']|'')*')|(&&|\|\||==|!=|!|\(|\)|,)"
                   r"|([A-Za-z_][\w-]*(?:\.[\w-]+)*)(\(\))?|(\d+(?:\.\d+)?))")


def evaluate(expr: str, ctx: dict[str, Any], status: str = "success") -> Any:
    """GitHub's expression `expr` (with or without ${{ }}) on the contexts `ctx`, a job
    status of `status` for the status functions.  A missing property is null (None)."""
    expr = expr.strip()
    if expr.startswith("${{") and expr.endswith("}}"):
        expr = expr[3:-2]
    funcs = {"success": status == "success", "failure": status == "failure",
             "cancelled": status == "cancelled", "always": True}
    out, pos = [], 0
    while pos < len(expr.rstrip()):
        m = TOKEN.match(expr, pos)
        assert m, f"cannot read {expr[pos:]!r}"
        pos = m.end()
        lit, op, name, call, num = m.groups()
        if lit is not None:
            out.append(repr(lit[1:-1].replace("''", "'")))
        elif op is not None:
            out.append({"&&": " and ", "||": " or ", "!": " not "}.get(op, f" {op} "))
        elif name is not None and call:
            out.append(repr(funcs[name]))
        elif name is not None:
            value: Any = {"true": True, "false": False, "null": None}.get(name, ctx)
            if value is ctx:
                for part in name.split("."):
                    value = value.get(part) if isinstance(value, dict) else None
            out.append(repr(value))
        else:
            out.append(num)
    return eval("".join(out), {"__builtins__": {}})  # noqa: S307 - built from tokens above


def _event(name: str, ref: str = "refs/heads/main", head: str | None = None) -> dict:
    github: dict[str, Any] = {"event_name": name, "ref": ref, "repository": "org/gpubench"}
    if head is not None:
        github["event"] = {"pull_request": {"head": {"repo": {"full_name": head}}}}
    return {"github": github, "inputs": {}, "vars": {}}


FORK_PR = _event("pull_request", "refs/pull/7/merge", head="someone/gpubench")
OWN_PR = _event("pull_request", "refs/pull/8/merge", head="org/gpubench")
PUSH_MAIN = _event("push")
DISPATCH = _event("workflow_dispatch", "refs/heads/some-branch")


def test_the_evaluator_reads_github_s_syntax():
    ctx = _event("push")
    assert evaluate("${{ github.event_name == 'push' && !cancelled() }}", ctx) is True
    assert evaluate("!cancelled() && github.ref == 'refs/heads/x'", ctx) is False
    assert evaluate("github.event.pull_request.head.repo.full_name == null", ctx) is True
    assert evaluate("always()", ctx, status="failure") is True


def _gpu_jobs() -> list[tuple[str, dict[str, Any]]]:
    jobs = [(f"{p.name}:{k}", j) for p, doc in _workflows() for k, j in doc["jobs"].items()
            if "self-hosted" in str(j.get("runs-on"))]
    assert jobs, "expected a self-hosted job"
    return jobs


@pytest.mark.parametrize("ctx, runs", [(FORK_PR, False), (OWN_PR, True), (PUSH_MAIN, True),
                                       (DISPATCH, True)],
                         ids=["fork-pr", "own-pr", "push-main", "dispatch"])
def test_a_fork_s_pull_request_never_reaches_the_self_hosted_runner(ctx, runs):
    for name, job in _gpu_jobs():
        assert bool(evaluate(str(job.get("if", "true")), ctx)) is runs, name


@pytest.mark.parametrize("ctx, writes", [(OWN_PR, False), (PUSH_MAIN, True),
                                         (DISPATCH, False),
                                         (_event("push", "refs/heads/feature"), False)],
                         ids=["own-pr", "push-main", "dispatch", "push-branch"])
def test_only_a_push_to_main_writes_the_history_store(ctx, writes):
    for name, job in _gpu_jobs():
        store_steps = [s for s in job["steps"] if "--store" in str(s.get("run", ""))]
        for s in store_steps:
            assert bool(evaluate(str(s.get("if", "success()")), ctx)) is writes, name
