"""Every kernel, provider and dtype against the float64 reference, on awkward shapes."""

from __future__ import annotations

import concurrent.futures
import inspect as pyinspect

import pytest
import torch

from kernels import DTYPES, REGISTRY, current_target
from kernels.attention_triton import FP8_MIN_HEAD_DIM
from kernels.spec import Target, UnsupportedShape

CPU = current_target("cpu")
INTERP = Target("cpu", None, interpret=True)

# Shapes that are no multiple of any block size: a single element, primes, odd sizes,
# and one just past a power of two.
SHAPES = {
    ("n",): [{"n": 1}, {"n": 7}, {"n": 1009}, {"n": 65537}],
    ("M", "K"): [{"M": 1, "K": 1}, {"M": 3, "K": 997}, {"M": 37, "K": 129},
                 {"M": 129, "K": 64}],
    ("M", "N", "K"): [{"M": 1, "N": 1, "K": 1}, {"M": 17, "N": 13, "K": 7},
                      {"M": 37, "N": 45, "K": 70}, {"M": 65, "N": 33, "K": 129}],
    ("M", "N"): [{"M": 1, "N": 1}, {"M": 3, "N": 997}, {"M": 37, "N": 129},
                 {"M": 129, "N": 64}],
    ("B", "H", "S", "D", "causal"): [
        {"B": 1, "H": 1, "S": 1, "D": 16, "causal": 0},
        {"B": 1, "H": 2, "S": 17, "D": 16, "causal": 1},
        {"B": 2, "H": 1, "S": 37, "D": 32, "causal": 0},
        {"B": 1, "H": 1, "S": 65, "D": 64, "causal": 1}],
}


def cases(provider: str):
    out = []
    for spec in REGISTRY.values():
        for dtype in spec.dtypes:
            target = CPU if provider == "torch" else INTERP
            reason = spec.skip_reason(provider, dtype, target)
            for shape in SHAPES[spec.dims]:
                if (provider == "triton" and spec.name == "attention" and dtype == "fp8"
                        and shape["D"] < FP8_MIN_HEAD_DIM):
                    continue  # skipped by design: an 8-bit tl.dot needs K >= 32 on GPUs
                marks = [pytest.mark.skip(reason=reason)] if reason else []
                sid = f"{spec.name}-{dtype}-" + "x".join(str(v) for v in shape.values())
                out.append(pytest.param(spec.name, dtype, shape, marks=marks, id=sid))
    return out


def run_checked(name: str, provider: str, dtype: str, shape: dict, seed: int = 0,
                device: str = "cpu") -> float:
    spec = REGISTRY[name]
    inputs = spec.make_inputs(shape, dtype, seed, device)
    out = spec.alloc_out(inputs, dtype)
    out.fill_(float("nan"))  # poison: an element the kernel does not write stays NaN
    result = spec.providers[provider].fn(inputs, out)
    return spec.check(result, inputs, dtype)


@pytest.mark.parametrize("name,dtype,shape", cases("torch"))
def test_torch_provider_matches_float64(name, dtype, shape):
    err = run_checked(name, "torch", dtype, shape)
    assert err <= DTYPES[dtype].tol, f"rel_err {err:.3g} > {DTYPES[dtype].tol}"


@pytest.mark.interpreter
@pytest.mark.parametrize("name,dtype,shape", cases("triton"))
def test_triton_provider_matches_float64(name, dtype, shape):
    err = run_checked(name, "triton", dtype, shape)
    assert err <= DTYPES[dtype].tol, f"rel_err {err:.3g} > {DTYPES[dtype].tol}"


@pytest.mark.interpreter
def test_interpreter_is_on():
    # conftest switches the interpreter on before triton is imported; if this fails, the
    # Triton tests above would be testing nothing.
    from kernels.spec import interpreter_enabled

    assert interpreter_enabled()


