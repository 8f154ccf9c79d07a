"""Triton's on-disk caches in a GPU sweep: autotuning results kept between runs
(`keep_tuning`), and the sweep's kernels compiled ahead in worker processes while the
ceilings are measured (`CompileAhead`).  Both land in Triton's cache (TRITON_CACHE_DIR).

Compile-ahead: every Triton launch of the sweep's distinct cases (the config shipped for
the GPU present, else every candidate), compiled by `JITFunction.warmup` (Triton's own
launch path short of the launch: the binder, specializations and options the sweep's
first calls look up), then its C launcher built (Triton 3.6 builds one per kernel
signature with the host compiler at a kernel's first launch; warmup returns before
that).  GPUBENCH_COMPILE_WORKERS processes (default half the cores, at most 8, shared by
a node's ranks; 0: off) in a spawn-context process pool, started by the command as soon
as it has parsed its arguments (`spawn_early`), importing torch, Triton and the kernels
meanwhile; the sweep waits for them after its ceilings (benches/sweep/compile_wait.py).

No CUDA in a worker: Triton's own driver answers warmup's questions (current device,
stream, target: runtime/jit.py run() and create_binder()) through torch.cuda, which
initialises CUDA in the process (a context holding GPU memory beside the ceilings being
measured).  A worker's driver is `offline_driver`: the target from the capability the
sweep passes, no device, no stream, nothing else (tests/test_triton_cache.py records
torch.cuda's calls).  Each worker runs in a session of its own (a signal to the sweep's
group never reaches it or its ptxas), is stopped by SIGKILL to that session's group,
and kills its group itself when its parent is gone.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from benches.sweep.compile_wait import worker_errors

if TYPE_CHECKING:  # annotations only: a worker, or a sweep's stop(), needs no torch
    from benches.sweep.cases import Case, RunConfig

WORKERS_ENV = "GPUBENCH_COMPILE_WORKERS"
COMPILE_FN = "benches.sweep.triton_cache:compile_case"  # "module:name", run per job
STOP_GRACE_S = 5.0  # how long stop() waits for the killed workers
PRELOAD = ("benches.sweep.triton_cache:preload",)  # what an early worker loads first
PARENT_POLL_S = 0.2  # how often a worker looks whether its parent is gone
# The device index of the offline driver: one no GPU has (torch holds 8 bits), so that
# nothing compiled under it is found by a launch on a real device.
OFFLINE_DEVICE = 127

Job = tuple[str, str, dict[str, int], int, tuple[int, int] | None]


def keep_tuning() -> bool:
    """Triton's autotuner keeps its results on disk from now on in this process (unless
    TRITON_CACHE_AUTOTUNING is set: it decides); whether it does."""
    try:
        from triton import knobs

        tuning = knobs.autotuning
    except (ImportError, AttributeError):
        return False
    if "TRITON_CACHE_AUTOTUNING" not in os.environ:
        tuning.cache = True
    return bool(tuning.cache)


def compile_jobs(cases: list[Case], cfg: RunConfig) -> list[Job]:
    """(kernel, dtype, shape, SM count, capability) of every distinct Triton case the
    sweep will run on this GPU, in run order."""
    if cfg.target.kind != "cuda" or cfg.target.interpret:
        return []
    seen: dict[tuple[str, str, str], Job] = {}
    for c in cases:
        if c.provider != "triton" or c.spec.triton_launches is None \
                or c.spec.skip_reason(c.provider, c.dtype, cfg.target):
            continue
        seen.setdefault((c.spec.name, c.dtype, c.shape_str), (
            c.spec.name, c.dtype, dict(c.shape), cfg.present.sms or 0, cfg.target.capability))
    return list(seen.values())


# ---- a worker's compile ------------------------------------------------------------------

@contextlib.contextmanager
def offline_driver(capability: tuple[int, int] | None) -> Iterator[None]:
    """Within the block Triton's active driver, where none is set yet (a stand-in set
    before stays: the rehearsal), answers the target of `capability` and asks no GPU."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime import driver as config

    if getattr(config, "_active", None) is not None:  # DriverConfig's (3.6 and 3.9)
        yield
        return
    if capability is None:
        raise RuntimeError("no GPU capability to compile for")
    try:  # 3.6 builds a C launcher per kernel signature; 3.9 has one for all
        from triton.backends.nvidia.driver import CudaLauncher, make_launcher  # noqa: F401
    except ImportError:
        CudaLauncher = None  # noqa: N806

    class Offline(DriverBase):
        launcher_cls = CudaLauncher

        @classmethod
        def is_active(cls) -> bool:
            return False

        def map_python_to_cpp_type(self, ty: str) -> str:
            from triton.backends.nvidia.driver import ty_to_cpp

            return ty_to_cpp(ty)

        def get_current_target(self) -> Any:
            return GPUTarget("cuda", capability[0] * 10 + capability[1], 32)

        def get_current_device(self) -> int:
            return OFFLINE_DEVICE

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def get_active_torch_device(self) -> Any:
            raise RuntimeError("a compile-ahead worker has no GPU")

        get_benchmarker = get_active_torch_device

    config.set_active(Offline())
    try:
        yield
    finally:
        config.set_active(None)  # type: ignore[arg-type]  # as it was: none set


