"""What every kernel family declares: dtypes, providers, FLOP/byte accounting, inputs,
a float64 reference and the correctness tolerance.

A family module builds one `KernelSpec` (or a few, e.g. gelu and gelu_erf) and the
registry in kernels/__init__.py lists them.  The harness derives everything else.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

# A kernel's input or launch argument: a tensor, or a scalar (an fp8 scale, a flag such as
# causal, a dimension, the dtype's name; None where a format has no such scale).
Arg = torch.Tensor | int | float | str | None
Inputs = dict[str, Arg]  # a case's inputs by name
# A compile-time argument: a flag, a block size, a rounding width or a mode's name.
Constexpr = int | str
Shape = dict[str, int]  # e.g. {"M": 4096, "N": 4096, "K": 4096}
T = TypeVar("T")


@dataclass(frozen=True)
class DType:
    """A benchmark dtype: how its tensors are stored and how close it must get to float64.

    `tol` bounds the relative error ||out - ref|| / ||ref|| against a float64 reference
    computed from the *same* (already rounded) inputs, so it covers only the kernel's own
    rounding: accumulation order and the final cast.  Values are a few times the unit
    roundoff of the output format: a wrong kernel lands near 1, far above any of them.
    """

    name: str
    storage: torch.dtype  # how inputs are held in memory
    tol: float
    is_fp8: bool = False
    # Block-scaled formats (kernels/blockscaled.py): one scale byte (`scale`: e8m0 or
    # e4m3) per `block` consecutive elements along K, elements of `bits` bits (fp4: two
    # per storage byte), and for NVFP4 a second-level fp32 scale per tensor.  block = 0:
    # a plain dtype (fp8 keeps one fp32 scale per tensor).
    block: int = 0
    bits: int = 0  # element bits when they differ from the storage's (fp4: 4)
    scale: torch.dtype | None = None
    tensor_scale: bool = False

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.storage).element_size()

    @property
    def element_bits(self) -> int:
        return self.bits or 8 * self.itemsize

    @property
    def bytes_per_element(self) -> float:
        """Stored bytes per element with the block scales amortized (NVFP4: 4 bits + 8
        bits per 16 = 4.5 bits); per-tensor scales (4 bytes per tensor) left out."""
        return self.element_bits / 8 + (1 / self.block if self.block else 0)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in [
        # fp32 sums of up to ~1e8 terms in a different order than float64: ~1e-6 normwise.
        DType("fp32", torch.float32, 2e-5),
        # tf32 rounds matmul inputs to 10 mantissa bits (u = 2^-11 ~ 4.9e-4).
        DType("tf32", torch.float32, 5e-3),
        DType("fp16", torch.float16, 5e-3),  # u = 2^-11
        DType("bf16", torch.bfloat16, 2e-2),  # u = 2^-8 ~ 3.9e-3
        DType("fp8", torch.float8_e4m3fn, 1e-1, is_fp8=True),  # e4m3: u = 2^-4
        DType("fp8e5", torch.float8_e5m2, 2e-1, is_fp8=True),  # e5m2: u = 2^-3
        # Block-scaled: the reference multiplies the *dequantized* inputs in float64, so
        # quantization error is not judged, only the product's.  An element times its
        # scale is exact in the tensor core and in bf16 (e4m3 x e8m0: 4 significant
        # bits, e2m1 x e4m3: 6; bf16 holds 8), the K products are summed in fp32 (about
        # sqrt(K) 2^-24 < 1e-5 normwise for K <= 16384) and the output is rounded once
        # to bf16, u = 2^-8 ~ 3.9e-3, which bounds the normwise error.  1e-2 ~ 2.5 u,
        # the same for the three formats; a scale off by 2x in one block column costs
        # sqrt(block / K) (4e-2 at K = 16384 for MX) and fails.
        DType("mxfp8", torch.float8_e4m3fn, 1e-2, block=32, scale=torch.float8_e8m0fnu),
        DType("mxfp4", torch.uint8, 1e-2, block=32, bits=4, scale=torch.float8_e8m0fnu),
        DType("nvfp4", torch.uint8, 1e-2, block=16, bits=4, scale=torch.float8_e4m3fn,
              tensor_scale=True),
    ]
}
DTYPE_NAMES: tuple[str, ...] = tuple(DTYPES)
# Dtypes of one value per element (every family has them) and the block-scaled formats
# (matmul only: their scales run along K of a matrix product).
PLAIN_DTYPES: tuple[str, ...] = tuple(d for d in DTYPES if not DTYPES[d].block)
BLOCK_SCALED: tuple[str, ...] = tuple(d for d in DTYPES if DTYPES[d].block)

# Which roof each benchmark dtype is measured against (a fact about the dtype, so it lives
# here; contract.devices re-exports it).  fp16 and bf16 share the 16-bit tensor-core
# roof; both fp8 encodings share the fp8 roof.
ROOF_CLASS: dict[str, str] = {
    "fp32": "fp32",
    "tf32": "tf32",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8",
    "fp8e5": "fp8",
    # Blackwell's tensor cores apply the block scales themselves: MXFP8 runs at the fp8
    # rate, MXFP4 and NVFP4 at the fp4 rate.  Devices without them: KernelSpec.roof_class.
    "mxfp8": "fp8",
    "mxfp4": "fp4",
    "nvfp4": "fp4",
}
# "fp4" is the 4-bit tensor-core roof, with a datasheet peak on Blackwell only (sm_100);
# every other device has none (contract/devices.py).
ROOF_CLASSES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")

# Largest finite value of each fp8 encoding; per-tensor scales map amax onto it.
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


@dataclass(frozen=True)
class Target:
    """Where kernels run: enough to decide whether a (provider, dtype) pair can run."""

    kind: str  # "cuda" or "cpu"
    capability: tuple[int, int] | None = None
    interpret: bool = False  # TRITON_INTERPRET=1: Triton kernels run on the CPU interpreter
    name: str = ""

    @property
    def device(self) -> str:
        return "cuda" if self.kind == "cuda" else "cpu"

    @property
    def triton_runs(self) -> bool:
        return self.kind == "cuda" or self.interpret


def interpreter_enabled() -> bool:
    """Whether this process's Triton kernels run in the CPU interpreter.

    Triton decides it when @triton.jit decorates a kernel (TRITON_INTERPRET is read then),
    so once the kernel modules are imported, how they were decorated is the answer,
    whatever the variable says now (setting it later switches nothing on); before that,
    the variable, which is what the decoration will read."""
    utils = sys.modules.get("kernels.triton_utils")
    if utils is not None:
        return bool(utils.KERNELS_INTERPRETED)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def current_target(kind: str | None = None) -> Target:
    """The target of this process: the first CUDA GPU unless `kind` says cpu."""
    if kind != "cpu" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return Target("cuda", (props.major, props.minor), interpreter_enabled(), props.name)
    return Target("cpu", None, interpreter_enabled(), "cpu")


# ---- fp8 accumulation mode: one setting for the Triton kernel, torch and the ceiling ----
#
# "fast": the tensor core's own accumulator carries the whole K reduction.  On sm_90 fp8
#   wgmma adds its products into that accumulator with fewer than fp32's mantissa bits
#   (~14 measured by DeepSeek-V3), so long K loses precision.  It is Triton's sm_90
#   default (max_num_imprecise_acc = 2^30, NVIDIA backend) and torchao's forward default
#   (Float8 training's use_fast_accum=True for the output GEMM), i.e. what a user of
#   either gets without asking; hence our default.
# "precise": the partial sums are promoted to a full fp32 accumulator with ordinary
#   FADDs every BLOCK_K = 128 elements of K (Triton: max_num_imprecise_acc = BLOCK_K;
#   cuBLAS: use_fast_accum=False; CUTLASS's default promotion interval is also 128).
# Only sm_90 wgmma has the two modes; mma.sync (sm_89) and the interpreter ignore it.
FP8_ACCUM_MODES: tuple[str, ...] = ("fast", "precise")
_fp8_accum = "fast"


def set_fp8_accum(mode: str) -> None:
    """Choose the fp8 accumulation mode of every fp8 matrix product (see above)."""
    global _fp8_accum
    if mode not in FP8_ACCUM_MODES:
        raise ValueError(f"unknown fp8 accumulation mode '{mode}' "
                         f"(choose from {', '.join(FP8_ACCUM_MODES)})")
    _fp8_accum = mode


def fp8_accum() -> str:
    """The fp8 accumulation mode in force: "fast" or "precise"."""
    return _fp8_accum


# Block-scaled formats on tensor cores that apply the scales themselves: Blackwell's
# tcgen05 block-scaled MMA (sm_100 class: B200, GB200, B300).  Anywhere else a provider
# that runs them (Triton's dot_scaled) upcasts to bf16 and multiplies on the bf16 tensor
# cores (Hopper), so that is the roof such rows are held against.
EMULATED_ROOF = "bf16"


def block_scaled_native(target: Target) -> bool:
    """Whether `target` multiplies MXFP8/MXFP4/NVFP4 natively (compute capability 10.x)."""
    return target.kind == "cuda" and (target.capability or (0, 0))[0] == 10


def fp8_ok_on(target: Target) -> bool:
    # fp8 tensor-core and conversion instructions arrived with Ada/Hopper (sm_89+).
    return target.kind != "cuda" or (target.capability or (0, 0)) >= (8, 9)


# ---- shape groups: the sizes a family is swept over ----------------------------------

SIZE_PRESETS: tuple[str, ...] = ("quick", "default", "full")  # --sizes by name


@dataclass(frozen=True)
class ShapeGroup:
    """The shapes of each size preset (SIZE_PRESETS) on a GPU and on a CPU, for the
    families of one set of dimensions.  Families of the same dimensions and the same
    sizes share a group (kernels/shape_groups.py: add, mul, gelu and dot share
    `vector`); a family of dimensions of its own declares its group in its own module.
    A spec names its group explicitly (KernelSpec.shape_group), so a new family never
    inherits another's sizes because its dimensions happen to match."""

    name: str
    gpu: Mapping[str, Sequence[Shape]]  # preset -> shapes, each with every dimension
    cpu: Mapping[str, Sequence[Shape]]
    # Dimensions that are 0/1 switches, not sizes (attention's causal): an explicit shape
    # gives them 0 or 1, and one integer (`--sizes 4096`) cannot size such a group.
    flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for where, table in (("GPU", self.gpu), ("CPU", self.cpu)):
            missing = [p for p in SIZE_PRESETS if not table.get(p)]
            if missing:
                raise ValueError(f"shape group {self.name}: no {where} shapes for "
                                 f"{', '.join(missing)}")

    def shapes(self, preset: str, on_gpu: bool) -> list[Shape]:
        """The preset's shapes, fresh copies (callers may annotate them)."""
        return [dict(s) for s in (self.gpu if on_gpu else self.cpu)[preset]]

    def check_dims(self, dims: Iterable[str], kernel: str) -> None:
        """Raise ValueError unless every shape of the group has exactly `dims`."""
        want = set(dims)
        if not set(self.flags) <= want:
            raise ValueError(f"{kernel}: shape group {self.name}'s flags "
                             f"{', '.join(self.flags)} are not among its dims")
        for table in (self.gpu, self.cpu):
            for preset, shapes in table.items():
                for s in shapes:
                    if set(s) != want or any(s[f] not in (0, 1) for f in self.flags):
                        raise ValueError(f"{kernel}: shape {s} of shape group {self.name} "
                                         f"({preset}) does not fit dims {tuple(dims)}")