@pytest.mark.interpreter
def test_unwritten_output_fails_the_check():
    """Poisoning works: a kernel that skips the last elements is caught."""
    from kernels.add import add_op
    from kernels.elementwise import launch_elementwise

    spec = REGISTRY["add"]
    inputs = spec.make_inputs({"n": 1000}, "fp32", 0, "cpu")
    out = spec.alloc_out(inputs, "fp32").fill_(float("nan"))
    short = dict(inputs, x=inputs["x"][:900], y=inputs["y"][:900])
    launch_elementwise(add_op, 2, short, out)  # writes only 900 of 1000 elements
    assert spec.check(out, inputs, "fp32") == float("inf")


def test_wrong_result_exceeds_every_tolerance():
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 16, "N": 16, "K": 16}, "fp32", 0, "cpu")
    wrong = inputs["A"] @ inputs["B"].t()  # transposed operand: a classic bug
    assert spec.check(wrong, inputs, "fp32") > max(d.tol for d in DTYPES.values())


def test_inputs_are_random_and_never_zero():
    for spec in REGISTRY.values():
        shape = SHAPES[spec.dims][2]
        a = spec.make_inputs(shape, "fp32", 1, "cpu")
        b = spec.make_inputs(shape, "fp32", 2, "cpu")
        t = [k for k, v in a.items() if isinstance(v, torch.Tensor) and v.dim() > 0]
        assert t
        for k in t:
            assert (a[k] != 0).all(), f"{spec.name}.{k} has zeros"
            assert not torch.equal(a[k], b[k]), f"{spec.name}.{k} ignores the seed"


@pytest.mark.interpreter
def test_triton_dot_is_deterministic():
    from kernels.dot import dot_triton

    spec = REGISTRY["dot"]
    inputs = spec.make_inputs({"n": 300_001}, "fp32", 3, "cpu")
    r1 = dot_triton(inputs, spec.alloc_out(inputs, "fp32")).clone()
    r2 = dot_triton(inputs, spec.alloc_out(inputs, "fp32"))
    assert torch.equal(r1, r2)


@pytest.mark.interpreter
def test_triton_dot_is_one_launch_that_rearms_its_ticket():
    """One launch (on a GPU too): the program that takes the last ticket writes the sum,
    and leaves the ticket at 0 for the next call (a ticket left at P would make every
    later call skip its final sum)."""
    from kernels.dot import dot_triton, ticket, triton_launches

    spec = REGISTRY["dot"]
    inputs = spec.make_inputs({"n": 100_003}, "bf16", 1, "cpu")
    out = spec.alloc_out(inputs, "bf16")
    assert [ln.name for ln in triton_launches(inputs, out, 132)] == ["dot_kernel"]
    for _ in range(2):
        out.fill_(float("nan"))
        assert spec.check(dot_triton(inputs, out), inputs, "bf16") <= DTYPES["bf16"].tol
        assert ticket(torch.device("cpu")).item() == 0


@pytest.mark.parametrize("itemsize", [1, 2, 4])
def test_dot_keeps_128_bytes_a_thread_in_flight(itemsize):
    from kernels.dot import IN_FLIGHT, WARPS, block_and_stages

    block, stages = block_and_stages(itemsize)
    per_thread = block // (32 * WARPS)
    assert per_thread <= 16  # fp32 accumulators: fp8's 32 a thread went past 64 registers
    assert (stages - 1) * 2 * per_thread * itemsize == IN_FLIGHT == 128
    assert per_thread * itemsize % 16 == 0  # whole 16-byte copies


def test_fp8_inputs_use_nontrivial_scales():
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 32, "N": 32, "K": 32}, "fp8", 0, "cpu")
    assert inputs["A"].dtype == torch.float8_e4m3fn
    assert inputs["sa"].item() != 1.0 and inputs["sb"].item() != 1.0
    # B is column-major, as torch._scaled_mm requires.
    assert inputs["B"].stride() == (1, 32)


def test_fp8_matmul_outputs_bf16_and_elementwise_stays_fp8():
    mm = REGISTRY["matmul"]
    i = mm.make_inputs({"M": 16, "N": 16, "K": 16}, "fp8e5", 0, "cpu")
    assert mm.alloc_out(i, "fp8e5").dtype == torch.bfloat16
    add = REGISTRY["add"]
    i = add.make_inputs({"n": 16}, "fp8e5", 0, "cpu")
    assert add.alloc_out(i, "fp8e5").dtype == torch.float8_e5m2


