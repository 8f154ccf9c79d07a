"""Measure a real training step (forward + backward + AdamW step) of the model a plan
describes: time, counted FLOPs, memory by category and the time split by kind of work.

    python -m roofline plan --preset gpt2-small --measure step --device cpu --seq-len 128

What is measured, and with what (each a library made for it):
- time: CUDA events around each step on a GPU, the wall clock on a CPU (the step ends in
  a synchronous optimizer step there); warm-up steps first (lazy init, optimizer state);
  median and 20th/80th percentiles of the timed steps;
- FLOPs: torch.utils.flop_counter.FlopCounterMode over one step, forward, backward and
  the optimizer apart.  An op it does not count on this device (the CPU's fused SDPA
  kernel counts 0) is counted with the counter's own formula for that op
  (sdpa_flop_count / sdpa_backward_flop_count: the full T x T square, the backward
  recomputing the scores as FlashAttention does), and the result says so;
- memory: parameters, gradients and optimizer state from the tensors themselves (exact);
  activations as the distinct storages autograd saves during the forward
  (torch.autograd.graph.saved_tensors_hooks), parameters excluded; on a GPU also
  torch.cuda.max_memory_allocated over a step;
- time by kind of work: torch.profiler over one step, each op's self time (device time on
  a GPU, CPU time on a CPU) put in one category (GEMMs, attention, norms and elementwise,
  loss, optimizer, other).

A model too big for the device is measured on a slice (`measure_layers` = k blocks with
the embedding and head) and on the embedding and head alone; each figure F of the whole
model is then F(0) + L x (F(k) - F(0)) / k, a line through the two measurements (blocks
are identical, so each adds the same), and the result says it was extrapolated.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benches.step_model import StepError, Transformer, check_shape, parameter_count
from benches.timing import time_call_ms
from roofline.plan import ModelShape

CATEGORIES = ("gemm", "attention", "norms and elementwise", "loss", "optimizer", "other")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def category(op: str) -> str:
    """The kind of work an aten op (or kernel name) is."""
    name = op.lower()
    if any(k in name for k in ("attention", "flash", "sdpa", "fmha", "efficient_attn")):
        return "attention"
    if any(k in name for k in ("adam", "_foreach", "optim", "lerp", "addcdiv", "addcmul")):
        return "optimizer"
    if any(k in name for k in ("cross_entropy", "nll_loss", "softmax", "logsumexp")):
        return "loss"
    if any(k in name for k in ("::mm", "addmm", "bmm", "matmul", "gemm", "cutlass",
                               "scaled_mm", "sm90_xmma", "ampere_", "cublas")) \
            or name in ("mm", "aten.mm", "aten.addmm", "aten.bmm"):
        return "gemm"
    if any(k in name for k in ("norm", "gelu", "silu", "mul", "add", "sub", "div", "tanh",
                               "exp", "pow", "sqrt", "mean", "sum", "copy", "cat", "split", "index",
                               "embedding", "to_copy", "fill", "zero", "elementwise",
                               "vectorized", "reduce", "where", "masked", "neg")):
        return "norms and elementwise"
    return "other"


def _percentiles(samples: list[float]) -> dict[str, Any]:
    s = sorted(samples)

    def q(p: float) -> float:
        i = p * (len(s) - 1)
        lo, hi = int(i), min(int(i) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (i - lo)
    return {"median": statistics.median(s), "p20": q(0.2), "p80": q(0.8), "n": len(s),
            "samples": samples}


def _flops_by_category(counter: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for op, n in counter.get_flop_counts().get("Global", {}).items():
        cat = category(str(op))
        out[cat] = out.get(cat, 0) + int(n)
    return out


def _attention_formula(shape: ModelShape, n_blocks: int, batch: int) -> tuple[int, int]:
    """(forward, backward) FLOPs of the blocks' SDPA by the flop counter's own formulas."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = (batch, shape.heads, shape.seq_len, shape.head_dim)
    fwd = sdpa_flop_count(q, q, q)
    bwd = sdpa_backward_flop_count(q, q, q, q)
    return n_blocks * int(fwd), n_blocks * int(bwd)


def _saved_bytes(run_forward: Callable[[], torch.Tensor], params: set[int],
                 blocks: list[torch.nn.Module]) -> tuple[torch.Tensor, int, int]:
    """Run a forward; (loss, bytes of the distinct storages autograd saved for the
    backward, of which saved while inside a block), parameters left out (they are
    counted as parameters)."""
    seen: dict[int, tuple[int, bool]] = {}
    inside = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in params and ptr not in seen:
                seen[ptr] = (st.nbytes(), inside[0] > 0)
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
    return (loss, sum(n for n, _ in seen.values()),
            sum(n for n, in_block in seen.values() if in_block))