class UnsupportedShape(ValueError):
    """A shape a provider's library call rejects; the harness records a skipped row."""


# A provider implementation: (inputs, preallocated output) -> output tensor.  Triton
# wrappers always write into `out` (which tests poison with NaN first); torch ones use
# `out=` where eager PyTorch offers it and may return a fresh tensor where it does not.
ProviderFn = Callable[[Inputs, torch.Tensor], torch.Tensor]
SkipFn = Callable[[str, Target], "str | None"]


@dataclass(frozen=True)
class Provider:
    name: str  # "torch", "triton", "compile", "sdpa-flash", ... (kernels.PROVIDERS)
    fn: ProviderFn
    dtypes: tuple[str, ...]
    # Extra reason a (dtype, target) cannot run, beyond dtype availability.
    skip: SkipFn | None = None
    note: str = ""  # how this provider computes (shown by --list)
    # (the row's call) -> which library kernel it ran, written in the row's reason; found
    # by one more call outside the timing (torch's SDPA picks its backend per call).
    backend: Callable[[Callable[[], object]], str] | None = None
    # A compiling provider's counter of compiles so far (kernels/compiled.py): its first
    # call's time is the row's compile_s, and a change while the row is timed means it
    # recompiled there.
    compiles: Callable[[], int] | None = None
    # (inputs, out) -> the call the timer repeats on those buffers, where it can be bound
    # once (a compiled provider resolves its compiled graph there, not in every call)
    bind: Callable[[Inputs, torch.Tensor], Callable[[], object]] | None = None


