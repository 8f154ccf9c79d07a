"""What a GPU launch hands to Triton's JIT, checked without a GPU.

- Every constexpr of every Triton launch the sweep can make is JSON-serialisable the way
  triton 3.6 serialises a launch's specialization for a post-compile hook (the sweep
  always sets one): a jit function passed as a constexpr raised TypeError there on the
  first launch of every elementwise kernel, while 3.9 serialises it.
- Launches of one kernel whose constexprs change the math (the row ops' OP) never share
  a tuning: the op is part of the autotuner's key.
- Tunings are kept on disk (keep_tuning) unless the user's environment says otherwise.
"""

from __future__ import annotations

import inspect
import json
import os

import pytest
import triton
from triton import knobs

from benches.sweep.shapes import preset_shapes
from kernels import REGISTRY
from kernels.spec import Target
from kernels.tuning import keep_tuning

TARGETS = (Target("cuda", (9, 0)), Target("cuda", (10, 0)))


def serialise_like_triton36(constants: dict) -> str:
    """triton 3.6's serialize_specialization_data on the constants: dtypes become their
    text, constexpr objects their value, anything else must be JSON as it is."""
    return json.dumps({
        k: str(v) if v.__class__.__name__ == "dtype"
        else {"constexpr": v.value} if v.__class__.__name__ == "constexpr" else v
        for k, v in constants.items()})


def all_launches():
    """(kernel, dtype, arch, launch) for every Triton launch at the quick GPU shapes."""
    for name, spec in REGISTRY.items():
        if spec.triton_launches is None:
            continue
        for target in TARGETS:
            for dtype in spec.dtypes:
                if spec.skip_reason("triton", dtype, target):
                    continue
                for shape in preset_shapes(spec, "quick", on_gpu=True)[:1]:
                    inputs = spec.make_inputs(shape, dtype, 0, "meta")
                    out = spec.alloc_out(inputs, dtype)
                    for launch in spec.launches(inputs, out, 132, target):
                        yield name, dtype, target.capability, launch


def test_every_launch_constexpr_serialises_as_triton_36_needs():
    bad = []
    seen = 0
    for name, dtype, cc, launch in all_launches():
        seen += 1
        for cfg in launch.configs:
            try:
                serialise_like_triton36({**launch.constexprs, **cfg.kwargs})
            except TypeError as e:
                bad.append(f"{name} {dtype} sm_{cc[0]}{cc[1]} {launch.name}: {e}")
                break
    assert seen > 20  # every family with a Triton provider was reached
    assert not bad, "\n".join(bad)


def test_jit_function_constexpr_is_what_triton_36_rejects():
    """The rule above is triton 3.6's: a jit function among the constants fails."""
    import triton

    @triton.jit
    def op(x):
        return x

    with pytest.raises(TypeError, match="not JSON serializable"):
        serialise_like_triton36({"OP": op})


def test_elementwise_kernel_per_op_is_one_object():
    """Each op has one kernel object (its compiled variants live on it), distinct from
    another op's, so two ops never share a compiled kernel or a tuning."""
    from kernels.add import add_op
    from kernels.elementwise import elementwise_kernel_for
    from kernels.mul import mul_op

    assert elementwise_kernel_for(add_op) is elementwise_kernel_for(add_op)
    assert elementwise_kernel_for(add_op) is not elementwise_kernel_for(mul_op)


def test_tuning_key_holds_every_constexpr():
    """The row ops share one kernel and matmul's fp32 and tf32 share float32 tensors:
    what tells them apart (OP, PRECISION) is in the tuner's key."""
    from kernels.tuning import tuning_key

    keys = {(name, launch.name): tuning_key(launch) for name, _, _, launch in all_launches()}
    assert "OP" in keys[("softmax", "rowop_kernel")]
    assert keys[("softmax", "rowop_kernel")][:2] == ["M", "N"]  # the declared key first
    assert {"PRECISION", "FP8_FAST"} <= set(keys[("matmul", "matmul_kernel")])


# A child without the interpreter: Triton's real autotuner and its on-disk cache, with a
# stand-in for the one driver call the cache key makes (the target).  It keys the same
# shape of softmax and layernorm, each on two GPU identities, twice.
DISK_CHILD = r'''
import json, sys
import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from kernels import REGISTRY
from kernels.tuning import make_tuner, tuning_values

class Target:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

driver.set_active(Target())
out = []
for attempt in range(2):
    for op in ("softmax", "layernorm"):
        spec = REGISTRY[op]
        inputs = spec.make_inputs({"M": 4096, "N": 16384}, "bf16", 0, "meta")
        launch = spec.launches(inputs, spec.alloc_out(inputs, "bf16"), 132)[0]
        assert len(launch.configs) > 1, "needs a tuned launch"
        for gpu in ("NVIDIA H100 80GB HBM3, 132 SMs", "NVIDIA H200, 132 SMs"):
            tuner = make_tuner(launch, gpu)
            key = tuple(tuning_values(launch).values()) + ("torch.bfloat16",) * 4
            def bench(cfg=launch.configs[-1], key=key, tuner=tuner):
                tuner.cache[key] = cfg
                tuner.configs_timings = {c: [1.0 + i] for i, c in enumerate(launch.configs)}
            hit = tuner.check_disk_cache(key, list(launch.configs), bench)
            out.append([attempt, op, gpu, hit, key in tuner.cache])
print(json.dumps(out))
'''


def test_on_disk_tunings_are_per_op_and_per_gpu(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    p = subprocess.run([sys.executable, "-c", DISK_CHILD], env=env, capture_output=True,
                       text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(p.stdout.strip().splitlines()[-1])
    first = [r for r in rows if r[0] == 0]
    again = [r for r in rows if r[0] == 1]
    # Four (op, GPU) pairs: each tunes on its own the first time (no record read for
    # another op or another GPU), and reads its own record back the second time, under
    # the key the autotuner looks up.
    assert [r[3] for r in first] == [False] * 4
    assert [r[3] for r in again] == [True] * 4
    assert all(r[4] for r in rows)
    records = list((tmp_path / "cache").rglob("*.autotune.json"))
    assert len(records) == 4


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
    assert keep_tuning() and knobs.autotuning.cache
    knobs.autotuning.__dict__.pop("cache", None)
    os.environ[tuning_knob] = "0"  # the user's word
    assert not keep_tuning() and not knobs.autotuning.cache


def test_this_triton_s_autotuner_reads_the_knob_when_made():
    """The mechanism keep_tuning relies on, in this Triton (3.6 on the GPU machines, 3.9
    here): each Autotuner reads knobs.autotuning.cache as it is made, and
    triton.autotune takes cache_results."""
    from triton.runtime.autotuner import Autotuner

    assert "knobs.autotuning.cache" in inspect.getsource(Autotuner.__init__)
    assert "cache_results" in inspect.signature(triton.autotune).parameters