# ---- skip reasons ------------------------------------------------------------------------

def test_skip_reasons():
    mm = REGISTRY["matmul"]
    hopper = Target("cuda", (9, 0))
    ampere = Target("cuda", (8, 0))
    assert mm.skip_reason("torch", "bf16", hopper) is None
    assert mm.skip_reason("triton", "fp8", hopper) is None
    assert "sm_89" in mm.skip_reason("triton", "fp8", ampere)
    assert "e5m2" in mm.skip_reason("torch", "fp8e5", hopper)
    assert "interpreter" in mm.skip_reason("triton", "bf16", INTERP)
    assert "tf32" in mm.skip_reason("torch", "tf32", CPU)
    assert "CUDA" in REGISTRY["add"].skip_reason("triton", "fp32", Target("cpu"))
    assert "no tf32" in REGISTRY["add"].skip_reason("torch", "tf32", hopper)


# ---- GPU-only ------------------------------------------------------------------------------

GPU_SIZES = {
    ("n",): [{"n": 4097}, {"n": 1 << 20}, {"n": (1 << 26) + 3}],
    ("M", "K"): [{"M": 129, "K": 257}, {"M": 4096, "K": 4096}, {"M": 8192, "K": 8191}],
    ("M", "N", "K"): [{"M": 129, "N": 255, "K": 67}, {"M": 1024, "N": 1024, "K": 1024},
                      {"M": 4096, "N": 4096, "K": 4096}],
    ("M", "N"): [{"M": 129, "N": 1000}, {"M": 4096, "N": 4096}, {"M": 7, "N": 50001}],
    ("B", "H", "S", "D", "causal"): [{"B": 2, "H": 3, "S": 129, "D": 64, "causal": 1},
                                     {"B": 4, "H": 16, "S": 1024, "D": 128, "causal": 0},
                                     {"B": 1, "H": 8, "S": 4097, "D": 128, "causal": 1}],
}


def pinned_config(launch, kernel: str = "", dtype: str = "", device=None):
    """The one candidate a Triton launch runs in the GPU tests: the config shipped for
    the GPU present (kernels/shipped.py; `device`: its name, SMs and memory in GB), the
    one a sweep there runs, else the launch's last (on Hopper a tuned matmul's last is a
    persistent TMA one, where the layout allows TMA).  These tests check each kernel's
    answer, not its tuning: one config a launch, where autotuning compiled and timed
    every candidate at every size (most of the 169 s `pytest -m gpu` took on the H200;
    docs/gpu-job.md has the count)."""
    if device is not None and len(launch.configs) > 1:
        from kernels.shipped import shipped_for

        shipped = shipped_for(str(device[0]), device[1], device[2]).configs
        config = shipped.pick(kernel, dtype, launch)[0] if shipped is not None else None
        if config is not None:
            return config
    return launch.configs[-1]


def gpu_present() -> tuple[str, int, float]:
    """The GPU's name, SM count and memory in GB, as the sweep reads them (Present)."""
    props = torch.cuda.get_device_properties(0)
    return props.name, props.multi_processor_count, props.total_memory / 1e9


def compile_pinned(kernel: str, dtype: str, shape: dict, sms: int, capability, fp8_mode: str,
                   device=None) -> int:
    """What a compile-ahead worker runs for the GPU tests: the case's launches with
    their pinned configs only (benches/sweep/triton_cache.compile_case); `device`: the
    GPU present, passed by CompileAhead."""
    from benches.sweep.triton_cache import compile_case

    return compile_case(kernel, dtype, shape, sms, capability, fp8_mode,
                        pick=lambda launch: [pinned_config(launch, kernel, dtype, device)])


