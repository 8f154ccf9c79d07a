"""Triton's on-disk caches in a GPU sweep (benches/sweep/triton_cache.py): which kernels are
compiled ahead, how the workers are started and stopped, and the autotuner keeping its
results.  No GPU here: the workers' compile is faked where it would need one."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from triton import knobs

from benches.sweep import triton_cache
from benches.sweep.cases import build_cases
from kernels import REGISTRY, Target
from kernels.triton_utils import config_str
from tests.test_measurement import gpu_cfg

ROOT = Path(__file__).resolve().parents[1]


def _quick_gpu_cfg(**kw):
    return gpu_cfg(kernels=list(REGISTRY), dtypes=["fp32", "bf16", "fp8"],
                   providers=["torch", "triton"], sizes="quick", **kw)


def test_the_jobs_are_the_runs_distinct_triton_cases_in_run_order():
    cfg = _quick_gpu_cfg()
    cases = build_cases(cfg)
    jobs = triton_cache.compile_jobs(cases, cfg)
    want = []
    for c in cases:
        key = (c.spec.name, c.dtype, dict(c.shape), cfg.present.sms, (9, 0))
        if c.provider == "triton" and c.spec.triton_launches is not None \
                and not c.spec.skip_reason("triton", c.dtype, cfg.target) and key not in want:
            want.append(key)
    assert jobs == want and len(jobs) > 20
    assert not any(k == "attention" and d == "fp32" for k, d, *_ in jobs)  # no variant
    # a CPU run, or the interpreter, compiles nothing ahead
    cpu = dataclasses.replace(cfg, target=Target("cpu"))
    assert triton_cache.compile_jobs(cases, cpu) == []
    interp = dataclasses.replace(cfg, target=Target("cuda", (9, 0), True))
    assert triton_cache.compile_jobs(cases, interp) == []


def test_a_case_compiles_each_launch_with_each_candidate(monkeypatch):
    got = []
    monkeypatch.setattr(triton_cache, "_warmup",
                        lambda launch, config: got.append((launch.name, config_str(config))))
    shape = {"M": 4096, "N": 4096, "K": 4096}
    # IEEE fp32 on a Blackwell (sm_100): candidates of its own
    n = triton_cache.compile_case("matmul", "fp32", shape, 148, (10, 0), "fast")
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs(shape, "fp32", 0, "meta")
    out = spec.alloc_out(inputs, "fp32")
    blackwell = spec.launches(inputs, out, 148, Target("cuda", (10, 0)))
    assert got == [(ln.name, config_str(c)) for ln in blackwell for c in ln.configs]
    assert n == len(got) > 1
    # the architecture's candidates, which a GPU run tunes over: not the default ones
    # that meta tensors alone would give
    default = spec.triton_launches(inputs, out, 148)
    assert got != [(ln.name, config_str(c)) for ln in default for c in ln.configs]


FAKES = "tests.compile_ahead_fakes"


def test_the_workers_share_the_jobs_and_say_what_they_did():
    """Each job compiled once by one of the workers (claimed in run order), a failure
    counted, and the workers gone once there is nothing left."""
    jobs = [("add", "fp32", {"n": 4096}, 132, (9, 0)), ("boom", "bf16", {"n": 1}, 132, None),
            ("matmul", "bf16", {"M": 1, "N": 1, "K": 1}, 132, (9, 0))]
    ahead = triton_cache.CompileAhead(2).submit(jobs, "fast", compile_fn=f"{FAKES}:counted")
    assert not concurrent.futures.wait(ahead.futures, 60).not_done
    pids = [p.pid for p in ahead.procs]
    assert ahead.stop() == {"workers": 2, "cases": 3, "cases_done": 2, "cases_failed": 1,
                            "kernels_compiled": 4, "kernels_built": 0,
                            "launchers_built": 0, "started_early": 0, "waited_s": 0.0,
                            "worker_errors": ["boom bf16: RuntimeError: ptxas failed"]}
    assert _gone_within(pids, 5.0) and not Path(ahead.logs).exists()
    assert ahead.stop()["cases_done"] == 2  # once stopped, stays stopped


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


# A sweep as run_bench runs one: compile-ahead workers started, then a wait inside the
# sweep's signal handling (as the ceilings are measured) that a signal ends, then stop().
SWEEP = """
import json, sys, time
from pathlib import Path
from benches.sweep import triton_cache
from benches.sweep.interrupt import Terminated, signals_raise

