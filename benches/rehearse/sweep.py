"""The sweep's GPU-side objects for a stand-in GPU: what a GPU run detects and configures
on it (`present_of`, `run_config`, `tuning_identity`), and the compile function of
compile-ahead workers that compile under the stand-in (`compile_case_on_standin`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from benches.rehearse.driver import ARCH_DEFAULT_MODEL, GPU_MODELS, GpuModel, StandInDriver
from benches.sweep.cases import SweepContext
from contract.devices import Present


def present_of(model: GpuModel) -> Present:
    """The Present a GPU run would detect on this device (contract.devices.detect
    from torch's device properties)."""
    from contract.devices import match_sku

    return Present(key=match_sku(model.name, model.sms), name=model.name, kind="cuda",
                   capability=model.capability, sms=model.sms,
                   l2_mb=model.l2_bytes / 2**20, memory_gb=model.total_memory / 1e9)


def run_config(model: GpuModel, kernels: list[str], dtypes: list[str], sizes: str = "quick",
               cache: list[str] | None = None) -> SweepContext:
    """A GPU sweep's context on `model` (compiled Triton, the datasheet's ceilings), as
    benches/sweep/job.py builds it on that GPU."""
    from contract.ceilings import Ceilings, datasheet_of
    from contract.devices import DEVICES
    from contract.request import RunRequest, Selection
    from contract.schema import DEFAULT_CACHE
    from kernels.spec import Target

    present = present_of(model)
    device = DEVICES[present.key]
    request = RunRequest(Selection(kernels=tuple(kernels), dtypes=tuple(dtypes),
                                   providers=("torch", "triton"), sizes=sizes,
                                   cache=tuple(cache or [DEFAULT_CACHE])))
    return SweepContext(request, device, present,
                        Target("cuda", model.capability, False, model.name),
                        ceilings=Ceilings(datasheet_of(device), None))


# The stand-in a compile-ahead worker compiles under (GPU_MODELS key); unset, the one
# of the job's architecture (ARCH_DEFAULT_MODEL).
DEVICE_ENV = "GPUBENCH_REHEARSE_DEVICE"


def compile_case_on_standin(kernel: str, dtype: str, shape: dict[str, int], sms: int,
                            capability: tuple[int, int] | None, fp8_mode: str,
                            device: Sequence[Any] | None = None) -> int:
    """triton_cache.compile_case in a compile-ahead worker without a GPU: the worker's
    Triton driver is a stand-in from its first job on (for the worker's life), then the
    sweep's own compile_case runs.  Pass it as CompileAhead's compile function (a module
    function: spawned workers import it by name)."""
    from triton.runtime import driver

    from benches.sweep.triton_cache import compile_case

    if not isinstance(getattr(driver, "_active", None), StandInDriver):
        key = os.environ.get(DEVICE_ENV) or \
            ARCH_DEFAULT_MODEL[f"sm_{capability[0]}{capability[1]}" if capability else "sm_90"]
        driver.set_active(StandInDriver(GPU_MODELS[key]))
    return compile_case(kernel, dtype, shape, sms, capability, fp8_mode, device=device)


def tuning_identity(model: GpuModel) -> str | None:
    """What the sweep names this GPU for its on-disk tunings (benches/sweep/job.py:
    identity_text of the Present it detects and NVML's maximum SM clock); None in a
    tree from before tunings were keyed by the GPU (kernels.tuning absent)."""
    try:
        from kernels.tuning import identity_text
    except ImportError:
        return None
    p = present_of(model)
    return identity_text(p.name, p.sms, p.memory_gb, p.l2_mb, model.sm_clock_khz / 1000)
