"""Measure a real training step (forward + backward + AdamW step) of the model a plan
describes: time, counted FLOPs, memory by category and the time split by kind of work.

    python -m roofline plan --preset gpt2-small --measure step --device cpu --seq-len 128

What is measured, and with what (each a library made for it):
- time: CUDA events around each step on a GPU, the wall clock on a CPU (the step ends in
  a synchronous optimizer step there); warm-up steps first (lazy init, optimizer state);
  median and 20th/80th percentiles of the timed steps;
- FLOPs: torch.utils.flop_counter.FlopCounterMode over one step, forward, backward and
  the optimizer apart, with the model's causal attention counted as what a causal kernel
  computes, half the T x T square (benches/step/flops.py; the counter alone counts the
  whole square).  An op it does not count on this device (the CPU's fused SDPA kernel
  counts 0) is counted with the counter's own formula for that op (sdpa_flop_count /
  sdpa_backward_flop_count, the backward recomputing the scores as FlashAttention does),
  halved the same way, and the result says so.  When SDPA
  runs on its math backend (no fused kernel accepts the inputs, e.g. a head dim that is
  no multiple of 8 in bf16 on a GPU), the counter sees its batched matmuls instead:
  the full square, which that backend multiplies before masking, filed as attention,
  and no formula is added on top;
- memory: parameters, gradients and optimizer state from the tensors themselves (exact);
  the distinct storages autograd saves during the forward
  (torch.autograd.graph.saved_tensors_hooks), parameters excluded, split into
  activations (what the forward computes) and weight casts (autocast's 16-bit copies of
  the weights, which the matmuls' backward keeps); on a GPU also
  torch.cuda.max_memory_allocated over a step;
- time by kind of work: torch.profiler over one step, each kernel (on a GPU) or each
  op's self CPU time (on a CPU) counted once and put in one category (GEMMs, attention,
  norms and elementwise, loss, optimizer, other) by the op that launched it
  (benches/step/profile.py); the same events split by kernel family and pass for
  `--explain`, and each GEMM's time per call by shape and pass, for the plan's table of
  the step's GEMMs (benches/step/kernel_split.py).

Before anything is built, the step's memory estimate (roofline.plan.step:
training state, activations by Korthikanti et al.'s estimate, logits, weight casts) is
held against the device's memory and what it has free now; a step that does not fit is
refused with the largest slice, micro-batch and sequence length that would, and an
allocation failure while measuring is one error line too.

A model too big for the device is measured on a slice (`measure_layers` = k blocks with
the embedding and head) and on the embedding and head alone; each figure F of the whole
model is then F(0) + L x (F(k) - F(0)) / k, a line through the two measurements (blocks
are identical, so each adds the same), and the result says it was extrapolated.
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch

from benches.step.flops import attention_formula, flop_counter
from benches.step.kernel_split import profile_step_explained
from benches.step.profile import CATEGORIES, category
from benches.step.transformer import StepError, Transformer, check_shape, parameter_count
from benches.timing.clock import time_call_ms
from contract.models import ModelShape
from roofline.plan.step import ADVICE_HEADROOM, step_memory_estimate, what_fits

__all__ = ["CATEGORIES", "AUTOCAST", "category", "free_memory_bytes", "measure_model",
           "measure_step"]

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepTimes:
    """The timed steps' median, 20th and 80th percentile (ms), how many and each."""

    median: float
    p20: float
    p80: float
    n: int
    samples: list[float]


def _percentiles(samples: list[float]) -> StepTimes:
    s = sorted(samples)

    def q(p: float) -> float:
        i = p * (len(s) - 1)
        lo, hi = int(i), min(int(i) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (i - lo)
    return StepTimes(statistics.median(s), q(0.2), q(0.8), len(s), samples)


@dataclass(frozen=True)
class ModelMeasured:
    """Every measurement of one model (measure_model): its blocks and parameters, the
    step's times, FLOPs by category (forward, backward, the optimizer), bytes by
    category, the profiled step's split (by kind of work, by kernel family and pass, its
    span, its GEMMs by shape), how attention was counted, and notes."""

    n_blocks: int
    params: int
    time_ms: StepTimes
    flops_forward: dict[str, int]
    flops_backward: dict[str, int]
    flops_optimizer: dict[str, int]
    memory: dict[str, int | None]
    profile_ms: dict[str, float]
    profile_explain_ms: dict[str, dict[str, float]]
    profile_span_ms: float
    gemm_calls: dict[str, dict[str, float]]
    attention_counting: str | None
    notes: list[str]

    # The step's part of measure_step's document (read by roofline/plan/step.py).
    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) if f.name != "time_ms"
                else asdict(self.time_ms) for f in fields(self)}