pids_file = sys.argv[1]
jobs = [("k", pids_file, {"s": s}, 132, (9, 0)) for s in (0.2, 300)]
ahead = triton_cache.CompileAhead(2).submit(
    jobs, "fast", compile_fn="tests.compile_ahead_fakes:like_ptxas")
# ready: both jobs started, the short one done (its worker has no more work)
while len(Path(pids_file).read_text().split() if Path(pids_file).exists() else []) < 3:
    time.sleep(0.05)
try:
    with signals_raise():
        # said inside the handling: a signal sent once the test reads it is caught
        print(json.dumps([p.pid for p in ahead.procs]), flush=True)
        time.sleep(120)
except (Terminated, KeyboardInterrupt) as e:
    print("signalled", type(e).__name__, flush=True)
t0 = time.monotonic()
print("stopped", json.dumps(ahead.stop()), round(time.monotonic() - t0, 2), flush=True)
"""


def _start_sweep(tmp_path: Path) -> tuple[subprocess.Popen, list[int], list[int]]:
    pids_file = tmp_path / "children"
    sweep = subprocess.Popen([sys.executable, "-c", SWEEP, str(pids_file)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)  # its own group, as under `timeout`
    assert sweep.stdout is not None
    workers = json.loads(sweep.stdout.readline() or "null")
    assert workers, sweep.stderr.read() if sweep.stderr else ""
    return sweep, workers, [int(p) for p in pids_file.read_text().split() if p.isdigit()]


@pytest.mark.parametrize("who", ["the sweep's group", "the workers' groups"])
def test_a_sigterm_to_the_group_leaves_stop_returning_and_nothing_running(tmp_path, who):
    """SIGTERM to the sweep's whole process group (a CI runner's cancel, `timeout`) while
    the workers compile, or to the workers' own groups: stop() returns within its grace
    and no worker, nor the ptxas-like child it ran, is left running.  (The
    multiprocessing.Pool the workers were before hung here for good: a worker killed
    while it waited for a task held the pool's queue lock, which Pool.terminate()
    waits for.)"""
    sweep, workers, children = _start_sweep(tmp_path)
    try:
        if who == "the sweep's group":
            os.killpg(sweep.pid, signal.SIGTERM)
        else:
            for pid in workers:
                os.killpg(pid, signal.SIGTERM)
            time.sleep(0.5)
            os.kill(sweep.pid, signal.SIGTERM)
        out, _ = sweep.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sweep.pid, signal.SIGKILL)
    assert "signalled Terminated" in out
    stopped = out.split("stopped ", 1)[1].split()
    assert float(stopped[-1]) < triton_cache.STOP_GRACE_S + 1.0
    assert json.loads(" ".join(stopped[:-1]))["workers"] == 2
    assert _gone_within(workers + children, 5.0)


def test_a_worker_dies_with_the_sweep_that_started_it(tmp_path):
    """The sweep killed outright (SIGKILL: `timeout --kill-after`): its workers and their
    ptxas-like children are gone within seconds, not compiling on into the next step."""
    sweep, workers, children = _start_sweep(tmp_path)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait(10)
    try:
        assert _gone_within(workers + children, 10.0)
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_workers_default_to_half_the_cores_shared_by_the_ranks(monkeypatch):
    monkeypatch.delenv(triton_cache.WORKERS_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert triton_cache.default_workers() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert triton_cache.default_workers() == 1
    monkeypatch.setenv(triton_cache.WORKERS_ENV, "0")
    assert triton_cache.default_workers() == 0
    cfg = _quick_gpu_cfg()
    assert triton_cache.start(build_cases(cfg), cfg, "fast") is None  # off


# ---- what a worker's compile asks of the GPU --------------------------------------------

# A worker's compile (compile_case, as a worker runs it) in a process where torch.cuda
# answers as on a GPU machine and records each call, with Triton's own CUDA driver
# available (its C helpers built against a stub libcuda: no GPU here).  Triton's warmup
# takes the device, stream and target from its active driver (runtime/jit.py run(),
# create_binder()), and Triton's CUDA driver asks torch.cuda for them (backends/driver.py
# GPUDriver: current_device, _cuda_getCurrentRawStream; backends/nvidia/driver.py
# get_current_target: get_device_capability; is_active: is_available): on a GPU, CUDA
# initialised in the worker.
ASKED = """
import json, os, sys
import torch
asked = []

