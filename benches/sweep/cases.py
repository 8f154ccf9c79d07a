"""What one benchmark case is, and what its row starts as: the (kernel, provider, dtype,
shape, cache mode) cases of a run in order, the sweep's context (the request and what
the run resolved), the row's identity and accounting (a contract.record.RunRow), the
inputs and float64 reference its providers share, and the copies of them a cold CPU
row's calls rotate over.
"""

from __future__ import annotations

import contextlib
import gc
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import torch

from benches.sweep.shapes import is_model_sizes, model_layers, shapes_for
from benches.sweep.throttle import ThrottleConfig
from benches.timing.clock import Timing
from benches.timing.plan import TimingConfig
from contract import metrics
from contract.ceilings import NO_ROOF_BELOW_FP32, Ceilings
from contract.devices import DeviceModel, Present
from contract.record import Accounting, CaseId, Check, RunRow
from contract.request import RunRequest, Selection
from contract.schema import DEFAULT_CACHE, WARM, RowKey, format_shape
from kernels import DTYPES, REGISTRY, KernelSpec, Target
from kernels.spec import Inputs, Shape


@dataclass(frozen=True)
class Case:
    spec: KernelSpec
    provider: str
    dtype: str
    shape: Shape
    # "cold" (caches flushed or rotated past between calls) or "warm" (back-to-back calls
    # on the same buffers): contract.schema.CACHE_MODES.
    cache: str = DEFAULT_CACHE
    # The model layer(s) the shape stands for under --sizes model:NAME ("attn.qkv")
    layer: str | None = None

    @property
    def shape_str(self) -> str:
        return format_shape(self.shape)

    @property
    def key(self) -> RowKey:
        """The key of this case's row (contract.schema.row_key)."""
        return (self.spec.name, self.provider, self.dtype, self.shape_str, self.cache)

    @property
    def id(self) -> CaseId:
        """The identity its row carries (contract.record.CaseId)."""
        return CaseId(self.spec.name, self.provider, self.dtype, self.shape_str, self.cache,
                      self.layer)

    @property
    def label(self) -> str:
        warm = "" if self.cache == DEFAULT_CACHE else f" {self.cache}"
        return f"{self.spec.name} {self.provider} {self.dtype} {self.shape_str}{warm}"


@dataclass(frozen=True)
class SweepContext:
    """What a sweep runs with: the request (its selection and settings are read from
    there, never copied) and what the run resolved: the device model the rows are held
    against and the device present, the target the kernels run on, the ceilings
    (measured or cached: set once they are known, `dataclasses.replace`), the timing
    and throttle configurations the request derives, the run budget (None: none; see
    benches/sweep/budget.py), and the Triton configs to run instead of autotuning, by
    case key (re-timing children get the confirmed row's own: its `config` column)."""

    request: RunRequest
    model: DeviceModel
    present: Present
    target: Target
    ceilings: Ceilings = field(default_factory=lambda: Ceilings(None, None))
    timing: TimingConfig = field(default_factory=TimingConfig)
    throttle: ThrottleConfig = field(default_factory=ThrottleConfig)
    run_budget_s: float | None = None
    configs: Mapping[RowKey, str] = field(default_factory=dict)

    @property
    def selection(self) -> Selection:
        return self.request.selection

    @property
    def check_only(self) -> bool:
        return self.request.selection.check_only

    @property
    def cache_modes(self) -> tuple[str, ...]:
        """The cache modes each case is timed in (--cache), in order; by default cold on
        a GPU (L2 flushed or rotated past), warm on a CPU (what its timer has always
        measured: blocks of calls on the same buffers).  Check-only runs check each case
        once, in the first."""
        asked = self.request.selection.cache
        if asked is not None:
            return asked
        return (DEFAULT_CACHE,) if self.target.kind == "cuda" else (WARM,)


