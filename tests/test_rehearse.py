"""The rehearsal (benches/rehearse, docs/rehearsal.md): Triton's real JIT path (binder,
post-compile hook, autotuner and its on-disk cache, compile, launcher) on a stand-in CUDA
driver, and the sweep's GPU-side code against it.

What compiles runs in child processes: tests/conftest.py sets TRITON_INTERPRET=1, which
replaces every @triton.jit function at import, and the rehearsal needs the real ones.
The children compile a few small kernels; the full rehearsal is the command line's.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from benches.rehearse.driver import (
    FLUSH_BYTES,
    GPU_MODELS,
    LaunchRecord,
    StandInDriver,
    StandInLauncher,
    stand_in_ms,
    standin_driver,
)
from benches.rehearse.sweep import run_config
from benches.rehearse.tensors import DeviceMemory, DeviceTensor
from benches.sweep.cases import InputCache, build_cases
from benches.sweep.timers import (
    ColdGraph,
    FlushedEvents,
    RowCall,
    WarmEvents,
    WarmGraph,
    rotation_of,
    timer_for,
)
from contract.schema import CACHE_MODES
from kernels import DTYPE_NAMES, REGISTRY

pytestmark = pytest.mark.rehearsal

ROOT = Path(__file__).resolve().parent.parent


def _triton_version() -> tuple[int, int]:
    import triton

    return tuple(int(x) for x in triton.__version__.split(".")[:2])  # type: ignore[return-value]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    return env


def _child(script: str, tmp_path: Path, *args: str, name: str = "child.py"
           ) -> subprocess.CompletedProcess:
    path = tmp_path / name  # a file: @triton.jit reads its function's source
    path.write_text(script)
    return subprocess.run([sys.executable, str(path), *args], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=900)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benches.rehearse", *args], cwd=ROOT,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=900)


# ---- the stand-in, without compiling ----------------------------------------------------

def test_the_standin_is_triton_s_driver_within_the_block_only():
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    before = driver._active
    with standin_driver("h200") as d:
        assert driver.active is d
        assert driver.active.get_current_target() == GPUTarget("cuda", 90, 32)
        props = d.utils.get_device_properties(d.get_current_device())
        assert props["multiprocessor_count"] == 132 and props["max_shared_mem"] == 232448
        flush = d.get_empty_cache_for_benchmark()
        assert flush.nbytes == FLUSH_BYTES and flush.device.type == "meta"
        assert d.get_device_interface().get_device_properties().total_memory > 141e9
        # the benchmarker times what the call launched, the same way every time
        rec = LaunchRecord("k", (4, 1, 1), 4, 3, 1, 0, 0, 64, 32, "BLOCK=128")
        assert d.benchmark(lambda: d.launches.append(rec), quantiles=(0.5, 0.2)) == \
            [stand_in_ms([rec])] * 2
    assert driver._active is before
    with standin_driver("b200"):
        assert driver.active.get_current_target() == GPUTarget("cuda", 100, 32)
    assert driver._active is before


class _Meta:
    name = "k"
    num_warps, num_ctas, num_stages, shared = 4, 1, 3, 0
    global_scratch_size, global_scratch_align = 0, 1


class _Src:
    signature = {"X": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    constants: dict = {}


def test_the_launcher_refuses_what_cuda_refuses_and_records_the_rest():
    d = StandInDriver(GPU_MODELS["h100"])
    launch = StandInLauncher(d, _Src(), _Meta())
    x = DeviceMemory(64).wrap(torch.empty(1024, device="meta"))
    launch(8, 1, 1, 0, 1, None, None, None, None, x, 1024, 128)
    assert d.launches[-1].grid == (8, 1, 1) and d.launches[-1].num_warps == 4
    with pytest.raises(RuntimeError, match="invalid argument.*grid y 70000"):
        launch(1, 70000, 1, 0, 1, None, None, None, None, x, 1024, 128)
    with pytest.raises(ValueError, match="cannot be accessed from Triton"):
        launch(1, 1, 1, 0, 1, None, None, None, None, torch.empty(4), 1024, 128)
    with pytest.raises(OverflowError, match="does not fit i32"):
        launch(1, 1, 1, 0, 1, None, None, None, None, x, 2**31, 128)
    assert len(d.launches) == 1


def test_device_tensors_say_cuda_and_keep_the_alignment_of_their_offsets():
    mem = DeviceMemory(64)
    base = torch.empty(64, 32, dtype=torch.bfloat16, device="meta")
    a, t, off = mem.wrap(base), mem.wrap(base.t()), mem.wrap(base.view(-1)[3:])
    assert isinstance(a, DeviceTensor) and isinstance(a, torch.Tensor)
    assert a.device == torch.device("cuda", 64) and a.is_cuda
    assert a.data_ptr() % 512 == 0 and t.data_ptr() == a.data_ptr()  # one storage
    assert off.data_ptr() - a.data_ptr() == 6  # 3 elements of 2 bytes: not 16-aligned
    assert (a.shape, a.stride(), t.stride(), a.dtype) == \
        ((64, 32), (32, 1), (1, 32), torch.bfloat16)
    assert mem.wrap(torch.empty(8, device="meta")).data_ptr() != a.data_ptr()


# ---- the sweep's GPU-side code against it -----------------------------------------------

def test_every_row_of_a_gpu_run_gets_a_gpu_timer():
    cfg = run_config(GPU_MODELS["h100"], list(REGISTRY), list(DTYPE_NAMES), "quick",
                     list(CACHE_MODES))
    methods: dict[tuple, set] = collections.defaultdict(set)
    twins = {ColdGraph: WarmGraph, FlushedEvents: WarmEvents}
    for case in build_cases(cfg):
        timer = type(timer_for(case, cfg))
        assert timer in (ColdGraph, WarmGraph, FlushedEvents, WarmEvents), case.label
        cold = timer in twins
        methods[(case.spec.name, case.dtype, case.shape_str)].add(
            timer if cold else next(c for c, w in twins.items() if w is timer))
    # both providers and both cache modes of a (kernel, dtype, shape) time one way
    assert all(len(m) == 1 for m in methods.values())
    assert methods[("add", "fp32", "n=4096")] == {ColdGraph}  # microseconds: graphs
    assert methods[("matmul", "bf16", "M=4096,N=4096,K=4096")] == {FlushedEvents}


@pytest.mark.parametrize("key", ["h100", "h200"])
def test_rotations_are_cold_and_every_row_fits_the_device(key):
    """On an 80 GB H100 and a 141 GB H200: a cold graph row's rotation (the sweep's own
    copies, made on meta tensors) spans more than twice the device's L2, and a row's
    inputs, output, copies and the L2-flush buffer fit its memory."""
    model = GPU_MODELS[key]
    cfg = run_config(model, list(REGISTRY), list(DTYPE_NAMES), "quick")
    with standin_driver(model) as d:
        flush = d.get_empty_cache_for_benchmark().nbytes
    assert flush > model.l2_bytes
    rotations = 0
    for case in build_cases(cfg):
        if case.provider != "triton" and case.spec.providers.get("triton"):
            continue  # both providers share one set of copies
        timer = timer_for(case, cfg)
        inputs = case.spec.make_inputs(case.shape, case.dtype, 0, "meta")
        out = case.spec.alloc_out(inputs, case.dtype)
        own = out.nbytes + sum(v.nbytes for v in inputs.values()
                               if isinstance(v, torch.Tensor))
        copies = timer.copies(RowCall(case, cfg, inputs, out, lambda i, o: print),
                              InputCache())
        if copies is not None:
            rotations += 1
            count = rotation_of(case, cfg)
            assert count == 2 * model.l2_bytes // case.spec.nbytes(case.shape, case.dtype) + 1
            assert len(copies.pairs) == count - 1
            assert copies.nbytes + own > 2 * model.l2_bytes, case.label
        assert own + (copies.nbytes if copies else 0) + flush < model.total_memory
    assert rotations > 20


# ---- the rehearsal itself: toy kernels ---------------------------------------------------

# Two toy kernels: one taking a @triton.jit function as a constexpr (what the elementwise
# kernels once did), one whose launch asks for a grid CUDA refuses; and a plain one.
TOYS = textwrap.dedent("""
    import json, sys, tempfile, warnings
    warnings.filterwarnings("ignore")
    import torch, triton, triton.language as tl

    from benches.rehearse.driver import GPU_MODELS
    from benches.rehearse.rehearsal_report import to_json
    from benches.rehearse.rehearsal import ArchReport, Case, rehearse
    from kernels.spec import TritonLaunch

    @triton.jit
    def plus(x, y):
        return x + y

    @triton.jit
    def toy_op_kernel(X, Y, n, OP: tl.constexpr, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + o, OP(tl.load(X + o, mask=o < n), 1.0), mask=o < n)

    @triton.jit
    def toy_plain_kernel(X, Y, n, BLOCK: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + o, tl.load(X + o, mask=o < n) + 1.0, mask=o < n)

    N = 1 << 16
    x, y = torch.empty(N, device="meta"), torch.empty(N, device="meta")
    CONFIGS = (triton.Config({"BLOCK": 256}, num_warps=4),
               triton.Config({"BLOCK": 1024}, num_warps=8))

    def case(name, fn, constexprs, grid):
        return Case(name, "fp32", f"n={N}", [TritonLaunch(fn, (x, y, N), constexprs,
                                                          CONFIGS, grid, tune_key=("n",))])

    def toys(grid_y=1):
        grid = lambda meta: (triton.cdiv(N, meta["BLOCK"]), grid_y)
        return [case("toy-op", toy_op_kernel, {"OP": plus}, grid),
                case("toy-plain", toy_plain_kernel, {}, grid)]

    if sys.argv[1] == "api":
        report = ArchReport("sm_90", "h100", [9, 0], "", tempfile.mkdtemp())
        rehearse(toys(), GPU_MODELS["h100"], report, log=lambda m: None)
        print(json.dumps(to_json(report)))
    else:  # the command line, its cases these toys (a grid CUDA refuses)
        import benches.rehearse.rehearsal as run
        from benches.rehearse.cli import main

        run.registry_cases = lambda *a, **k: toys(grid_y=70000)
        sys.exit(main(["--arch", "sm_90", "--kernels", "add", "--out", sys.argv[2]]))