def _flops_by_category(counter: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        cat = category(str(op))
        out[cat] = out.get(cat, 0) + int(n)
    return out


def _is_weight_cast(t: torch.Tensor, params: set[int]) -> bool:
    """Whether `t` is (a view of) a dtype copy of a parameter: the 16-bit weights autocast
    makes for a matmul and caches for the step, which the matmul's backward then saves.
    Such a copy is a ToCopyBackward node straight over the parameter's AccumulateGrad;
    an activation cast (a norm's fp32 output going into a bf16 matmul) sits over the op
    that computed it instead."""
    base = t._base if t._base is not None else t
    fn = base.grad_fn
    if fn is None or not type(fn).__name__.startswith("ToCopyBackward"):
        return False
    nexts = [f for f, _ in fn.next_functions if f is not None]
    return len(nexts) == 1 and id(getattr(nexts[0], "variable", None)) in params


def _saved_bytes(run_forward: Callable[[], torch.Tensor], params: list[torch.Tensor],
                 blocks: list[torch.nn.Module]) -> tuple[torch.Tensor, dict[str, int]]:
    """Run a forward; (loss, bytes of the distinct storages autograd saved for the
    backward): `activations`, what the forward computed, `activations_in_blocks`, those
    of them saved while inside a block, and `weight_casts`, autocast's copies of the
    parameters.  The parameters themselves are left out (counted as parameters)."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in params}
    param_ids = {id(p) for p in params}
    seen: dict[int, tuple[int, str]] = {}
    inside = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in param_ptrs and ptr not in seen:
                kind = ("weight_casts" if _is_weight_cast(t, param_ids)
                        else "activations_in_blocks" if inside[0] > 0 else "activations")
                seen[ptr] = (st.nbytes(), kind)
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            pass
        return t

    def enter(*_: Any) -> None:
        inside[0] += 1

    def leave(*_: Any) -> None:
        inside[0] -= 1

    hooks = [h for b in blocks for h in (b.register_forward_pre_hook(enter),
                                         b.register_forward_hook(leave))]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = run_forward()
    finally:
        for h in hooks:
            h.remove()
    total = {k: sum(n for n, kind in seen.values() if kind == k)
             for k in ("activations", "activations_in_blocks", "weight_casts")}
    total["activations"] += total["activations_in_blocks"]
    return loss, total


class _Step:
    """One training step of a model built on `device`: the forward (under autocast for a
    16-bit dtype), the whole step (zeroed gradients, forward, backward, AdamW) and the
    device's synchronize."""

    def __init__(self, shape: ModelShape, n_blocks: int, micro_batch: int, device: str,
                 dtype: str) -> None:
        self.on_gpu, self.device = device == "cuda", device
        torch.manual_seed(0)
        # Built on the device: built on the host, every weight is drawn there one value
        # at a time (the CPU's random fill is serial) and then copied over, which was most
        # of the GPU job's plan-step (docs/gpu-job.md); on the GPU the draws take
        # milliseconds.
        with torch.device(device):
            self.model = Transformer(shape, n_blocks)
        fused = {"fused": True} if self.on_gpu else {"foreach": True}
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, **fused)
        self.idx = torch.randint(shape.vocab, (micro_batch, shape.seq_len), device=device)
        self.tgt = torch.randint(shape.vocab, (micro_batch, shape.seq_len), device=device)
        self.amp = AUTOCAST.get(dtype)

    def forward(self) -> torch.Tensor:
        with (torch.autocast(device_type=self.device, dtype=self.amp) if self.amp is not None
              else contextlib.nullcontext()):
            return self.model(self.idx, self.tgt)

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.forward().backward()
        self.opt.step()

    def sync(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize()


@dataclass(frozen=True)
class _Flops:
    """One step's FLOPs by category, forward, backward and the optimizer apart; how its
    attention was counted (causal, the full square, None for no block) and why."""

    forward: dict[str, int]
    backward: dict[str, int]
    optimizer: dict[str, int]
    attention_counting: str | None
    notes: list[str]


def _counted(run: _Step, shape: ModelShape, n_blocks: int, micro_batch: int, dtype: str
             ) -> tuple[_Flops, dict[str, int], int | None]:
    """One step under the FLOP counter, forward, backward and the optimizer apart, the
    forward's saved tensors measured: (its FLOPs, the saved bytes, the peak allocated on
    a GPU)."""
    run.opt.zero_grad(set_to_none=True)
    if run.on_gpu:
        torch.cuda.reset_peak_memory_stats()
    with flop_counter() as fwd_count:
        loss, saved = _saved_bytes(run.forward, list(run.model.parameters()),
                                   list(run.model.blocks))
    with flop_counter() as bwd_count:
        loss.backward()
    with flop_counter() as opt_count:
        run.opt.step()
    run.sync()
    peak = torch.cuda.max_memory_allocated() if run.on_gpu else None
    fwd, bwd = _flops_by_category(fwd_count), _flops_by_category(bwd_count)
    notes = []
    math_backend = any("bmm" in str(op) for op in
                       fwd_count.get_flop_counts().get("Global", {}))
    counting = None if not n_blocks else "full square" if math_backend else "causal"
    if n_blocks and not fwd.get("attention"):
        af, ab = attention_formula(shape, n_blocks, micro_batch)
        fwd["attention"], bwd["attention"] = af, ab
        notes.append(f"FlopCounterMode counts no FLOPs for scaled_dot_product_attention on "
                     f"this device ({run.device}): counted by its formula instead "
                     "(torch.utils.flop_counter.sdpa_flop_count and "
                     "sdpa_backward_flop_count, backward with recompute), halved for "
                     "the causal mask")
    elif math_backend:
        # SDPA's math backend is a composite of bmm, softmax...: the flop counter sees its
        # batched matmuls, which category() files under attention (no formula on top).
        notes.append("scaled_dot_product_attention ran on its math backend (no fused "
                     f"kernel was chosen for head dim {shape.head_dim}, {dtype}, "
                     f"{run.device}): its FLOPs are the batched matmuls FlopCounterMode "
                     "counted, filed as attention; its backward keeps the scores, so it is "
                     "2x the forward, not 2.5x")
    return _Flops(fwd, bwd, _flops_by_category(opt_count), counting, notes), saved, peak


def _memory(run: _Step, saved: dict[str, int], peak: int | None) -> dict[str, int | None]:
    """Bytes by category: the tensors' own (parameters, gradients, AdamW's m and v, its
    step counters), the forward's saved storages, the peak allocated (GPU)."""
    params, state = list(run.model.parameters()), run.opt.state.values()
    return {
        "parameters": sum(p.numel() * p.element_size() for p in params),
        "gradients": sum(p.grad.numel() * p.grad.element_size()
                         for p in params if p.grad is not None),
        # AdamW's m and v; its per-tensor step counters apart (a scalar each).
        "optimizer_state": sum(v.numel() * v.element_size() for s in state
                               for k, v in s.items() if torch.is_tensor(v) and k != "step"),
        "optimizer_step_counters": sum(v.numel() * v.element_size() for s in state
                                       for k, v in s.items()
                                       if torch.is_tensor(v) and k == "step"),
        **saved,
        "peak_allocated": peak,
    }


def measure_model(shape: ModelShape, n_blocks: int, micro_batch: int, device: str,
                  dtype: str, steps: int = 5, warmup: int = 2) -> ModelMeasured:
    """Every measurement of one model (n_blocks of the shape's blocks)."""
    run = _Step(shape, n_blocks, micro_batch, device, dtype)
    for _ in range(warmup):
        run.step()
    run.sync()
    # Time: whole steps, nothing else in the loop (events recorded on the stream).
    samples = [time_call_ms(run.step, run.on_gpu) for _ in range(steps)]
    flops, saved, peak = _counted(run, shape, n_blocks, micro_batch, dtype)
    memory = _memory(run, saved, peak)
    # The same profiled step split two ways: by kind of work, and by kernel family and
    # pass for --explain (benches/step/kernel_split.py).
    prof = profile_step_explained(lambda: run.forward().backward(), run.opt.step,
                                  lambda: run.opt.zero_grad(set_to_none=True), run.on_gpu)
    return ModelMeasured(n_blocks, parameter_count(run.model), _percentiles(samples),
                         flops.forward, flops.backward, flops.optimizer, memory,
                         prof.categories, prof.explain, prof.span_ms, prof.gemm_calls,
                         flops.attention_counting, flops.notes)


def _line(base: Any, part: Any, blocks: int, k: int) -> Any:
    """base + blocks x (part - base) / k, through dicts of numbers, a block adding no
    less than nothing: every figure is a time, a FLOP count or bytes, and a slice that
    measured less than the embedding and head alone (a category of a tiny model on a
    busy host: the loss's, the head's) is noise, which the line would multiply by
    blocks / k into a negative time."""
    if isinstance(base, dict):
        keys = set(base) | set(part)
        return {key: _line(base.get(key, 0), part.get(key, 0), blocks, k) for key in keys
                if key != "samples"}
    if base is None or part is None:
        return None
    return base + blocks * max(0, part - base) / k


MEMINFO = "/proc/meminfo"


def free_memory_bytes(device: str) -> tuple[float | None, str]:
    """(bytes the device can give a step now, where the number comes from): free GPU
    memory on a GPU; on a CPU the host's available memory (the kernel's MemAvailable:
    free plus what it can reclaim), None when it cannot be read."""
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        return float(free), "free on the GPU (torch.cuda.mem_get_info)"
    try:
        with open(MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024, f"available ({MEMINFO} MemAvailable)"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return (float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")),
                "free host memory (sysconf)")
    except (ValueError, OSError, AttributeError):
        return None, "unknown"


def _does_not_fit(shape: ModelShape, k: int, micro_batch: int, dtype: str,
                  need: dict[str, float], limit: float, where: str) -> str:
    """The one-line refusal: what the step needs, what the device has, what would fit."""
    items = ", ".join(f"{name} {v / 1e9:.3g}" for name, v in need.items() if v)
    fits = what_fits(shape, k, micro_batch, dtype, ADVICE_HEADROOM * limit)
    ways = []
    if fits["measure_layers"]:
        ways.append(f"--measure-layers {fits['measure_layers']}")
    at_one = "" if k == 1 else " with --measure-layers 1"
    if fits["micro_batch"]:
        ways.append(f"--micro-batch {fits['micro_batch']}{at_one}")
    if fits["seq_len"]:
        ways.append(f"--seq-len {fits['seq_len']}{at_one}")
    if ways:
        advice = (f"what fits in {ADVICE_HEADROOM:.0%} of it (the rest for temporaries): "
                  + ", or ".join(ways))
    else:
        advice = ("even one block at micro-batch 1 does not fit (the training state of "
                  "16 B per parameter and the logits alone): pass a smaller model")
    return (f"a step of {k} of {shape.n_layers} block(s) at micro-batch {micro_batch} x "
            f"{shape.seq_len} tokens ({dtype}) needs at least {sum(need.values()) / 1e9:.3g}"
            f" GB ({items} GB; activations by the 34 h bytes per token and layer "
            f"estimate), the device has {limit / 1e9:.3g} GB {where}: {advice}")


def _is_out_of_memory(e: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(e, (oom, MemoryError)):
        return True
    text = str(e)
    # The CPU allocator's RuntimeError: "DefaultCPUAllocator: not enough memory: you
    # tried to allocate ..." (or "can't allocate memory").
    return isinstance(e, RuntimeError) and ("DefaultCPUAllocator" in text
                                            or "out of memory" in text.lower())


def _address_space_cap(available: float | None) -> tuple[int, int, int] | None:
    """(cap, soft, hard): the address space this process maps now plus the memory
    available, and its RLIMIT_AS as it is; None where there is nothing to lower (no
    reading, not Linux, or a lower limit already set)."""
    if available is None:
        return None
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError, IndexError, AttributeError):
        return None
    cap = int(mapped + available)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    if soft != resource.RLIM_INFINITY and soft <= cap:
        return None
    return cap, soft, hard


@contextlib.contextmanager
def _address_space_limit(available: float | None) -> Iterator[None]:
    """On a CPU, cap the process's address space at what it maps now plus the memory
    available while the step runs: an allocation past it fails in the allocator (one
    error line) instead of the kernel's OOM killer ending the process unannounced."""
    limits = _address_space_cap(available)
    if limits is None:
        yield
        return
    import resource

    cap, soft, hard = limits
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _measure(shape: ModelShape, n_blocks: int, micro_batch: int, device: str, dtype: str,
             steps: int, warmup: int, available: float | None) -> ModelMeasured:
    """measure_model, an allocation failure turned into a StepError (one line)."""
    try:
        with (_address_space_limit(available) if device == "cpu"
              else contextlib.nullcontext()):
            return measure_model(shape, n_blocks, micro_batch, device, dtype, steps, warmup)
    except (RuntimeError, MemoryError) as e:
        if not _is_out_of_memory(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        smaller = "--micro-batch or --seq-len" + (" or --measure-layers" if n_blocks > 1
                                                   else "")
        raise StepError(f"the step of {n_blocks} block(s) at micro-batch {micro_batch} x "
                        f"{shape.seq_len} tokens ran out of memory on {device} ({first}); "
                        "the memory check's estimate is a lower bound (allocator and "
                        f"backward temporaries come on top): try a smaller {smaller}"
                        ) from None


def measure_step(shape: ModelShape, micro_batch: int, device: str, dtype: str,
                 measure_layers: int | None = None, device_bytes: float | None = None,
                 steps: int = 5, log: Callable[[str], None] = lambda m: None,
                 warmup: int = 2) -> dict[str, Any]:  # the planner's (harness.py MeasureStep)
    """The step's measurements for the whole model (measured, or extrapolated from a
    slice of `measure_layers` blocks), as a JSON-able dict.  Refused (StepError) before
    anything is built when the step's memory estimate exceeds the device's memory
    (`device_bytes`, the plan's per device) or what it has free now."""
    check_shape(shape, micro_batch, measure_layers)
    if measure_layers == 0:
        raise StepError("--measure-layers must be at least 1")
    L = shape.n_layers
    k = L if measure_layers is None else measure_layers
    need = step_memory_estimate(shape, k, micro_batch, dtype)
    free, where = free_memory_bytes(device)
    limit = free
    if device_bytes and (free is None or device_bytes < free):
        limit, where = device_bytes, "(the plan's memory per device)"
    if limit and sum(need.values()) > limit:
        raise StepError(_does_not_fit(shape, k, micro_batch, dtype, need, limit, where))
    log(f"measuring a training step of {k} of {L} blocks on {device} ({dtype}, "
        f"micro-batch {micro_batch} x {shape.seq_len} tokens)")
    part = _measure(shape, k, micro_batch, device, dtype, steps, warmup, free)
    result = {"device": device, "dtype": dtype, "micro_batch": micro_batch,
              "tokens": micro_batch * shape.seq_len, "layers": L,
              "measured_layers": k, "steps": steps, "warmup": warmup}
    if k == L:
        return {**result, **part.to_json(), "slice": None}
    log("measuring the embedding and head alone, to extrapolate the slice to all blocks")
    base = _measure(shape, 0, micro_batch, device, dtype, steps, warmup, free)
    if part.time_ms.median - base.time_ms.median <= 0:
        # The blocks' time is lost in the noise (a tiny model on a busy host): an
        # extrapolation from it would be meaningless, a negative step time at worst.
        raise StepError(
            f"the slice of {k} blocks took {part.time_ms.median:.3g} ms a step, no "
            f"more than the embedding and head alone ({base.time_ms.median:.3g} ms): "
            "the blocks' time cannot be told from the noise; measure more blocks "
            "(--measure-layers) or the whole model")
    return {**result, **_extrapolated(part, base, L, k, shape.params),
            "slice": {"blocks": k, "measured": part.to_json(), "base": base.to_json()}}


def _extrapolated(part: ModelMeasured, base: ModelMeasured, L: int, k: int, params: int
                  ) -> dict[str, Any]:  # measure_step's document's figures
    """The whole model's figures from a slice of k of L blocks and the embedding and
    head alone (base): every figure on the line through the two."""
    part_json, base_json = part.to_json(), base.to_json()
    whole = {key: _line(base_json[key], part_json[key], L, k) for key in
             ("time_ms", "flops_forward", "flops_backward", "flops_optimizer", "memory",
              "profile_ms", "profile_explain_ms", "profile_span_ms")}
    whole["params"] = params
    whole["n_blocks"] = L
    whole["attention_counting"] = part.attention_counting
    # Per call, a GEMM's time needs no extrapolating: the slice runs every kind of them.
    whole["gemm_calls"] = part.gemm_calls
    whole["notes"] = part.notes + [
        f"measured on a slice of {k} of {L} blocks and on the embedding and head alone; "
        f"every figure F extrapolated as F(0) + {L} x (F({k}) - F(0)) / {k} (identical "
        "blocks each add the same time, FLOPs and memory); the time's spread is the "
        "slice's"]
    whole["time_ms"]["n"] = part.time_ms.n
    return whole