def build_cases(cfg: SweepContext) -> list[Case]:
    """Cases in run order: kernel, dtype, shape, provider, then cache mode, so that both
    providers of a (kernel, dtype, shape) share one set of inputs, and a row's cold and
    warm times are taken next to each other (the same autotuned config, the same spell
    of a shared machine).  A provider the kernel does not have (attention's SDPA
    backends for matmul) makes no case: --list says which kernel has which."""
    cases = []
    on_gpu = cfg.target.kind == "cuda"
    sel = cfg.selection
    modes = cfg.cache_modes[:1] if sel.check_only else cfg.cache_modes
    shapes = None if sel.shapes is None else [dict(s) for s in sel.shapes]
    for name in sel.kernels:
        spec = REGISTRY[name]
        layers = {format_shape(s.shape): s.layer for s in model_layers(sel.sizes, name)} \
            if is_model_sizes(sel.sizes) else {}
        for dtype in sel.dtypes:
            if dtype not in spec.dtypes:
                continue  # e.g. tf32 exists for matmul only
            for shape in shapes_for(spec, sel.sizes, on_gpu, shapes):
                layer = layers.get(format_shape(shape))
                for prov in sel.providers:
                    if prov not in spec.providers:
                        continue
                    cases += [Case(spec, prov, dtype, shape, mode, layer) for mode in modes]
    return cases


def energy_keys(cases: list[Case], rows: str) -> frozenset[RowKey]:
    """The cases whose rows get an energy window under --energy `rows`: every one, none,
    or ("largest") the largest shape (FLOPs + bytes) of each kernel, provider, dtype and
    cache mode among `cases`, where the energy per call says most (the roof's TFLOP/J)
    for a window of the same length."""
    if rows == "all":
        return frozenset(c.key for c in cases)
    if rows == "off":
        return frozenset()
    best: dict[tuple[str, str, str, str], tuple[float, Case]] = {}
    for c in cases:
        series = (c.spec.name, c.provider, c.dtype, c.cache)
        work = float(c.spec.flops(c.shape, c.dtype) + c.spec.nbytes(c.shape, c.dtype))
        if series not in best or work > best[series][0]:
            best[series] = (work, c)
    return frozenset(c.key for _, c in best.values())


def case_seed(base: int, spec: KernelSpec, dtype: str, shape: Shape) -> int:
    """Stable per-(kernel, dtype, shape) seed: fresh data per case, reproducible per run."""
    return (base * 1_000_003 + zlib.crc32(f"{spec.name}|{dtype}|{shape}".encode())) % 2**31


def roofs_of(case: Case, cfg: SweepContext) -> tuple[float | None, float | None,
                                                float | None, float | None]:
    """(peak_tflops, peak_gbps, meas_peak_tflops, meas_peak_gbps) a row is held against.

    On a CPU the fp8 compute ceiling is measured with e4m3 (torch._scaled_mm); an e5m2
    product takes another, much slower path there, so fp8e5 matrix rows get no roof
    rather than one measured on a different format."""
    spec, dtype = case.spec, case.dtype
    rc = spec.roof_class(dtype, cfg.target)
    ceil = cfg.ceilings
    if cfg.target.kind != "cuda" and spec.matrix_unit and dtype == "fp8e5" \
            and ceil.meas_tflops("fp8e5") is None:
        return None, None, None, None
    return ceil.peak_tflops(rc), ceil.peak_gbps(), ceil.meas_tflops(rc), ceil.meas_gbps()


def base_row(case: Case, cfg: SweepContext) -> RunRow:
    """A case's row before it runs: its identity, its accounting (FLOPs, bytes, the roofs
    it is held against), its dtype's tolerance, the roofline bounds it has untimed."""
    spec, dtype = case.spec, case.dtype
    flops = spec.flops(case.shape, dtype)
    nbytes = spec.nbytes(case.shape, dtype)
    peak_tflops, peak_gbps, meas_tflops, meas_gbps = roofs_of(case, cfg)
    acc = Accounting(flops=flops, bytes=nbytes, intensity=metrics.intensity(flops, nbytes),
                     roof_class=spec.roof_class(dtype, cfg.target), device=cfg.model.key,
                     gpu_name=cfg.present.name, peak_tflops=peak_tflops,
                     peak_gbps=peak_gbps, meas_peak_tflops=meas_tflops,
                     meas_peak_gbps=meas_gbps)
    return RunRow(case=case.id, accounting=acc, check=Check(tolerance=DTYPES[dtype].tol),
                  metrics=metrics.row_metrics(acc, None))