@pytest.fixture(scope="module")
def compiled_ahead():
    """Every pinned launch of the GPU tests compiled first, in parallel, by the sweep's
    own compile-ahead workers (benches/sweep/triton_cache.CompileAhead: half the cores,
    at most 8): the tests then load them from Triton's on-disk cache instead of
    compiling some 140 kernels one after another.  A worker's failure only costs time:
    the test's own launch compiles what is missing, and fails as it would have."""
    from benches.sweep import triton_cache
    from kernels.spec import fp8_accum

    target = current_target()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    jobs = [(name, dtype, shape, sms, target.capability)
            for name, spec in REGISTRY.items() if spec.triton_launches is not None
            for dtype in spec.dtypes if not spec.skip_reason("triton", dtype, target)
            for shape in GPU_SIZES[spec.dims]]
    workers = min(len(jobs), max(1, triton_cache.default_workers()))
    ahead = triton_cache.CompileAhead(workers).submit(
        jobs, fp8_accum(), compile_fn=f"{__name__}:compile_pinned", device=gpu_present())
    concurrent.futures.wait(ahead.futures, 300)  # a hang guard: stop() kills what is left
    return ahead.stop()


def run_pinned(name: str, dtype: str, shape: dict) -> float:
    """run_checked for the Triton provider on the GPU, its launches run with
    pinned_config, as the sweep runs a row's chosen configs (prepared_call)."""
    from kernels.triton_utils import prepared_call

    spec = REGISTRY[name]
    inputs = spec.make_inputs(shape, dtype, 0, "cuda")
    out = spec.alloc_out(inputs, dtype)
    out.fill_(float("nan"))  # poison: an element the kernel does not write stays NaN
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    launches = spec.launches(inputs, out, sms, current_target())
    device = gpu_present()
    prepared_call(launches, [pinned_config(ln, name, dtype, device) for ln in launches])()
    return spec.check(out, inputs, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("provider", ["torch", "triton"])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_gpu_every_dtype_three_sizes(name, provider, compiled_ahead):
    spec = REGISTRY[name]
    target = current_target()
    errors = []
    for dtype in spec.dtypes:
        if spec.skip_reason(provider, dtype, target):
            continue
        for shape in GPU_SIZES[spec.dims]:
            try:
                err = (run_pinned(name, dtype, shape) if provider == "triton" else
                       run_checked(name, provider, dtype, shape, device="cuda"))
            except UnsupportedShape:
                continue  # e.g. torch._scaled_mm on dims that are not multiples of 16
            if not err <= DTYPES[dtype].tol:
                errors.append(f"{dtype} {shape}: {err:.3g}")
    assert not errors, errors


def test_the_gpu_tests_run_the_shipped_config_of_the_gpu_present(monkeypatch, shipped_matmul):
    """pinned_config: on the GPU a file was shipped for, its config (what a sweep there
    runs), also in the compile-ahead workers (compile_pinned); elsewhere the last
    candidate."""

    from benches.sweep import triton_cache
    from kernels.triton_utils import config_str

    shape = {"M": 4096, "N": 4096, "K": 4096}
    h200 = ("NVIDIA H200", 132, 150.1)
    launch, chosen = shipped_matmul(2)
    assert config_str(pinned_config(launch, "matmul", "bf16", h200)) == chosen
    assert pinned_config(launch, "matmul", "bf16", ("NVIDIA H100", 132, 85.0)) \
        is launch.configs[-1]
    assert pinned_config(launch) is launch.configs[-1]
    got = []
    monkeypatch.setattr(triton_cache, "_warmup",
                        lambda ln, config: got.append(config_str(config)))
    assert compile_pinned("matmul", "bf16", shape, 132, (9, 0), "fast", device=h200) == 1
    assert got == [chosen]


# ---- fp8 accumulation mode and the declared launches --------------------------------------

@pytest.fixture
def fp8_mode():
    """Restore the process-wide fp8 accumulation mode after a test changes it."""
    from kernels.spec import fp8_accum, set_fp8_accum

    old = fp8_accum()
    yield set_fp8_accum
    set_fp8_accum(old)


def test_fp8_accum_default_and_validation(fp8_mode):
    from kernels.spec import FP8_ACCUM_MODES, fp8_accum

    assert FP8_ACCUM_MODES == ("fast", "precise") and fp8_accum() == "fast"
    with pytest.raises(ValueError, match="unknown fp8 accumulation mode"):
        fp8_mode("exact")
    fp8_mode("precise")
    assert fp8_accum() == "precise"


@pytest.mark.parametrize("mode", ["fast", "precise"])
def test_fp8_mode_reaches_scaled_mm_triton_and_ceiling(mode, fp8_mode, monkeypatch):
    """One setting drives torch._scaled_mm's use_fast_accum, the Triton kernel's
    FP8_FAST constexpr (and config list), and the measured fp8 ceiling."""
    from benches import measured_ceilings as ceilings
    from kernels import matmul as mm

    fp8_mode(mode)
    calls = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm",
                        lambda *a, **kw: calls.append(kw["use_fast_accum"]) or real(*a, **kw))
    spec = REGISTRY["matmul"]
    inputs = spec.make_inputs({"M": 32, "N": 32, "K": 32}, "fp8", 0, "cpu")
    mm.matmul_torch(inputs, spec.alloc_out(inputs, "fp8"))
    fn, _ = ceilings._gemm_fn("fp8", 32, "cpu")
    fn()
    assert calls == [mode == "fast"] * 2
    (launch,) = mm.triton_launches(inputs, spec.alloc_out(inputs, "fp8"), 132)
    assert launch.constexprs["FP8_FAST"] is (mode == "fast")
    assert launch.tuner == ("fp8" if mode == "fast" else "fp8-precise")
    # Precise promotion keeps a second accumulator: no 128x256 / 256x128 tiles, and
    # BLOCK_K = 128 (the promotion interval) in every config.
    if mode == "precise":
        assert all(c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= 128 * 128
                   for c in launch.configs)
        assert {c.kwargs["BLOCK_K"] for c in launch.configs} == {128}


