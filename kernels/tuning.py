"""The autotuner of a declared launch, keyed so that no tuning is ever handed to a launch
or a GPU it was not measured for.

Triton's autotuner keys a tuning by the values of its `key` arguments and the dtypes of
the tensor arguments; its on-disk cache (knobs.autotuning.cache, kept between runs by
keep_tuning below) adds Triton's version, the backend's hash, the
kernel's source and the candidates.  Two things are missing there, and both are added
here:

- The launch's constexprs.  Launches of one kernel whose constexprs change the math
  share every tensor dtype: the row ops' OP (softmax, layernorm and rmsnorm are one
  kernel), matmul's PRECISION (fp32 IEEE and tf32 both take float32 tensors), its fp8
  accumulation mode.  Without them in the key, the first op's choice is read by the
  others, in memory and on disk.
- The device.  On triton 3.6 the backend's hash is `ptxas version - arch`: an H100 SXM,
  PCIe and NVL, an H200 and a GH200 all key as `90`, so a kept cache directory (a CI
  runner's) would give one GPU model's tunings to another.  The on-disk key gets the
  device's identity (name, SM count, memory, L2, clocks where torch reports them, or
  what the sweep sets from NVML): a tuning from another model is tuned afresh, never
  read.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton

from kernels.spec import Arg, TritonLaunch

_IDENTITY: dict[int, str] = {}  # CUDA device index -> identity set by the caller


def keep_tuning() -> bool:
    """Switch Triton's autotuner to keep its tunings on disk, unless the user's
    TRITON_CACHE_AUTOTUNING says otherwise; whether it keeps them."""
    from triton import knobs

    if "TRITON_CACHE_AUTOTUNING" not in os.environ:
        knobs.autotuning.cache = True
    return bool(knobs.autotuning.cache)


def set_device_identity(text: str, device: int | None = None) -> None:
    """Name the GPU at `device` (default: the current one) for on-disk tuning keys (the
    sweep calls this once with what it read of the device: identity_text).  Without it,
    the identity comes from torch's device properties."""
    _IDENTITY[torch.cuda.current_device() if device is None else device] = text


def identity_text(name: str, sms: int | None, memory_gb: float | None,
                  l2_mb: float | None, max_sm_clock_mhz: float | None) -> str:
    """A GPU's identity from what the sweep read of it (torch's properties, NVML's
    maximum SM clock): what tells models apart that share an architecture."""
    parts = [name, f"{sms} SMs", f"{memory_gb:.1f} GB" if memory_gb else "memory ?",
             f"L2 {l2_mb:g} MiB" if l2_mb else "L2 ?",
             f"max SM clock {max_sm_clock_mhz:.0f} MHz" if max_sm_clock_mhz else "clock ?"]
    return ", ".join(parts)


def device_identity(device: torch.device | None) -> str:
    """The identity of a CUDA device that keys its tunings on disk (None: the current
    one)."""
    if device is None:
        device = torch.device("cuda")
    if not torch.cuda.is_available():
        # Launches on tensors that only look like CUDA ones (the launch rehearsal's, a
        # test's fakes): what names the device is what was set for it, else its index.
        index = device.index or 0
        return _IDENTITY.get(index, f"cuda:{index} (no CUDA here: not a real GPU)")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _IDENTITY:
        return _IDENTITY[index]
    p = torch.cuda.get_device_properties(index)
    parts = [p.name, f"{p.multi_processor_count} SMs", f"{p.total_memory >> 20} MiB",
             f"L2 {getattr(p, 'L2_cache_size', 0)} B"]
    # Newer torch reports clocks in its properties; where it does, they key too.
    for attr in ("clock_rate", "memory_clock_rate"):
        if getattr(p, attr, None):
            parts.append(f"{attr} {getattr(p, attr)} kHz")
    return ", ".join(parts)


def plain(value: Any) -> Any:
    """A key value as the on-disk record can hold it (JSON): numbers, strings and bools
    as they are, anything else (a Triton dtype) as its text."""
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def tuning_key(launch: TritonLaunch) -> list[str]:
    """The autotuner's key: the launch's declared tune_key, then every constexpr it
    passes (their values change what is computed, so they change what is fastest)."""
    return [*launch.tune_key, *(k for k in launch.constexprs if k not in launch.tune_key)]


def tuning_values(launch: TritonLaunch) -> dict[str, Arg]:
    """The values the autotuner keys `launch` by, in tuning_key's order: the tune_key
    arguments' values and the constexprs (Triton adds the tensors' dtypes)."""
    # args are the leading parameters; the constexprs follow by name.
    values = {**dict(zip(launch.fn.arg_names, launch.args, strict=False)),
              **launch.constexprs}
    return {k: values.get(k) for k in tuning_key(launch)}


def make_tuner(launch: TritonLaunch, identity: str) -> Any:
    """Triton's autotuner over `launch`'s configs, keyed by tuning_key, whose on-disk
    records also carry `identity` (the GPU it tunes on).  Each consultation of the
    on-disk cache sets the tuner's `disk_hit` (whether the tuning was read, not run):
    a row's config_source says `cached` for it."""
    tuner = triton.autotune(configs=list(launch.configs), key=tuning_key(launch))(launch.fn)
    on_disk = tuner.check_disk_cache

    def check_disk_cache(key: tuple, configs: list, bench_fn: Any) -> bool:
        # The on-disk key is the in-memory one plus the device; Triton stores a record it
        # reads back under the key it was given, so move it to the key run() looks up.
        keyed = (*(plain(v) for v in key), identity)
        hit = on_disk(keyed, configs, bench_fn)
        tuner.disk_hit = hit
        if keyed in tuner.cache:
            tuner.cache[key] = tuner.cache.pop(keyed)
        return hit

    tuner.check_disk_cache = check_disk_cache
    return tuner
