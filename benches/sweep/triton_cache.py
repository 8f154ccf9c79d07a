"""The sweep's Triton kernels and 3.6's C launchers compiled into Triton's on-disk cache
ahead by worker processes under an offline driver while the ceilings are measured
(`CompileAhead`), waited for after them (`after_ceilings`).  Why, and what it saves:
docs/measurement.md."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import math
import multiprocessing
import os
import pkgutil
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import wait as mp_wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: a worker, or a sweep's stop(), needs no torch
    from benches.sweep.cases import Case, SweepContext
    from benches.sweep.time_split import TimeSplit

WORKERS_ENV = "GPUBENCH_COMPILE_WORKERS"
WAIT_ENV = "GPUBENCH_COMPILE_WAIT_S"
DEFAULT_WAIT_S = 90.0
COMPILE_FN = "benches.sweep.triton_cache:compile_case"  # "module:name", run per job
# What an early worker loads first: torch, Triton, every kernel family (REGISTRY loads
# them), asking no driver.
PRELOAD = ("kernels.shipped", "kernels.triton_utils", "kernels:REGISTRY")
STOP_GRACE_S = 5.0  # how long stop() waits for the killed workers
PARENT_POLL_S = 0.2  # how often a worker looks whether its parent is gone
# The offline driver's device index: one no GPU has (torch holds 8 bits), so that
# nothing compiled under it is found by a launch on a real device.
OFFLINE_DEVICE = 127
MAX_ERRORS, ERROR_CHARS = 5, 300  # the worker errors recorded, and their length
# A log's head holds its preload lines, its tail the last words of a worker that died;
# between them may lie megabytes of PTX that Triton prints when ptxas fails.
LOG_EDGE_BYTES = 65536

Job = tuple[str, str, dict[str, int], int, tuple[int, int] | None]


def compile_jobs(cases: list[Case], cfg: SweepContext) -> list[Job]:
    """Each distinct Triton case the sweep will run on this GPU, in run order."""
    if cfg.target.kind != "cuda" or cfg.target.interpret:
        return []
    seen: dict[tuple[str, str, str], Job] = {}
    for c in cases:
        if c.provider == "triton" and c.spec.triton_launches is not None \
                and not c.spec.skip_reason(c.provider, c.dtype, cfg.target):
            seen.setdefault((c.spec.name, c.dtype, c.shape_str), (
                c.spec.name, c.dtype, dict(c.shape), cfg.present.sms or 0,
                cfg.target.capability))
    return list(seen.values())


def _env_number(name: str, default: float, want: str, whole: bool = False) -> float:
    """`name`'s value, 0 or more (a count where `whole`), `default` where unset or blank;
    anything else refused in one line."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    with contextlib.suppress(ValueError):
        got = float(raw)
        if math.isfinite(got) and got >= 0 and (raw.isdigit() or not whole):
            return got
    from contract.request import RequestError  # pandas: only to refuse

    raise RequestError(f"{name}={raw!r}: give {want}")