def recorded(name, value):
    def call(*args, **kwargs):
        asked.append(name)
        return value
    return call

for name, value in [("is_available", True), ("is_initialized", True), ("init", None),
                    ("_lazy_init", None), ("device_count", 1), ("current_device", 0),
                    ("set_device", None), ("get_device_capability", (9, 0)),
                    ("synchronize", None)]:
    setattr(torch.cuda, name, recorded("torch.cuda." + name, value))
for name, value in [("_cuda_getCurrentRawStream", 0), ("_cuda_init", None),
                    ("_cuda_getDevice", 0), ("_cuda_getDeviceCount", 1)]:
    setattr(torch._C, name, recorded("torch._C." + name, value))
from benches.rehearse.launcher import stub_libcuda
os.environ["TRITON_LIBCUDA_PATH"] = stub_libcuda()
from benches.sweep.triton_cache import compile_case, host_builds
with host_builds() as launchers:
    n = compile_case("add", "fp32", {"n": 4096}, 132, (9, 0), "fast")
from triton.runtime import driver
print(json.dumps({"compiled": n, "asked": asked, "launchers": len(launchers),
                  "driver_left": getattr(driver, "_active", None) is not None,
                  "cached": len(os.listdir(os.environ["TRITON_CACHE_DIR"]))}))
"""


def test_a_workers_compile_asks_torch_cuda_nothing(tmp_path):
    """A worker's compile asks torch.cuda nothing (no CUDA in the worker: Triton's own
    CUDA driver, which asks torch.cuda, is not used), writes the kernel to Triton's cache
    and, under a Triton that builds a C launcher per kernel (3.6), its launcher too; the
    process's driver is left as it was (none set)."""
    from benches.rehearse.launcher import per_kernel_launchers

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    p = subprocess.run([sys.executable, "-c", ASKED], cwd=ROOT, env=env, timeout=300,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.splitlines()[-1])
    assert got["asked"] == [] and got["compiled"] == 1 and got["cached"] >= 1
    assert got["launchers"] == int(per_kernel_launchers()) and not got["driver_left"]


# A worker is given the capability by the sweep (it asks torch nothing itself), so the
# child takes it from the test's process too; whether a primary context exists is asked
# after each stage, so a failure says which stage made it.
NO_CONTEXT = """
import json, sys
import torch
has = lambda: torch._C._cuda_hasPrimaryContext(0)
stages = {"import": has()}
from benches.sweep.triton_cache import compile_case
stages["triton_cache imported"] = has()
from kernels import REGISTRY
REGISTRY["add"]  # its family's module: Triton, triton.language, the kernels' helpers
stages["kernels imported"] = has()
cc = tuple(json.loads(sys.argv[1]))
n = compile_case("add", "fp32", {"n": 4096}, 132, cc, "fast")
stages["compiled"] = has()
print(json.dumps({"compiled": n, "context": stages}))
"""

# The sweep's first call of the same case, in another process: Triton's compile listener
# says whether each compile was a hit in the on-disk cache, its build hook whether a C
# launcher was built (none: the worker built it).
LAUNCH = """
import json
import torch
from triton import knobs
hits = []
knobs.compilation.listener = lambda **kw: hits.append(kw["cache_hit"])
from benches.sweep.triton_cache import host_builds
from kernels import REGISTRY, current_target
from kernels.triton_utils import run_launch
spec = REGISTRY["add"]
inputs = spec.make_inputs({"n": 4096}, "fp32", 0, "cuda")
out = spec.alloc_out(inputs, "fp32")
with host_builds() as built:
    for launch in spec.launches(inputs, out, 132, current_target()):
        run_launch(launch)
print(json.dumps({"hits": hits, "rel_err": spec.check(out, inputs, "fp32"),
                  "launchers": len(built)}))
"""