def _warmup(launch: Any, config: Any) -> Any:
    """Compile one launch with one config as its sweep call will (run_launch's kwargs),
    without launching it; the compiled kernel."""
    return launch.fn.warmup(*launch.args, grid=launch.grid(dict(config.kwargs)),
                            **launch.constexprs, **config.all_kwargs())


def compile_case(kernel: str, dtype: str, shape: dict[str, int], sms: int,
                 capability: tuple[int, int] | None, fp8_mode: str,
                 pick: Callable[[Any], Sequence[Any]] | None = None,
                 device: Sequence[Any] | None = None) -> int:
    """Compile every launch x config of one case for a GPU of `capability` into Triton's
    cache, each kernel's C launcher too (3.6); the number compiled.  `pick`: the configs
    of a launch (default: every candidate).  `device` (the GPU present: name, SMs,
    memory in GB): a launch with a config shipped for it compiles that one alone."""
    from triton.runtime import driver

    from kernels import REGISTRY
    from kernels.spec import Target, set_fp8_accum

    set_fp8_accum(fp8_mode)
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, dtype, 0, "meta")
    out = spec.alloc_out(inputs, dtype)
    if pick is None and device is not None:
        pick = _shipped_pick(kernel, dtype, device)
    done = 0
    with offline_driver(capability):
        launcher = getattr(driver.active, "launcher_cls", None)
        for launch in spec.launches(inputs, out, sms, Target("cuda", capability)):
            for config in launch.configs if pick is None else pick(launch):
                compiled = _warmup(launch, config)
                if launcher is not None and hasattr(compiled, "metadata"):
                    launcher(compiled.src, compiled.metadata)
                done += 1
    return done


def _shipped_pick(kernel: str, dtype: str, device: Sequence[Any]
                  ) -> Callable[[Any], Sequence[Any]] | None:
    """A launch's shipped config for the device present where one applies (as
    row_setup.shipped_configs_of finds it), else every candidate; None under
    GPUBENCH_RETUNE or with no file for the device."""
    from kernels.shipped import retune_requested, shipped_for

    name, sms, memory_gb = device
    choice = shipped_for(str(name), sms, memory_gb)
    if retune_requested() or choice.configs is None:
        return None
    shipped = choice.configs

    def pick(launch: Any) -> Sequence[Any]:
        config = shipped.pick(kernel, dtype, launch)[0] if len(launch.configs) > 1 else None
        return launch.configs if config is None else [config]

    return pick