""")


@pytest.fixture(scope="module")
def toys(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("toys")
    p = _child(TOYS, tmp, "api")
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_jit_function_constexpr_fails_on_triton_36_naming_the_kernel(toys):
    """triton 3.6 serialises a launch's constexprs to JSON for the post-compile hook (the
    sweep always sets one) and cannot serialise a jit function: the first launch of such
    a kernel raises on a GPU, and the rehearsal says which.  3.9 serialises it."""
    failed = {(f["kernel"], f["launch"], f["path"]) for f in toys["failures"]}
    if _triton_version() >= (3, 9):
        assert toys["failures"] == []
    elif _triton_version() == (3, 6):
        assert ("toy-op", "toy_op_kernel", "sweep") in failed
        assert ("toy-op", "toy_op_kernel", "config") in failed
        assert all(f["error"] == "TypeError: Object of type JITFunction is not JSON "
                   "serializable" for f in toys["failures"] if f["path"] != "signals")
        # Raised before the hook is called: LLVM's signal handlers stay (until the
        # sweep's row ends and puts Python's back), which the rehearsal notes too.
        assert {f["path"] for f in toys["failures"]} <= {"sweep", "config", "signals"}
        assert {f["config"] for f in toys["failures"] if f["path"] == "config"} == \
            {"BLOCK=256,num_warps=4,num_stages=3", "BLOCK=1024,num_warps=8,num_stages=3"}
    else:
        pytest.skip(f"expectations are set for triton 3.6 and 3.9, not {_triton_version()}")
    assert not any(k == "toy-plain" for k, _, _ in failed)


def test_a_toy_goes_the_whole_way(toys):
    """The plain kernel: tuned over both configs on disk, every config launched (the
    tuning's, the sweep's, then each alone), compiled ahead by warmup; nothing failed."""
    plain = toys["kernels"]["toy-plain"]
    # 2 candidates timed + the chosen one + each config alone
    assert plain["launches"] == 5 and plain["tunings"] == 1 and plain["failures"] == 0
    (tuning,) = [t for t in toys["tunings"] if t["kernel"] == "toy-plain"]
    assert tuning["launch"] == "toy_plain_kernel" and not tuning["hit"]
    assert tuning["inputs_match"] and tuning["cache_key"] and tuning["best"]
    assert tuning["target"].startswith("GPUTarget(backend='cuda', arch=90")
    assert str(1 << 16) in tuning["tuning_key"] and len(tuning["configs"]) == 2


def test_the_command_line_fails_naming_a_launch_cuda_would_refuse(tmp_path):
    p = _child(TOYS, tmp_path, "cli", str(tmp_path / "out"))
    assert p.returncode == 1, p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("FAILED")]
    assert any("toy-plain" in ln and "toy_plain_kernel" in ln and "grid y 70000" in ln
               for ln in lines), p.stdout[-3000:]
    doc = json.loads((tmp_path / "out" / "rehearsal.json").read_text())
    assert doc["passed"] is False and doc["arches"][0]["arch"] == "sm_90"


# ---- the rehearsal itself: the suite's kernels -------------------------------------------

def test_the_command_line_passes_a_kernel_and_refuses_bad_input(tmp_path):
    p = _cli(tmp_path, "--arch", "sm_90", "--kernels", "add", "--dtypes", "fp32",
             "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "sm_90: passed" in p.stdout
    arch = json.loads((tmp_path / "out" / "rehearsal.json").read_text())["arches"][0]
    assert arch["kernels"]["add"]["cases"] == 1 and arch["kernels"]["add"]["covered"] == 3
    assert arch["kernels"]["add"]["launches"] == 1 and arch["failures"] == []
    for bad in (["--kernels", "nope"], ["--arch", "sm_90", "--device", "b200"]):
        p = _cli(tmp_path, *bad)
        assert p.returncode == 2 and p.stderr.startswith("error: ") \
            and len(p.stderr.strip().splitlines()) == 1, (bad, p.stderr)


@pytest.mark.slow
def test_tunings_are_kept_apart_by_op_and_by_device_and_read_back(tmp_path):
    """The row ops share one kernel: softmax's and layernorm's tunings have keys of
    their own, and so do an H100's and an H200's (both sm_90); the same run again reads
    every tuning back from disk."""
    cache = tmp_path / "cache"

    def run(device: str, name: str) -> dict:
        p = _cli(tmp_path, "--arch", "sm_90", "--kernels", "softmax,layernorm", "--dtypes",
                 "bf16", "--device", device, "--cache-dir", str(cache),
                 "--out", str(tmp_path / name))
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return json.loads((tmp_path / name / "rehearsal.json").read_text())["arches"][0]

    h100, h200, again = run("h100", "a"), run("h200", "b"), run("h100", "c")
    for arch in (h100, h200, again):
        assert arch["tunings"] and all(t["inputs_match"] for t in arch["tunings"])
    keys = {(a["device"], t["kernel"], t["shape"]): t["cache_key"]
            for a in (h100, h200) for t in a["tunings"]}
    assert len(set(keys.values())) == len(keys) == 4  # 2 ops x 2 devices, one shape tuned
    assert not any(t["hit"] for t in h100["tunings"] + h200["tunings"])
    assert all(t["hit"] for t in again["tunings"])
    # The stand-in's timings depend on the launches only: the H200's tuning, timed in
    # another process, chose what the H100's did, and the H100's read back is the same.
    best = [t["best"] for t in h100["tunings"]]
    assert best == [t["best"] for t in h200["tunings"]] == [t["best"] for t in again["tunings"]]
    assert all(best)


SIGNALS = textwrap.dedent("""
    import json, sys, tempfile, warnings
    warnings.filterwarnings("ignore")
    from benches.rehearse.driver import GPU_MODELS
    from benches.rehearse.rehearsal_report import to_json
    from benches.rehearse.rehearsal import ArchReport, registry_cases, rehearse
    import benches.sweep.interrupt as interrupt

    if sys.argv[1] == "no-hook":  # what the sweep would do without its hook
        interrupt.restore_handlers_after_compiles = lambda: None
    model = GPU_MODELS["h100"]
    report = ArchReport("sm_90", "h100", [9, 0], "", tempfile.mkdtemp())
    cases = registry_cases("sm_90", model, ["add"], ["fp32"], "quick", "fast", report)
    rehearse(cases, model, report, log=lambda m: None)
    print(json.dumps(to_json(report)))
