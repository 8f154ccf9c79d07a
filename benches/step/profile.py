"""The training step's time by kind of work (`plan --measure step`): torch.profiler over
one step, each unit of work counted once and put in one category.

- On a GPU the unit is a device kernel (or memcpy / memset), counted once with its own
  duration.  torch's event list holds each kernel twice: as a device event of its own
  and in the `kernels` of the CPU op that launched it (the innermost op running when
  cudaLaunchKernel was called, linked by the kernel's correlation id), which is why a sum
  of every event's self device time comes out near 2x (torch's own table sums the device
  events only).  The kernel is categorized by its launching op and that op's CPU parents
  (below); a kernel no op claims is categorized by its own name.
- On a CPU the unit is each op's self CPU time (the op minus its children: counted once),
  categorized by the op and its parents the same way.

The path from the launching op out to the outermost op decides the category:
- the outermost op of attention, the loss or the optimizer takes everything under it:
  these are composite ops whose inner work (SDPA's math backend's batched matmuls and
  softmax, a flash backward's zero-fill, cross-entropy's log-softmax) is theirs;
- otherwise the innermost op with a category: aten::addmm under aten::linear is a GEMM,
  aten::sum under AddmmBackward0 (the bias gradient) is elementwise, a memset under
  aten::zero_ is elementwise;
- otherwise the kernel's own name (Hopper's cuBLAS kernels are nvjet_*), else "other".
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

CATEGORIES = ("gemm", "attention", "norms and elementwise", "loss", "optimizer", "other")
# Categories of composite ops that own all the work beneath them.
COMPOSITE = ("attention", "loss", "optimizer")


def category(op: str) -> str:
    """The kind of work an aten op (or kernel name) is.  In the measured model every
    batched matmul (bmm) and plain softmax is attention's: its linear layers fold their
    tokens into one mm/addmm (tested), so these appear only when SDPA runs on its math
    backend, which decomposes into them."""
    name = op.lower()
    if any(k in name for k in ("log_softmax", "logsoftmax", "cross_entropy", "nll_loss",
                               "nllloss", "logsumexp")):
        return "loss"
    if any(k in name for k in ("attention", "flash", "sdpa", "fmha", "efficient_attn",
                               "softmax", "bmm")):
        return "attention"
    if any(k in name for k in ("adam", "_foreach", "optim", "lerp", "addcdiv", "addcmul")):
        return "optimizer"
    if any(k in name for k in ("::mm", "addmm", "matmul", "gemm", "gemv", "cutlass",
                               "scaled_mm", "xmma", "ampere_", "cublas", "nvjet")) \
            or name in ("mm", "aten.mm", "aten.addmm"):
        return "gemm"
    if any(k in name for k in ("norm", "gelu", "silu", "mul", "add", "sub", "div", "tanh",
                               "exp", "pow", "sqrt", "mean", "sum", "copy", "cat", "split", "index",
                               "embedding", "to_copy", "fill", "zero", "elementwise",
                               "vectorized", "reduce", "where", "masked", "neg")):
        return "norms and elementwise"
    return "other"


def event_path(op: Any) -> list[Any]:
    """The op and its CPU parents, innermost first."""
    out = []
    while op is not None:
        out.append(op)
        op = getattr(op, "cpu_parent", None)
    return out


def launched_category(op: Any, kernel: str | None = None) -> str:
    """Category of work launched (or done, on a CPU) by `op`: see the module's docstring."""
    cats = [category(e.name) for e in event_path(op)]
    composite = [c for c in cats if c in COMPOSITE]
    if composite:
        return composite[-1]  # the outermost
    own = next((c for c in cats if c != "other"), None)
    if own is not None:
        return own
    return category(kernel) if kernel else "other"


def is_device_event(ev: Any) -> bool:
    from torch.autograd import DeviceType

    return ev.device_type != DeviceType.CPU


def device_work(events: list[Any]) -> tuple[list[tuple[Any, str, float]],
                                             list[tuple[str, float]]]:
    """Every device event (kernel, memcpy, memset) once: ([(launching op, kernel name,
    us)], [(name, us) of the events no op claims]).  A launching op's kernel entry (name,
    duration) claims one of the device events it mirrors.  GPU user annotations
    (record_function ranges mirrored on the GPU timeline) are spans, not work: left out."""
    device = [e for e in events if is_device_event(e) and not getattr(e, "is_user_annotation",
                                                                  False)]
    pending = Counter((e.name, e.time_range.elapsed_us()) for e in device)
    claimed = []
    for op in events:
        if is_device_event(op):
            continue
        for k in getattr(op, "kernels", ()):
            key = (k.name, k.duration)
            if pending[key] > 0:
                pending[key] -= 1
                claimed.append((op, k.name, k.duration))
    unclaimed = [(name, us) for (name, us), n in pending.items() for _ in range(n)]
    return claimed, unclaimed


def split_device_time(events: Iterable[Any], only: str | None = None) -> dict[str, float]:
    """ms of device time per category: every device event once (device_work), by the op
    that launched it, else by its name; all of it in `only` when given."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    claimed, unclaimed = device_work(list(events))
    for op, name, us in claimed:
        out[only or launched_category(op, name)] += us / 1e3
    for name, us in unclaimed:
        out[only or category(name)] += us / 1e3
    return out


def split_cpu_time(events: Iterable[Any], only: str | None = None) -> dict[str, float]:
    """ms of self CPU time per category (each op's own time, its children's apart)."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for op in events:
        if is_device_event(op) or getattr(op, "is_async", False):
            continue
        us = op.self_cpu_time_total
        if us:
            out[only or launched_category(op)] += us / 1e3
    return out


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


# The range a profiled call runs in (torch.profiler.record_function): its span is the
# call's profiled time, its self time the time in no op (the interpreter between ops and
# the profiler's own recording).  No category keyword matches it.
SPAN = "gpubench::profiled"


def profile_events(run: Callable[[], None], on_gpu: bool) -> list[Any]:
    """The profiler's event list of one call of `run`, inside a SPAN range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    # Input shapes tell the step's GEMMs apart (benches/step/kernel_split.gemm_calls).
    with _native_stderr_to_null(), profile(activities=acts, record_shapes=True) as prof:
        with record_function(SPAN):
            run()
        if on_gpu:
            torch.cuda.synchronize()
    return list(prof.events())


def split_ms(events: list[Any], on_gpu: bool, only: str | None = None) -> dict[str, float]:
    """ms per category of an event list (device time on a GPU, self CPU time on a CPU),
    the SPAN range's own time left out; all of it in category `only` when given."""
    work = [e for e in events if e.name != SPAN]
    return split_device_time(work, only) if on_gpu else split_cpu_time(work, only)


def profile_ms(run: Callable[[], None], on_gpu: bool, only: str | None = None
               ) -> dict[str, float]:
    """ms per category over one call of `run` (device time on a GPU, self CPU time on a
    CPU); all of it in category `only` when given."""
    return split_ms(profile_events(run, on_gpu), on_gpu, only)