@contextlib.contextmanager
def host_builds() -> Iterator[list[float]]:
    """The seconds of each C module Triton builds with the host compiler in the block
    (3.6's launchers): Triton's build hook (knobs.build.impl) around its own build."""
    from triton import knobs
    from triton.runtime import build

    builds: list[float] = []
    prior = knobs.build.impl

    def timed(*args: Any) -> str:
        t0 = time.perf_counter()
        knobs.build.impl = prior
        try:
            so = prior(*args) if prior is not None else build._build(*args, [])
        finally:
            knobs.build.impl = timed
        builds.append(time.perf_counter() - t0)
        return so

    knobs.build.impl = timed
    try:
        yield builds
    finally:
        knobs.build.impl = prior


# ---- the worker processes ----------------------------------------------------------------

def _named(name: str) -> Any:
    import importlib

    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr) if attr else \
        importlib.import_module(module)


def _worker_start(preload: Sequence[str], logs: str, parent: int) -> None:
    """A worker's start (the pool's initializer): a session of its own, stdout and stderr
    to logs/<pid>.log (Triton prints PTX there when ptxas fails), a thread that kills the
    session's group once the parent is gone, then `preload` ("module[:function]")."""
    os.setsid()
    fd = os.open(os.path.join(logs, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    threading.Thread(target=_die_with, args=(parent,), daemon=True).start()
    for name in ("triton.knobs", *preload):  # knobs: what each job counts with
        try:
            loaded = _named(name)
            if callable(loaded):
                loaded()
        except Exception as e:  # the job that needs it fails and is counted
            print(f"preload {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        except SystemExit as e:  # the worker ends with its code: stop() reads its log
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)


def _die_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.killpg(0, signal.SIGKILL)  # itself and the ptxas it runs


def _compile_job(i: int, job: Job, order: dict[str, Any]) -> dict[str, Any]:
    """One job in a worker: {"job", "compiled", "built" (not found in Triton's cache:
    its compilation listener), "launchers" (built by the host compiler)} or {"job",
    "error"}."""
    from triton import knobs

    kernel, dtype, shape, sms, cc = job
    os.environ.update(order["env"])  # what the sweep set after the worker started
    try:
        fn = _named(order["compile"])
    except Exception as e:  # every job fails alike
        return {"job": i, "error": f"compile function {order['compile']}: "
                                   f"{type(e).__name__}: {e}"[:200]}
    built, prior = [0], knobs.compilation.listener

    def heard(**kw: Any) -> None:
        built[0] += kw.get("cache_hit") is False

    knobs.compilation.listener = heard
    try:
        with host_builds() as launchers:
            extra = {"device": order["device"]} if order["device"] else {}
            n = int(fn(kernel, dtype, shape, sms, tuple(cc) if cc else None,
                       order["fp8_mode"], **extra))
        return {"job": i, "compiled": n, "built": built[0], "launchers": len(launchers)}
    except Exception as e:  # counted: the sweep's own compile says what is wrong
        return {"job": i, "error": f"{type(e).__name__}: {e}"[:200]}
    finally:
        knobs.compilation.listener = prior


def _pool(workers: int, preload: Sequence[str]) -> tuple[cf.ProcessPoolExecutor, str]:
    logs = tempfile.mkdtemp(prefix="gpubench-compile-ahead-")
    return cf.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start,
        initargs=(tuple(preload), logs, os.getpid())), logs


def _processes(pool: cf.ProcessPoolExecutor) -> list[multiprocessing.Process]:
    # The pool's own table (pid -> Process): its workers' pids, each its group's.
    return list((getattr(pool, "_processes", None) or {}).values())


def _shut(pool: cf.ProcessPoolExecutor, procs: list[Any], grace_s: float) -> None:
    """SIGKILL to each worker's group, ptxas included, then the pool shut and the workers
    reaped within `grace_s`: nothing a killed worker held (a queue's lock) is waited on."""
    for p in procs:
        for kill in (os.killpg, os.kill):  # the worker too: still starting, no group yet
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(p.pid, signal.SIGKILL)
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))