""")


@pytest.mark.slow
def test_a_compile_leaves_python_s_signal_handlers_in_place(tmp_path):
    """A fresh compile in the sweep's way runs LLVM, which puts its own C-level SIGINT
    and SIGTERM handlers in place of Python's; the sweep's post-compile hook puts them
    back, and the rehearsal checks it after every case (control: without the hook)."""
    def run(mode: str) -> dict:
        p = _child(SIGNALS, tmp_path / mode, mode)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    (tmp_path / "hook").mkdir()
    (tmp_path / "no-hook").mkdir()
    control = run("no-hook")
    if not any(f["path"] == "signals" for f in control["failures"]):
        pytest.skip("this Triton's compile leaves the signal handlers alone")
    assert run("hook")["failures"] == []


AHEAD = textwrap.dedent("""
    import concurrent.futures, json, sys, warnings
    warnings.filterwarnings("ignore")
    from benches.rehearse.driver import GPU_MODELS
    from benches.rehearse.sweep import run_config
    from benches.sweep import triton_cache
    from benches.sweep.cases import build_cases

    if __name__ == "__main__":  # the workers (spawned) import this file too
        cfg = run_config(GPU_MODELS["h100"], ["add", "softmax"], ["fp32"], "quick")
        jobs = triton_cache.compile_jobs(build_cases(cfg), cfg)
        # "early": started before the jobs, loading torch, Triton and the kernels
        # (triton_cache.PRELOAD) as the command starts them
        ahead = triton_cache.CompileAhead(2, triton_cache.PRELOAD, early=True) \
            if sys.argv[2:] == ["early"] else triton_cache.CompileAhead(2)
        ahead.submit(jobs, "fast", compile_fn=sys.argv[1])
        concurrent.futures.wait(ahead.futures, 600)
        print(json.dumps({"jobs": len(jobs), **ahead.stop()}))
