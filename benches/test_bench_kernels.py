"""pytest-benchmark suite: every (kernel, provider, dtype) of the registry at the
`quick` preset's shapes (CPU presets shrink on a machine without a GPU).

    pytest benches/ --benchmark-autosave
    pytest benches/ --benchmark-compare --benchmark-compare-fail=median:5%

Timing is device time, not the host time of an asynchronous launch: each round runs
the kernel and synchronizes, with L2 flushed in the (untimed) setup, so a round spans
launch to completion.  The do_bench median (CUDA events, no launch overhead) is recorded
beside it in extra_info as ms_device.  Every case is checked against the float64
reference before it is timed; a wrong kernel fails its test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benches.shapes import preset_shapes
from benches.timing import TimingConfig, time_gpu
from kernels import DTYPES, REGISTRY, current_target
from kernels.spec import Target
from roofline import metrics
from roofline.schema import format_shape

TARGET: Target = current_target()
ON_GPU = TARGET.kind == "cuda"
ROUNDS = 50 if ON_GPU else 10


def _cases():
    for spec in REGISTRY.values():
        for dtype in spec.dtypes:
            for shape in preset_shapes(spec, "quick", ON_GPU):
                for provider in spec.providers:
                    yield pytest.param(spec.name, provider, dtype, shape,
                                       id=f"{spec.name}-{provider}-{dtype}-{format_shape(shape)}")


@pytest.fixture(scope="session")
def ceilings():
    """The run_bench ceilings cache (results/.ceilings): measured once per device."""
    from roofline.ceilings import get_ceilings
    from roofline.devices import DEVICES, detect

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

    rc = spec.roof_class(dtype)
    flops, nbytes = spec.flops(shape, dtype), spec.nbytes(shape, dtype)
    median_ms = benchmark.stats.stats.median * 1e3
    m = metrics.derive(flops, nbytes, median_ms, ceilings.peak_tflops(rc),
                       ceilings.peak_gbps(), ceilings.meas_tflops(rc), ceilings.meas_gbps())
    benchmark.extra_info.update(
        kernel=name, provider=provider, dtype=dtype, shape=format_shape(shape),
        flops=flops, bytes=nbytes, rel_err=rel_err, roof_class=rc,
        **{k: m[k] for k in ("intensity", "tflops", "gbps", "mfu", "pct_roof",
                             "peak_tflops", "peak_gbps", "roof_tflops")},
    )
    if ON_GPU:
        dev = time_gpu(lambda: fn(inputs, out), TimingConfig())
        benchmark.extra_info["ms_device"] = dev.ms_median
