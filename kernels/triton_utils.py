"""Small Triton helpers shared by the kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.spec import TritonLaunch, interpreter_enabled
from kernels.tuning import device_identity, make_tuner, tuning_values

# Explicit mantissa bits of the formats whose fp32 -> narrow cast the Triton interpreter
# gets wrong (seen with triton 3.9: bf16 truncates; fp8 loses the exponent carry when
# rounding up across a power of two, e.g. -124.98 -> -64 in e4m3).  0 = cast is fine.
_INTERP_ROUND_BITS = {torch.bfloat16: 7, torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}


def store_round_bits(out: torch.Tensor) -> int:
    """MBITS for `round_for_store`: nonzero only under the interpreter, for the formats
    it casts wrongly, so compiled GPU kernels never carry the extra instructions."""
    return _INTERP_ROUND_BITS.get(out.dtype, 0) if interpreter_enabled() else 0


@triton.jit
def round_for_store(x, MBITS: tl.constexpr):
    """Round fp32 `x` to nearest-even at MBITS mantissa bits (the hardware cast's
    rounding), so that the following narrowing cast is exact.  Integer add on the bit
    pattern: a carry out of the mantissa correctly bumps the exponent."""
    if MBITS > 0:
        SHIFT: tl.constexpr = 23 - MBITS
        bits = x.to(tl.uint32, bitcast=True)
        lsb = (bits >> SHIFT) & 1
        bits = ((bits + ((1 << (SHIFT - 1)) - 1) + lsb) >> SHIFT) << SHIFT
        x = bits.to(tl.float32, bitcast=True)
    return x


@triton.jit
def grouped_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   GROUP_M: tl.constexpr):
    """(row-block, column-block) of tile number `tile` of an M x N output in grouped
    order: consecutive tiles walk GROUP_M row-blocks down a column of tiles before moving
    right, so the A and B tiles they share are still in L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    group_rows = min(num_m - first_m, GROUP_M)
    return first_m + ((tile % per_group) % group_rows), (tile % per_group) // group_rows


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile of an M x N output, in grouped order (grouped_coords).
    Returns (offs_m, offs_n, am, bn): the tile's rows and columns, and the same wrapped
    modulo M and N (with contiguity hints) for the loads: rows/cols past the edge re-read
    valid ones, so loads stay unmasked along M and N and in bounds, and store_tile's mask
    drops the duplicates."""
    pid_m, pid_n = grouped_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M)
    bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N)
    return offs_m, offs_n, am, bn


@triton.jit
def store_tile(C, acc, offs_m, offs_n, M, N, stride_cm, stride_cn, MBITS: tl.constexpr):
    """Write the fp32 tile `acc` to C (rows offs_m, columns offs_n) in C's dtype, masked
    to the M x N output; MBITS: store_round_bits."""
    c_ptrs = C + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, round_for_store(acc, MBITS).to(C.dtype.element_ty), mask=mask)


# How this process's kernels were decorated: jit returns an InterpretedFunction when
# TRITON_INTERPRET=1 was set at import (kernels.spec.interpreter_enabled reads this).
KERNELS_INTERPRETED: bool = type(round_for_store).__name__ == "InterpretedFunction"


def _index_scalars_like_newer_interpreters() -> None:
    """Triton 3.6's interpreter turns a scalar tensor into a Python int with
    int(array), and holds scalars as 1-element 1-D arrays, which NumPy 2 refuses ("only
    0-dimensional arrays can be converted to Python scalars"): every loop over a runtime
    bound (dot, matvec, matmul) fails there.  Later Triton (3.9) flattens first; the GPU
    machines run 3.6 with NumPy 2.5, so their interpreter tests get the same fix here.
    Only the interpreter is touched, and only where it lacks the fix."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "flattens_index", False):
        return
    import inspect

    if "squeeze" in inspect.getsource(original):  # a Triton that has the fix
        return

    def patched(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__",
                       lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.flattens_index = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patched


def _decode_e4m3_block_scales() -> None:
    """Triton 3.9's interpreter decodes every tl.dot_scaled block scale as e8m0 (the
    byte shifted into an fp32 exponent), so NVFP4's e4m3 scales come out wrong (0x38,
    e4m3's 1.0, reads as 2^-71).  Scales typed float8e4nv are decoded as e4m3 instead;
    others still take the interpreter's own path.  Applied only where a known e4m3 byte
    comes out wrong, so a Triton that has the fix (or no dot_scaled at all) is left
    alone."""
    try:
        import numpy as np
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    original = getattr(interpreter, "_dot_scaled_scale_to_f32", None)
    if original is None or getattr(original, "decodes_e4m3", False):
        return
    one = interpreter.TensorHandle(np.array([0x38], dtype=np.uint8), tl.float8e4nv)
    try:
        if float(original(one, tl.bfloat16).reshape(-1)[0]) == 1.0:
            return
    except Exception:  # e.g. an assertion on the scale's dtype: not e4m3-aware either
        pass
    table = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(
        torch.float8_e4m3fn).float().numpy()

    def patched(scale_handle: Any, compute_type: Any) -> Any:
        if scale_handle.dtype == tl.float8e4nv:
            return table[scale_handle.data.view(np.uint8)]
        return original(scale_handle, compute_type)

    patched.decodes_e4m3 = True  # type: ignore[attr-defined]
    interpreter._dot_scaled_scale_to_f32 = patched


if KERNELS_INTERPRETED:
    _index_scalars_like_newer_interpreters()
    _decode_e4m3_block_scales()


# ---- approximate math: one hardware instruction on the GPU, a formula in the interpreter ---
#
# The single place that decides it: compiled kernels use the special-function unit's
# approximations (PTX inline assembly), which the CPU interpreter cannot run; there the same
# functions come from exact formulas, so a kernel's math is tested on the CPU up to the
# hardware's documented error.  Kernels use these only where their output's rounding
# dwarfs that error (each caller says where).
HW_APPROX = tl.constexpr(not KERNELS_INTERPRETED)


@triton.jit
def tanh_approx(x):
    """tanh of fp32 `x`: tanh.approx.f32 (one MUFU.TANH; PTX ISA: max relative error
    2^-10.987) in compiled kernels, 1 - 2 / (exp(2x) + 1) in the interpreter."""
    if HW_APPROX:
        t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x],
                                      dtype=tl.float32, is_pure=True, pack=1)
    else:
        t = 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)
    return t


