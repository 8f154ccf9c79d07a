"""Tensors that take a launch down the GPU path without a GPU.

`kernels.triton_utils.run_launch` launches compiled kernels (autotuning, allocator, the
configs' warps and stages) when an argument is a torch.Tensor on a CUDA device, and the
CPU interpreter otherwise.  A CPU build of torch cannot make CUDA tensors, so a launch's
meta tensors (shapes, strides and dtypes, no memory: how compile-ahead and --inspect
build launches) are viewed as `DeviceTensor`: the same tensor, whose `device` says
cuda:<index> and whose `data_ptr()` is an address on a made-up device.

Fidelity: everything Triton reads from a tensor argument is the real one (dtype, shape,
strides, and the alignment of data_ptr: its storage offset times the element size on a
512-byte aligned base, as torch's caching allocator gives), so the binder specializes
exactly as for the GPU's tensors.  What is lost: there are no values (nothing runs, so
nothing reads them), and torch operations on a DeviceTensor are plain meta operations.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

from kernels.spec import TritonLaunch

# Where the made-up device's allocations start, and how far apart (2 GiB: no two of a
# launch's tensors overlap, each base 512-byte aligned like the caching allocator's).
_BASE = 0x7F00_0000_0000
_STRIDE = 2**31


class DeviceTensor(torch.Tensor):
    """A meta tensor that says it lives on a CUDA device (see the module's docstring)."""

    # No subclass propagation: any torch operation on it is the meta tensor's.
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.__dict__["_standin_device"]

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    def data_ptr(self) -> int:  # type: ignore[override]
        return self.__dict__["_standin_base"] + self.storage_offset() * self.element_size()


def on_device(t: torch.Tensor, device: torch.device, base: int) -> DeviceTensor:
    """`t` (a meta tensor) as a DeviceTensor on `device`, its storage at `base`."""
    if t.device.type != "meta":
        raise ValueError(f"a DeviceTensor is made from a meta tensor, not {t.device}")
    d = t.as_subclass(DeviceTensor)
    d.__dict__["_standin_device"] = device
    d.__dict__["_standin_base"] = base
    return d


class DeviceMemory:
    """The made-up device's address space: one base per storage, so that views of one
    tensor (a transposed operand, x passed as y) share it, as they share memory."""

    def __init__(self, index: int) -> None:
        self.device = torch.device("cuda", index)
        self._bases: dict[int, int] = {}
        self._next = itertools.count()

    def wrap(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or isinstance(value, DeviceTensor):
            return value
        key = value.untyped_storage()._cdata
        if key not in self._bases:
            self._bases[key] = _BASE + next(self._next) * _STRIDE
        return on_device(value, self.device, self._bases[key])

    def launch(self, launch: TritonLaunch) -> TritonLaunch:
        """`launch` with its tensor arguments on this device."""
        return dataclasses.replace(launch, args=tuple(self.wrap(a) for a in launch.args))