@contextlib.contextmanager
def _native_stderr_to_null() -> Iterator[None]:
    """The profiler's C++ side logs a line to file descriptor 2 at every start and stop
    (libkineto's "profiler_start"/"profiler_stop"), which no setting silences: point the
    descriptor at /dev/null while it runs.  Python exceptions still propagate."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _profile(run: Callable[[], None], on_gpu: bool, only: str | None = None
             ) -> dict[str, float]:
    """ms of self time per category over one call of `run`; all of it in category
    `only` when given."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with _native_stderr_to_null(), profile(activities=acts) as prof:
        run()
        if on_gpu:
            torch.cuda.synchronize()
    out = dict.fromkeys(CATEGORIES, 0.0)
    for ev in prof.key_averages():
        if on_gpu:
            us = getattr(ev, "self_device_time_total", None)
            if us is None:
                us = getattr(ev, "self_cuda_time_total", 0.0)
        else:
            us = ev.self_cpu_time_total
        if us:
            out[only or category(ev.key)] += us / 1e3
    return out


def _profile_step(forward_backward: Callable[[], None], optimizer_step: Callable[[], None],
                  zero_grad: Callable[[], None], on_gpu: bool) -> dict[str, float]:
    """One step profiled in two parts: forward and backward op by op, and the optimizer
    step as a whole (its ops, sqrt, mul, lerp..., are named like any elementwise op)."""
    zero_grad()
    parts = _profile(forward_backward, on_gpu)
    opt = _profile(optimizer_step, on_gpu, only="optimizer")
    return {k: parts[k] + opt[k] for k in CATEGORIES}


def measure_model(shape: ModelShape, n_blocks: int, micro_batch: int, device: str,
                  dtype: str, steps: int = 5, warmup: int = 2) -> dict[str, Any]:
    """Every measurement of one model (n_blocks of the shape's blocks)."""
    on_gpu = device == "cuda"
    torch.manual_seed(0)
    model = Transformer(shape, n_blocks).to(device)
    fused = {"fused": True} if on_gpu else {"foreach": True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    idx = torch.randint(shape.vocab, (micro_batch, shape.seq_len), device=device)
    tgt = torch.randint(shape.vocab, (micro_batch, shape.seq_len), device=device)
    amp = AUTOCAST.get(dtype)

    def autocast() -> contextlib.AbstractContextManager:
        if amp is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device, dtype=amp)

    def forward() -> torch.Tensor:
        with autocast():
            return model(idx, tgt)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        forward().backward()
        opt.step()

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()

    # Time: whole steps, nothing else in the loop (events recorded on the stream).
    samples = []
    for _ in range(steps):
        samples.append(time_call_ms(step, on_gpu))

    # FLOPs, forward / backward / optimizer apart; activations saved by the forward.
    from torch.utils.flop_counter import FlopCounterMode

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    opt.zero_grad(set_to_none=True)
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    with FlopCounterMode(display=False) as fwd_count:
        loss, activations, block_acts = _saved_bytes(forward, params, list(model.blocks))
    with FlopCounterMode(display=False) as bwd_count:
        loss.backward()
    with FlopCounterMode(display=False) as opt_count:
        opt.step()
    sync()
    peak = torch.cuda.max_memory_allocated() if on_gpu else None
    fwd, bwd = _flops_by_category(fwd_count), _flops_by_category(bwd_count)
    notes = []
    if n_blocks and not fwd.get("attention"):
        af, ab = _attention_formula(shape, n_blocks, micro_batch)
        fwd["attention"], bwd["attention"] = af, ab
        notes.append(f"FlopCounterMode counts no FLOPs for scaled_dot_product_attention on "
                     f"this device ({device}): counted by its formula instead "
                     "(torch.utils.flop_counter.sdpa_flop_count and "
                     "sdpa_backward_flop_count, full T x T square, backward with recompute)")

    memory = {
        "parameters": sum(p.numel() * p.element_size() for p in model.parameters()),
        "gradients": sum(p.grad.numel() * p.grad.element_size()
                         for p in model.parameters() if p.grad is not None),
        # AdamW's m and v; its per-tensor step counters apart (a scalar each).
        "optimizer_state": sum(v.numel() * v.element_size() for s in opt.state.values()
                               for k, v in s.items()
                               if torch.is_tensor(v) and k != "step"),
        "optimizer_step_counters": sum(v.numel() * v.element_size()
                                       for s in opt.state.values()
                                       for k, v in s.items()
                                       if torch.is_tensor(v) and k == "step"),
        "activations": activations,
        "activations_in_blocks": block_acts,
        "peak_allocated": peak,
    }
    profile_ms = _profile_step(lambda: forward().backward(), opt.step,
                               lambda: opt.zero_grad(set_to_none=True), on_gpu)
    return {"n_blocks": n_blocks, "params": parameter_count(model),
            "time_ms": _percentiles(samples), "flops_forward": fwd, "flops_backward": bwd,
            "flops_optimizer": _flops_by_category(opt_count), "memory": memory,
            "profile_ms": profile_ms, "notes": notes}


