"""Compile functions a compile-ahead worker runs in tests (benches/sweep/triton_cache.py's
workers import them by name): standard library only, so a worker starts in a blink."""

from __future__ import annotations

import subprocess


def counted(kernel: str, dtype: str, shape: dict[str, int], sms: int,
            capability: tuple[int, int] | None, fp8_mode: str) -> int:
    """Compiles len(shape) kernels; the kernel "boom" fails."""
    if kernel == "boom":
        raise RuntimeError("ptxas failed")
    return len(shape)


def like_ptxas(kernel: str, dtype: str, shape: dict[str, int], sms: int,
               capability: tuple[int, int] | None, fp8_mode: str) -> int:
    """Runs a child process for shape["s"] seconds, as a compile runs ptxas; its pid is
    written to the file `dtype` as it starts, "done" once it has ended."""
    child = subprocess.Popen(["sleep", str(shape["s"])])
    with open(dtype, "a") as f:
        f.write(f"{child.pid}\n")
    child.wait()
    with open(dtype, "a") as f:
        f.write("done\n")
    return 1


def with_device(kernel: str, dtype: str, shape: dict[str, int], sms: int,
                capability: tuple[int, int] | None, fp8_mode: str,
                device: list[object] | None = None) -> int:
    """Compiles as many kernels as the device's SM count it was given (0: none given)."""
    return int(device[1]) if device else 0  # type: ignore[call-overload]


def retune_seen(kernel: str, dtype: str, shape: dict[str, int], sms: int,
                capability: tuple[int, int] | None, fp8_mode: str,
                device: list[object] | None = None) -> int:
    """Compiles 2 kernels where the worker's environment asks to retune, else 1."""
    import os

    return 2 if os.environ.get("GPUBENCH_RETUNE") == "1" else 1


def two_built_one_loaded(kernel: str, dtype: str, shape: dict[str, int], sms: int,
                         capability: tuple[int, int] | None, fp8_mode: str) -> int:
    """Compiles 3 kernels as Triton reports them to its listener: 2 built, 1 loaded
    from its cache."""
    from triton import knobs

    for hit in (False, True, False):
        knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None,
                                   cache_hit=hit)
    return 3
