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
  the sweep's first calls look up) on meta tensors, in GPUBENCH_COMPILE_WORKERS spawned
  processes (default: half the cores, shared by a node's ranks; 0: off).  It runs only
  while the main process measures the ceilings, on the GPU and not the host's cores the
  workers use; whatever is not compiled by then is stopped (Triton writes a cache entry
  whole or not at all), and the sweep compiles it in turn as before.  A worker's
  failure is only counted: the sweep's own compile says what is wrong.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

from benches.sweep.cases import Case, RunConfig

WORKERS_ENV = "GPUBENCH_COMPILE_WORKERS"


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
                 capability: tuple[int, int] | None, fp8_mode: str) -> int:
    """Compile every launch x config of one case into Triton's cache (in a worker);
    the number compiled.  The launches are those of a GPU of `capability` (on meta
    tensors a kernel would build the default candidates, not its architecture's)."""
    from kernels import REGISTRY
    from kernels.spec import Target, set_fp8_accum

    set_fp8_accum(fp8_mode)
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(shape, dtype, 0, "meta")
    out = spec.alloc_out(inputs, dtype)
    done = 0
    for launch in spec.launches(inputs, out, sms, Target("cuda", capability)):
        for config in launch.configs:
            _warmup(launch, config)
            done += 1
    return done


def default_workers() -> int:
    """GPUBENCH_COMPILE_WORKERS, else half this node's cores shared among its ranks
    (LOCAL_WORLD_SIZE under torchrun), at most 8."""
    env = os.environ.get(WORKERS_ENV)
    if env is not None:
        try:
            return max(0, int(env))
        except ValueError:
            return 0
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(0, min(8, (os.cpu_count() or 2) // 2 // ranks))


class CompileAhead:
    """Worker processes compiling `jobs` (compile_jobs) until stop()."""

    def __init__(self, jobs: list[Job], workers: int,
                 fp8_mode: str, context: Any = None,
                 compile_fn: Callable[..., int] = compile_case) -> None:
        ctx = context or multiprocessing.get_context("spawn")
        self.jobs = len(jobs)
        self.workers = min(workers, len(jobs))
        self.pool = ctx.Pool(self.workers)
        self.results = [self.pool.apply_async(compile_fn, (*job, fp8_mode)) for job in jobs]

    def stop(self) -> dict[str, int]:
        """Stop the workers (what they have not compiled is left to the sweep); what was
        done, for the run's metadata."""
        done = [r for r in self.results if r.ready()]
        ok = [r for r in done if r.successful()]
        compiled = sum(r.get() for r in ok)
        self.pool.terminate()
        self.pool.join()
        return {"workers": self.workers, "cases": self.jobs, "cases_done": len(ok),
                "cases_failed": len(done) - len(ok), "kernels_compiled": compiled}


def start(cases: list[Case], cfg: RunConfig, fp8_mode: str,
          workers: int | None = None) -> CompileAhead | None:
    """Compile the sweep's Triton kernels ahead (None: nothing to compile, off, or the
    workers could not be started)."""
    jobs = compile_jobs(cases, cfg)
    workers = default_workers() if workers is None else workers
    if not jobs or workers < 1:
        return None
    try:
        return CompileAhead(jobs, workers, fp8_mode)
    except OSError:
        return None