# One autotuner per (kernel, tuner name, candidate configs, device), created on first use
# (kernels/tuning.py: what its key holds): its cache of tuned configs lives as long as the
# process.  The candidates are part of the key because they differ per arch
# (kernels/matmul.py ARCH_CONFIGS): a tuner built for one GPU's list must never serve
# another's.
_TUNERS: dict[tuple[str, str, tuple[str, ...], str], object] = {}


def config_str(cfg: Any) -> str:
    """A config as one line: its tuned constexprs, then warps and stages
    ("BLOCK_M=128,BLOCK_N=256,BLOCK_K=64,GROUP_M=8,num_warps=8,num_stages=3")."""
    parts = [f"{k}={v}" for k, v in cfg.kwargs.items()]
    parts += [f"num_warps={cfg.num_warps}", f"num_stages={cfg.num_stages}"]
    # Written only when set, so that two configs never share a text (none here sets them).
    if getattr(cfg, "num_ctas", 1) != 1:
        parts.append(f"num_ctas={cfg.num_ctas}")
    if getattr(cfg, "maxnreg", None) is not None:
        parts.append(f"maxnreg={cfg.maxnreg}")
    return ",".join(parts)


def _on_gpu(launch: TritonLaunch) -> bool:
    return _gpu_device(launch) is not None


def _gpu_device(launch: TritonLaunch) -> torch.device | None:
    """The CUDA device of the launch's first CUDA tensor (None: not a GPU launch)."""
    for a in launch.args:
        if isinstance(a, torch.Tensor) and a.device.type == "cuda":
            return a.device
    return None