@dataclass(frozen=True)
class TritonLaunch:
    """One Triton kernel launch that a GPU run makes, declared once per kernel module.

    The Triton provider launches exactly this (autotuning over `configs`), and
    `python run_bench.py --inspect` binds the same `args` and `constexprs` with Triton's
    own argument binding and compiles every config ahead of time, so the two cannot
    drift apart.  Built from (meta-device) inputs: only shapes, strides and dtypes matter.
    """

    fn: Any  # the @triton.jit function
    args: tuple[Arg, ...]  # runtime arguments in order: tensors, ints and scales
    constexprs: dict[str, Constexpr]  # compile-time arguments that are not tuned
    configs: tuple[Any, ...]  # triton.Config candidates; one entry = a fixed config
    # (the launch's arguments by name, the config's kwargs among them) -> launch grid
    grid: Callable[[dict[str, Arg]], tuple[int, ...]]
    tune_key: tuple[str, ...] = ()  # autotune key (argument names) when configs > 1
    # Autotuner name: a launch's tuner is also keyed by its constexprs and the GPU
    # (kernels/tuning.py), so launches whose constexprs change the math (fp32 IEEE vs
    # tf32, the row ops' OP) never share tuned configs whatever this says.
    tuner: str = ""
    # Tensor operands read by the kernel -> their strides: the names of stride
    # arguments, or the literal 1 for a dimension the kernel walks with contiguous
    # offsets.  Inspect uses it to know where 128-bit loads are possible.
    operands: dict[str, tuple[str | int, ...]] = field(default_factory=dict)
    matrix_unit: bool = False  # a tl.dot that must map onto tensor cores
    # Small config for the CPU interpreter, where autotuning would only cost time.
    interp_config: Any = None

    @property
    def name(self) -> str:
        return self.fn.__name__