class Spawned:
    """Workers started before the jobs are known, each loading `preload` meanwhile (the
    pool starts a worker for each task while none is idle: one no-op each starts them
    all now).  A CompileAhead takes them (take()); stop() ends those none took."""

    def __init__(self, workers: int, preload: Sequence[str] = PRELOAD) -> None:
        self.workers = workers
        self.pool, self.logs = _pool(workers, preload)
        for _ in range(workers):
            self.pool.submit(os.getpid)
        self.procs = _processes(self.pool)

    def take(self) -> tuple[cf.ProcessPoolExecutor, str]:
        taken, self.procs = (self.pool, self.logs), []
        return taken

    def stop(self) -> None:
        if self.procs:
            _shut(self.pool, self.procs, STOP_GRACE_S)
            shutil.rmtree(self.logs, ignore_errors=True)
            self.procs = []


def gpu_present_cheaply() -> bool:
    """Whether this machine has an NVIDIA GPU, without asking CUDA: its control device."""
    return os.path.exists("/dev/nvidiactl")


def default_workers() -> int:
    """GPUBENCH_COMPILE_WORKERS (0: none), else half this node's cores shared among its
    ranks (LOCAL_WORLD_SIZE under torchrun), at most 8; a value that is no whole number
    of workers is a one-line error (the command's exit 2)."""
    env = os.environ.get(WORKERS_ENV)
    if env is not None and env.strip():
        count = int(env) if env.strip().isdigit() else -1
        if count < 0:
            from benches.sweep.run_folder import RequestError  # pandas: only to refuse

            raise RequestError(f"{WORKERS_ENV}={env!r}: give the number of compile-ahead "
                               "worker processes, 0 or more (0: none; unset: half the "
                               "cores, at most 8)")
        return count
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(0, min(8, (os.cpu_count() or 2) // 2 // ranks))


def spawn_early(workers: int | None = None) -> Spawned | None:
    """The workers, started at the command's start on a machine with a GPU; None where
    there is none, they are off, or they could not be started."""
    workers = default_workers() if workers is None else workers
    if workers < 1 or not gpu_present_cheaply():
        return None
    try:
        return Spawned(workers)
    except OSError:
        return None


def preload() -> None:
    """What an early worker loads before its jobs: torch, Triton, every kernel family.
    Nothing here asks Triton's driver anything."""
    import triton  # noqa: F401

    import kernels.shipped  # noqa: F401
    import kernels.triton_utils  # noqa: F401
    from kernels import REGISTRY

    len(REGISTRY)


class CompileAhead:
    """`jobs` (compile_jobs) compiled by worker processes until done or stop(); wait()
    waits for them (compile_wait.after_ceilings), record() is the run's record."""

    def __init__(self, jobs: list[Job], workers: int, fp8_mode: str,
                 compile_fn: str = COMPILE_FN, device: Sequence[Any] | None = None,
                 spawned: Spawned | None = None) -> None:
        from kernels.shipped import RETUNE_ENV

        self.jobs, self.early = len(jobs), int(spawned is not None)
        self.names = [f"{kernel} {dtype}" for kernel, dtype, *_ in jobs]
        self.workers = spawned.workers if spawned else min(workers, len(jobs))
        self.pool, self.logs = spawned.take() if spawned else _pool(self.workers, ())
        self.stopped: dict[str, int] | None = None
        self.waited_s, self.wait_ended = 0.0, None
        self.worker_errors: list[str] = []
        order = {"compile": compile_fn, "fp8_mode": fp8_mode,
                 "device": list(device) if device is not None else None,
                 "env": {k: os.environ[k] for k in (RETUNE_ENV,) if k in os.environ}}
        self.futures: list[cf.Future] = []
        with contextlib.suppress(cf.BrokenExecutor):  # a worker died: stop() says why
            for i, job in enumerate(jobs):
                self.futures.append(self.pool.submit(_compile_job, i, job, order))
        self.procs = _processes(self.pool)

    def _results(self) -> list[dict[str, Any]]:
        return [f.result() for f in self.futures
                if f.done() and not f.cancelled() and f.exception() is None]

    def _warm(self) -> bool:
        """Whether the first results (one a worker) all found their kernels in Triton's
        cache: the sweep loads the rest as fast itself."""
        got = self._results()
        return len(got) >= min(self.workers, self.jobs) > 0 and all(
            "compiled" in r and not r["built"] and not r["launchers"] for r in got)

    def wait(self, seconds: float) -> float:
        """Wait until every job is done, the cache proves warm (_warm) or `seconds` have
        passed; the seconds waited (added to `waited_s`; why it ended: `wait_ended`)."""
        if self.stopped is not None:
            return 0.0
        start = time.monotonic()
        self.wait_ended = "interrupted"  # until the wait returns: a signal ends it
        try:
            while True:
                pending = [f for f in self.futures if not f.done()]
                left = start + seconds - time.monotonic()
                if not pending or self._warm() or left <= 0:
                    self.wait_ended = ("done" if not pending else "cache warm"
                                       if self._warm() else "deadline")
                    break
                cf.wait(pending, timeout=left, return_when=cf.FIRST_COMPLETED)
        finally:
            waited = time.monotonic() - start
            self.waited_s += waited
        return waited

    def stop(self, grace_s: float = STOP_GRACE_S) -> dict[str, int]:
        """Stop the workers (what they have not compiled is left to the sweep) within
        about `grace_s`; what was done, for the run's metadata."""
        if self.stopped is not None:
            return self.stopped
        exits = {p.pid: p.exitcode for p in self.procs if p.exitcode is not None}
        _shut(self.pool, self.procs, grace_s)
        results = self._results()
        failed: dict[str, list[str]] = {}
        for r in results:
            if "error" in r:
                failed.setdefault(r["error"], []).append(self.names[r["job"]])
        self.worker_errors = worker_errors(self.logs, exits, [
            f"{names[0]}: {err}" + (f" (and {len(names) - 1} more cases)" if names[1:]
                                    else "") for err, names in failed.items()])
        shutil.rmtree(self.logs, ignore_errors=True)
        ok = [r for r in results if "compiled" in r]
        self.stopped = {"workers": self.workers, "cases": self.jobs, "cases_done": len(ok),
                        "cases_failed": len(results) - len(ok),
                        "kernels_compiled": sum(r["compiled"] for r in ok),
                        # of those, built (not found in Triton's cache): a cold cache
                        "kernels_built": sum(r["built"] for r in ok),
                        "launchers_built": sum(r["launchers"] for r in ok),
                        "started_early": self.early}
        return self.stopped

    def record(self) -> dict[str, Any]:
        """The run's `metadata.compiled_ahead`: stop()'s counts, the seconds waited after
        the ceilings and why the wait ended, and why workers failed."""
        return {**self.stop(), "waited_s": round(self.waited_s, 1),
                **({"wait_ended": self.wait_ended} if self.wait_ended else {}),
                "worker_errors": list(self.worker_errors)}


def start(cases: list[Case], cfg: RunConfig, fp8_mode: str,
          workers: int | None = None, spawned: Spawned | None = None
          ) -> CompileAhead | None:
    """Compile the sweep's Triton kernels ahead (None: nothing to compile, off, or the
    workers could not be started), in `spawned` where given (stopped where nothing is to
    be compiled)."""
    jobs = compile_jobs(cases, cfg)
    workers = default_workers() if workers is None else workers
    if not jobs or workers < 1:
        if spawned is not None:
            spawned.stop()
        return None
    try:
        p = cfg.present
        return CompileAhead(jobs, workers, fp8_mode, device=(p.name, p.sms, p.memory_gb),
                            spawned=spawned)
    except OSError:
        return None
