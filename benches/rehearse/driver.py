"""A stand-in Triton driver for CUDA that launches nothing.

Activated with `triton.runtime.driver.set_active(...)` (`standin_driver` below), it
answers every question Triton's JIT, its compiled kernels and its autotuner ask a CUDA
driver, with the figures of an H100, H200 or B200, so that a launch goes the whole way a
GPU launch goes (binder and specialization, the post-compile hook, the compile for the
device's target, the autotuner and its on-disk cache, the kernel's load checks, the
launcher) up to the launch itself, which is recorded and not made.

What Triton asks, and where (3.6.0 and 3.9.0 read; the differences are marked):
- `JITFunction.create_binder`/`run`: get_current_target, get_current_device,
  get_current_stream; the compiler front end asks get_current_target too
  (language/target_info.py, semantic.py).
- `CompiledKernel._init_handles`: launcher_cls(src, metadata), utils.get_device_properties
  (max_shared_mem), utils.load_binary -> (module, function, n_regs, n_spills,
  n_max_threads); 3.6 reads get_current_target().warp_size there, 3.9 the metadata's.
- `CompiledKernel.__del__` (3.9 only): utils.unload_module(module), through whatever
  driver is active then; `standin_driver` hands back no loaded kernel (see `release`).
- the launch: launcher(gridX, gridY, gridZ, stream, function, packed_metadata,
  launch_metadata, enter_hook, exit_hook, *args), the same call in both versions (3.6's
  CudaLauncher passes all but the grid, stream and function to its C launcher, 3.9's
  splits them itself).  3.6's CudaLauncher builds a C launcher per kernel signature with
  the host compiler; the stand-in's builds the same one (benches/rehearse/launcher.py).
- `Autotuner`: get_benchmarker, get_current_target (its on-disk key);
  triton.testing.do_bench: get_device_interface, get_empty_cache_for_benchmark,
  clear_cache (the sweep's own flush buffer comes from the same call).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from triton.backends.driver import DriverBase

from benches.rehearse.cubin import CubinUsage, cubin_usage
from benches.rehearse.launcher import build_launcher, per_kernel_launchers

# ---- the devices ---------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    """What a CUDA driver reports about one GPU (cuDeviceGetAttribute, and torch's
    device properties for the name, memory and L2)."""

    key: str  # contract.devices key
    name: str  # torch.cuda.get_device_name
    capability: tuple[int, int]
    sms: int
    total_memory: int  # bytes, as torch's total_memory
    l2_bytes: int  # torch's L2_cache_size
    max_shared_mem: int  # per block, opt-in
    sm_clock_khz: int
    mem_clock_khz: int
    mem_bus_width: int  # bits
    max_num_regs: int = 65536  # per block
    warp_size: int = 32

    @property
    def arch(self) -> int:
        return self.capability[0] * 10 + self.capability[1]


# H200: the committed H200 run's torch properties (143,155 MiB, 60 MB of L2, 132 SMs);
# H100 SXM 80GB: 81,089 MiB and 50 MB as torch reports them; B200: NVIDIA's figures
# (148 SMs, 126 MB of L2) and nvidia-smi's 183,359 MiB.  Shared memory: 227 KB opt-in on
# both architectures (docs/inspect.md).  Clocks and bus widths: datasheets (only
# triton.testing's peak estimates read them).
GPU_MODELS: dict[str, GpuModel] = {m.key: m for m in [
    GpuModel("h100", "NVIDIA H100 80GB HBM3", (9, 0), 132, 81089 * 2**20, 50 * 2**20,
             232448, 1980000, 2619000, 5120),
    GpuModel("h200", "NVIDIA H200", (9, 0), 132, 143155 * 2**20, 60 * 2**20,
             232448, 1980000, 3201000, 6144),
    GpuModel("b200", "NVIDIA B200", (10, 0), 148, 183359 * 2**20, 126 * 2**20,
             232448, 1965000, 3996000, 8192),
]}

# The device each architecture is rehearsed on unless another is named.
ARCH_DEFAULT_MODEL = {"sm_90": "h100", "sm_100": "b200"}

# CUDA's launch limits (cuLaunchKernelEx fails with CUDA_ERROR_INVALID_VALUE past them).
MAX_GRID_X = 2**31 - 1
MAX_GRID_YZ = 65535
MAX_BLOCK_THREADS = 1024
# The device index the stand-in answers with: one no real GPU has (a node has 8 or 16),
# so that nothing a JITFunction compiled under it (its per-device caches) is found by a
# real launch later; torch holds a device index in 8 bits.
STANDIN_DEVICE = 64
# What do_bench zeroes to flush the L2: 256 MB in Triton 3.x's CUDA driver.
FLUSH_BYTES = 256 * 1024 * 1024


# ---- what a launch records -----------------------------------------------------------


@dataclass(frozen=True)
class LaunchRecord:
    """One launch the stand-in received instead of making it."""

    kernel: str
    grid: tuple[int, int, int]
    num_warps: int
    num_stages: int
    num_ctas: int
    shared: int  # bytes of shared memory the kernel asked for
    scratch_bytes: int  # global scratch the launch would have allocated
    device: int
    registers: int  # per thread, from the cubin
    constants: str  # the compile-time arguments it was specialized on

    def config_text(self) -> str:
        return (f"{self.kernel}[{self.constants}] warps={self.num_warps} "
                f"stages={self.num_stages} ctas={self.num_ctas} shared={self.shared}")


def stand_in_ms(launches: list[LaunchRecord]) -> float:
    """A deterministic time for a benchmarked call, in ms: from a hash of what its
    launches were (kernel, grid, warps, stages, constants), between 1 and 2 ms, the same
    in every process, so that the autotuner's choice is reproducible (and meaningless as
    a speed: nothing ran)."""
    text = "|".join(f"{r.config_text()} grid={r.grid}" for r in launches)
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")
    return 1.0 + (h % 1000) / 1000


def max_threads(usage: CubinUsage, model: GpuModel) -> int:
    """CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: the kernel's own bound, and what its
    registers allow (allocated per warp in units of 256)."""
    limit = MAX_BLOCK_THREADS
    if usage.threads:
        limit = min(limit, usage.threads)
    if usage.registers:
        per_warp = -(-usage.registers * model.warp_size // 256) * 256
        limit = min(limit, model.max_num_regs // per_warp * model.warp_size)
    return limit


# ---- the driver ----------------------------------------------------------------------


class StandInUtils:
    """driver.utils: what CudaUtils's C module gives, from the model."""

    def __init__(self, owner: StandInDriver) -> None:
        self._owner = owner
        self._handles = itertools.count(1)

    def get_device_properties(self, device: int) -> dict[str, int]:
        m = self._owner.model
        return {"max_shared_mem": m.max_shared_mem, "max_num_regs": m.max_num_regs,
                "multiprocessor_count": m.sms, "warpSize": m.warp_size,
                "sm_clock_rate": m.sm_clock_khz, "mem_clock_rate": m.mem_clock_khz,
                "mem_bus_width": m.mem_bus_width}

    def load_binary(self, name: str, kernel: bytes, shared: int, device: int
                    ) -> tuple[int, int, int, int, int]:
        """(module, function, registers, spilled registers, max threads per block): the
        handles are tokens; the rest is read from the cubin."""
        usage = cubin_usage(bytes(kernel), name)
        module = next(self._handles)
        self._owner.loaded.add(module)
        self._owner.usage[name] = usage
        return (module, module, usage.registers, usage.frame_bytes // 4,
                max_threads(usage, self._owner.model))

    def unload_module(self, module: int) -> None:  # 3.9's CompiledKernel.__del__
        self._owner.loaded.discard(module)

    # 3.9's CudaUtils also serves a torch-free process (CudaDriver without torch).
    def get_current_device(self) -> int:
        return self._owner.get_current_device()

    def set_current_device(self, device: int) -> None:
        self._owner.set_current_device(device)

    def get_default_stream(self, device: int) -> int:
        return 0

    def is_stream_capturing(self, stream: int) -> bool:
        return False

    def set_printf_fifo_size(self, size: int) -> None:
        pass

    def cuOccupancyMaxActiveClusters(self, *args: Any) -> int:  # noqa: N802 (Triton's name)
        return 1

    def __getattr__(self, name: str) -> Any:
        # Host-side TMA descriptors (fill_tma_descriptor*) and the C launcher need a
        # GPU: a kernel that asks for them says so instead of getting a stand-in.  An
        # AttributeError, so that hasattr() still answers.
        raise AttributeError(f"the stand-in driver has no utils.{name} (it needs a GPU)")