def default_workers() -> int:
    """GPUBENCH_COMPILE_WORKERS, else half the cores shared by the node's ranks, at most 8."""
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return int(_env_number(WORKERS_ENV, max(0, min(8, (os.cpu_count() or 2) // 2 // ranks)),
                           "the number of compile-ahead worker processes, 0 or more (0: "
                           "none; unset: half the cores, at most 8)", whole=True))


def wait_s() -> float:
    """GPUBENCH_COMPILE_WAIT_S: the wait for the workers after the ceilings (0: none)."""
    return _env_number(WAIT_ENV, DEFAULT_WAIT_S, "the seconds to wait after the ceilings "
                       "for the compile-ahead workers, 0 or more (0: stop them when the "
                       f"ceilings end; default {DEFAULT_WAIT_S:g})")


# ---- a worker's compile ------------------------------------------------------------------

@contextlib.contextmanager
def offline_driver(capability: tuple[int, int] | None) -> Iterator[None]:
    """In the block Triton's driver, where none is set (the rehearsal's stand-in stays),
    answers `capability`'s target and asks no GPU (Triton's CUDA driver asks torch.cuda,
    which makes a CUDA context)."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.backends.nvidia import driver as nvidia
    from triton.runtime import driver as config

    if getattr(config, "_active", None) is not None:  # DriverConfig's (3.6 and 3.9)
        yield
        return
    if capability is None:
        raise RuntimeError("no GPU capability to compile for")
    target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)

    def no_gpu(*args: Any) -> Any:
        raise RuntimeError("a compile-ahead worker has no GPU")

    class Offline(DriverBase):
        # 3.6 builds a C launcher per kernel signature (make_launcher); 3.9 one for all
        launcher_cls = nvidia.CudaLauncher if hasattr(nvidia, "make_launcher") else None
        map_python_to_cpp_type = staticmethod(nvidia.ty_to_cpp)
        is_active = classmethod(lambda cls: False)
        get_current_target = staticmethod(lambda: target)
        get_current_device = staticmethod(lambda: OFFLINE_DEVICE)
        get_current_stream = staticmethod(lambda device=None: 0)
        get_active_torch_device = get_benchmarker = staticmethod(no_gpu)

    config.set_active(Offline())
    try:
        yield
    finally:
        config.set_active(None)  # type: ignore[arg-type]  # as it was: none set


def _warmup(launch: Any, config: Any) -> Any:
    """One launch with one config compiled as its sweep call will (run_launch's kwargs)."""
    return launch.fn.warmup(*launch.args, grid=launch.grid(dict(config.kwargs)),
                            **launch.constexprs, **config.all_kwargs())


def compile_case(kernel: str, dtype: str, shape: dict[str, int], sms: int,
                 capability: tuple[int, int] | None, fp8_mode: str,
                 pick: Callable[[Any], Sequence[Any]] | None = None,
                 device: Sequence[Any] | None = None) -> int:
    """Compile each launch x config of one case for a GPU of `capability` into Triton's
    cache, and each kernel's C launcher (3.6's warmup builds none); the number compiled.
    `pick`: a launch's configs (default: every candidate, or with `device`, the GPU's
    name, SMs and memory in GB, the one shipped for it if any and no GPUBENCH_RETUNE)."""
    from triton.runtime import driver

    from kernels import REGISTRY
    from kernels.shipped import retune_requested, shipped_for
    from kernels.spec import Target, set_fp8_accum

    set_fp8_accum(fp8_mode)
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, dtype, 0, "meta")
    out = spec.alloc_out(inputs, dtype)
    shipped = None if pick is not None or device is None or retune_requested() else \
        shipped_for(str(device[0]), device[1], device[2]).configs
    if shipped is not None:
        def pick(launch: Any) -> Sequence[Any]:
            one = shipped.pick(kernel, dtype, launch)[0] if len(launch.configs) > 1 else None
            return launch.configs if one is None else [one]
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


@contextlib.contextmanager
def host_builds() -> Iterator[list[float]]:
    """Seconds of each C module (3.6's launchers) Triton builds in the block (its hook)."""
    from triton import knobs
    from triton.runtime import build

    builds: list[float] = []
    prior = knobs.build.impl

    def timed(*args: Any) -> str:
        t0 = time.perf_counter()
        knobs.build.impl = prior  # Triton's own build calls the hook: not itself again
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

def _worker_start(preload: Sequence[str], logs: str, parent: int) -> None:
    """A worker's start: a session of its own (a signal to the sweep's group misses it),
    its output to logs/<pid>.log (Triton's PTX when ptxas fails), a thread that kills the
    session once the parent is gone, then `preload` ("module[:function]")."""
    os.setsid()
    fd = os.open(os.path.join(logs, f"{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)
    threading.Thread(target=_die_with, args=(parent,), daemon=True).start()
    for name in ("triton.knobs", *preload):  # knobs: what each job counts with
        try:
            loaded = pkgutil.resolve_name(name)
            if callable(loaded):
                loaded()
        except Exception as e:  # the job that needs it fails and is counted
            print(f"preload {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            break  # the rest would fail alike: one line for one cause
        except SystemExit as e:  # the worker ends with its code: stop() reads its log
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)


def _die_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os.killpg(0, signal.SIGKILL)  # itself and the ptxas it runs


def _compile_job(i: int, job: Job, order: dict[str, Any]) -> dict[str, Any]:
    """One job in a worker: {"job", "compiled", "built" (not from Triton's cache),
    "launchers" (built)} or {"job", "error"}."""
    from benches.sweep.time_split import TimeSplit, compiles_booked

    kernel, dtype, shape, sms, cc = job
    os.environ.update(order["env"])  # what the sweep set after the worker started
    split, extra = TimeSplit(), {"device": order["device"]} if order["device"] else {}
    what = f"compile function {order['compile']}: "  # until it loads: every job fails alike
    try:
        fn, what = pkgutil.resolve_name(order["compile"]), ""
        with compiles_booked(split), host_builds() as launchers:
            n = int(fn(kernel, dtype, shape, sms, tuple(cc) if cc else None,
                       order["fp8_mode"], **extra))
        return {"job": i, "compiled": n, "built": split.compiles["compiled"],
                "launchers": len(launchers)}
    except Exception as e:  # counted: the sweep's own compile says what is wrong
        return {"job": i, "error": f"{what}{type(e).__name__}: {e}"[:200]}


def _log_lines(path: str) -> tuple[list[str], ...]:
    """A worker's log: the non-empty lines of its head and of its tail."""
    edges = [b"", b""]
    with contextlib.suppress(OSError), open(path, "rb") as f:
        edges[0] = f.read(LOG_EDGE_BYTES)
        f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_EDGE_BYTES))
        edges[1] = f.read()
    return tuple([s.strip() for s in b.decode(errors="replace").splitlines() if s.strip()]
                 for b in edges)


def worker_errors(logs: str, exits: dict[int, int], job_errors: Iterable[str]) -> list[str]:
    """Up to MAX_ERRORS distinct lines: the last line of the log (`logs`/<pid>.log) of each
    worker that failed on its own (`exits`), each log's `preload` lines, `job_errors`."""
    names = sorted(os.listdir(logs)) if os.path.isdir(logs) else []
    seen = {int(n.split(".")[0]): _log_lines(os.path.join(logs, n)) for n in names}
    found = [f"worker exited with code {code}: "
             + (seen.get(pid, ([], []))[1] or ["nothing on its stderr"])[-1]
             for pid, code in exits.items() if code != 0]
    found += [ln for head, _ in seen.values() for ln in head if ln.startswith("preload ")]
    found += job_errors
    return list(dict.fromkeys(e[:ERROR_CHARS] for e in found))[:MAX_ERRORS]


class CompileAhead:
    """`workers` processes in a spawn-context pool, each loading `preload` before its jobs
    (`early`: started at the command's start), compiling the jobs submit() hands them
    until done or stop(); record() is the run's `metadata.compiled_ahead`."""

    def __init__(self, workers: int, preload: Sequence[str] = (), early: bool = False
                 ) -> None:
        self.workers, self.logs = workers, tempfile.mkdtemp(prefix="gpubench-compile-ahead-")
        self.pool = cf.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=_worker_start, initargs=(tuple(preload), self.logs, os.getpid()))
        for _ in range(workers):  # all started now: one per task while none is idle
            self.pool.submit(os.getpid)
        # The pool's own table (pid -> Process): each worker's pid is its group's.
        self.procs: list[Any] = list(self.pool._processes.values())  # type: ignore[union-attr]
        self.early = int(early)
        self.names: list[str] = []  # each job's "kernel dtype", in submit order
        self.futures: list[cf.Future] = []
        self.stopped: dict[str, Any] | None = None
        self.waited_s, self.wait_ended = 0.0, None

    def submit(self, jobs: list[Job], fp8_mode: str, compile_fn: str = COMPILE_FN,
               device: Sequence[Any] | None = None) -> CompileAhead:
        """Hand `jobs` to the workers (`device`: compile_case's); itself."""
        from kernels.shipped import RETUNE_ENV

        order = {"compile": compile_fn, "fp8_mode": fp8_mode,
                 "device": list(device) if device is not None else None,
                 "env": {k: os.environ[k] for k in (RETUNE_ENV,) if k in os.environ}}
        first, self.names = len(self.names), [*self.names, *(f"{k} {d}" for k, d, *_ in jobs)]
        with contextlib.suppress(cf.BrokenExecutor):  # a worker died: stop() says why
            for i, job in enumerate(jobs, first):
                self.futures.append(self.pool.submit(_compile_job, i, job, order))
        return self

    def _results(self) -> list[dict[str, Any]]:
        return [f.result() for f in self.futures
                if f.done() and not f.cancelled() and f.exception() is None]

    def _warm(self) -> bool:
        """Whether the first results (one a worker) found all in Triton's cache: the sweep
        loads the rest as fast itself."""
        got = self._results()
        return len(got) >= min(self.workers, len(self.names)) > 0 and all(
            "compiled" in r and not r["built"] and not r["launchers"] for r in got)

    def wait(self, seconds: float) -> None:
        """Wait until every job is done, the cache proves warm or `seconds` have passed."""
        if self.stopped is not None:
            return
        start = time.monotonic()
        self.wait_ended = "interrupted"  # until the wait returns: a signal ends it
        try:
            while (pending := [f for f in self.futures if not f.done()]) and not self._warm() \
                    and (left := start + seconds - time.monotonic()) > 0:
                cf.wait(pending, timeout=left, return_when=cf.FIRST_COMPLETED)
            self.wait_ended = "done" if not pending else \
                "cache warm" if self._warm() else "deadline"
        finally:
            self.waited_s += time.monotonic() - start

    def _kill(self) -> dict[int, int]:
        """SIGKILL to each worker's group (ptxas too), the workers reaped within STOP_GRACE_S
        (nothing a killed worker held waited on); the exit codes of those that had ended."""
        # Ended: its sentinel is ready.  Its exit code may not be set yet: the pool's own
        # thread may be reaping it (a Process's two waiters race, the loser reads None).
        ended = [p for p in self.procs if mp_wait([p.sentinel], 0)]
        for p in self.procs:
            for kill in (os.killpg, os.kill):  # the worker too: still starting, no group yet
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_GRACE_S
        if self.procs:
            self.pool.shutdown(wait=False, cancel_futures=True)
            for p in self.procs:
                p.join(max(0.0, deadline - time.monotonic()))
        while any(p.exitcode is None for p in ended) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.procs = []
        return {p.pid: p.exitcode for p in ended if p.exitcode is not None}

    def stop(self) -> dict[str, Any]:
        """Stop the workers (the sweep compiles what they did not); the record."""
        if self.stopped is None:
            exits, results = self._kill(), self._results()
            failed: dict[str, list[str]] = {}
            for r in results:
                if "error" in r:
                    failed.setdefault(r["error"], []).append(self.names[r["job"]])
            errors = worker_errors(self.logs, exits, [
                f"{names[0]}: {err}" + (f" (and {len(names) - 1} more cases)" if names[1:]
                                        else "") for err, names in failed.items()])
            shutil.rmtree(self.logs, ignore_errors=True)
            ok = [r for r in results if "compiled" in r]
            self.stopped = {"workers": self.workers, "cases": len(self.names),
                            "cases_done": len(ok), "cases_failed": len(results) - len(ok),
                            "kernels_compiled": sum(r["compiled"] for r in ok),
                            "kernels_built": sum(r["built"] for r in ok),  # a cold cache
                            "launchers_built": sum(r["launchers"] for r in ok),
                            "started_early": self.early, "waited_s": round(self.waited_s, 1),
                            **({"wait_ended": self.wait_ended} if self.wait_ended else {}),
                            "worker_errors": errors}
        return self.stopped

    record = stop  # the run's metadata.compiled_ahead


def gpu_present_cheaply() -> bool:
    """Whether this machine has an NVIDIA GPU, without asking CUDA: its control device."""
    return os.path.exists("/dev/nvidiactl")


def spawn_early() -> CompileAhead | None:
    """The workers, started at the command's start where there is a GPU; else None."""
    workers = default_workers()
    if workers > 0 and gpu_present_cheaply():
        with contextlib.suppress(OSError):
            return CompileAhead(workers, PRELOAD, early=True)
    return None


def start(cases: list[Case], cfg: SweepContext, fp8_mode: str,
          workers: int | None = None, spawned: CompileAhead | None = None
          ) -> CompileAhead | None:
    """The sweep's Triton kernels compiling ahead, in `spawned` where given (stopped if
    there is nothing to compile); None: nothing to compile, off, or no workers."""
    jobs = compile_jobs(cases, cfg)
    workers = default_workers() if workers is None else workers
    if not jobs or workers < 1:
        if spawned is not None:
            spawned.stop()
        return None
    p = cfg.present
    with contextlib.suppress(OSError):
        return (spawned or CompileAhead(min(workers, len(jobs)))).submit(
            jobs, fp8_mode, device=(p.name, p.sms, p.memory_gb))
    return None


def after_ceilings(ahead: CompileAhead, split: TimeSplit,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """Wait up to wait_s() for `ahead` after the ceilings (booked as compile time; never
    slower: what the workers leave, the sweep compiles serially), stop it and say so to
    `say` (rich markup), with a warning per worker error; its record."""
    from rich.markup import escape  # an error's own brackets are no markup

    seconds = wait_s()
    if seconds > 0:
        with split.phase("compile"):
            ahead.wait(seconds)
    record = ahead.record()
    from contract.rows import compiled_ahead_text  # pandas: after the wait, and no worker's

    say(f"compiled ahead: {compiled_ahead_text(record)}")
    for err in record["worker_errors"]:
        say(f"[yellow]warning[/yellow]: a compile-ahead worker: {escape(err)}")
    return record