def set_timing(row: RunRow, case: Case, cfg: SweepContext, timing: Timing,
               note: str) -> RunRow:
    """The row ok with its timing: times, samples, timer, metrics, the reason's notes (the
    roof's, and why it has no MFU where its roof class has no compute roof here)."""
    rc = case.spec.roof_class(case.dtype, cfg.target)
    note = "; ".join(x for x in (note, case.spec.roof_note(case.dtype, cfg.target)) if x)
    if rc in cfg.ceilings.no_roofs() and cfg.ceilings.peak_tflops(rc) is None:
        # Said in the row, where its MFU would be (contract.ceilings.no_roofs).
        no_roof = (f"no {rc} compute roof here (measured under {NO_ROOF_BELOW_FP32:g}x "
                   "fp32's): no MFU")
        if no_roof not in note:
            note = "; ".join(x for x in (note, no_roof) if x)
    timed = replace(row.timing, ms_median=timing.ms_median, ms_p20=timing.ms_p20,
                    ms_p80=timing.ms_p80, n_samples=timing.n_samples, timer=timing.timer,
                    host_us=timing.host_us, samples_ms=tuple(timing.samples_ms))
    return replace(row, status="ok", reason=note, timing=timed,
                   metrics=metrics.row_metrics(row.accounting, timing.ms_median))


class InputCache:
    """Inputs of the current (kernel, dtype, shape) and their float64 reference, shared
    by its providers (a large float64 matmul reference is worth computing once), and the
    copies a cold CPU row rotates over (`copies`, made by the runner, kept for the
    row's rounds, their memory from `scratch`)."""

    def __init__(self, scratch: Scratch | None = None) -> None:
        self.key: tuple | None = None
        self.inputs: Inputs | None = None
        self.ref: torch.Tensor | None = None
        self.copies: Copies | None = None
        self.scratch = scratch  # where copies' memory comes from (the sweep's)

    def get(self, case: Case, cfg: SweepContext) -> Inputs:
        key = (case.spec.name, case.dtype, case.shape_str)
        if key != self.key:
            self.clear()
            seed = case_seed(cfg.selection.seed, case.spec, case.dtype, case.shape)
            self.inputs = case.spec.make_inputs(case.shape, case.dtype, seed,
                                                cfg.target.device)
            self.key = key
        assert self.inputs is not None
        return self.inputs

    def reference(self, case: Case) -> torch.Tensor:
        """float64 reference of the inputs last returned by get() for this case."""
        assert self.inputs is not None
        if self.ref is None:
            self.ref = case.spec.reference(self.inputs, case.dtype)
        return self.ref

    def clear(self) -> None:
        self.key, self.inputs, self.ref, self.copies = None, None, None, None


# A provider's call bound to one set of buffers: make_call(inputs, out)().
MakeCall = Callable[[Inputs, torch.Tensor], Callable[[], object]]


def clone_inputs(inputs: Inputs) -> Inputs:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