def _scratch(size: int, alignment: int, stream: Any) -> torch.Tensor:
    """Global scratch for a launch, from torch's caching allocator (no cudaMalloc per
    launch; under CUDA-graph capture, from the graph's pool).  Its blocks are 512-byte
    aligned, past any `alignment` Triton asks for."""
    del alignment, stream
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _use_scratch_allocator() -> None:
    """Kernels that build TMA descriptors on the device (tl.make_tensor_descriptor:
    kernels/matmul.py's persistent configs) get their 128 bytes per descriptor from the
    allocator Triton is given; set per context (it is a ContextVar) before GPU launches."""
    triton.set_allocator(_scratch)


def _launch_with(launch: TritonLaunch, cfg: Any, on_gpu: bool) -> None:
    kwargs = cfg.all_kwargs() if on_gpu else dict(cfg.kwargs)
    launch.fn[launch.grid(dict(cfg.kwargs))](*launch.args, **launch.constexprs, **kwargs)


def find_config(launch: TritonLaunch, text: str) -> Any:
    """The config of `launch` written as `text` (config_str); ValueError if none is."""
    for cfg in (*launch.configs, launch.interp_config):
        if cfg is not None and config_str(cfg) == text:
            return cfg
    raise ValueError(f"{launch.name} has no config {text}")


def run_launch(launch: TritonLaunch, config: Any = None) -> Any:
    """Launch a declared kernel launch and return the config it ran: `config` when given
    (no tuning: re-timing runs the row's own config), else autotuned over its configs
    on a GPU, or its small interpreter config (or first config) on the CPU interpreter."""
    return run_launch_with(launch, config).config


# Where a launch's config came from (the row's `config_source`): a shipped config
# (kernels/shipped.py), tuned on this call, read from Triton's on-disk tuning cache, the
# launch's one candidate, or given by the caller (re-timing runs the row's own).
CONFIG_SOURCES: tuple[str, ...] = ("shipped", "tuned", "cached", "fixed", "given")


@dataclass(frozen=True)
class Launched:
    """What one launch ran: its config, where the config came from (CONFIG_SOURCES),
    and under --retune how the shipped config timed against the tuned one."""

    config: Any
    source: str
    note: str = ""


# The source and per-config timings of each tuned bucket, by (tuner key, bucket, tensor
# dtypes): a later row of the same bucket (another cache mode) gets the tuner's in-memory
# result and says where it first came from.
_RESOLVED: dict[tuple[Any, ...], tuple[str, dict[Any, Any] | None]] = {}


def run_launch_with(launch: TritonLaunch, config: Any = None, shipped: Any = None,
                    retune: bool = False) -> Launched:
    """run_launch, saying where the config came from.  `shipped`: the shipped config of
    this launch (kernels/shipped.py), run without building a tuner; with `retune`, the
    launch is tuned anyway and the note compares the shipped config's tuning time with
    the winner's."""
    on_gpu = _on_gpu(launch)
    if on_gpu:
        _use_scratch_allocator()
    if config is not None:
        _launch_with(launch, config, on_gpu)
        return Launched(config, "given")
    if not on_gpu or len(launch.configs) == 1:
        cfg = (launch.interp_config or launch.configs[0]) if not on_gpu else launch.configs[0]
        _launch_with(launch, cfg, on_gpu)
        return Launched(cfg, "fixed")
    if shipped is not None and not retune:
        _launch_with(launch, shipped, on_gpu)
        return Launched(shipped, "shipped")
    identity = device_identity(_gpu_device(launch))
    key = (launch.name, launch.tuner, tuple(config_str(c) for c in launch.configs), identity)
    tuner = _TUNERS.get(key)
    if tuner is None:
        tuner = make_tuner(launch, identity)
        _TUNERS[key] = tuner
    bucket = (*key, bucket_values(launch))
    resolved = _RESOLVED.get(bucket)
    tuner.configs_timings = None
    tuner.disk_hit = None  # set by make_tuner's check_disk_cache when it is consulted
    tuner[launch.grid](*launch.args, **launch.constexprs)
    # Set by the autotuner on every call: the config tuned for this key.
    best = getattr(tuner, "best_config", None)
    if resolved is None:
        resolved = ("cached" if tuner.disk_hit else "tuned", tuner.configs_timings)
        _RESOLVED[bucket] = resolved
    source, timings = resolved
    note = retune_note(launch, shipped, best, timings) if shipped is not None else ""
    return Launched(best, source, note)


