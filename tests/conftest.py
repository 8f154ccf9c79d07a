"""Test setup: which Triton the tests get, and which tests run where.

Triton decides at import whether its kernels are compiled for the GPU or run in the CPU
interpreter (TRITON_INTERPRET read when @triton.jit decorates them), so the choice is made
here, at the top of the conftest, before any test module imports a kernel:

- no CUDA device: the interpreter (TRITON_INTERPRET=1); tests marked `gpu` are skipped;
- a CUDA device: compiled kernels, and the `gpu` tests run on it.  Tests marked
  `interpreter` launch Triton kernels on CPU tensors, which compiled kernels refuse
  ("Pointer argument cannot be accessed from Triton (cpu tensor?)"): they are skipped in
  this process and run together in a child process with the interpreter on and CUDA
  hidden (tests/test_gpu_machine.py), so a GPU machine runs the whole suite.

Tests write temporary folders only, never the repository's results/ (a user's runs and
measured ceilings):

- every command's ceiling cache is one temporary folder per session
  ($GPUBENCH_CEILINGS_DIR, honoured by roofline.ceilings.get_ceilings, inherited by the
  commands tests start), seeded with copies of results/.ceilings so nothing is measured
  twice, and never copied back;
- results/ is compared before and after each test (its folders) and the session (every
  file): a test that changed it fails, and so does the session.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# What the kernels will be decorated with (nothing has imported them yet).
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

from roofline.ceilings import CACHE_DIR_ENV as CEILINGS_ENV  # noqa: E402


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU" if not HAS_CUDA else
                              "needs compiled Triton kernels (TRITON_INTERPRET=1 is set)")
    no_interp = pytest.mark.skip(reason="needs the Triton CPU interpreter: run in a child "
                                        "process by test_gpu_machine.py")
    for item in items:
        if "gpu" in item.keywords and (not HAS_CUDA or INTERPRETED):
            item.add_marker(no_gpu)
        if "interpreter" in item.keywords and not INTERPRETED:
            item.add_marker(no_interp)


# ---- tests write temporary folders only --------------------------------------------------

SESSION_MARK = ".test-session"  # in a session's cache: a child pytest shares, never removes
# The folder the suite must leave as it found it; a test of this guard points it elsewhere.
GUARDED = Path(os.environ.get("GPUBENCH_TEST_GUARDED_DIR") or ROOT / "results")
_session: dict = {}


def _session_ceilings() -> None:
    """$GPUBENCH_CEILINGS_DIR to a new temporary cache seeded from the user's caches (or
    the one a parent pytest made, shared as is)."""
    inherited = os.environ.get(CEILINGS_ENV)
    _session["env_before"] = inherited
    if inherited and (Path(inherited) / SESSION_MARK).is_file():
        return
    cache = Path(tempfile.mkdtemp(prefix="gpubench-test-ceilings-"))
    (cache / SESSION_MARK).write_text(f"{os.getpid()}\n")
    for src in (GUARDED / ".ceilings", Path(inherited) if inherited else None):
        if src is not None and src.is_dir():
            for f in src.glob("ceilings-*.json"):
                shutil.copyfile(f, cache / f.name)
    os.environ[CEILINGS_ENV] = str(cache)
    _session["cache"] = cache


def _state(files: bool) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of GUARDED and everything under it: folders only (cheap, and
    every file created, renamed or removed changes its folder's mtime), or files too."""
    if not GUARDED.exists():
        return {}
    st = GUARDED.stat()
    out = {".": (st.st_mtime_ns, 0)}
    for dirpath, dirnames, filenames in os.walk(GUARDED):
        for name in dirnames + (filenames if files else []):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            out[os.path.relpath(path, GUARDED)] = (st.st_mtime_ns, st.st_size)
    return out


def _changes(before: dict, after: dict, modified: str = "modified") -> str:
    new = sorted(after.keys() - before.keys())
    gone = sorted(before.keys() - after.keys())
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    parts = [f"{what} {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}"
             for what, names in (("created", new), ("removed", gone), (modified, changed))
             if names]
    return "; ".join(parts)


def pytest_configure(config):
    _session_ceilings()
    _session["results"] = _state(files=True)


def pytest_sessionfinish(session, exitstatus):
    changes = _changes(_session.get("results", {}), _state(files=True))
    if changes:
        msg = (f"the test run changed {GUARDED} ({changes}): tests must write temporary "
               "folders only")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.ensure_newline()
            reporter.write_line(f"ERROR: {msg}", red=True, bold=True)
        else:
            print(f"ERROR: {msg}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    cache = _session.pop("cache", None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)
        if _session.get("env_before") is None:
            os.environ.pop(CEILINGS_ENV, None)
        else:
            os.environ[CEILINGS_ENV] = _session["env_before"]


@pytest.fixture(autouse=True)
def _results_left_alone(request):
    """Fails the test (at teardown) that created, renamed or removed anything under
    results/; in-place edits of its files are caught at the session's end."""
    before = _state(files=False)
    yield
    changes = _changes(before, _state(files=False), modified="files changed in")
    if changes:
        pytest.fail(f"{request.node.nodeid} changed {GUARDED} ({changes}): tests must "
                    "write temporary folders only", pytrace=False)
