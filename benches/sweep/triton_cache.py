"""Triton's on-disk caches in a GPU sweep: autotuning results kept between runs, and the
sweep's kernels compiled ahead, in worker processes, while the ceilings are measured.

Both land in Triton's cache directory (TRITON_CACHE_DIR, default ~/.triton/cache),
which a CI runner can keep between jobs:

- `keep_tuning`: Triton's autotuner writes each tuning (the candidates' times for a
  kernel, its tuning key and candidates) there and reads it back instead of timing the
  candidates again (its cache_results, switched on for every tuner through
  knobs.autotuning.cache; TRITON_CACHE_AUTOTUNING in the environment decides instead
  when set).  The key holds Triton's version, the GPU target, the kernel's source, the
  tuning key's values and the candidates: a changed kernel or GPU tunes afresh.
- `CompileAhead`: every Triton launch of the sweep's cases, with each of its candidate
  configs, compiled by `JITFunction.warmup` (Triton's own launch path up to the
  launch: the same binder, specializations and options, hence the same cache entries
  the sweep's first calls look up) on meta tensors, in GPUBENCH_COMPILE_WORKERS worker
  processes (benches/sweep/compile_worker.py; default: half the cores, shared by a
  node's ranks; 0: off).  It runs only while the main process measures the ceilings,
  on the GPU and not the host's cores the workers use; then the sweep waits for them,
  up to GPUBENCH_COMPILE_WAIT_S (benches/sweep/compile_wait.py: why waiting costs
  nothing, and what a worker's failure leaves in the run's metadata).  Whatever is not
  compiled by then is stopped (Triton writes a cache entry whole or not at all), and
  the sweep compiles it in turn as before.  A worker's failure costs no row: the sweep's
  own compile fails it; its stderr goes to a file, which says why.  The command starts
  the workers as soon as it has parsed its arguments (`spawn_early`, a `Spawned`): they
  import torch, Triton and the kernels (about 4 s) while the sweep imports its own and
  sets up the GPU, and get their jobs when the ceilings' measuring starts; started
  there instead, they were still starting when the H200's 3.8 s of ceilings ended.

  The workers create no CUDA context: warmup asks Triton's driver for the current
  device, stream and target only (torch.cuda.current_device, the current stream's
  handle, the device's capability), and loads a compiled kernel onto the GPU only at
  its first launch, which warmup never makes (tests/test_triton_cache.py: the questions
  recorded on a CPU, no primary context on a GPU).  Each worker runs in a session of
  its own and is stopped by SIGKILL to its process group, ptxas included; one whose
  parent dies kills its own group.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from benches.sweep.compile_wait import (
    cache_was_warm,
    read_output,
    result_lines,
    wait_for_exit,
    worker_errors,
)

if TYPE_CHECKING:  # annotations only: a worker, or a sweep's stop(), needs no torch
    from benches.sweep.cases import Case, RunConfig

WORKERS_ENV = "GPUBENCH_COMPILE_WORKERS"
# What a worker runs for each job ("module:name", imported in the worker).
COMPILE_FN = "benches.sweep.triton_cache:compile_case"
# How long stop() waits for the killed workers and their last result lines.
STOP_GRACE_S = 5.0


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


Job = tuple[str, str, dict[str, int], int, tuple[int, int] | None]


def compile_jobs(cases: list[Case], cfg: RunConfig) -> list[Job]:
    """(kernel, dtype, shape, SM count, capability) of every distinct Triton case the
    sweep will run on this GPU, in run order (the first rows' kernels first)."""
    if cfg.target.kind != "cuda" or cfg.target.interpret:
        return []
    sms = cfg.present.sms or 0
    seen: dict[tuple[str, str, str], Job] = {}
    for c in cases:
        if c.provider != "triton" or c.spec.triton_launches is None \
                or c.spec.skip_reason(c.provider, c.dtype, cfg.target):
            continue
        seen.setdefault((c.spec.name, c.dtype, c.shape_str),
                        (c.spec.name, c.dtype, dict(c.shape), sms, cfg.target.capability))
    return list(seen.values())


def _warmup(launch: Any, config: Any) -> None:
    """Compile one launch with one config the way its sweep call will (run_launch's
    kwargs), without launching it."""
    launch.fn.warmup(*launch.args, grid=launch.grid(dict(config.kwargs)),
                     **launch.constexprs, **config.all_kwargs())


def compile_case(kernel: str, dtype: str, shape: dict[str, int], sms: int,
                 capability: tuple[int, int] | None, fp8_mode: str,
                 pick: Callable[[Any], Sequence[Any]] | None = None,
                 device: Sequence[Any] | None = None) -> int:
    """Compile every launch x config of one case into Triton's cache (in a worker);
    the number compiled.  The launches are those of a GPU of `capability` (on meta
    tensors a kernel would build the default candidates, not its architecture's).
    `pick`: the configs of a launch to compile (default: every candidate).  `device`:
    the GPU present (name, SM count, memory in GB): a launch with a config shipped for
    it (kernels/shipped.py) compiles that config only, the one the sweep will run
    without tuning (every candidate under GPUBENCH_RETUNE, which tunes)."""
    from kernels import REGISTRY
    from kernels.spec import Target, set_fp8_accum

    set_fp8_accum(fp8_mode)
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, dtype, 0, "meta")
    out = spec.alloc_out(inputs, dtype)
    if pick is None and device is not None:
        pick = _shipped_pick(kernel, dtype, device)
    done = 0
    for launch in spec.launches(inputs, out, sms, Target("cuda", capability)):
        for config in launch.configs if pick is None else pick(launch):
            _warmup(launch, config)
            done += 1
    return done