@pytest.mark.gpu
def test_a_workers_compile_creates_no_context_and_is_what_the_sweep_loads(tmp_path):
    """On the GPU itself: a fresh process that compiles as a worker does holds no CUDA
    context afterwards (no GPU memory, nothing beside the ceilings being measured), and
    the sweep's own first call of that case, in another process, finds every kernel and
    its C launcher in Triton's cache: the compiles ahead are the ones it looks up."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")

    def child(code: str, *argv: str) -> dict:
        p = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=env,
                           timeout=300, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout.splitlines()[-1])

    import torch

    cc = json.dumps(list(torch.cuda.get_device_capability(0)))
    assert child(NO_CONTEXT, cc) == {"compiled": 1, "context": {
        "import": False, "triton_cache imported": False, "kernels imported": False,
        "compiled": False}}
    launched = child(LAUNCH)
    assert launched["hits"] == [True] and launched["rel_err"] < 1e-5
    assert launched["launchers"] == 0


@pytest.mark.parametrize("interpret", ["1", None])
def test_a_worker_runs_the_real_compile_function(monkeypatch, interpret):
    """The default worker imports and runs compile_case: under the interpreter its
    warmup compiles nothing and returns (one launch x config counted); without it, for
    the capability given, with no GPU."""
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    from benches.rehearse.launcher import per_kernel_launchers

    ahead = triton_cache.CompileAhead(1).submit([("add", "fp32", {"n": 4096}, 132, (9, 0))],
                                                "fast")
    ahead.wait(120)
    record = ahead.record()
    # without a GPU the kernel compiles for sm_90 (the offline driver); its C launcher
    # (3.6) needs a libcuda to link against, which a CPU machine lacks
    fails = not interpret and per_kernel_launchers()
    assert (record["cases_done"], record["cases_failed"]) == (int(not fails), int(fails))
    assert not fails or "libcuda" in record["worker_errors"][0]


def test_a_case_compiles_only_the_configs_picked(monkeypatch):
    """compile_case's pick: the GPU tests' workers compile each launch's one pinned
    config, not every candidate."""
    got = []
    monkeypatch.setattr(triton_cache, "_warmup",
                        lambda launch, config: got.append(config_str(config)))
    shape = {"M": 4096, "N": 4096, "K": 4096}
    n = triton_cache.compile_case("matmul", "bf16", shape, 132, (9, 0), "fast",
                                  pick=lambda launch: [launch.configs[-1]])
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs(shape, "bf16", 0, "meta")
    (launch,) = spec.launches(inputs, spec.alloc_out(inputs, "bf16"), 132, Target("cuda", (9, 0)))
    assert n == 1 and got == [config_str(launch.configs[-1])]
    assert len(launch.configs) > 1 and launch.configs[-1].kwargs.get("TMA")


H200 = ("NVIDIA H200", 132, 150.1)


@pytest.mark.parametrize("retune", [False, True])
def test_a_shipped_config_is_compiled_alone(monkeypatch, shipped_matmul, retune):
    """With the GPU present given (as the sweep passes it), a launch with a config
    shipped for that GPU compiles that config only, the one the sweep runs untuned;
    under GPUBENCH_RETUNE (the sweep tunes) every candidate; on another GPU, or at a
    bucket the file lacks, every candidate."""

    from kernels.shipped import RETUNE_ENV

    if retune:
        monkeypatch.setenv(RETUNE_ENV, "1")
    else:
        monkeypatch.delenv(RETUNE_ENV, raising=False)
    shape = {"M": 4096, "N": 4096, "K": 4096}
    launch, chosen = shipped_matmul(3)  # not the first candidate
    got = []
    monkeypatch.setattr(triton_cache, "_warmup",
                        lambda launch, config: got.append(config_str(config)))
    n = triton_cache.compile_case("matmul", "bf16", shape, 132, (9, 0), "fast", device=H200)
    if retune:
        assert n == len(launch.configs) > 1
    else:
        assert got == [chosen] and n == 1
    # an H100 (no file for it), or a bucket the file lacks: every candidate
    assert triton_cache.compile_case("matmul", "bf16", shape, 132, (9, 0), "fast",
                                     device=("NVIDIA H100 80GB HBM3", 132, 85.0)) > 1
    assert triton_cache.compile_case("matmul", "bf16", {"M": 512, "N": 512, "K": 512},
                                     132, (9, 0), "fast", device=H200) > 1


def test_the_sweep_passes_the_gpu_present_to_its_workers(monkeypatch):
    got = {}

    class Ahead:
        def __init__(self, workers, preload=(), early=False):
            got["workers"], got["pool"] = workers, self

        def submit(self, jobs, fp8_mode, compile_fn=None, device=None):
            got["jobs"], got["device"], got["to"] = len(jobs), device, self
            return self

    monkeypatch.setattr(triton_cache, "CompileAhead", Ahead)
    cfg = _quick_gpu_cfg()
    assert triton_cache.start(build_cases(cfg), cfg, "fast", workers=2) is got["pool"]
    p = cfg.present
    assert got["device"] == (p.name, p.sms, p.memory_gb) and got["to"] is got["pool"]
    assert got["workers"] == 2 < got["jobs"]
    # never more workers than jobs
    one = gpu_cfg(kernels=["add"], dtypes=["fp32"], providers=["triton"],
                  shapes=[{"n": 4096}])
    assert triton_cache.start(build_cases(one), one, "fast", workers=8) is not None
    assert got["workers"] == got["jobs"] == 1
    # the workers the command started early get the jobs, and no pool is made
    early, got["workers"] = Ahead(3), None
    assert triton_cache.start(build_cases(cfg), cfg, "fast", workers=2,
                              spawned=early) is early
    assert got["to"] is early and got["workers"] is None


def test_a_worker_passes_the_device_to_the_compile_function(tmp_path):
    """The order's device reaches the compile function as its keyword (the default
    compile_case takes it); an order without one calls it as before."""
    order = {"fp8_mode": "fast", "compile": f"{FAKES}:with_device", "env": {},
             "device": ["NVIDIA H200", 132, 150.1]}
    job = ("k", "d", {}, 1, None)
    assert triton_cache._compile_job(0, job, order) == {
        "job": 0, "compiled": 132, "built": 0, "launchers": 0}
    assert triton_cache._compile_job(1, job, {**order, "device": None})["compiled"] == 0


def test_a_worker_says_how_many_kernels_it_built_not_found_in_tritons_cache(tmp_path):
    """Triton's compilation listener tells a build from a load out of its cache: the
    run's record of a cold cache when the workers built what the sweep then loads."""

    order = {"fp8_mode": "fast", "compile": f"{FAKES}:two_built_one_loaded", "env": {},
             "device": None}
    prior = knobs.compilation.listener
    assert triton_cache._compile_job(0, ("k", "d", {}, 1, None), order) == {
        "job": 0, "compiled": 3, "built": 2, "launchers": 0}
    assert knobs.compilation.listener is prior  # put back once the job is done


