"""The sweep: for every (kernel, provider, dtype, shape) check correctness against the
float64 reference, time it in each cache mode asked (cold: caches flushed or rotated
past; warm: back-to-back calls on the same buffers), derive the roofline metrics, and hand
the row over (benches/sweep/results.py writes it); on a CPU, timing rounds interleaved over
chunks of cases.

Names imported `X as X` are re-exported: they lived here before the sweep was split into
cases, failures, results and gpu_monitor.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

from benches.sweep import energy, kernel_time
from benches.sweep.budget import RowBudget, RunBudget
from benches.sweep.cases import (
    Case,
    Copies,
    InputCache,
    MakeCall,
    RunConfig,
    base_row,
    clone_inputs,
    copies_frozen,
    roofs_of,
)
from benches.sweep.failures import (
    SweepAborted,
    compile_error_types,
    error_message,
    is_oom,
    is_sticky_cuda_error,
)
from benches.sweep.gpu_monitor import (
    gpu_monitor,
    time_unthrottled,
)
from benches.sweep.interrupt import (
    python_handlers_back,
    restore_handlers_after_compiles,
    signal_name,
)
from benches.sweep.phases import TimeSplit
from benches.sweep.row_setup import (
    bound_triton_call,
    first_call_tunes,
    footprint_reason,
    shipped_configs_of,
    triton_launches_of,
)
from benches.sweep.timers import CPU_TIMERS, RowCall, RowTimer, sweep_cache, timer_for
from benches.timing.clock import Timing, summarize
from benches.timing.plan import CpuPlan, OverBudget, cpu_round_config, plan_cpu
from benches.timing.stopping import cpu_settled
from contract import metrics
from contract.ceilings import NO_ROOF_BELOW_FP32
from contract.schema import CUT_SHORT, DEFAULT_CACHE, SAMPLES, Row
from kernels import DTYPES, Target
from kernels.compiled import compile_mark, first_call, recompile_note
from kernels.shipped import retune_requested
from kernels.spec import UnsupportedShape
from kernels.triton_utils import (
    configs_text,
    parse_configs,
    run_launch_with,
    sources_text,
)


def _sync(target: Target) -> None:
    if target.kind == "cuda":
        torch.cuda.synchronize()


def run_case(case: Case, cfg: RunConfig, cache: InputCache,
             budget: RowBudget | None = None, split: TimeSplit | None = None
             ) -> Row:
    """One row: skipped, failed (wrong result or the kernel raised) or ok (correct and
    timed).  Raises SweepAborted (carrying the failed row) on a sticky CUDA error.

    On a CPU the checked call is timed: it sizes the row's samples within its budget
    (`budget`: the run's share; its call_s and plan are filled in), and a row whose
    minimum samples cannot fit the row budget is skipped after its check.  `split` books
    the row's time by phase (benches/sweep/phases.py)."""
    budget = budget if budget is not None else RowBudget()
    split = split if split is not None else TimeSplit()
    row = base_row(case, cfg)
    reason = case.spec.skip_reason(case.provider, case.dtype, cfg.target)
    if reason is None and case.provider == "triton" and cfg.target.kind != "cuda" \
            and not cfg.check_only:
        reason = "Triton on the CPU runs only in the interpreter: checked, not timed (--check-only)"
    reason = reason or footprint_reason(case, cfg)
    if reason:
        row.update(status="skipped", reason=reason)
        return row
    spec, dtype = case.spec, case.dtype
    fn = spec.providers[case.provider].fn
    compiles = spec.providers[case.provider].compiles
    make_call: MakeCall | None = None
    try:
        with split.phase("inputs"):
            inputs = cache.get(case, cfg)
            out = spec.alloc_out(inputs, dtype)
        # First call untimed: an autotuned kernel tunes here, running every candidate
        # config into `out`.  Only then is `out` poisoned, so an element the chosen
        # config fails to write stays NaN instead of holding another config's answer.
        launches = triton_launches_of(case, cfg, inputs, out)
        forced = cfg.configs.get(case.key)
        shipped, not_shipped = shipped_configs_of(case, cfg, launches, forced)
        retune = retune_requested()
        tunes = first_call_tunes(launches, forced, cfg) and (retune or any(
            s is None and len(ln.configs) > 1 for ln, s in zip(launches or [], shipped,
                                                               strict=True)))
        config_note = ""
        with split.phase("tune" if tunes else "check"):
            if launches is None:
                row["compile_s"] = first_call(lambda: fn(inputs, out), compiles,
                                              lambda: _sync(cfg.target))
                call: Callable[[], object] = lambda: fn(inputs, out)  # noqa: E731
            else:
                # A Triton row runs (and records) its chosen configs; re-timing passes
                # the confirmed row's configs in, so it never tunes to another one; a
                # shipped config (kernels/shipped.py) runs untuned unless --retune.
                chosen = parse_configs(launches, forced) if forced else [None] * len(launches)
                ran_with = [run_launch_with(ln, c, s, retune) for ln, c, s in
                            zip(launches, chosen, shipped, strict=True)]
                chosen = [r.config for r in ran_with]
                call = lambda: fn(inputs, out)  # noqa: E731
                # Why a launch tuned where a shipped config could have run, and under
                # --retune how the shipped config timed: in the row's reason.
                config_note = "; ".join(x for x in (
                    not_shipped if any(r.source in ("tuned", "cached") for r in ran_with)
                    else "", *(r.note for r in ran_with)) if x)
                if all(c is not None for c in chosen):
                    row["config"] = configs_text(launches, chosen)
                    row["config_source"] = sources_text(ran_with)
                    make_call = bound_triton_call(case, cfg, chosen)
                    call = make_call(inputs, out)
        with split.phase("check"):
            _sync(cfg.target)
            out.fill_(float("nan"))
            t0 = time.perf_counter()
            result = call()
            result = out if result is None else result
            _sync(cfg.target)
            budget.call_s = time.perf_counter() - t0
            with split.phase("inputs"):
                ref = cache.reference(case)
            rel_err = spec.check(result, inputs, dtype, ref=ref)
            # What a library provider ran (SDPA's backend): one more call, untimed.
            backend = spec.providers[case.provider].backend
            ran = "; ".join(x for x in (backend(call) if backend is not None else "",
                                        config_note) if x)
    except Exception as e:
        return _error_row(row, e, case, cfg, cache, "")
    finite = rel_err != float("inf")
    row["rel_err"] = rel_err if finite else None
    row["correct"] = bool(rel_err <= DTYPES[dtype].tol)
    if not row["correct"]:
        why = (f"rel_err {rel_err:.3g} > tolerance {DTYPES[dtype].tol:g}" if finite else
               "output holds NaN/inf (unwritten or overflowed elements)")
        row.update(status="failed", reason=why)
        return row
    if cfg.check_only:
        row.update(status="ok", reason="; ".join(
            x for x in ("check-only: not timed", ran, spec.roof_note(dtype, cfg.target)) if x))
        return row
    if cfg.target.kind != "cuda":
        try:
            # The plan is per round (a one-round config when the sweep interleaves).
            round_cfg = cpu_round_config(cfg.timing)
            share = None if budget.share_s is None \
                else budget.share_s / round_cfg.cpu_rounds_of_row
            budget.plan = plan_cpu(budget.call_s, round_cfg, share)
        except OverBudget as e:
            row.update(status="skipped", reason=str(e))
            return row
    # On a GPU the NVML window covers the timing only: not the inputs, the float64
    # reference, compilation or autotuning above, whose idle clocks and power events say
    # nothing about the samples.
    monitor = gpu_monitor() if cfg.target.kind == "cuda" else None
    clocks: dict[str, Any] = {}
    try:
        timer = timer_for(case, cfg)
        with split.phase("inputs"):
            copies = timer.copies(RowCall(case, cfg, inputs, out, make_call or _plain_call(case)),
                                  cache)

        def timed() -> tuple[Timing, str]:
            with split.phase("timing"):
                return time_case(case, cfg, inputs, out, make_call, budget.plan, copies,
                                 split, timer)

        meter = energy.row_meter(monitor, cfg.target.kind)  # energy over the samples
        before = compile_mark(compiles)
        if monitor is None:
            timing, note = meter.around(timed)
        else:
            timing, note, clocks = time_unthrottled(timed, monitor, cfg.throttle)
        recompiled = recompile_note(compiles, before)
        if cfg.target.kind == "cuda":  # kernel-only time and library: torch.profiler
            with split.phase("profile"):
                kcols, knote = kernel_time.row_columns(call, budget.call_s, case.provider)
            clocks.update(kcols)
            note = "; ".join(x for x in (note, knote) if x)
    except Exception as e:
        return _error_row(row, e, case, cfg, cache, " while timing")
    row = _set_timing(row, case, cfg, timing,
                      "; ".join(x for x in (note, ran, recompiled) if x))
    row.update(clocks)
    row.update(meter.columns(row))
    return row


def _error_row(row: Row, e: BaseException, case: Case, cfg: RunConfig,
               cache: InputCache, stage: str) -> Row:
    """The row of a case whose kernel raised.  Only a shape the library rejects and
    out-of-memory are `skipped` (cannot run here by design); a compile error, a CUDA
    error or any other exception is `failed`.  A sticky CUDA error raises SweepAborted."""
    msg = error_message(e)
    if is_sticky_cuda_error(e):
        row.update(status="failed",
                   reason=f"CUDA error{stage} (context unusable, sweep aborted): {msg}")
        raise SweepAborted(row, f"{case.label}: {msg}") from e
    if isinstance(e, UnsupportedShape):
        row.update(status="skipped", reason=str(e))
    elif is_oom(e) and not isinstance(e, compile_error_types()):
        cache.clear()
        if cfg.target.kind == "cuda":
            torch.cuda.empty_cache()
        row.update(status="skipped", reason=f"out of memory at this shape{stage} ({msg})")
    elif isinstance(e, compile_error_types()):
        row.update(status="failed", reason=f"Triton compile error: {msg}")
    elif "cuda" in str(e).lower() or type(e).__name__ == "AcceleratorError":
        row.update(status="failed", reason=f"CUDA error{stage}: {msg}")
    else:
        row.update(status="failed", reason=f"kernel raised{stage}: {msg}")
    return row


def _set_timing(row: Row, case: Case, cfg: RunConfig, timing: Timing,
                note: str) -> Row:
    rc = case.spec.roof_class(case.dtype, cfg.target)
    note = "; ".join(x for x in (note, case.spec.roof_note(case.dtype, cfg.target)) if x)
    if rc in cfg.ceilings.no_roofs() and cfg.ceilings.peak_tflops(rc) is None:
        # Said in the row, where its MFU would be (contract.ceilings.no_roofs).
        no_roof = (f"no {rc} compute roof here (measured under {NO_ROOF_BELOW_FP32:g}x "
                   "fp32's): no MFU")
        if no_roof not in note:
            note = "; ".join(x for x in (note, no_roof) if x)
    row.update(ms_median=timing.ms_median, ms_p20=timing.ms_p20, ms_p80=timing.ms_p80,
               n_samples=timing.n_samples, timer=timing.timer, status="ok", reason=note,
               host_us=timing.host_us)
    row[SAMPLES] = list(timing.samples_ms)
    row.update(metrics.derive(row["flops"], row["bytes"], timing.ms_median,
                              *roofs_of(case, cfg)))
    return row


def _plain_call(case: Case) -> MakeCall:
    prov = case.spec.providers[case.provider]
    if prov.bind is not None:  # a compiled provider: its graph looked up once per buffers
        return prov.bind
    return lambda ins, o: (lambda: prov.fn(ins, o))


def time_case(case: Case, cfg: RunConfig, inputs: dict[str, Any], out: torch.Tensor,
              make_call: MakeCall | None = None, plan: CpuPlan | None = None,
              copies: Copies | None = None, split: TimeSplit | None = None,
              timer: RowTimer | None = None) -> tuple[Timing, str]:
    """(timing, note) of a checked case by its timer (benches/sweep/timers.py): the note says
    why a CUDA-graph case fell back to events or what bound its graph, that a CPU row's
    budget cut its samples (`plan`: how each CPU round samples, see
    benches.timing.plan.plan_cpu), or that a cold CPU row is cold by size.
    `make_call(inputs, out)` gives the provider's call on those buffers (a Triton row's is
    bound once to its chosen configs); a cold row's calls rotate over (inputs, out) and
    `copies` of them (made here when not given); `split` gets a CUDA graph's capture.
    `timer`: the case's timer when the caller already chose it (timer_for)."""
    row = RowCall(case, cfg, inputs, out, make_call or _plain_call(case), copies, plan,
                  split if split is not None else TimeSplit())
    return (timer or timer_for(case, cfg)).time(row)


def one_by_one(cfg: RunConfig) -> bool:
    """Whether `iterate` runs each case whole before the next (a GPU sweep, checks only,
    one CPU round), so that the time between two rows is the later row's own; else the
    CPU rounds interleave over chunks of cases."""
    return cfg.target.kind == "cuda" or cfg.check_only or cfg.timing.cpu_rounds <= 1


def iterate(cases: list[Case], cfg: RunConfig, split: TimeSplit | None = None
            ) -> Iterator[tuple[Case, Row]]:
    """Run the cases in order, yielding each finished row.  A case whose error leaves
    the CUDA context unusable yields its failed row, then SweepAborted is raised: no
    later case could run, and hundreds of follow-on rows would hide the first error.

    CPU-timed sweeps interleave their rounds (see TimingConfig.cpu_rounds): cases are
    checked and timed for one round in chunks of about cpu_chunk_s seconds, then every
    further round of the chunk is timed in turn, and the chunk's rows are yielded
    together.  An interrupt (or any exception) yields the chunk's rows timed so far,
    over the rounds they completed (n_samples says how many), before it propagates.
    `split` books the sweep's time by phase (benches/sweep/phases.py)."""
    budget = RunBudget(cfg.timing.row_budget_s, cfg.run_budget_s)
    split = split if split is not None else TimeSplit()
    restore_handlers_after_compiles()
    if one_by_one(cfg):
        yield from _iterate_serial(cases, cfg, budget, split)
        return
    with copies_frozen():
        yield from _iterate_chunks(cases, cfg, budget, split)


@dataclass
class Pending:
    """A chunk's row waiting for its later CPU rounds: the case's checked inputs (None
    when the cache no longer holds them), the rounds timed so far, the plan of each round
    and a cold row's rotated copies.  `row` is replaced if a later round fails."""

    case: Case
    row: Row
    inputs: dict[str, Any] | None
    plan: CpuPlan | None
    copies: Copies | None
    rounds: int = 1
    # Its later rounds skipped by the stopping rule (cpu_settled): not cut short.
    settled: bool = False


def _iterate_chunks(cases: list[Case], cfg: RunConfig, budget: RunBudget, split: TimeSplit
                    ) -> Iterator[tuple[Case, Row]]:
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


def _budgeted(case: Case, cfg: RunConfig, cache: InputCache, budget: RunBudget,
              cases_left: int, split: TimeSplit) -> tuple[Row, CpuPlan | None]:
    """run_case within the run's budget (benches/sweep/budget.py): on a CPU a case whose path
    cannot fit the row budget is skipped without a call; (row, its CPU rounds' plan)."""
    if cfg.target.kind != "cuda" and not cfg.check_only:
        why = budget.skip_reason(case)
        if why is not None:
            row = base_row(case, cfg)
            row.update(status="skipped", reason=why)
            return row, None
    granted = budget.row(cases_left)
    row = run_case(case, cfg, cache, granted, split)
    python_handlers_back()  # a compile the hook did not see (e.g. async) left LLVM's
    budget.record(case, row, granted)
    return row, granted.plan


def _iterate_serial(cases: list[Case], cfg: RunConfig, budget: RunBudget, split: TimeSplit
                    ) -> Iterator[tuple[Case, Row]]:
    cache = sweep_cache(cfg)
    try:
        for i, case in enumerate(cases):
            try:
                row, _ = _budgeted(case, cfg, cache, budget, len(cases) - i, split)
            except SweepAborted as e:
                yield case, e.row
                raise
            yield case, row
    finally:
        cache.clear()


def _later_rounds(chunk: list[Pending], cfg: RunConfig, one_round: RunConfig,
                  cache: InputCache, split: TimeSplit) -> None:
    """Rounds 2..cpu_rounds of a chunk's CPU-timed rows, round by round over the chunk,
    each on fresh copies of the case's inputs and a fresh output.  A row's samples grow
    by whole rounds only.  The cache keeps its case: the chunk's next one may be its
    other provider or cache mode, whose inputs and float64 reference it shares."""
    for _ in range(1, cfg.timing.cpu_rounds):
        for item in chunk:
            case, row = item.case, item.row
            if row["status"] != "ok" or row.get("timer") not in CPU_TIMERS \
                    or item.inputs is None or item.settled:
                continue
            if cpu_settled(row[SAMPLES], item.rounds, cfg.timing):
                item.settled = True  # its later rounds are skipped
                continue
            compiles = case.spec.providers[case.provider].compiles
            try:
                with split.phase("inputs"):
                    ins = clone_inputs(item.inputs)
                    out = case.spec.alloc_out(ins, case.dtype)
                before = compile_mark(compiles)
                with split.phase("timing"):
                    timing, _ = time_case(case, one_round, ins, out, plan=item.plan,
                                          copies=item.copies)
                if (again := recompile_note(compiles, before)) not in (row["reason"] or ""):
                    row["reason"] = "; ".join(x for x in (row["reason"], again) if x)
            except Exception as e:
                # A kernel that raises in a later round failed: no timing is kept.
                failed = base_row(case, cfg)
                failed.update(rel_err=row["rel_err"], correct=row["correct"])
                item.row = _error_row(failed, e, case, cfg, cache, " while timing")
                continue
            row[SAMPLES] = row[SAMPLES] + list(timing.samples_ms)
            item.rounds += 1


def cut_short(row: Row) -> bool:
    """An ok row whose CPU rounds were cut short by an interrupt (its CUT_SHORT field, see
    _emit): --resume times it again in full."""
    return row.get("status") == "ok" and bool(row.get(CUT_SHORT))


def _emit(chunk: list[Pending], cfg: RunConfig, stopped_by: str = ""
          ) -> Iterator[tuple[Case, Row]]:
    """Yield (and remove) the chunk's rows, each CPU-timed one summarised over all its
    samples; a row cut short (by `stopped_by`) records its rounds in CUT_SHORT and says
    so in its reason.  A row leaves the chunk only as it is yielded, so an interrupt
    while one is summarised loses none."""
    while chunk:
        case, row, rounds = chunk[0].case, chunk[0].row, chunk[0].rounds
        if row["status"] == "ok" and row.get("timer") in CPU_TIMERS:
            reason = row["reason"]
            planned = cfg.timing.cpu_rounds
            if rounds < planned and not chunk[0].settled:
                row[CUT_SHORT] = f"{rounds}/{planned}"
                reason = (f"timed in {rounds} of {planned} rounds only "
                          f"(stopped by {stopped_by or 'an error'})")
            _set_timing(row, case, cfg, summarize(row[SAMPLES], row["timer"]), reason)
        chunk.pop(0)
        yield case, row