@pytest.mark.interpreter
@pytest.mark.parametrize("mode", ["fast", "precise"])
def test_triton_fp8_matmul_in_both_modes(mode, fp8_mode):
    """The precise path (max_num_imprecise_acc = BLOCK_K) still runs and is correct
    under the interpreter."""
    fp8_mode(mode)
    err = run_checked("matmul", "triton", "fp8", {"M": 65, "N": 33, "K": 129})
    assert err <= DTYPES["fp8"].tol


def test_ceiling_cache_key_depends_on_fp8_mode(fp8_mode):
    from benches.measured_ceilings import cache_key
    from contract.devices import Present

    present = Present("cpu", "host", "cpu")
    fast = cache_key(present)
    fp8_mode("precise")
    assert cache_key(present) != fast


def test_tf32_b_is_column_major_and_fp32_row_major():
    spec = REGISTRY["matmul"]
    shape = {"M": 32, "N": 48, "K": 64}
    assert spec.make_inputs(shape, "tf32", 0, "cpu")["B"].stride() == (1, 64)
    assert spec.make_inputs(shape, "fp32", 0, "cpu")["B"].stride() == (48, 1)
    assert spec.make_inputs(shape, "fp16", 0, "cpu")["B"].stride() == (48, 1)


def test_every_triton_provider_declares_its_launches():
    """The launch declarations inspect compiles are complete: every runtime argument of
    the jit function is given, in order, and every config names its tile constexprs."""
    for spec in REGISTRY.values():
        assert spec.triton_launches is not None, spec.name
        for dtype in spec.providers["triton"].dtypes:
            shape = SHAPES[spec.dims][-1]
            inputs = spec.make_inputs(shape, dtype, 0, "meta")
            for launch in spec.triton_launches(inputs, spec.alloc_out(inputs, dtype), 132):
                fn = getattr(launch.fn, "fn", launch.fn)  # interpreter wraps the function
                sig = pyinspect.signature(fn).parameters
                params = list(sig)
                # Parameters with a default (matmul's TMA) may be left to it.
                required = [p for p in params if sig[p].default is pyinspect.Parameter.empty]
                for cfg in launch.configs:
                    named = {*launch.constexprs, *cfg.kwargs}
                    given = len(launch.args) + len(named)
                    assert len(required) <= given <= len(params), (spec.name, launch.name)
                    assert named <= set(params[len(launch.args):]), (spec.name, launch.name)
                for ptr in launch.operands:
                    assert ptr in params, (spec.name, ptr)
