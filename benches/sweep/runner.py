"""The sweep: for every (kernel, provider, dtype, shape) check correctness against the
float64 reference (benches/sweep/row_check.py), time it in each cache mode asked (cold:
caches flushed or rotated past; warm: back-to-back calls on the same buffers), derive the
roofline metrics, and hand the row over (benches/sweep/results.py writes it).  On a GPU
the providers of a case are timed together (benches/sweep/gpu_case.py); on a CPU, timing
rounds are interleaved over chunks of cases.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from benches.sweep import row_energy as energy
from benches.sweep.budget import RowBudget, RunBudget
from benches.sweep.cases import (
    Case,
    Copies,
    InputCache,
    MakeCall,
    SweepContext,
    base_row,
    clone_inputs,
    copies_frozen,
    energy_keys,
    set_timing,
)
from benches.sweep.failures import SweepAborted
from benches.sweep.gpu_case import time_gpu_case
from benches.sweep.interrupt import (
    python_handlers_back,
    restore_handlers_after_compiles,
    signal_name,
)
from benches.sweep.row_check import Checked, check_case, error_row, plain_call
from benches.sweep.time_split import RowSplits, TimeSplit
from benches.sweep.timers import CPU_TIMERS, RowCall, RowTimer, sweep_cache, timer_for
from benches.timing.clock import Timing, summarize
from benches.timing.plan import CpuPlan, OverBudget, cpu_round_config, plan_cpu
from benches.timing.stopping import cpu_settled
from contract.record import RunRow
from contract.schema import DEFAULT_CACHE, RowKey
from kernels.compiled import compile_mark, recompile_note
from kernels.spec import Inputs


def run_case(case: Case, cfg: SweepContext, cache: InputCache,
             budget: RowBudget | None = None, split: TimeSplit | None = None
             ) -> RunRow:
    """One row on its own: skipped, failed (wrong result or the kernel raised) or ok
    (correct and timed).  Raises SweepAborted (carrying the failed row) on a sticky CUDA
    error.  (A sweep times the providers of a case together: iterate.)

    On a CPU the checked call is timed: it sizes the row's samples within its budget
    (`budget`: the run's share; its call_s and plan are filled in), and a row whose
    minimum samples cannot fit the row budget is skipped after its check.  `split` books
    the row's time by phase (benches/sweep/time_split.py)."""
    budget = budget if budget is not None else RowBudget()
    split = split if split is not None else TimeSplit()
    got = check_case(case, cfg, cache, budget, split)
    if not isinstance(got, Checked):
        return got
    if cfg.target.kind == "cuda":
        return time_gpu_case([got], [budget], cfg, cache, split, RowSplits(),
                             energy_keys([case], cfg.request.measurement.energy))[0]
    return _time_cpu(got, cfg, cache, budget, split)


def _time_cpu(item: Checked, cfg: SweepContext, cache: InputCache, budget: RowBudget,
              split: TimeSplit) -> RunRow:
    """A checked CPU row timed: its samples planned within its budget (skipped when its
    minimum cannot fit), its energy from RAPL around the timing where readable."""
    case, row = item.case, item.row
    try:
        # The plan is per round (a one-round config when the sweep interleaves).
        round_cfg = cpu_round_config(cfg.timing)
        share = None if budget.share_s is None \
            else budget.share_s / round_cfg.cpu_rounds_of_row
        budget.plan = plan_cpu(budget.call_s or 0.0, round_cfg, share)
    except OverBudget as e:
        return replace(row, status="skipped", reason=str(e))
    compiles = case.spec.providers[case.provider].compiles
    try:
        timer = timer_for(case, cfg)
        call = RowCall(case, cfg, item.inputs, item.out, item.make_call or plain_call(case),
                       plan=budget.plan, split=split)
        with split.phase("inputs"):
            call.copies = timer.copies(call, cache)
        meter = energy.rapl_meter()  # RAPL around the samples
        before = compile_mark(compiles)
        with split.phase("timing"):
            timing, note = meter.around(lambda: timer.time(call))
    except Exception as e:
        return error_row(row, e, case, cfg, cache, " while timing")
    row = set_timing(row, case, cfg, timing, "; ".join(
        x for x in (note, item.ran, recompile_note(compiles, before)) if x))
    return replace(row, energy=meter.group(row))


def time_case(case: Case, cfg: SweepContext, inputs: Inputs, out: torch.Tensor,
              make_call: MakeCall | None = None, plan: CpuPlan | None = None,
              copies: Copies | None = None, split: TimeSplit | None = None,
              timer: RowTimer | None = None) -> tuple[Timing, str]:
    """(timing, note) of a checked case timed alone by its timer
    (benches/sweep/timers.py): the note says why a CUDA-graph case fell back to events or
    what bound its graph, that a CPU row's budget cut its samples (`plan`: how each CPU
    round samples, see benches.timing.plan.plan_cpu), or that a cold CPU row is cold by
    size.  `make_call(inputs, out)` gives the provider's call on those buffers (a Triton
    row's is bound once to its chosen configs); a cold row's calls rotate over (inputs,
    out) and `copies` of them (made here when not given); `split` gets a CUDA graph's
    capture.  `timer`: the case's timer when the caller already chose it (timer_for)."""
    row = RowCall(case, cfg, inputs, out, make_call or plain_call(case), copies, plan,
                  split if split is not None else TimeSplit())
    return (timer or timer_for(case, cfg)).time(row)


def one_by_one(cfg: SweepContext) -> bool:
    """Whether `iterate` runs each case whole before the next (a GPU sweep, checks only,
    one CPU round), so that the time between two rows is the later row's own; else the
    CPU rounds interleave over chunks of cases."""
    return cfg.target.kind == "cuda" or cfg.check_only or cfg.timing.cpu_rounds <= 1


def iterate(cases: list[Case], cfg: SweepContext, split: TimeSplit | None = None,
            splits: RowSplits | None = None) -> Iterator[tuple[Case, RunRow]]:
    """Run the cases in order, yielding each finished row.  A case whose error leaves
    the CUDA context unusable yields its failed row, then SweepAborted is raised: no
    later case could run, and hundreds of follow-on rows would hide the first error.

    A GPU sweep checks every case of a (kernel, dtype, shape) first, then times the
    providers of each cache mode together (blocks; benches/sweep/gpu_case.py), so that
    they share the GPU's clocks; the rows come out in case order once their block is done.
    `splits` gets each row's own time split where rows run one by one (one_by_one).

    CPU-timed sweeps interleave their rounds (see TimingConfig.cpu_rounds): cases are
    checked and timed for one round in chunks of about cpu_chunk_s seconds, then every
    further round of the chunk is timed in turn, and the chunk's rows are yielded
    together.  An interrupt (or any exception) yields the chunk's rows timed so far,
    over the rounds they completed (n_samples says how many), before it propagates.
    `split` books the sweep's time by phase (benches/sweep/time_split.py)."""
    budget = RunBudget(cfg.timing.row_budget_s, cfg.run_budget_s)
    split = split if split is not None else TimeSplit()
    restore_handlers_after_compiles()
    if one_by_one(cfg):
        yield from _iterate_serial(cases, cfg, budget, split,
                                   splits if splits is not None else RowSplits(),
                                   energy_keys(cases, cfg.request.measurement.energy))
        return
    with copies_frozen():
        yield from _iterate_chunks(cases, cfg, budget, split)


@dataclass
class Pending:
    """A chunk's row waiting for its later CPU rounds: the case's checked inputs (None
    when the cache no longer holds them), the rounds timed so far, the plan of each round
    and a cold row's rotated copies.  `row` is replaced if a later round fails."""

    case: Case
    row: RunRow
    inputs: Inputs | None
    plan: CpuPlan | None
    copies: Copies | None
    rounds: int = 1
    # Its later rounds skipped by the stopping rule (cpu_settled): not cut short.
    settled: bool = False


def _iterate_chunks(cases: list[Case], cfg: SweepContext, budget: RunBudget, split: TimeSplit
                    ) -> Iterator[tuple[Case, RunRow]]:
    """iterate's CPU sweep, its rounds interleaved over chunks of cases."""
    cache = sweep_cache(cfg)
    one_round = replace(cfg, timing=cpu_round_config(cfg.timing))
    chunk: list[Pending] = []
    try:
        start = time.monotonic()
        for i, case in enumerate(cases):
            try:
                row, plan = _budgeted(case, one_round, cache, budget, len(cases) - i,
                                      split)
            except SweepAborted as e:
                yield from _emit(chunk, cfg, "the sweep's abort")
                yield case, e.row
                raise
            # The case's checked inputs, kept for its later rounds (copied per round:
            # ~1 ms, where making them again takes ~100 ms at 2^22 elements), and a cold
            # row's rotated copies (views made once; see benches.sweep.cases.Scratch).
            key = (case.spec.name, case.dtype, case.shape_str)
            mine = cache.key == key
            copies = cache.copies if mine and case.cache == DEFAULT_CACHE else None
            chunk.append(Pending(case, row, cache.inputs if mine else None, plan, copies))
            if time.monotonic() - start >= cfg.timing.cpu_chunk_s:
                _later_rounds(chunk, cfg, one_round, cache, split)
                yield from _emit(chunk, cfg)
                start = time.monotonic()
        _later_rounds(chunk, cfg, one_round, cache, split)
        yield from _emit(chunk, cfg)
    except GeneratorExit:
        raise  # closed by the consumer: nothing may be yielded any more
    except BaseException as e:
        yield from _emit(chunk, cfg, signal_name(e) or type(e).__name__)
        raise
    finally:
        cache.clear()


def _budgeted(case: Case, cfg: SweepContext, cache: InputCache, budget: RunBudget,
              cases_left: int, split: TimeSplit) -> tuple[RunRow, CpuPlan | None]:
    """run_case within the run's budget (benches/sweep/budget.py): on a CPU a case whose path
    cannot fit the row budget is skipped without a call; (row, its CPU rounds' plan)."""
    if cfg.target.kind != "cuda" and not cfg.check_only:
        why = budget.skip_reason(case)
        if why is not None:
            return replace(base_row(case, cfg), status="skipped", reason=why), None
    granted = budget.row(cases_left)
    row = run_case(case, cfg, cache, granted, split)
    python_handlers_back()  # a compile the hook did not see (e.g. async) left LLVM's
    budget.record(case, row, granted)
    return row, granted.plan


def blocks(cases: list[Case], cfg: SweepContext) -> Iterator[list[Case]]:
    """The cases in runs that are checked, then timed, together: on a GPU every case of
    one (kernel, dtype, shape), consecutive in run order (cases.build_cases), whose rows
    of one cache mode are timed together; elsewhere one case at a time."""
    if cfg.target.kind != "cuda" or cfg.check_only:
        for case in cases:
            yield [case]
        return
    block: list[Case] = []
    for case in cases:
        if block and _block_key(block[0]) != _block_key(case):
            yield block
            block = []
        block.append(case)
    if block:
        yield block


def _block_key(case: Case) -> tuple[str, str, str]:
    return case.spec.name, case.dtype, case.shape_str


def _iterate_serial(cases: list[Case], cfg: SweepContext, budget: RunBudget, split: TimeSplit,
                    splits: RowSplits, metered: frozenset[RowKey]
                    ) -> Iterator[tuple[Case, RunRow]]:
    cache = sweep_cache(cfg)
    left = len(cases)
    try:
        for block in blocks(cases, cfg):
            yield from _run_block(block, cfg, cache, budget, left, split, splits, metered)
            left -= len(block)
    finally:
        cache.clear()


def _run_block(block: list[Case], cfg: SweepContext, cache: InputCache, budget: RunBudget,
               cases_left: int, split: TimeSplit, splits: RowSplits,
               metered: frozenset[RowKey] = frozenset()) -> Iterator[tuple[Case, RunRow]]:
    """A block's rows (blocks), in case order: each case checked, then the checked ones
    timed (on a GPU the providers of each cache mode together, benches/sweep/gpu_case.py).
    An interrupt or an abort yields the rows finished so far (and an aborted case's own
    failed row) before it propagates."""
    rows: dict[int, RunRow] = {}
    checked: dict[int, tuple[Checked, RowBudget]] = {}
    try:
        for i, case in enumerate(block):
            if cfg.target.kind != "cuda" and not cfg.check_only and \
                    (why := budget.skip_reason(case)) is not None:
                rows[i] = replace(base_row(case, cfg), status="skipped", reason=why)
                continue
            granted = budget.row(cases_left - i)
            mark = split.mark()
            got = check_case(case, cfg, cache, granted, split)
            python_handlers_back()  # a compile the hook did not see left LLVM's
            splits.add(case.key, split.since(mark))
            if isinstance(got, Checked):
                checked[i] = (got, granted)
            else:
                rows[i] = got
                budget.record(case, got, granted)
        _time_checked(block, checked, rows, cfg, cache, split, splits, metered)
        for i, (_, granted) in checked.items():
            budget.record(block[i], rows[i], granted)
    except GeneratorExit:
        raise
    except SweepAborted as e:
        yield from ((block[i], rows[i]) for i in sorted(rows))
        yield next((c for c in block if c.key == e.row.key), block[0]), e.row
        raise
    except BaseException:
        yield from ((block[i], rows[i]) for i in sorted(rows))
        raise
    yield from ((block[i], rows[i]) for i in range(len(block)))


def _time_checked(block: list[Case], checked: dict[int, tuple[Checked, RowBudget]],
                  rows: dict[int, RunRow], cfg: SweepContext, cache: InputCache,
                  split: TimeSplit, splits: RowSplits, metered: frozenset[RowKey]) -> None:
    """Time a block's checked cases into `rows`: on a GPU those of each cache mode
    together, in the order the modes come; on a CPU each alone."""
    if cfg.target.kind != "cuda":
        for i, (item, granted) in checked.items():
            mark = split.mark()
            rows[i] = _time_cpu(item, cfg, cache, granted, split)
            python_handlers_back()
            splits.add(block[i].key, split.since(mark))
        return
    for mode in dict.fromkeys(block[i].cache for i in checked):
        idx = [i for i in checked if block[i].cache == mode]
        got = time_gpu_case([checked[i][0] for i in idx], [checked[i][1] for i in idx],
                            cfg, cache, split, splits, metered)
        python_handlers_back()
        rows.update(zip(idx, got, strict=True))


def _later_rounds(chunk: list[Pending], cfg: SweepContext, one_round: SweepContext,
                  cache: InputCache, split: TimeSplit) -> None:
    """Rounds 2..cpu_rounds of a chunk's CPU-timed rows, round by round over the chunk,
    each on fresh copies of the case's inputs and a fresh output.  A row's samples grow
    by whole rounds only.  The cache keeps its case: the chunk's next one may be its
    other provider or cache mode, whose inputs and float64 reference it shares."""
    for _ in range(1, cfg.timing.cpu_rounds):
        for item in chunk:
            row = item.row
            if not row.ok or row.timing.timer not in CPU_TIMERS \
                    or item.inputs is None or item.settled:
                continue
            if cpu_settled(list(row.timing.samples_ms), item.rounds, cfg.timing):
                item.settled = True  # its later rounds are skipped
                continue
            _one_more_round(item, cfg, one_round, cache, split)


def _one_more_round(item: Pending, cfg: SweepContext, one_round: SweepContext,
                    cache: InputCache, split: TimeSplit) -> None:
    """One later round of a pending row: its samples grown, or the row failed."""
    case, row = item.case, item.row
    assert item.inputs is not None
    compiles = case.spec.providers[case.provider].compiles
    try:
        with split.phase("inputs"):
            ins = clone_inputs(item.inputs)
            out = case.spec.alloc_out(ins, case.dtype)
        before = compile_mark(compiles)
        with split.phase("timing"):
            timing, _ = time_case(case, one_round, ins, out, plan=item.plan,
                                  copies=item.copies)
        if (again := recompile_note(compiles, before)) not in (row.reason or ""):
            row = row.with_note(again)
    except Exception as e:
        # A kernel that raises in a later round failed: no timing is kept.
        failed = replace(base_row(case, cfg), check=row.check)
        item.row = error_row(failed, e, case, cfg, cache, " while timing")
        return
    item.row = replace(row, timing=replace(
        row.timing, samples_ms=row.timing.samples_ms + tuple(timing.samples_ms)))
    item.rounds += 1


def cut_short(row: RunRow) -> bool:
    """An ok row whose CPU rounds were cut short by an interrupt (its Timing.cut_short,
    see _emit): --resume times it again in full."""
    return row.ok and bool(row.timing.cut_short)


def _emit(chunk: list[Pending], cfg: SweepContext, stopped_by: str = ""
          ) -> Iterator[tuple[Case, RunRow]]:
    """Yield (and remove) the chunk's rows, each CPU-timed one summarised over all its
    samples; a row cut short (by `stopped_by`) records its rounds in its Timing's
    cut_short and says so in its reason.  A row leaves the chunk only as it is yielded,
    so an interrupt while one is summarised loses none."""
    while chunk:
        case, row, rounds = chunk[0].case, chunk[0].row, chunk[0].rounds
        if row.ok and row.timing.timer in CPU_TIMERS:
            reason = row.reason or ""
            planned = cfg.timing.cpu_rounds
            if rounds < planned and not chunk[0].settled:
                row = replace(row, timing=replace(row.timing,
                                                  cut_short=f"{rounds}/{planned}"))
                reason = (f"timed in {rounds} of {planned} rounds only "
                          f"(stopped by {stopped_by or 'an error'})")
            row = set_timing(row, case, cfg,
                             summarize(list(row.timing.samples_ms), row.timing.timer), reason)
        chunk.pop(0)
        yield case, row
