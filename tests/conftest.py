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
  ($GPUBENCH_CEILINGS_DIR, honoured by benches.measured_ceilings.get_ceilings, inherited by the
  commands tests start), seeded with copies of results/.ceilings' GPU caches so nothing
  is measured twice, and never copied back;
- results/ is compared before and after each test (its folders) and the session (every
  file): a test that changed it fails, and so does the session.

No test measures this CPU's ceilings: which classes are a roof depends on the CPU (bf16
matmul is one where AVX-512 BF16 or AMX runs it, and an emulated path under 0.1x fp32's
rate on an AVX2 CPU: no roof, no MFU), so tests run under the ceilings of two CPUs
(CPU_CEILINGS), seeded into the caches as this CPU's measurement:

- a test whose rows or commands hold a class that is a roof on one CPU and not on the
  other takes the `cpu_ceilings` fixture, and runs once under each CPU;
- every other command a test starts reads the session's CPU (`--cpu-ceilings KIND`,
  default fast-bf16): fp32, what those tests time, is a roof on both.

A test that measured this CPU's ceilings anyway (a cache key not seeded) fails, by name.
"""

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
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

from benches.measured_ceilings import CACHE_DIR_ENV as CEILINGS_ENV  # noqa: E402
from benches.measured_ceilings import cache_key  # noqa: E402
from contract.ceilings import no_roofs  # noqa: E402
from contract.devices import host_cpu  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--cpu-ceilings", choices=sorted(CPU_CEILINGS), default="fast-bf16",
                     help="the CPU whose ceilings commands read in tests that do not run "
                          "under both (tests/conftest.py)")


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


def _session_ceilings(cpu_kind: str) -> None:
    """$GPUBENCH_CEILINGS_DIR to a new temporary cache holding the CPU `cpu_kind`'s
    ceilings and copies of the user's GPU caches (or the one a parent pytest made, shared
    as is)."""
    inherited = os.environ.get(CEILINGS_ENV)
    _session["env_before"] = inherited
    if inherited and (Path(inherited) / SESSION_MARK).is_file():
        _session["dir"] = Path(inherited)
        _session["seeded"] = _cpu_entries(Path(inherited))
        return
    cache = Path(tempfile.mkdtemp(prefix="gpubench-test-ceilings-"))
    (cache / SESSION_MARK).write_text(f"{os.getpid()}\n")
    for src in (GUARDED / ".ceilings", Path(inherited) if inherited else None):
        if src is not None and src.is_dir():
            for f in src.glob("ceilings-*.json"):
                if not f.name.startswith(CPU_CACHE_PREFIX):  # a measured CPU: not read
                    shutil.copyfile(f, cache / f.name)
    seed_cpu_ceilings(cache, cpu_kind)
    os.environ[CEILINGS_ENV] = str(cache)
    _session.update(cache=cache, dir=cache, seeded=_cpu_entries(cache))


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
    _session_ceilings(config.getoption("--cpu-ceilings"))
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


# ---- the ceilings of two CPUs --------------------------------------------------------------

# Ceilings (benches.measured_ceilings.measure's document) of two 2-core VMs:
# - fast-bf16: an Intel Xeon with AVX-512 BF16 and AMX (this project's CI VM): bf16
#   matmul at 4.9x fp32's rate, fp16 at fp32's, fp8 torch._scaled_mm emulated
#   at 1/2,400 of it (no fp8 roof);
# - slow-bf16: an AMD EPYC with AVX2 and no AVX-512 BF16: bf16 and fp16 matmul at 1/125
#   of fp32's rate (no roof), fp8 at half of it.  Its bandwidths were not recorded: the
#   Xeon's stand in (a roof's slope only; no test depends on their values).
_COPIES = {"hbm_gbps": 13.4, "l2_gbps": 98.4}
CPU_CEILINGS: dict[str, dict] = {
    "fast-bf16": {"tflops": {"fp32": 0.0897, "fp16": 0.0938, "bf16": 0.440, "fp8": 3.74e-5},
                  **_COPIES},
    "slow-bf16": {"tflops": {"fp32": 0.175, "fp16": 0.0014, "bf16": 0.0014, "fp8": 0.081},
                  **_COPIES},
}
CPU_CACHE_PREFIX = f"ceilings-{host_cpu().key}-"  # benches.measured_ceilings.cache_key's names
FP8_MODES = ("fast", "precise")


@dataclass(frozen=True)
class CpuCeilings:
    """The CPU a test runs under: its name in CPU_CEILINGS, its ceilings, and its classes
    that are no roof with the explanation rows and summaries give
    (contract.ceilings.no_roofs)."""

    kind: str
    measured: dict
    no_roofs: dict[str, str]

    def peak(self, roof_class: str) -> float | None:
        """The compute roof a row of `roof_class` is held against, None for no roof."""
        return None if roof_class in self.no_roofs else self.measured["tflops"].get(roof_class)


def _cpu_entries(folder: Path) -> set[str]:
    return {f.name for f in folder.glob(f"{CPU_CACHE_PREFIX}*.json")}


def seed_cpu_ceilings(folder: Path, kind: str) -> CpuCeilings:
    """A ceiling cache in `folder` holding CPU_CEILINGS[kind] as this CPU's measurement,
    under every key a command started here computes (benches.measured_ceilings.cache_key): any
    torch thread count up to the cores (a fleet rank runs its share of them) and either
    fp8 accumulation mode."""
    measured = {**CPU_CEILINGS[kind], "method": {"compute": f"the {kind} CPU of the tests"},
                "measured_at": "2026-11-26T00:00:00+00:00"}
    folder.mkdir(parents=True, exist_ok=True)
    for threads in range(1, max(os.cpu_count() or 1, torch.get_num_threads()) + 1):
        for mode in FP8_MODES:
            name = f"ceilings-{cache_key(host_cpu(), threads, mode)}.json"
            (folder / name).write_text(json.dumps(measured))
    return CpuCeilings(kind, measured, no_roofs(measured["tflops"]))


@pytest.fixture(scope="module", params=sorted(CPU_CEILINGS))
def cpu_ceilings(request, tmp_path_factory) -> Iterator[CpuCeilings]:
    """The module's tests that take it run once per CPU of CPU_CEILINGS, every command's
    ceiling cache ($GPUBENCH_CEILINGS_DIR, inherited by child processes) holding that
    CPU's ceilings."""
    folder = tmp_path_factory.mktemp(f"ceilings-{request.param}")
    cpu = seed_cpu_ceilings(folder, request.param)
    (folder / SESSION_MARK).write_text(f"{os.getpid()}\n")  # a child pytest shares it
    seeded = _cpu_entries(folder)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CEILINGS_ENV, str(folder))
        yield cpu
    _fail_on_measured(folder, seeded, f"under the {request.param} CPU's ceilings")