# (inputs, preallocated output, SM count of the GPU[, target=Target]) -> the launches, in
# order.  `target` is an optional keyword: the GPU the launches are built for, so that a
# family can give each architecture its own configs (kernels/matmul.py: Hopper's spill on
# sm_100).  A family whose launches do not depend on the architecture may leave it out
# (KernelSpec.launches then calls it without); one that takes it resolves target=None
# with launch_capability, so its provider, which calls it without a target, launches on a
# GPU what --inspect compiled for that GPU's arch.
LaunchFn = Callable[..., "list[TritonLaunch]"]


def launch_capability(target: Target | None, *tensors: Any) -> tuple[int, int] | None:
    """The compute capability launches are built for: `target`'s when given (None for a
    CPU target), else that of the GPU holding the first CUDA tensor among `tensors`, else
    None (meta or CPU tensors: no GPU, the default configs)."""
    if target is not None:
        return target.capability if target.kind == "cuda" else None
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return torch.cuda.get_device_capability(t.device)
    return None


def for_arch(by_major: Mapping[int, T], default: T, capability: tuple[int, int] | None) -> T:
    """The entry of `by_major` for the capability's major version (10: the sm_100 class,
    B200/GB200/B300), else `default` (no GPU, or an arch without its own entry)."""
    if capability is None:
        return default
    return by_major.get(capability[0], default)


