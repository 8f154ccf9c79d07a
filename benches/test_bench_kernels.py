"""pytest-benchmark suite: every (kernel, provider, dtype) of the registry at the
`quick` preset's shapes (CPU presets shrink on a machine without a GPU).

    pytest benches/ --benchmark-autosave
    pytest benches/ --benchmark-compare --benchmark-compare-fail=median:5%

What pytest-benchmark times on a GPU is host latency: each round launches the kernel and
synchronizes (L2 flushed in the untimed setup), so it spans Python dispatch, launch and
completion; for a Triton kernel of a few microseconds that is several times its device
time.  So TFLOP/s, GB/s, MFU and % of roof in extra_info are derived from the device time
(ms_device: benches.timing.clock.time_gpu, CUDA events with L2 flushed and no host time
counted), and the host latency is kept beside them as host_latency_ms, with the host
dispatch per call as host_us.  On a CPU the call is synchronous and the device time is
the benchmark's own.  Every case is checked against the float64 reference before it is timed; a
wrong kernel fails its test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benches.sweep.shapes import preset_shapes
from benches.timing.clock import time_gpu
from benches.timing.plan import TimingConfig
from contract import metrics
from contract.schema import format_shape
from kernels import DEFAULT_PROVIDERS, DTYPES, REGISTRY, current_target
from kernels.spec import Target
from kernels.triton_utils import prepared_call, run_launch

TARGET: Target = current_target()
ON_GPU = TARGET.kind == "cuda"
ROUNDS = 50 if ON_GPU else 10


def _cases():
    for spec in REGISTRY.values():
        for dtype in spec.dtypes:
            for shape in preset_shapes(spec, "quick", ON_GPU):
                # torch against Triton: torch.compile's providers compile per shape
                # (compile-max autotunes for minutes); the sweep runs those.
                for provider in (p for p in spec.providers if p in DEFAULT_PROVIDERS):
                    yield pytest.param(spec.name, provider, dtype, shape,
                                       id=f"{spec.name}-{provider}-{dtype}-{format_shape(shape)}")


@pytest.fixture(scope="session")
def ceilings():
    """The run_bench ceilings cache (results/.ceilings): measured once per device."""
    from benches.measured_ceilings import get_ceilings
    from contract.devices import DEVICES, detect

    present = detect()
    cache = Path(__file__).resolve().parent.parent / "results" / ".ceilings"
    return get_ceilings(DEVICES[present.key], present, cache, log=lambda m: None)


@pytest.fixture(scope="session")
def l2_flush():
    if not ON_GPU:
        return lambda: None
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 50 << 20) or (50 << 20)
    buf = torch.empty(2 * l2 // 4, dtype=torch.int32, device="cuda")
    return lambda: buf.zero_()


@pytest.mark.parametrize("name,provider,dtype,shape", _cases())
def test_kernel(benchmark, ceilings, l2_flush, name, provider, dtype, shape):
    spec = REGISTRY[name]
    reason = spec.skip_reason(provider, dtype, TARGET)
    if reason is None and provider == "triton" and not ON_GPU:
        reason = "Triton kernels are timed on a GPU only"
    if reason:
        pytest.skip(reason)
    inputs = spec.make_inputs(shape, dtype, 0, TARGET.device)
    out = spec.alloc_out(inputs, dtype).fill_(float("nan"))
    fn = spec.providers[provider].fn
    rel_err = spec.check(fn(inputs, out), inputs, dtype)
    assert rel_err <= DTYPES[dtype].tol, f"wrong result: rel_err {rel_err:.3g}"

    if ON_GPU:
        def run():
            fn(inputs, out)
            torch.cuda.synchronize()

        def setup():
            l2_flush()
            torch.cuda.synchronize()
    else:
        def run():
            fn(inputs, out)

        setup = None
    benchmark.pedantic(run, setup=setup, rounds=ROUNDS, warmup_rounds=3, iterations=1)

    host_ms = benchmark.stats.stats.median * 1e3
    # On a GPU the device time comes from the flushed timer (time_gpu: CUDA events, the
    # GPU kept busy after each flush so no host time is counted); a Triton kernel is
    # timed bound once to its tuned configs, as run_bench.py times it.
    device = time_gpu(_timed_call(spec, provider, inputs, out), TimingConfig()) \
        if ON_GPU else None
    benchmark.extra_info.update(kernel=name, provider=provider, dtype=dtype,
                                shape=format_shape(shape), rel_err=rel_err,
                                host_us=device.host_us if device else None,
                                **bench_metrics(spec, dtype, shape,
                                                device.ms_median if device else None,
                                                host_ms, ceilings))


def _timed_call(spec, provider: str, inputs: dict, out: torch.Tensor):
    """The call whose device time is taken: the provider's function, or for a Triton
    kernel its launches bound to the configs it was tuned to."""
    fn = spec.providers[provider].fn
    if provider != "triton" or spec.triton_launches is None:
        return lambda: fn(inputs, out)
    sms = torch.cuda.get_device_properties(out.device).multi_processor_count
    launches = spec.triton_launches(inputs, out, sms)
    return prepared_call(launches, [run_launch(ln) for ln in launches])


def bench_metrics(spec, dtype: str, shape: dict, device_ms: float | None, host_ms: float,
                  ceilings) -> dict:
    """extra_info's numbers: TFLOP/s, GB/s, MFU and % of roof from the device time
    (ms_device), the host latency (pytest-benchmark's median of launch + synchronize)
    beside them.  device_ms None (a CPU: the call is synchronous, there is no device
    timer): the device time is the benchmark's own."""
    device_ms = host_ms if device_ms is None else device_ms
    rc = spec.roof_class(dtype, TARGET)  # emulated block-scaled rows: the bf16 roof
    flops, nbytes = spec.flops(shape, dtype), spec.nbytes(shape, dtype)
    m = metrics.derive(flops, nbytes, device_ms, ceilings.peak_tflops(rc),
                       ceilings.peak_gbps(), ceilings.meas_tflops(rc), ceilings.meas_gbps())
    return {"flops": flops, "bytes": nbytes, "roof_class": rc, "ms_device": device_ms,
            "host_latency_ms": host_ms,
            **{k: m[k] for k in ("intensity", "tflops", "gbps", "mfu", "pct_roof",
                                 "peak_tflops", "peak_gbps", "roof_tflops")}}