@pytest.fixture
def cpu_ceilings_now() -> CpuCeilings:
    """The CPU whose ceilings a command started now reads: the cpu_ceilings fixture's in
    a module that takes it, else the session's (--cpu-ceilings)."""
    path = Path(os.environ[CEILINGS_ENV]) / f"ceilings-{cache_key(host_cpu())}.json"
    measured = json.loads(path.read_text())
    kind = next(k for k, c in CPU_CEILINGS.items() if c["tflops"] == measured["tflops"])
    return CpuCeilings(kind, measured, no_roofs(measured["tflops"]))


def _fail_on_measured(folder: Path, seeded: set[str], where: str) -> None:
    """Fails when `folder` holds a CPU cache entry it was not seeded with: a command
    measured this CPU (a key seed_cpu_ceilings does not make).  The entry is removed, so
    that the next test doing so fails too."""
    measured = sorted(_cpu_entries(folder) - seeded)
    for name in measured:
        (folder / name).unlink(missing_ok=True)
    if measured:
        pytest.fail(f"this CPU's ceilings were measured {where} ({', '.join(measured)}): "
                    "tests read the ceilings seed_cpu_ceilings gives (tests/conftest.py)",
                    pytrace=False)


@pytest.fixture(autouse=True)
def _no_cpu_ceilings_measured(request):
    """Fails the test (at teardown) that measured this CPU's ceilings into the session's
    cache."""
    yield
    if "dir" in _session:
        _fail_on_measured(_session["dir"], _session["seeded"],
                          f"by {request.node.nodeid}")


@pytest.fixture
def shipped_matmul(tmp_path, monkeypatch):
    """ship(index) -> (launch, config text): a shipped-configs file for the H200 (132
    SMs, 150.1 GB) holding bf16 matmul's candidate `index` at 4096^3 (sm_90), in tmp_path,
    read in place of the repository's files."""
    import functools

    from kernels import REGISTRY, Target
    from kernels import shipped as shipped_mod
    from kernels.shipped import ShippedDevice, ShippedEntry, bucket_text, document
    from kernels.triton_utils import config_str

    def ship(index: int) -> tuple[object, str]:
        spec = REGISTRY["matmul"]
        inputs = spec.make_inputs({"M": 4096, "N": 4096, "K": 4096}, "bf16", 0, "meta")
        (launch,) = spec.launches(inputs, spec.alloc_out(inputs, "bf16"), 132,
                                  Target("cuda", (9, 0)))
        chosen = config_str(launch.configs[index])
        entry = ShippedEntry("matmul", launch.name, "bf16", bucket_text(launch), chosen,
                             "r", 1.0)
        doc = document(ShippedDevice("NVIDIA H200", 132, 150.1), [entry], ["r"])
        (tmp_path / "h200.json").write_text(json.dumps(doc))
        monkeypatch.setattr(shipped_mod, "shipped_for",
                            functools.partial(shipped_mod.shipped_for.__wrapped__,
                                              directory=tmp_path))
        return launch, chosen

    return ship