class StandInLauncher:
    """launcher_cls: built once per loaded kernel (src, metadata), called per launch;
    checks what the CUDA launcher and cuLaunchKernelEx check, records, launches nothing."""

    def __init__(self, owner: StandInDriver, src: Any, metadata: Any) -> None:
        self.owner = owner
        fn = getattr(src, "fn", None)
        if fn is not None:
            owner.kernels.add(fn)
        self.name = metadata.name
        self.signature = dict(getattr(src, "signature", {}) or {})
        consts = getattr(src, "constants", {}) or {}
        self.constants = ",".join(f"{k}={_const_text(v)}" for k, v in consts.items())
        self.meta = metadata
        # Triton 3.6's own C launcher for this signature, built (or loaded from Triton's
        # cache) as CudaLauncher builds it: the host compiler's cost, paid as on a GPU.
        self.module = build_launcher(src, metadata) if per_kernel_launchers() else None

    def __call__(self, grid_x: int, grid_y: int, grid_z: int, stream: Any, function: Any,
                 packed_metadata: Any, launch_metadata: Any, enter_hook: Callable | None,
                 exit_hook: Callable | None, *args: Any) -> None:
        m = self.meta
        num_warps, num_ctas = m.num_warps, getattr(m, "num_ctas", 1)
        _check_grid(grid_x * num_ctas, grid_y, grid_z, num_warps * self.owner.model.warp_size)
        _check_args(self.signature, args)
        grid_size = grid_x * grid_y * grid_z
        scratch = 0
        size = getattr(m, "global_scratch_size", 0) or 0
        if size > 0 and grid_size > 0:
            scratch = grid_size * num_ctas * size
            _check_allocator(scratch, getattr(m, "global_scratch_align", 1))
        if enter_hook is not None:
            enter_hook(launch_metadata)
        usage = self.owner.usage.get(self.name)
        self.owner.launches.append(LaunchRecord(
            self.name, (grid_x, grid_y, grid_z), num_warps, getattr(m, "num_stages", 0),
            num_ctas, getattr(m, "shared", 0), scratch, self.owner.get_current_device(),
            usage.registers if usage else 0, self.constants))
        if exit_hook is not None:
            exit_hook(launch_metadata)