def _accepts_target(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: no introspection
        return False
    return any(p.name == "target" or p.kind is inspect.Parameter.VAR_KEYWORD
               for p in params)


@dataclass(frozen=True)
class KernelSpec:
    name: str
    family: str
    dims: tuple[str, ...]  # shape dimension names, in the order shapes are written
    flops: Callable[[Shape, str], int]
    nbytes: Callable[[Shape, str], int]
    flops_formula: str  # the counting convention, printed by --list
    bytes_formula: str
    make_inputs: Callable[[Shape, str, int, str], Inputs]  # (shape, dtype, seed, device)
    alloc_out: Callable[[Inputs, str], torch.Tensor]  # (inputs, dtype) -> empty output
    reference: Callable[[Inputs, str], torch.Tensor]  # float64 result from the same inputs
    providers: dict[str, Provider]
    # Decode an output to float64 in the reference's units (fp8 outputs carry a scale).
    decode: Callable[[torch.Tensor, Inputs, str], torch.Tensor] = (
        lambda out, inputs, dtype: out.double())
    # True: a matrix product on the tensor cores, held against the dtype's tensor-core
    # roof, and plotted against FLOPs (contract.rows.compute_kernels).
    matrix_unit: bool = False
    description: str = ""
    # The Triton launches a GPU run makes (None: no Triton provider).
    triton_launches: LaunchFn | None = None
    # The sizes it is swept over (see ShapeGroup).  Every registered spec has one (the
    # registry checks); None only while a builder's spec is being completed.
    shape_group: ShapeGroup | None = None

    def __post_init__(self) -> None:
        if self.shape_group is not None:
            self.shape_group.check_dims(self.dims, self.name)

    def launches(self, inputs: Inputs, out: torch.Tensor, sms: int,
                 target: Target | None = None) -> list[TritonLaunch]:
        """The Triton launches of a run on `target` (see LaunchFn): `target` is passed to
        a triton_launches that takes it, so that --inspect --arch sm_100 and a run on a
        B200 build the same launches; [] without a Triton provider."""
        fn = self.triton_launches
        if fn is None:
            return []
        if target is not None and _accepts_target(fn):
            return fn(inputs, out, sms, target=target)
        return fn(inputs, out, sms)

    @property
    def dtypes(self) -> tuple[str, ...]:
        seen = {d for p in self.providers.values() for d in p.dtypes}
        return tuple(d for d in DTYPE_NAMES if d in seen)

    def roof_class(self, dtype: str, target: Target | None = None) -> str:
        """Which ceiling a row is held against.  Only matrix products run on tensor
        cores; elementwise ops, dot and matvec compute in fp32 on the vector units
        whatever their storage dtype.  A block-scaled product on a `target` whose tensor
        cores cannot apply block scales runs emulated on the bf16 ones (Triton's
        dot_scaled upcasts there), so it is held against the bf16 roof, never against a
        4- or 8-bit peak that device lacks or that the row does not use."""
        if not self.matrix_unit:
            return "fp32"
        if target is not None and DTYPES[dtype].block and not block_scaled_native(target):
            return EMULATED_ROOF
        return ROOF_CLASS[dtype]

    def roof_note(self, dtype: str, target: Target) -> str:
        """The flag of a row held against the emulation roof instead of its dtype's ("" if
        it is not)."""
        if self.roof_class(dtype, target) == self.roof_class(dtype):
            return ""
        where = (f"sm_{''.join(map(str, target.capability or ()))}"
                 if target.kind == "cuda" else "the CPU")
        return (f"emulated: held against the {EMULATED_ROOF} roof (no block-scaled tensor "
                f"cores on {where}; {dtype} is native on sm_100)")

    def skip_reason(self, provider: str, dtype: str, target: Target) -> str | None:
        """Why (provider, dtype) cannot run on `target`, or None when it can."""
        prov = self.providers.get(provider)
        if prov is None:
            return f"{self.name} has no {provider} provider"
        if dtype not in prov.dtypes:
            return f"{provider} {self.name} has no {dtype} variant"
        if DTYPES[dtype].is_fp8 and not fp8_ok_on(target):
            sm = "".join(map(str, target.capability or ()))
            return f"fp8 needs sm_89 or newer (device is sm_{sm})"
        if provider == "triton" and not target.triton_runs:
            return ("Triton needs a CUDA GPU (TRITON_INTERPRET=1 runs it on the CPU, "
                    "for --check-only)")
        if prov.skip is not None:
            return prov.skip(dtype, target)
        return None

    def check(self, out: torch.Tensor, inputs: Inputs, dtype: str,
              ref: torch.Tensor | None = None) -> float:
        """Relative error ||out - ref|| / ||ref|| in float64 (inf if anything is not finite).
        `ref` is self.reference(inputs, dtype), computed here when not given."""
        if ref is None:
            ref = self.reference(inputs, dtype)
        got = self.decode(out, inputs, dtype).reshape(ref.shape).to(ref.device)
        if not torch.isfinite(got).all():
            return float("inf")
        denom = torch.linalg.vector_norm(ref).item()
        return torch.linalg.vector_norm(got - ref).item() / (denom or 1.0)


# ---- input construction shared by the families ------------------------------------

def generator(seed: int, device: str) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def randn(shape: tuple[int, ...], seed: int, device: str, scale: float = 1.0) -> torch.Tensor:
    """Standard normal fp32 values times `scale`: never zeros, unlike torch.empty.
    On the "meta" device (shapes and strides only, used to bind kernel launches without
    a GPU) there are no values to draw."""
    if device == "meta":
        return torch.empty(shape, device="meta")
    return torch.randn(shape, generator=generator(seed, device), device=device) * scale


def quantize(x: torch.Tensor, dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Store fp32 values `x` in `dtype`.  For fp8, with a per-tensor scale chosen so that
    amax maps to the format's largest value: x ~= stored * scale.  Returns (stored,
    scale) with scale a 0-d fp32 tensor (1.0 for non-fp8 dtypes)."""
    d = DTYPES[dtype]
    one = torch.ones((), dtype=torch.float32, device=x.device)
    if not d.is_fp8:
        return x.to(d.storage), one
    amax = x.abs().amax().clamp_min(1e-12)
    scale = (amax / FP8_MAX[d.storage]).to(torch.float32)
    return (x / scale).to(d.storage), scale


def dequantize(t: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    return t.double() * (scale.double() if isinstance(scale, torch.Tensor) else scale)


def out_scale_for(amax_bound: torch.Tensor, dtype: str) -> torch.Tensor:
    """Per-tensor scale of an fp8 output whose values are bounded by `amax_bound`."""
    return (amax_bound.clamp_min(1e-12) / FP8_MAX[DTYPES[dtype].storage]).to(torch.float32)