class Copies:
    """Copies of a case's inputs and output, each pair on memory of its own (with the
    originals' values, strides and dtypes), for a rotation of calls; `nbytes` is the
    memory they span.  Copies cut from a Scratch share its memory with the other rows'
    copies: `ready()` writes this row's input values back into it when another row's
    were written since (before each of the row's rounds)."""

    def __init__(self, pairs: list[tuple[Inputs, torch.Tensor]], nbytes: int,
                 fills: list[tuple[torch.Tensor, torch.Tensor]],
                 scratch: Scratch | None) -> None:
        self.pairs = pairs
        self.nbytes = nbytes
        self._fills = fills  # (the copies of one input as one block, the input)
        self._scratch = scratch
        self._filled: Copies | None = None  # self once filled
        # Each provider's calls on the pairs, made on first use and kept for the row's
        # rounds (thousands of closures a round otherwise, at 2^12 elements).
        self.calls: dict[str, list[Callable[[], object]]] = {}

    def ready(self) -> None:
        """The inputs' values in every copy (a no-op when the memory still holds them:
        memory of their own, filled once, or a Scratch no other row wrote since).

        Written in copy order, a group of copies at a time with all its inputs (not one
        input's copies after another's), so that a copy's data was written the longer
        ago the earlier the rotation reaches it: between a copy's write and its first
        call lie the writes of every later copy and the calls on every earlier one."""
        holder = self._scratch.holder if self._scratch is not None else self._filled
        if holder is self:
            return
        count = len(self.pairs)
        step = -(-count // _FILL_GROUPS)
        for start in range(0, count, step):
            for block, x in self._fills:
                part = block[start:start + step]
                part.copy_(x.unsqueeze(0).expand_as(part))
        if self._scratch is not None:
            self._scratch.holder = self
        self._filled = self


class Scratch:
    """One block of memory that a sweep's cold CPU rows cut their copies from, in turn:
    each row's copies are views of its start, and a row's input values are written in
    (Copies.ready) before each of its rounds.

    Why shared: a row's copies take 2-4x the last-level cache.  Made afresh for every
    round they cost more than a small row's timing (first-touch page faults and zeroing,
    ~4x the copy itself: docs/measurement.md, "Figures behind the code's choices");
    kept per row for its rounds, a chunk of rows
    interleaved over seconds (runner.iterate) would hold gigabytes.  Shared, the memory
    stays at one rotation's (`capacity`, 4x the cache: a rotation never needs more) and
    is touched once; a row's refill writes its inputs only (the calls write the outputs).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.block: torch.Tensor | None = None
        self.touched = 0  # bytes from the start written at least once
        self.holder: Copies | None = None  # whose inputs the memory holds now

    def region(self, nbytes: int, device: torch.device) -> torch.Tensor:
        """The first `nbytes` of the block (made, or made larger, as needed), every page
        of them touched."""
        if self.block is None or self.block.numel() < nbytes or self.block.device != device:
            size = max(nbytes, self.capacity)
            self.block = torch.empty(size, dtype=torch.uint8, device=device)
            self.touched, self.holder = 0, None
        if nbytes > self.touched:
            self.block[self.touched:nbytes].zero_()  # page faults here, not in a timed call
            self.touched = nbytes
        return self.block[:nbytes]


_ALIGN = 64  # bytes: every copy starts on a cache line (and any SIMD width's boundary)
_FILL_GROUPS = 16  # Copies.ready writes the copies in this many groups, in order


# Set while a sweep lets gc_paused freeze what it made (copies_frozen).
_FREEZE = [False]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while thousands of long-lived objects are made
    (a rotation's views, input dicts and calls), on again after; within copies_frozen,
    what exists then is frozen (gc.freeze), so that no collection walks them again.

    Made with it on and left to it, they drive collections generation by generation into
    full ones, each walking every object of the process (torch's and triton's own):
    measured, 11 full collections and 1.4 s of a 20 s quick CPU sweep, against 1 and
    0.13 s before copies existed; paused but not frozen, still 2 and 0.7 s."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if _FREEZE[0]:
            gc.freeze()
        if was_on:
            gc.enable()


@contextlib.contextmanager
def copies_frozen() -> Iterator[None]:
    """A sweep's span in which gc_paused freezes the objects it made, all unfrozen at
    its end (gc.unfreeze).  Frozen objects are still freed as soon as nothing refers to
    them; only cyclic garbage that exists when a freeze happens waits for the end.  A
    process that froze objects of its own (gc.get_freeze_count() > 0) is left as it
    is: nothing is frozen, so its freeze is never undone."""
    mine = not _FREEZE[0] and gc.get_freeze_count() == 0
    _FREEZE[0] = _FREEZE[0] or mine
    try:
        yield
    finally:
        if mine:
            _FREEZE[0] = False
            gc.unfreeze()


def make_copies(inputs: Inputs, out: torch.Tensor, count: int,
                scratch: Scratch | None = None) -> Copies:
    """`count` copies of (inputs, out), cut from one block of memory (the start of
    `scratch` when given, else their own), each copy starting on a 64-byte boundary,
    each input's copies filled by one copy_ from it.

    Not `count` clones: a cold CPU rotation at 2^12 elements needs thousands of copies,
    and a clone each costs ~100x the time of one fill (docs/measurement.md, "Figures
    behind the code's choices").  The output's copies hold whatever
    the memory held, every page touched before any call is timed.  Tensors of one cache
    line or less (the fp8 scales) are shared by all copies: read once a call, they add no
    traffic worth rotating, and thousands of views of them would cost more than the
    copies of the data."""
    with gc_paused():
        return _make_copies(inputs, out, count, scratch)


def _make_copies(inputs: Inputs, out: torch.Tensor, count: int,
                 scratch: Scratch | None) -> Copies:
    names = [k for k, v in inputs.items()
             if isinstance(v, torch.Tensor) and v.nbytes > _ALIGN]
    tensors = [inputs[k] for k in names] + [out]
    layouts = [_layout(x) for x in tensors]
    sizes = [count * slot * x.element_size() if slot else 0
             for x, (_, slot) in zip(tensors, layouts, strict=True)]
    total = sum(sizes)
    if scratch is not None:
        memory = scratch.region(total, out.device)
    else:
        memory = torch.empty(total, dtype=torch.uint8, device=out.device)
        memory.zero_()  # touched before any call is timed
    made: list[list[torch.Tensor]] = []
    fills: list[tuple[torch.Tensor, torch.Tensor]] = []
    at = 0
    for j, (x, (perm, slot), size) in enumerate(zip(tensors, layouts, sizes, strict=True)):
        if slot:
            block, views = _replicas(x, count, perm, slot, memory[at:at + size])
            made.append(views)
            if j < len(names):  # an input: its values; the output's the calls write
                fills.append((block, x.permute(perm)))
        else:  # overlapping or gapped strides (none in this suite): plain clones
            made.append([x.clone() for _ in range(count)])
        at += size
    pairs = []
    for i in range(count):
        ins = dict(inputs)
        ins.update({k: views[i] for k, views in zip(names, made, strict=False)})
        pairs.append((ins, made[-1][i]))
    copies = Copies(pairs, total + sum(count * x.nbytes for x, (_, slot)
                                       in zip(tensors, layouts, strict=True) if not slot),
                    fills, scratch)
    copies.ready()
    return copies


def _layout(x: torch.Tensor) -> tuple[list[int], int]:
    """(x's dimensions in memory order, elements a copy takes with its padding to 64
    bytes); slot 0 when x's strides are not a permutation of a dense layout.  Memory
    order: a column-major matrix (matmul's B) is a row-major one permuted, and its
    copies are made so too."""
    perm = sorted(range(x.dim()), key=lambda d: (-x.stride(d), -x.size(d)))
    if not x.permute(perm).is_contiguous():
        return perm, 0
    item = x.element_size()
    return perm, -(-max(x.numel(), 1) * item // _ALIGN) * _ALIGN // item


def _replicas(x: torch.Tensor, count: int, perm: list[int], slot: int,
              memory: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the copies as one block of x's layout, each copy: x's shape and strides) in
    `memory` (uint8, count x slot elements of x's dtype)."""
    xp = x.permute(perm)
    rows = memory.view(x.dtype).view(count, slot)
    block = rows[:, :x.numel()].view(count, *xp.shape)
    views = list(block.unbind(0))
    if perm != sorted(perm):
        back = [perm.index(d) for d in range(x.dim())]
        views = [v.permute(back) for v in views]
    return block, views
