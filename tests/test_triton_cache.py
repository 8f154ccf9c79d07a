"""Triton's on-disk caches in a GPU sweep (benches/sweep/triton_cache.py): which kernels are
compiled ahead, how the workers are started and stopped, and the autotuner keeping its
results.  No GPU here: the workers' compile is faked where it would need one."""

from __future__ import annotations

import dataclasses
import inspect
import multiprocessing
import os

import pytest
import triton
from triton import knobs

from benches.sweep import triton_cache
from benches.sweep.cases import build_cases
from kernels import REGISTRY, Target
from kernels.triton_utils import config_str
from tests.test_measurement import gpu_cfg


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


def _fake_compile(kernel, dtype, shape, sms, capability, fp8_mode):
    if kernel == "boom":
        raise RuntimeError("ptxas failed")
    return len(shape)


def test_the_workers_run_until_stopped_and_say_what_they_did():
    ctx = multiprocessing.get_context("fork")
    jobs = [("add", "fp32", {"n": 4096}, 132, (9, 0)), ("boom", "bf16", {"n": 1}, 132, None),
            ("matmul", "bf16", {"M": 1, "N": 1, "K": 1}, 132, (9, 0))]
    ahead = triton_cache.CompileAhead(jobs, 2, "fast", context=ctx,
                                      compile_fn=_fake_compile)
    for r in ahead.results:
        r.wait(30)
    assert ahead.stop() == {"workers": 2, "cases": 3, "cases_done": 2, "cases_failed": 1,
                            "kernels_compiled": 4}
    with pytest.raises(ValueError):  # terminated: takes no more work
        ahead.pool.apply_async(_fake_compile, ("add", "fp32", {}, 0, None, "fast"))


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


@pytest.fixture
def tuning_knob():
    """Triton's knob as it was, and its environment variable (setting the knob sets the
    variable too: Triton's knobs write the environment through)."""
    key = "TRITON_CACHE_AUTOTUNING"
    env, held = os.environ.get(key), knobs.autotuning.__dict__.get("cache")
    yield key
    knobs.autotuning.__dict__.pop("cache", None)
    if held is not None:
        knobs.autotuning.__dict__["cache"] = held
    os.environ.pop(key, None)
    if env is not None:
        os.environ[key] = env


def test_tuning_is_kept_on_disk_unless_the_environment_says(tuning_knob):
    os.environ.pop(tuning_knob, None)
    knobs.autotuning.__dict__.pop("cache", None)
    assert not knobs.autotuning.cache
    assert triton_cache.keep_tuning() and knobs.autotuning.cache
    knobs.autotuning.__dict__.pop("cache", None)
    os.environ[tuning_knob] = "0"  # the user's word
    assert not triton_cache.keep_tuning() and not knobs.autotuning.cache


def test_this_triton_s_autotuner_reads_the_knob_when_made():
    """The mechanism keep_tuning relies on, in this Triton (3.6 on the GPU machines, 3.9
    here): each Autotuner reads knobs.autotuning.cache as it is made, and
    triton.autotune takes cache_results."""
    from triton.runtime.autotuner import Autotuner

    assert "knobs.autotuning.cache" in inspect.getsource(Autotuner.__init__)
    assert "cache_results" in inspect.signature(triton.autotune).parameters