def _line(base: Any, part: Any, blocks: int, k: int) -> Any:
    """base + blocks x (part - base) / k, through dicts of numbers."""
    if isinstance(base, dict):
        keys = set(base) | set(part)
        return {key: _line(base.get(key, 0), part.get(key, 0), blocks, k) for key in keys
                if key != "samples"}
    if base is None or part is None:
        return None
    return base + blocks * (part - base) / k


def slice_bytes_estimate(shape: ModelShape, n_blocks: int, micro_batch: int) -> float:
    """What a slice needs at least, checked before it is built: 16 bytes per parameter
    (fp32 weights, gradients, AdamW m and v) plus the logits in fp32, twice (values and
    their gradient), the largest single activation of a step."""
    per_block = (shape.params - shape.vocab * shape.d_model * (1 if shape.tied else 2)
                 - (shape.seq_len * shape.d_model if shape.learned_pos else 0)
                 - shape.d_model * shape.norm_params) / shape.n_layers
    params = shape.params - shape.n_layers * per_block + n_blocks * per_block
    logits = micro_batch * shape.seq_len * shape.vocab * 4 * 2
    return 16 * params + logits


def measure_step(shape: ModelShape, micro_batch: int, device: str, dtype: str,
                 measure_layers: int | None = None, device_bytes: float | None = None,
                 steps: int = 5, log: Callable[[str], None] = lambda m: None,
                 warmup: int = 2) -> dict[str, Any]:
    """The step's measurements for the whole model (measured, or extrapolated from a
    slice of `measure_layers` blocks), as a JSON-able dict."""
    check_shape(shape, micro_batch, measure_layers)
    if measure_layers == 0:
        raise StepError("--measure-layers must be at least 1")
    L = shape.n_layers
    k = L if measure_layers is None else measure_layers
    need = slice_bytes_estimate(shape, k, micro_batch)
    if device_bytes and need > device_bytes:
        raise StepError(f"a slice of {k} block(s) needs at least {need / 1e9:.3g} GB "
                        f"(16 B per parameter and the logits), the device has "
                        f"{device_bytes / 1e9:.3g} GB: use a smaller --measure-layers")
    log(f"measuring a training step of {k} of {L} blocks on {device} ({dtype}, "
        f"micro-batch {micro_batch} x {shape.seq_len} tokens)")
    part = measure_model(shape, k, micro_batch, device, dtype, steps, warmup)
    result: dict[str, Any] = {"device": device, "dtype": dtype, "micro_batch": micro_batch,
                              "tokens": micro_batch * shape.seq_len, "layers": L,
                              "measured_layers": k, "steps": steps, "warmup": warmup}
    if k == L:
        return {**result, **part, "slice": None}
    log("measuring the embedding and head alone, to extrapolate the slice to all blocks")
    base = measure_model(shape, 0, micro_batch, device, dtype, steps, warmup)
    whole = {key: _line(base[key], part[key], L, k) for key in
             ("time_ms", "flops_forward", "flops_backward", "flops_optimizer", "memory",
              "profile_ms")}
    whole["params"] = shape.params
    whole["n_blocks"] = L
    whole["notes"] = part["notes"] + [
        f"measured on a slice of {k} of {L} blocks and on the embedding and head alone; "
        f"every figure F extrapolated as F(0) + {L} x (F({k}) - F(0)) / {k} (identical "
        "blocks each add the same time, FLOPs and memory); the time's spread is the "
        "slice's"]
    whole["time_ms"]["n"] = part["time_ms"]["n"]
    return {**result, **whole, "slice": {"blocks": k, "measured": part, "base": base}}