def bucket_values(launch: TritonLaunch) -> tuple[str, ...]:
    """What the autotuner keys a call by: the tuning key's values (kernels/tuning.py)
    and the tensor arguments' dtypes, as text."""
    return (*(str(v) for v in tuning_values(launch).values()),
            *(str(a.dtype) for a in launch.args if isinstance(a, torch.Tensor)))


def _ms(timing: Any) -> float:
    # do_bench with quantiles returns [median, p20, p80]; a plain float otherwise.
    return float(timing[0] if isinstance(timing, (list, tuple)) else timing)


def retune_note(launch: TritonLaunch, shipped: Any, best: Any,
                timings: dict[Any, Any] | None) -> str:
    """How the shipped config timed against the tuned winner in the autotuner's own
    timings (configs_timings), as one clause of the row's reason."""
    text = config_str(shipped)
    if best is not None and config_str(best) == text:
        return f"retune {launch.name}: the shipped config is the tuned one"
    by_text = {config_str(c): _ms(t) for c, t in (timings or {}).items()}
    if text not in by_text or best is None or config_str(best) not in by_text:
        return f"retune {launch.name}: shipped [{text}] not timed by the tuner"
    s, b = by_text[text], by_text[config_str(best)]
    return (f"retune {launch.name}: shipped [{text}] {s:.4g} ms vs tuned "
            f"[{config_str(best)}] {b:.4g} ms ({(s / b - 1) * 100:+.1f}%)")


def sources_text(launched: list[Launched]) -> str:
    """The `config_source` column: one source when every launch agrees, else each
    launch's in the order of the `config` column, "; " between."""
    sources = [x.source for x in launched]
    return sources[0] if len(set(sources)) == 1 else "; ".join(sources)


def configs_text(launches: list[TritonLaunch], configs: list[Any]) -> str:
    """The `config` column: "name[config]" per launch, "; " between launches."""
    return "; ".join(f"{ln.name}[{config_str(c)}]" for ln, c in zip(launches, configs,
                                                                     strict=True) if c)


def parse_configs(launches: list[TritonLaunch], text: str) -> list[Any]:
    """configs_text read back against the launches it was written for."""
    parts = [p.strip() for p in text.split("; ") if p.strip()]
    if len(parts) != len(launches):
        raise ValueError(f"config '{text}' names {len(parts)} launches, not {len(launches)}")
    out = []
    for launch, part in zip(launches, parts, strict=True):
        name, _, rest = part.partition("[")
        if name != launch.name or not rest.endswith("]"):
            raise ValueError(f"config '{part}' is not one of {launch.name}")
        out.append(find_config(launch, rest[:-1]))
    return out


def prepared_call(launches: list[TritonLaunch], configs: list[Any]) -> Callable[[], None]:
    """The launches bound once to their chosen configs, grids and arguments, so that a
    timed call costs Triton's own launch and nothing of ours: no launch objects, grid
    lambdas, autotuner key or cache lookup per call (on a GPU, do_bench's start event
    runs right after its L2 flush, so Python time before the launch can show up as
    device time)."""
    bound = []
    for launch, cfg in zip(launches, configs, strict=True):
        on_gpu = _on_gpu(launch)
        if on_gpu:
            _use_scratch_allocator()
        kwargs = {**launch.constexprs, **(cfg.all_kwargs() if on_gpu else dict(cfg.kwargs))}
        bound.append((launch.fn[launch.grid(dict(cfg.kwargs))], launch.args, kwargs))

    def call() -> None:
        for kernel, args, kwargs in bound:
            kernel(*args, **kwargs)
    return call


def tile_config(bm: int, bn: int, bk: int, stages: int, warps: int, group: int = 8
                ) -> triton.Config:
    """An autotune candidate of the tiled matmul kernels: a BLOCK_M x BLOCK_N output tile
    stepping BLOCK_K along K, programs grouped GROUP_M tile-rows at a time for L2 reuse."""
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group},
                         num_stages=stages, num_warps=warps)