def _const_text(v: Any) -> str:
    return getattr(v, "__name__", None) or str(getattr(v, "value", v))


def _check_grid(x: int, y: int, z: int, threads: int) -> None:
    why = (f"grid x {x} > {MAX_GRID_X}" if x > MAX_GRID_X else
           f"grid y {y} > {MAX_GRID_YZ}" if y > MAX_GRID_YZ else
           f"grid z {z} > {MAX_GRID_YZ}" if z > MAX_GRID_YZ else
           f"{threads} threads a block > {MAX_BLOCK_THREADS}" if threads > MAX_BLOCK_THREADS
           else "")
    if why:  # the message Triton gives for CUDA_ERROR_INVALID_VALUE, and why
        raise RuntimeError(f"Triton Error [CUDA]: invalid argument ({why})")


_INT_BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64,
             "u1": 1, "u8": 8, "u16": 16, "u32": 32, "u64": 64}


def _check_args(signature: dict[Any, Any], args: tuple[Any, ...]) -> None:
    """What the launcher's argument extraction refuses: a pointer argument that is not
    a device pointer (3.6's words), an integer out of its type's range."""
    for i, (ty, arg) in enumerate(zip(signature.values(), args, strict=False)):
        if not isinstance(ty, str) or ty == "constexpr":
            continue
        if ty.startswith("*"):
            if arg is None:
                continue
            if not hasattr(arg, "data_ptr") or not isinstance(arg.data_ptr(), int):
                raise TypeError("Pointer argument must be either uint64 or have data_ptr "
                                "method")
            device = getattr(arg, "device", None)
            if device is not None and getattr(device, "type", "cuda") != "cuda":
                raise ValueError(f"Pointer argument (at {i}) cannot be accessed from "
                                 "Triton (cpu tensor?)")
        elif ty in _INT_BITS:
            v, bits = int(arg), _INT_BITS[ty]
            lo, hi = (0, 2**bits - 1) if ty[0] == "u" or bits == 1 else \
                (-(2**(bits - 1)), 2**(bits - 1) - 1)
            if not lo <= v <= hi:
                raise OverflowError(f"argument {i} = {v} does not fit {ty}")


def _check_allocator(nbytes: int, align: int) -> None:
    """A kernel that needs global scratch (device-side TMA descriptors) gets it from the
    allocator set with triton.set_allocator at launch: none set is Triton's own error.
    One that is set is not called (it would allocate on the GPU)."""
    from triton.runtime import _allocation  # Triton's, the same in 3.6 and 3.9

    allocator = _allocation._allocator.get()
    if isinstance(allocator, _allocation.NullAllocator):
        allocator(nbytes, align, None)  # raises: "no allocator was set"


@dataclass(frozen=True)
class DeviceProperties:
    """torch.cuda.get_device_properties's fields, for the device interface."""

    name: str
    major: int
    minor: int
    multi_processor_count: int
    total_memory: int
    L2_cache_size: int  # noqa: N815 (torch's name)


class StandInDeviceInterface:
    """get_device_interface(): torch.cuda's informational calls for the model; no
    streams or events (nothing here can be timed)."""

    def __init__(self, owner: StandInDriver) -> None:
        self._owner = owner

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return self._owner.get_current_device()

    def set_device(self, device: int) -> None:
        self._owner.set_current_device(device)

    def synchronize(self, device: Any = None) -> None:
        pass

    def get_device_capability(self, device: Any = None) -> tuple[int, int]:
        return self._owner.model.capability

    def get_device_name(self, device: Any = None) -> str:
        return self._owner.model.name

    def get_device_properties(self, device: Any = None) -> DeviceProperties:
        m = self._owner.model
        return DeviceProperties(m.name, *m.capability, m.sms, m.total_memory, m.l2_bytes)


