"""A cold sweep's Triton compiles on a stand-in GPU, with and without compile-ahead.

    python -m benches.rehearse.cold [--device h200] [--sizes quick] [--ahead WORKERS]
                                    [--kernels a,b] [--dtypes x,y]

On an empty Triton cache: with --ahead N, the sweep's compile-ahead (triton_cache.
CompileAhead, N workers compiling under the stand-in) runs to the end first; then every
Triton launch of the sweep's distinct cases is made as a GPU sweep makes it (the shipped
config of the device where one applies, else tuned over the candidates: run_launch_with)
on the stand-in.  Prints one JSON line: the seconds of each part, the kernels the sweep
built and loaded from the cache (Triton's compilation listener), and the C launchers it
built with the host compiler (Triton 3.6).  docs/measurement.md has the figures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import tempfile
import time
from typing import Any, NotRequired, TypedDict


class ColdSweep(TypedDict):
    """One cold sweep's figures, the printed JSON line in this key order: the stand-in
    device, the distinct Triton cases, the compile-ahead workers and their record (only
    with --ahead), seconds of each part, the kernels the sweep built and loaded from the
    cache, the C launchers it built and their seconds."""

    device: str
    cases: int
    ahead_workers: int
    # triton_cache.CompileAhead.record()'s document (a run's metadata.compiled_ahead),
    # printed as that module writes it
    compiled_ahead: NotRequired[dict[str, Any]]
    ahead_s: float
    sweep_s: float
    sweep_built: int
    sweep_loaded: int
    sweep_launchers_built: int
    sweep_launchers_s: float
    total_s: float


def cold_sweep(device: str, kernels: list[str], dtypes: list[str], sizes: str,
               ahead: int) -> ColdSweep:
    """The figures of one cold sweep (module docstring), in this process."""
    from benches.rehearse.driver import GPU_MODELS, STANDIN_DEVICE, standin_driver
    from benches.rehearse.rehearsal import sweep_hooks
    from benches.rehearse.sweep import DEVICE_ENV, run_config, tuning_identity
    from benches.rehearse.tensors import DeviceMemory
    from benches.sweep import triton_cache
    from benches.sweep.cases import build_cases
    from benches.sweep.row_setup import shipped_configs_of
    from benches.sweep.time_split import TimeSplit, compiles_booked
    from kernels.spec import fp8_accum
    from kernels.triton_utils import run_launch_with
    from kernels.tuning import set_device_identity

    model = GPU_MODELS[device]
    cache = tempfile.mkdtemp(prefix="rehearse-cold-")
    os.environ.update(TRITON_CACHE_DIR=cache, **{DEVICE_ENV: model.key})
    cfg = run_config(model, kernels, dtypes, sizes)
    jobs = triton_cache.compile_jobs(build_cases(cfg), cfg)
    cases = {(c.spec.name, c.dtype, c.shape_str): c for c in build_cases(cfg)
             if c.provider == "triton" and (c.spec.name, c.dtype, dict(c.shape)) in
             [(k, d, s) for k, d, s, *_ in jobs]}
    compiled_ahead, t0 = None, time.perf_counter()
    if ahead:
        p = cfg.present
        run = triton_cache.CompileAhead(min(ahead, len(jobs))).submit(
            jobs, fp8_accum(), compile_fn="benches.rehearse.sweep:compile_case_on_standin",
            device=(p.name, p.sms, p.memory_gb))
        concurrent.futures.wait(run.futures)
        compiled_ahead = run.record()
    ahead_s = round(time.perf_counter() - t0, 1)
    set_device_identity(tuning_identity(model), STANDIN_DEVICE)
    split, t1 = TimeSplit(), time.perf_counter()
    with sweep_hooks(cache), standin_driver(model), compiles_booked(split), \
            triton_cache.host_builds() as launchers:
        memory = DeviceMemory(STANDIN_DEVICE)
        for case in cases.values():
            inputs = case.spec.make_inputs(dict(case.shape), case.dtype, 0, "meta")
            launches = case.spec.launches(inputs, case.spec.alloc_out(inputs, case.dtype),
                                          model.sms, cfg.target)
            shipped, _ = shipped_configs_of(case, cfg, launches, None)
            for launch, config in zip(launches, shipped, strict=True):
                run_launch_with(memory.launch(launch), shipped=config)
    sweep_s = round(time.perf_counter() - t1, 1)
    return ColdSweep(device=device, cases=len(cases), ahead_workers=ahead,
                     **({} if compiled_ahead is None else {"compiled_ahead": compiled_ahead}),
                     ahead_s=ahead_s, sweep_s=sweep_s, sweep_built=split.compiles["compiled"],
                     sweep_loaded=split.compiles["from_cache"],
                     sweep_launchers_built=len(launchers),
                     sweep_launchers_s=round(sum(launchers), 1),
                     total_s=round(ahead_s + sweep_s, 1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benches.rehearse.cold", description=__doc__)
    p.add_argument("--device", default="h200")
    p.add_argument("--sizes", default="quick")
    p.add_argument("--ahead", type=int, default=0, help="compile-ahead workers (0: none)")
    p.add_argument("--kernels", default=None)
    p.add_argument("--dtypes", default=None, help="default: every dtype, as the sweep")
    a = p.parse_args(argv)
    from kernels import DTYPE_NAMES, REGISTRY

    kernels = a.kernels.split(",") if a.kernels else list(REGISTRY)
    dtypes = a.dtypes.split(",") if a.dtypes else list(DTYPE_NAMES)
    print(json.dumps(cold_sweep(a.device, kernels, dtypes, a.sizes, a.ahead)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