def _shipped_pick(kernel: str, dtype: str, device: Sequence[Any]
                  ) -> Callable[[Any], Sequence[Any]] | None:
    """compile_case's pick for the device present: a launch's shipped config where one
    applies (as the sweep's row_setup.shipped_configs_of finds it), else every candidate;
    None (every candidate everywhere) under GPUBENCH_RETUNE or with no file for it."""
    from kernels.shipped import retune_requested, shipped_for

    name, sms, memory_gb = device
    choice = shipped_for(str(name), sms, memory_gb)
    if retune_requested() or choice.configs is None:
        return None
    shipped = choice.configs

    def pick(launch: Any) -> Sequence[Any]:
        if len(launch.configs) > 1:
            config, _ = shipped.pick(kernel, dtype, launch)
            if config is not None:
                return [config]
        return launch.configs

    return pick


def default_workers() -> int:
    """GPUBENCH_COMPILE_WORKERS (0: none), else half this node's cores shared among its
    ranks (LOCAL_WORLD_SIZE under torchrun), at most 8.  A value that is not a whole
    number of workers, 0 or more, is a one-line error (the command's exit 2, before
    anything is measured), not silently none."""
    env = os.environ.get(WORKERS_ENV)
    if env is not None and env.strip():
        try:
            count = int(env)
        except ValueError:
            count = -1
        if count < 0:
            from benches.sweep.run_folder import RequestError  # pandas: only to refuse

            raise RequestError(f"{WORKERS_ENV}={env!r}: give the number of compile-ahead "
                               "worker processes, 0 or more (0: none; unset: half the "
                               "cores, at most 8)")
        return count
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(0, min(8, (os.cpu_count() or 2) // 2 // ranks))


def preload() -> None:
    """What a worker started before its jobs are known loads meanwhile: torch, Triton,
    Triton's helpers and every kernel family (the registry loads them on first use).
    Nothing here asks Triton's driver anything: that would initialise CUDA."""
    import triton  # noqa: F401

    import kernels.shipped  # noqa: F401
    import kernels.triton_utils  # noqa: F401
    from kernels import REGISTRY

    len(REGISTRY)


# The worker's --preload: this module, then preload() run.
PRELOAD = ("benches.sweep.triton_cache:preload",)


def _worker_env() -> dict[str, str]:
    """The environment of a worker: this process's, with its import path (the tests'
    fakes included)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [p for p in sys.path if p] + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its session's group: ptxas too


def _end(procs: list[subprocess.Popen]) -> None:
    """Kill workers that have no result to give, reap them and close their pipes."""
    for proc in procs:
        _kill_group(proc)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_GRACE_S)
        _close((proc.stdin, proc.stdout))


def _close(files: Iterable[IO[bytes] | None]) -> None:
    for f in files:
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


class Spawned:
    """Compile-ahead workers waiting for their jobs, each importing `preload` meanwhile
    (spawn_early's: PRELOAD, while this process imports its own and sets up the GPU;
    none for those CompileAhead starts with the jobs at hand).  A CompileAhead takes the
    workers (take()) and sends them the jobs; stop() kills those no CompileAhead took.

    Each worker's stderr goes to a log file of its own from its start (`logs`, by pid):
    a worker whose import fails dies before any job is known, and its log says why.  The
    files have no name (removed at once, read through this process's descriptor), so a
    sweep killed outright leaves none behind."""

    def __init__(self, workers: int, preload: Sequence[str] = PRELOAD) -> None:
        self.procs: list[subprocess.Popen] = []
        self.logs: dict[int, IO[bytes]] = {}
        env = _worker_env()
        try:
            for _ in range(workers):
                # open while its worker may write: closed by stop(), or by the taker's
                log = tempfile.TemporaryFile(prefix="gpubench-compile-worker-")  # noqa: SIM115
                try:
                    proc = subprocess.Popen(
                        [sys.executable, "-m", "benches.sweep.compile_worker",
                         "--preload", ",".join(preload)],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                        stderr=log, env=env, start_new_session=True)
                except BaseException:
                    log.close()
                    raise
                self.procs.append(proc)
                self.logs[proc.pid] = log
        except BaseException:
            self.stop()
            raise

    def take(self) -> tuple[list[subprocess.Popen], dict[int, IO[bytes]]]:
        """The workers and their logs, handed over: their taker stops them and closes
        the logs from now on."""
        procs, logs = self.procs, self.logs
        self.procs, self.logs = [], {}
        return procs, logs

    def stop(self) -> None:
        _end(self.procs)
        _close(self.logs.values())
        self.procs, self.logs = [], {}


def gpu_present_cheaply() -> bool:
    """Whether this machine has an NVIDIA GPU, without asking CUDA (torch.cuda's answer
    initialises the driver): the driver's control device."""
    return os.path.exists("/dev/nvidiactl")


def spawn_early(workers: int | None = None) -> Spawned | None:
    """The compile-ahead workers, started at the process's start on a machine with a
    GPU (the sweep's compile-ahead window then runs from the start, not from the
    ceilings' start: a worker's own start-up, about 4 s, is over by then); None where
    there is no GPU, the workers are off, or they could not be started."""
    workers = default_workers() if workers is None else workers
    if workers < 1 or not gpu_present_cheaply():
        return None
    try:
        return Spawned(workers)
    except OSError:
        return None


class CompileAhead:
    """Worker processes compiling `jobs` (compile_jobs) until they are done or stop();
    wait() waits for them (benches/sweep/compile_wait.py), record() is the run's record.

    Each worker (benches/sweep/compile_worker.py) runs in a session of its own, so a
    signal to the sweep's process group (Ctrl-C, `timeout`, a CI runner's cancel) never
    reaches it or the ptxas it runs: the sweep alone stops them, by SIGKILL to each
    worker's group, ptxas included, and nothing the workers hold (a pool's queue lock,
    the death of which hung multiprocessing.Pool.terminate) can keep stop() waiting.  A
    worker whose parent dies kills its own group (its stdin ends)."""

    def __init__(self, jobs: list[Job], workers: int, fp8_mode: str,
                 compile_fn: str = COMPILE_FN, device: Sequence[Any] | None = None,
                 spawned: Spawned | None = None) -> None:
        self.jobs = len(jobs)
        self.names = [f"{kernel} {dtype}" for kernel, dtype, *_ in jobs]
        self.procs: list[subprocess.Popen] = []
        self.stopped: dict[str, int] | None = None
        self.early = spawned is not None
        # What tells why a worker compiled nothing: its stderr log, and its exit code
        # where it exited on its own (by pid); result lines read so far (wait()).
        self.logs: dict[int, IO[bytes]] = {}
        self.exits: dict[int, int] = {}
        self.out: dict[int, bytearray] = {}
        self.waited_s = 0.0
        # why the wait ended: compile_wait.wait_for_exit's reason, or "interrupted"
        self.wait_ended: str | None = None
        self.worker_errors: list[str] = []
        self.claims = tempfile.mkdtemp(prefix="gpubench-compile-ahead-")
        # `device` (the GPU present: name, SMs, memory) reaches compile_case, which then
        # compiles a shipped config alone; absent, every candidate.  `env`: what this
        # process set after an early worker started (--retune).
        from kernels.shipped import RETUNE_ENV

        # The jobs go in a file: an order line past the pipe's 64 KiB would block the
        # write until a worker still importing reads it.
        jobs_file = os.path.join(self.claims, "jobs.json")
        with open(jobs_file, "w") as f:
            json.dump(jobs, f)
        order = json.dumps({"jobs_file": jobs_file, "fp8_mode": fp8_mode,
                            "claims": self.claims, "compile": compile_fn,
                            "device": list(device) if device is not None else None,
                            "env": {k: os.environ[k] for k in (RETUNE_ENV,)
                                    if k in os.environ}}) + "\n"
        try:
            # started early, every one of them gets the jobs; else as many as there are
            # jobs, up to `workers`, started now
            self.procs, self.logs = (
                spawned or Spawned(min(workers, len(jobs)), preload=())).take()
            sent = []
            for proc in self.procs:
                assert proc.stdin is not None
                if proc.poll() is not None:
                    # an early worker that died (its import failed): the rest work
                    self.exits[proc.pid] = proc.returncode
                    continue
                try:
                    proc.stdin.write(order.encode())
                    proc.stdin.flush()  # stdin stays open: its end tells the worker to die
                except BrokenPipeError:  # dying: its exit code says why
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.exits[proc.pid] = proc.wait(STOP_GRACE_S)
                    continue
                sent.append(proc)
            _end([proc for proc in self.procs if proc not in sent])
            self.procs = sent
            self.workers = len(self.procs)
        except BaseException:
            self.workers = len(self.procs)
            self.stop()
            raise

    def wait(self, seconds: float) -> float:
        """Wait until every worker has exited (each does when no job is left), their
        first results found a warm cache (compile_wait.cache_was_warm: one result a
        worker) or `seconds` have passed; the seconds waited (also added to `waited_s`;
        why it ended: `wait_ended`)."""
        if self.stopped is not None:
            return 0.0
        start = time.monotonic()
        self.wait_ended = "interrupted"  # until the wait returns
        try:
            self.wait_ended = wait_for_exit(
                self.procs, self.out, seconds,
                enough=lambda out: cache_was_warm(out, min(self.workers, self.jobs)))
        finally:  # an interrupt ends the wait: what was waited is still recorded
            waited = time.monotonic() - start
            self.waited_s += waited
        return waited

    def stop(self, grace_s: float = STOP_GRACE_S) -> dict[str, int]:
        """Stop the workers (what they have not compiled is left to the sweep); what was
        done, for the run's metadata (record() adds why workers failed and the wait).
        Returns within about `grace_s`."""
        if self.stopped is not None:
            return self.stopped
        for proc in self.procs:
            if proc.poll() is not None:  # exited on its own, not by the kill below
                self.exits[proc.pid] = proc.returncode
            _kill_group(proc)
        lines: list[dict[str, Any]] = []
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            lines += _result_lines(proc, deadline, self.out.get(proc.pid, b""))
            _close((proc.stdin,))
        self.worker_errors = worker_errors(self.logs, self.exits, self._job_errors(lines))
        _close(self.logs.values())
        shutil.rmtree(self.claims, ignore_errors=True)
        ok = [ln for ln in lines if "compiled" in ln]
        self.stopped = {"workers": self.workers, "cases": self.jobs, "cases_done": len(ok),
                        "cases_failed": len(lines) - len(ok),
                        "kernels_compiled": sum(int(ln["compiled"]) for ln in ok),
                        # of those, built (not found in Triton's cache): a cold cache
                        "kernels_built": sum(int(ln.get("built") or 0) for ln in ok),
                        "started_early": int(self.early)}
        return self.stopped

    def record(self) -> dict[str, Any]:
        """The run's `metadata.compiled_ahead` (the workers stopped first): stop()'s
        counts, the seconds the sweep waited for them after its ceilings (`waited_s`) and
        why workers failed (`worker_errors`: compile_wait.worker_errors)."""
        return {**self.stop(), "waited_s": round(self.waited_s, 1),
                **({"wait_ended": self.wait_ended} if self.wait_ended else {}),
                "worker_errors": list(self.worker_errors)}

    def _job_errors(self, lines: list[dict[str, Any]]) -> list[str]:
        """The jobs' errors, each once, with the first case it failed and how many more."""
        cases: dict[str, list[str]] = {}
        for ln in lines:
            if "error" in ln:
                i = ln["job"]
                name = self.names[i] if isinstance(i, int) and 0 <= i < self.jobs else "?"
                cases.setdefault(str(ln["error"]), []).append(name)
        return [f"{names[0]}: {err}" + (f" (and {len(names) - 1} more cases)"
                                        if len(names) > 1 else "")
                for err, names in cases.items()]


def _result_lines(proc: subprocess.Popen, deadline: float, before: bytes = b""
                  ) -> list[dict[str, Any]]:
    """The whole result lines a stopped worker wrote (`before`: what was read of them
    while waiting), the rest read without waiting past `deadline`."""
    if proc.stdout is None:
        return result_lines(bytes(before))
    data = bytearray(before)
    while not proc.stdout.closed:
        size = len(data)
        read_output([proc], {proc.pid: data}, deadline - time.monotonic())
        if len(data) == size:  # its end, or the deadline
            proc.stdout.close()
    return result_lines(bytes(data))


def start(cases: list[Case], cfg: RunConfig, fp8_mode: str,
          workers: int | None = None, spawned: Spawned | None = None
          ) -> CompileAhead | None:
    """Compile the sweep's Triton kernels ahead (None: nothing to compile, off, or the
    workers could not be started), in `spawned` (spawn_early's workers) where given:
    those are stopped where nothing is to be compiled."""
    jobs = compile_jobs(cases, cfg)
    workers = default_workers() if workers is None else workers
    if not jobs or workers < 1:
        if spawned is not None:
            spawned.stop()
        return None
    try:
        present = cfg.present
        return CompileAhead(jobs, workers, fp8_mode,
                            device=(present.name, present.sms, present.memory_gb),
                            spawned=spawned)
    except OSError:
        return None