""")



@pytest.mark.slow
def test_compile_ahead_workers_compile_under_the_standin(tmp_path):
    """CompileAhead's workers, given the stand-in's compile function, compile every job
    for sm_90 into Triton's cache; with the sweep's own (its offline driver, no GPU
    here): the control."""
    def run(fn: str, where: Path, *extra: str) -> dict:
        where.mkdir(exist_ok=True)
        p = _child(AHEAD, where, fn, *extra)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    for how in ("standin", "early"):  # started with the jobs, and before them
        got = run("benches.rehearse.sweep:compile_case_on_standin", tmp_path / how,
                  *(["early"] if how == "early" else []))
        # add's 4 shapes and softmax's 3, one launch each: one config, two at N=16384
        assert got["jobs"] == got["cases_done"] == 7 and got["cases_failed"] == 0, how
        assert got["kernels_compiled"] == 8 and got["started_early"] == (how == "early")
        # built, as Triton's compilation listener says (the run's record of a cold
        # cache): not every one, since add's shapes share specializations, and the first
        # worker to build one leaves it in the cache for the other
        assert 0 < got["kernels_built"] < 8, how
        archs = {json.loads(f.read_text())["target"]["arch"]
                 for f in (tmp_path / how / "triton").rglob("*.json")
                 if '"target"' in f.read_text()}
        assert archs == {90}
    # again on the cache the first run filled: all found there, none built (warm)
    again = run("benches.rehearse.sweep:compile_case_on_standin", tmp_path / "standin")
    assert again["kernels_compiled"] == 8 and again["kernels_built"] == 0
    # The control: the sweep's own compile (its offline driver, no GPU).  A Triton that
    # builds a C launcher per kernel at compile (3.6) needs the CUDA libraries for it, so
    # every job fails here; one that builds none (3.9) compiles offline in full.
    from benches.rehearse.launcher import per_kernel_launchers

    control = run("benches.sweep.triton_cache:compile_case", tmp_path / "cuda")
    failed = control["jobs"] if per_kernel_launchers() else 0
    assert control["jobs"] == 7 and control["cases_failed"] == failed


def test_compile_ahead_leaves_the_sweep_no_launcher_to_build(tmp_path):
    """Under a Triton that builds a C launcher per kernel signature with the host
    compiler (3.6, at a kernel's first launch), a cold sweep of add fp32 on the stand-in
    builds its launchers itself; after the compile-ahead (one worker) it builds nothing,
    kernel or launcher: the worker built both (benches/rehearse/cold.py)."""
    from benches.rehearse.launcher import per_kernel_launchers

    if not per_kernel_launchers():
        pytest.skip("this Triton builds no launcher per kernel")

    def cold(ahead: int) -> dict:
        p = subprocess.run([sys.executable, "-m", "benches.rehearse.cold", "--kernels",
                            "add", "--dtypes", "fp32", "--ahead", str(ahead)], cwd=ROOT,
                           env=_env(tmp_path), capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout.strip().splitlines()[-1])

    alone = cold(0)
    assert alone["sweep_built"] >= 1 and alone["sweep_launchers_built"] >= 1
    ahead = cold(1)
    assert ahead["sweep_built"] == ahead["sweep_launchers_built"] == 0
    assert ahead["sweep_loaded"] == alone["sweep_built"] + alone["sweep_loaded"]
    done = ahead["compiled_ahead"]
    assert done["cases_done"] == done["cases"] == alone["cases"]
    assert done["launchers_built"] == alone["sweep_launchers_built"]