class StandInDriver(DriverBase):
    """The stand-in: a DriverBase (not GPUDriver, whose constructor binds torch.cuda)."""

    def __init__(self, model: GpuModel, device: int = STANDIN_DEVICE,
                 bench: Callable[[list[LaunchRecord]], float] = stand_in_ms) -> None:
        super().__init__()
        self.model = model
        self.device = device
        self.devices = {device}  # every device index it answered for
        self.bench_ms = bench
        self.utils = StandInUtils(self)
        self.launcher_cls = functools.partial(StandInLauncher, self)
        self.launches: list[LaunchRecord] = []
        self.loaded: set[int] = set()  # module tokens load_binary handed out
        self.kernels: set[Any] = set()  # the JITFunctions whose kernels were loaded
        self.usage: dict[str, CubinUsage] = {}
        self.benchmarked: list[BenchRecord] = []

    @classmethod
    def is_active(cls) -> bool:
        return True  # usable whenever it is set active; never picked by Triton itself

    def map_python_to_cpp_type(self, ty: str) -> str:
        from triton.backends.nvidia.driver import ty_to_cpp

        return ty_to_cpp(ty)

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.model.arch, self.model.warp_size)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cuda", self.device)

    def get_current_device(self) -> int:
        return self.device

    def set_current_device(self, device: int) -> None:
        self.device = device
        self.devices.add(device)

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        return self.model.capability

    def get_device_interface(self) -> StandInDeviceInterface:
        return StandInDeviceInterface(self)

    def get_benchmarker(self) -> Callable[..., Any]:
        return self.benchmark

    def benchmark(self, kernel_call: Callable[[], object], quantiles: Any = None,
                  **kwargs: Any) -> Any:
        """do_bench's contract: the call is made (its launches recorded), its time is
        stand_in_ms of them; an error (e.g. OutOfResources, which the autotuner turns
        into an infinite time) is noted and propagates."""
        start = len(self.launches)
        try:
            kernel_call()
        except Exception as e:
            self.benchmarked.append(BenchRecord([], None, f"{type(e).__name__}: "
                                                f"{_first_line(e)}"))
            raise
        made = self.launches[start:]
        ms = self.bench_ms(made)
        self.benchmarked.append(BenchRecord(made, ms, ""))
        if quantiles is None:
            return ms
        return [ms for _ in quantiles]

    def get_empty_cache_for_benchmark(self) -> torch.Tensor:
        return torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="meta")

    def clear_cache(self, cache: torch.Tensor) -> None:
        cache.zero_()

    def assemble_tensormap_to_arg(self, tensormaps_info: Any, args: Any) -> Any:
        return args

    def allocate_default_profile_scratch(self, size: int, alignment: int, stream: Any
                                         ) -> torch.Tensor:  # 3.9
        return torch.empty(size, dtype=torch.int8, device="meta")

    def release(self) -> None:
        """Drop what was compiled under this driver from the caches of the kernels it
        loaded (the devices it served), their module handles cleared: 3.9's
        CompiledKernel.__del__ unloads a module through whatever driver is active when
        it runs, and a real CUDA driver must never be handed a stand-in's token."""
        for fn in self.kernels:
            caches = getattr(fn, "device_caches", None)
            for device in self.devices:
                entry = caches.pop(device, None) if caches is not None else None
                for kernel in (entry[0].values() if entry else ()):
                    if getattr(kernel, "module", None) in self.loaded:
                        kernel.module = None
        self.loaded.clear()


@dataclass
class BenchRecord:
    """One call the autotuner benchmarked: its launches and stand-in time, or its error."""

    launches: list[LaunchRecord] = field(default_factory=list)
    ms: float | None = None
    error: str = ""


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


@contextlib.contextmanager
def standin_driver(model: GpuModel | str, device: int = STANDIN_DEVICE
                   ) -> Iterator[StandInDriver]:
    """Within the block, Triton's active driver is a StandInDriver for `model`; the one
    set before (none: Triton's default, made when first asked) is set again after."""
    from triton.runtime import driver as config

    if isinstance(model, str):
        model = GPU_MODELS[model]
    # DriverConfig keeps what set_active set in `_active` (3.6 and 3.9 alike); reading
    # `active` instead would create the default driver, which fails without a GPU.
    previous = getattr(config, "_active", None)
    stand_in = StandInDriver(model, device)
    config.set_active(stand_in)
    try:
        yield stand_in
    finally:
        stand_in.release()
        config.set_active(previous)