# ---- workers started at the sweep's start ------------------------------------------------

def _wait_for(path: Path, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return True
        time.sleep(0.05)
    return False


def test_early_workers_preload_then_compile_the_jobs_sent_later(tmp_path, monkeypatch):
    """spawn_early's workers import their preload before any job exists (the marker
    module is imported with no order sent), then compile the jobs a CompileAhead sends
    them, with the environment the sweep set after they started (--retune)."""
    marker = tmp_path / "preloaded"
    monkeypatch.setenv("COMPILE_AHEAD_MARKER", str(marker))
    monkeypatch.delenv("GPUBENCH_RETUNE", raising=False)
    spawned = triton_cache.CompileAhead(2, (f"{FAKES}_preload:mark",), early=True)
    try:
        assert _wait_for(marker)  # preloaded while no job was known
        deadline = time.monotonic() + 60
        while marker.read_text().count("called") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.read_text().count("called") == 2  # each imported, then called it
        assert all(p.is_alive() for p in spawned.procs)  # waiting for the jobs
        monkeypatch.setenv("GPUBENCH_RETUNE", "1")
        jobs = [("add", "fp32", {"n": 1}, 132, (9, 0)), ("mul", "fp32", {"n": 1}, 132, None),
                ("dot", "fp32", {"n": 1}, 132, None)]
        ahead = spawned.submit(jobs, "fast", compile_fn=f"{FAKES}:retune_seen")
        assert not concurrent.futures.wait(ahead.futures, 60).not_done
        got = ahead.stop()
        # every job once, each seeing GPUBENCH_RETUNE=1 (2 kernels each)
        assert got == {"workers": 2, "cases": 3, "cases_done": 3, "cases_failed": 0,
                       "kernels_compiled": 6, "kernels_built": 0, "launchers_built": 0,
                       "started_early": 1, "waited_s": 0.0, "worker_errors": []}
        spawned.stop()  # taken: the CompileAhead stopped them
        assert spawned.procs == [] and ahead.stop() == got
    finally:
        spawned.stop()


def test_early_workers_no_sweep_takes_are_stopped(tmp_path):
    """Workers started early that get no jobs (nothing to compile, a resumed run with its
    ceilings, an error before the sweep) are gone once stopped, and so when start()
    finds nothing to compile."""
    spawned = triton_cache.CompileAhead(2, early=True)
    pids = [p.pid for p in spawned.procs]
    spawned.stop()
    assert _gone_within(pids, 10.0) and spawned.procs == []
    spawned = triton_cache.CompileAhead(1, early=True)
    pids = [p.pid for p in spawned.procs]
    cfg = gpu_cfg(kernels=["add"], dtypes=["fp32"], providers=["torch"], sizes="quick")
    assert triton_cache.start(build_cases(cfg), cfg, "fast", workers=2,
                              spawned=spawned) is None
    assert _gone_within(pids, 10.0)


def test_early_workers_start_only_for_a_sweep_on_a_gpu(monkeypatch, tmp_path):
    import run_bench
    from benches.measured_ceilings import CACHE_DIR_ENV

    started = []
    monkeypatch.setattr(triton_cache, "CompileAhead",
                        lambda n, preload, early: started.append(n) or (
                            "pool" if early and preload == triton_cache.PRELOAD else "?"))
    monkeypatch.setattr(triton_cache, "gpu_present_cheaply", lambda: True)
    monkeypatch.setenv(triton_cache.WORKERS_ENV, "3")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)

    def early(*argv: str) -> object:
        return run_bench._early_workers(run_bench.parse_args([*argv, "--out",
                                                              str(tmp_path)]))

    assert early() == "pool" and started == [3]
    assert early("--providers", "torch,triton", "--sizes", "quick") == "pool"
    for argv in (["--estimate"], ["--check-only"], ["--device", "cpu"], ["--list"],
                 ["--inspect"], ["--providers", "torch"], ["--providers", "torch,compile"]):
        assert early(*argv) is None, argv
    assert started == [3, 3]
    # no ceilings to measure (--no-measure-ceilings, or a cache entry unless
    # --remeasure-ceilings): the sweep still waits for them after (after_ceilings), unless
    # told not to wait, when there is no time to compile in
    (tmp_path / ".ceilings").mkdir()
    (tmp_path / ".ceilings" / "ceilings-0123.json").write_text("{}")
    assert early("--no-measure-ceilings") == "pool" and early() == "pool"
    assert started == [3, 3, 3, 3]
    monkeypatch.setenv("GPUBENCH_COMPILE_WAIT_S", "0")
    assert early("--no-measure-ceilings") is None and early() is None
    assert early("--remeasure-ceilings") == "pool" and started == [3, 3, 3, 3, 3]
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "elsewhere"))  # not there
    assert early() == "pool" and started == [3, 3, 3, 3, 3, 3]
    monkeypatch.setenv("GPUBENCH_COMPILE_WAIT_S", "soon")  # refused later, in one line
    assert early() is None
    monkeypatch.delenv("GPUBENCH_COMPILE_WAIT_S")
    monkeypatch.setenv(triton_cache.WORKERS_ENV, "0")
    assert early() is None
    monkeypatch.setenv(triton_cache.WORKERS_ENV, "many")  # refused later, in one line
    assert early() is None
    monkeypatch.setenv(triton_cache.WORKERS_ENV, "3")
    monkeypatch.setattr(triton_cache, "gpu_present_cheaply", lambda: False)
    assert early() is None and started == [3, 3, 3, 3, 3, 3]


