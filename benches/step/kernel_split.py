"""The training step held against its own kernels (`plan --measure step --explain`), the
profiler's side: one profiled step's time split by the kinds of kernel the harness has
families for, and by pass.

The categories follow the kernel families: `gemm` (matmul), `attention` (attention and
attention_bwd), `norm` (layernorm, rmsnorm), `loss/softmax` (softmax: cross-entropy's
log-softmax over the vocabulary), `optimizer/elementwise` and `other` (no family).  The
passes are forward, backward (work under an autograd engine node), the optimizer step
(profiled apart, all of it optimizer/elementwise) and, on a GPU, unattributed (kernels
no op the profiler saw launched).

A unit of work (a kernel on a GPU, an op's self CPU time on a CPU: benches/step/profile.py)
goes to the category of the outermost composite op on its path -- attention, the loss,
a norm (its inner pow, mean, rsqrt... on a CPU are the norm's) -- else the innermost op
with a category, as the step's own split does.  A backward op's path also holds the
forward op whose autograd node it runs: the node's sequence number is the one the
profiler records on the forward op that made it (torch's FunctionEvent.sequence_nr),
so a composite RMSNorm's MulBackward0 and RsqrtBackward0 are the norm's backward, not
elementwise work.  The same events give the step's split by the coarser categories, so
the two always add up to the same time.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benches.step.profile import (
    CATEGORIES,
    SPAN,
    category,
    device_work,
    event_path,
    is_device_event,
    profile_events,
    split_ms,
)

EXPLAIN_CATEGORIES = ("gemm", "attention", "norm", "loss/softmax", "optimizer/elementwise",
                      "other")
# "unattributed": GPU kernels no op the profiler saw launched (by name to a category;
# their pass cannot be told).
PASSES = ("forward", "backward", "optimizer", "unattributed")
# The step's coarse categories (benches.step.profile) in the explain ones; norms come
# out of "norms and elementwise" by name (is_norm).
_FROM_COARSE = {"gemm": "gemm", "attention": "attention", "loss": "loss/softmax",
                "optimizer": "optimizer/elementwise",
                "norms and elementwise": "optimizer/elementwise", "other": "other"}
_ENGINE = "autograd::engine::evaluate_function"


def is_norm(name: str) -> bool:
    """LayerNorm and RMSNorm ops, their autograd nodes and kernels: aten::layer_norm,
    aten::native_layer_norm, NativeLayerNormBackward0, aten::rms_norm,
    aten::_fused_rms_norm, FusedRmsNormBackward0, vectorized_layer_norm_kernel..."""
    n = name.lower().replace("_", "")
    return "layernorm" in n or "rmsnorm" in n


def _composite(name: str) -> str | None:
    if is_norm(name):
        return "norm"
    coarse = category(name)
    return _FROM_COARSE[coarse] if coarse in ("attention", "loss", "optimizer") else None


def _bare(name: str) -> str:
    """An op's or autograd node's name reduced for matching the two: aten::_log_softmax
    and LogSoftmaxBackward0 both give logsoftmax."""
    name = name.split("::")[-1].split(": ")[-1]
    name = re.sub(r"Backward\d*$", "", name)
    return name.replace("_", "").lower()


class ForwardLinks:
    """Forward ops by the sequence number of the autograd node they made, to put a
    backward op on the path of the forward op it differentiates."""

    def __init__(self, events: list[Any]) -> None:
        self.by_seq: dict[int, list[Any]] = defaultdict(list)
        for e in events:
            seq = getattr(e, "sequence_nr", -1)
            if seq is not None and seq >= 0 and not is_device_event(e) and not _backward(e):
                self.by_seq[seq].append(e)

    def forward_of(self, node: Any) -> Any | None:
        """The forward op whose autograd node `node` (an evaluate_function range or the
        node's own op) runs: among the ops with its sequence number the one of the same
        name (mul for MulBackward0), the deepest; else the deepest of them."""
        ops = self.by_seq.get(getattr(node, "sequence_nr", -1), [])
        if not ops:
            return None
        same = [o for o in ops if _bare(o.name) == _bare(node.name)]
        return max(same or ops, key=lambda o: len(event_path(o)))


def _backward(op: Any) -> bool:
    return any(e.name.startswith(_ENGINE) for e in event_path(op))


def explain_category(op: Any, links: ForwardLinks, kernel: str | None = None) -> str:
    """Category of the work `op` launched (on a GPU) or did (on a CPU): the outermost
    composite on its path, then on its forward op's path (backward work); else the
    innermost op with a category on its path, then on its forward op's (an autograd
    node's own time, MmBackward0's, is its forward mm's kind); else the kernel's own
    name."""
    path = event_path(op)
    linked: list[Any] = []
    for e in path:
        if e.name.startswith(_ENGINE) or "Backward" in e.name:
            fwd = links.forward_of(e)
            if fwd is not None:
                linked = event_path(fwd)
                break
    for chain in (path, linked):
        found = [c for c in (_composite(e.name) for e in chain) if c]
        if found:
            return found[-1]
    own = next((c for chain in (path, linked) for c in (category(e.name) for e in chain)
                if c != "other"), None)
    if own is None and kernel:
        own = category(kernel)
    if own == "norms and elementwise" and kernel and is_norm(kernel):
        return "norm"
    return _FROM_COARSE[own or "other"]


def _empty() -> dict[str, dict[str, float]]:
    return {c: dict.fromkeys(PASSES, 0.0) for c in EXPLAIN_CATEGORIES}


def split_explained(events: list[Any], on_gpu: bool) -> dict[str, dict[str, float]]:
    """ms per explain category and pass (forward or backward) of a profiled forward and
    backward: the same units of work, each once, as benches.step.profile's split."""
    links = ForwardLinks(events)
    out = _empty()
    work = [e for e in events if e.name != SPAN]
    if not on_gpu:
        for op in work:
            if is_device_event(op) or getattr(op, "is_async", False) or not op.self_cpu_time_total:
                continue
            pas = "backward" if _backward(op) else "forward"
            out[explain_category(op, links)][pas] += op.self_cpu_time_total / 1e3
        return out
    # Each device event once, claimed by its launching op as split_device_time does.
    claimed, unclaimed = device_work(work)
    for op, name, us in claimed:
        pas = "backward" if _backward(op) else "forward"
        out[explain_category(op, links, name)][pas] += us / 1e3
    for name, us in unclaimed:
        cat = "norm" if is_norm(name) else _FROM_COARSE[category(name)]
        out[cat]["unattributed"] += us / 1e3
    return out


GEMM_OPS = ("aten::mm", "aten::addmm")


def _gemm_dims(op: Any) -> tuple[int, int, int] | None:
    """(M, N, K) of an mm or addmm from its recorded input shapes: the last two 2-D
    ones are [M, K] and [K, N] (addmm's bias and scalars come first and last)."""
    mats = [s for s in (getattr(op, "input_shapes", None) or []) if len(s) == 2]
    if len(mats) < 2 or mats[-2][1] != mats[-1][0]:
        return None
    (m, k), (_, n) = mats[-2], mats[-1]
    return int(m), int(n), int(k)


def gemm_calls(events: list[Any], on_gpu: bool) -> dict[str, dict[str, float]]:
    """The GEMMs of a profiled forward and backward by roofline.plan.arithmetic.gemm_key
    (pass, output sides, reduction): {"ms": their time, "calls": how many}.  A GEMM is an
    mm or addmm op (the model's linear layers fold their tokens into one, tested); its
    time is, on a GPU, the device time of the kernels it launched (cuBLAS may launch more
    than one), on a CPU its self CPU time."""
    from roofline.plan.arithmetic import gemm_key

    times: dict[int, tuple[Any, float]] = {}
    if on_gpu:
        claimed, _ = device_work([e for e in events if e.name != SPAN])
        for op, _name, us in claimed:
            if op.name in GEMM_OPS:
                times[id(op)] = (op, times.get(id(op), (op, 0.0))[1] + us)
    else:
        times = {id(op): (op, op.self_cpu_time_total) for op in events
                 if op.name in GEMM_OPS and not is_device_event(op)}
    out: dict[str, dict[str, float]] = {}
    for op, us in times.values():
        dims = _gemm_dims(op)
        if dims is None:
            continue
        entry = out.setdefault(gemm_key("backward" if _backward(op) else "forward", *dims),
                               {"ms": 0.0, "calls": 0})
        entry["ms"] += us / 1e3
        entry["calls"] += 1
    return out


def span_ms(events: list[Any], on_gpu: bool) -> float:
    """The profiled call's own time: on a CPU the SPAN range's length; on a GPU the
    device timeline from the first kernel's start to the last one's end."""
    if on_gpu:
        dev = [e for e in events if is_device_event(e) and not getattr(e, "is_user_annotation",
                                                                  False)]
        if not dev:
            return 0.0
        return (max(e.time_range.end for e in dev)
                - min(e.time_range.start for e in dev)) / 1e3
    spans = [e for e in events if e.name == SPAN and not is_device_event(e)]
    return sum(e.cpu_time_total for e in spans) / 1e3


@dataclass(frozen=True)
class StepProfile:
    """A profiled step split two ways (profile_step_explained)."""

    categories: dict[str, float]
    explain: dict[str, dict[str, float]]
    span_ms: float
    gemm_calls: dict[str, dict[str, float]]


def profile_step_explained(forward_backward: Callable[[], None],
                           optimizer_step: Callable[[], None], zero_grad: Callable[[], None],
                           on_gpu: bool) -> StepProfile:
    """One step profiled in two parts, forward and backward op by op, then the optimizer
    step as a whole (its ops, sqrt, mul, lerp..., are named like any elementwise op), and
    split both ways from the same events:
    `categories` (the step's coarse split), `explain` (category -> pass -> ms), and
    `span_ms`, the two profiled calls' own time, of which what the categories leave is
    in no op (on a CPU the interpreter between ops and the profiler's recording; on a
    GPU the device idle between kernels); and `gemm_calls`, the forward and backward's
    GEMMs by shape and pass."""
    zero_grad()
    fb = profile_events(forward_backward, on_gpu)
    opt = profile_events(optimizer_step, on_gpu)
    parts, opt_ms = split_ms(fb, on_gpu), split_ms(opt, on_gpu, only="optimizer")
    coarse = {k: parts[k] + opt_ms[k] for k in CATEGORIES}
    explain = split_explained(fb, on_gpu)
    explain["optimizer/elementwise"]["optimizer"] += opt_ms["optimizer"]
    span = span_ms(fb, on_gpu) + span_ms(opt, on_gpu)
    return StepProfile(coarse, explain, span, gemm_calls(fb, on_gpu))
