"""The `library` column of a GPU row: one more call of the row, untimed, under the
profiler, its CUDA kernels' names mapped to their library (contract/libraries.py).  A
Triton row's library is known without it; a CPU row has none."""

from __future__ import annotations

from collections.abc import Callable

import torch

from contract.libraries import library_of


def kernel_names(call: Callable[[], object]) -> list[str]:
    """The names of the CUDA kernels one `call` launches, in launch order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]


def row_library(provider: str, on_gpu: bool, call: Callable[[], object]) -> str | None:
    """The library a row's call runs: None on a CPU, triton for this project's Triton
    rows, else from the kernels one profiled call launches (None where the profiler
    cannot run or names nothing known: the column is a label, never worth a failed row)."""
    if not on_gpu:
        return None
    if provider == "triton":
        return "triton"
    try:
        return library_of(kernel_names(call))
    except Exception:  # noqa: BLE001  (a profiler already running, CUPTI missing)
        return None