def test_early_workers_are_stopped_when_the_command_ends_before_the_sweep(monkeypatch):
    """A bad request after the workers started: the one-line error, and the workers
    stopped (the sweep never took them)."""
    import run_bench

    stops = []

    class Early:
        def stop(self) -> None:
            stops.append(1)

    monkeypatch.setattr(run_bench, "_early_workers", lambda args: Early())
    assert run_bench.main(["--kernels", "no-such-kernel"]) == 2
    assert stops == [1]


def test_the_command_hands_its_early_workers_to_the_sweep(monkeypatch, tmp_path):
    """run_bench's early workers reach triton_cache.start with the sweep's cases (which
    sends them the jobs, or stops them where there are none), and are stopped at the
    end either way."""
    import run_bench

    got, stops = [], []

    class Early:
        def stop(self) -> None:
            stops.append(1)

    def start(cases, cfg, fp8_mode, workers=None, spawned=None):
        got.append((len(cases), spawned))
        return None

    early = Early()
    monkeypatch.setattr(run_bench, "_early_workers", lambda args: early)
    monkeypatch.setattr(triton_cache, "start", start)
    monkeypatch.setenv("GPUBENCH_CEILINGS_DIR", str(tmp_path / "ceilings"))
    code = run_bench.main(["--kernels", "add", "--dtypes", "fp32", "--providers", "torch",
                           "--sizes", "4096", "--out", str(tmp_path), "--no-plots"])
    assert code == 0
    assert got == [(1, early)] and stops == [1]


def test_an_early_worker_that_died_leaves_the_jobs_to_the_sweep(tmp_path):
    """One early worker killed before the jobs are sent: the pool takes none (the sweep
    compiles them itself), stop() returns at once and says the worker's exit; live
    workers take jobs of any size (past a pipe's 64 KiB in all)."""
    spawned = triton_cache.CompileAhead(3, early=True)
    dead = spawned.procs[0]
    os.kill(dead.pid, signal.SIGKILL)
    dead.join(10)
    ahead = spawned.submit([("add", "fp32", {"n": 1}, 132, (9, 0))] * 3, "fast",
                           compile_fn=f"{FAKES}:counted")
    t0 = time.monotonic()
    record = ahead.record()
    assert time.monotonic() - t0 < triton_cache.STOP_GRACE_S and record["cases_done"] == 0
    assert record["workers"] == 3 and record["started_early"] == 1 and record["cases"] == 3
    assert record["worker_errors"][0].startswith("worker exited with code -9: ")
    big = {f"dim{j}": j for j in range(300)}  # ~4 KB a job, 100 jobs
    jobs = [("add", "fp32", big, 132, (9, 0)) for _ in range(100)]
    assert len(json.dumps(jobs)) > 65536
    ahead = triton_cache.CompileAhead(2).submit(jobs, "fast", compile_fn=f"{FAKES}:counted")
    assert not concurrent.futures.wait(ahead.futures, 60).not_done
    got = ahead.stop()
    assert got["cases_done"] == 100 and got["kernels_compiled"] == 100 * 300


def test_the_preload_loads_triton_and_every_family_without_asking_the_driver():
    """triton_cache.PRELOAD, what an early worker loads before the GPU is set up by the
    sweep: Triton and every kernel family imported, nothing asked of CUDA or of
    Triton's driver (which would initialise CUDA in the worker)."""
    code = """
import json, pkgutil, sys, torch
asked = []
for name in ("is_available", "current_device", "device_count", "init", "_lazy_init",
             "get_device_capability", "get_device_properties"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _n=name, _r=real, **k: (asked.append(_n), _r(*a, **k))[1])
from benches.sweep import triton_cache
for name in triton_cache.PRELOAD:
    pkgutil.resolve_name(name)
import triton.runtime
drv = triton.runtime.driver
print(json.dumps([asked, "triton" in sys.modules, "kernels.matmul" in sys.modules,
                  "kernels.attention" in sys.modules, getattr(drv, "_active", None) is None]))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    asked, has_triton, has_matmul, has_attention, no_driver = json.loads(
        out.stdout.splitlines()[-1])
    assert asked == [] and has_triton and has_matmul and has_attention and no_driver
