"""The main job behind run_bench.py: validate the request, resolve the device, measure
or load ceilings, run the sweep with a progress bar, then plots, summary and compare."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from benches.measured_ceilings import get_ceilings
from benches.sweep import gpu_monitor, runner, triton_cache
from benches.sweep.budget import DEFAULT_CPU_RUN_BUDGET_S
from benches.sweep.cases import Case, SweepContext, build_cases
from benches.sweep.console import console, print_devices, print_kernels, print_summary
from benches.sweep.gpu_monitor import nvml_snapshot
from benches.sweep.interrupt import Terminated, exit_code, signal_name
from benches.sweep.nvml_doc import NvmlFacts
from benches.sweep.results import ResultWriter, busy_cpu_warning, collect_metadata, load_average
from benches.sweep.retime import RETIME_ROUNDS, Retimer, RetimeSettings
from benches.sweep.run_folder import (
    check_run_id,
    new_run_dir,
    read_run_doc,
    writable_dir,
)
from benches.sweep.shapes import ShapeError
from benches.sweep.throttle import ThrottleConfig, run_clock_facts
from benches.sweep.time_split import RowSplits, TimeSplit, compiles_booked
from benches.timing.plan import TimingConfig
from contract.ceilings import Ceilings
from contract.devices import DeviceError, DeviceModel, Present, resolve_device
from contract.record import RunRow
from contract.request import RequestError, RunRequest, resumed_request
from contract.run_meta import RunMeta
from contract.schema import RESULTS_JSON, RowKey, RunDoc, RunLoadError, parse_row_key
from contract.versions import check_versions, warning_line
from kernels import spec as kernel_spec
from kernels.shipped import RETUNE_ENV, shipped_for
from kernels.spec import Target, interpreter_enabled
from kernels.tuning import identity_text, keep_tuning, set_device_identity
from roofline.gate.rules import CompareError, parse_allow
from roofline.gate.runs import check_baseline
from roofline.report.run_time import time_split_line

USER_ERRORS: tuple[type[Exception], ...] = (ShapeError, DeviceError, RunLoadError,
                                             CompareError, RequestError)


def finish_run(writer: ResultWriter, run_dir: Path, plots: bool) -> None:
    """Figures and summary.md from whatever rows exist (also after an interrupt)."""
    doc = RunDoc(writer.meta, tuple(writer.rows), run_dir / RESULTS_JSON)
    try:
        from contract.schema import ROOFLINE_PNG, SCALING_PNG
        from roofline.report.plot import plot_roofline
        from roofline.report.plot_scaling import plot_scaling
        from roofline.report.summary import write_summary

        if plots:
            import matplotlib.pyplot as plt

            plt.close(plot_roofline(doc, run_dir / ROOFLINE_PNG))
            plt.close(plot_scaling(doc, run_dir / SCALING_PNG))
        write_summary(run_dir, doc)
    except Exception as e:  # a plotting problem must not lose the measurements
        console.print(f"[yellow]warning[/yellow]: figures/summary failed: "
                      f"{type(e).__name__}: {e}")


def compare_retimer(cases: list[Case], cfg: SweepContext, rows: list[RunRow]
                    ) -> Callable[[list[RowKey]], dict[RowKey, list[list[float]]]]:
    """The compare step's `retime` callback: this run's settings, the rows of its cases
    only (benches/sweep/retime.py's Retimer)."""
    settings = RetimeSettings(cfg.selection.seed, kernel_spec.fp8_accum(), cfg.ceilings,
                              cfg.throttle)
    client = Retimer(cfg.model.key, settings, rows,
                     say=lambda text: console.print(f"[yellow]warning[/yellow]: {text}"))
    ours = {c.key for c in cases}

    def retime(keys: list[RowKey]) -> dict[RowKey, list[list[float]]]:
        todo = [k for k in map(parse_row_key, keys) if k in ours]
        if todo:
            console.print(f"re-timing {len(todo)} rows that look slower ({RETIME_ROUNDS} "
                          "rounds, each in a fresh process)")
        return client(todo)

    return retime


def _ceilings_dir(req: RunRequest, out_root: Path) -> Path:
    """The ceiling cache: <out>/.ceilings, or the fleet rank's own (its cache_dir)."""
    own = req.ceilings.cache_dir
    return Path(own) if own else out_root / ".ceilings"


def timing_config(req: RunRequest) -> TimingConfig:
    row = req.budgets.row
    return TimingConfig() if row is None else TimingConfig(row_budget_s=row)


def run_budget_s_of(req: RunRequest, present: Present) -> float | None:
    """--run-budget: seconds, None for none ('inf'); by default the CPU's (a GPU's sweep
    is bounded by its rows' budgets alone)."""
    v = req.budgets.run
    if v is None:
        return DEFAULT_CPU_RUN_BUDGET_S if present.kind != "cuda" else None
    return None if math.isinf(v) else float(v)


def sweep_context(req: RunRequest, model: DeviceModel, present: Present,
                  interpret: bool | None = None) -> SweepContext:
    """The sweep's context: the request and what the run resolved from it (the device,
    the target, the timing and throttle configurations, the run budget), its ceilings
    still unknown; `interpret`: Triton's interpreter (default: as this process has it)."""
    interpret = interpreter_enabled() if interpret is None else interpret
    meas = req.measurement
    return SweepContext(
        request=req, model=model, present=present,
        target=Target(present.kind, present.capability, interpret, present.name),
        timing=timing_config(req), run_budget_s=run_budget_s_of(req, present),
        throttle=ThrottleConfig(threshold_pct=meas.throttle_threshold,
                                recovery_delay_s=meas.throttle_recovery_delay))


@dataclass(frozen=True)
class Checked:
    """The request as checked before anything is measured (a resume's: the run's own
    settings), with what it resolved to; `resumed`: the resumed run's folder, metadata
    and rows (None for a new run)."""
    cfg: SweepContext
    cases: list[Case]
    resumed: Resumed | None
    allow: frozenset[str]

    @property
    def req(self) -> RunRequest:
        return self.cfg.request


@dataclass(frozen=True)
class Resumed:
    """A run to resume: its folder, metadata and rows, as read."""
    run_dir: Path
    meta: RunMeta
    rows: list[RunRow]


@dataclass(frozen=True)
class Opened:
    """The run's folder (new or resumed), its output root, its writer (which holds its
    metadata as it goes) and the cases it has still to measure."""
    run_dir: Path
    out_root: Path
    writer: ResultWriter
    todo: list[Case]


@dataclass(frozen=True)
class Measured:
    """How the measuring ended: its exit code so far (0, or an abort's or interrupt's),
    the stage it reached ('ceilings' or 'sweep') and the context with its ceilings."""
    code: int
    stage: str
    cfg: SweepContext


def run(req: RunRequest, argv: list[str],
        on_cases: Callable[[list[Case]], None] | None = None,
        started: float | None = None,
        early: triton_cache.CompileAhead | None = None) -> int:
    """One run of the request; `on_cases` sees the selected cases before any folder is
    made or anything measured (a fleet's ranks agree on them there: benches/fleet/run.py);
    `started`: the perf_counter reading at which the process started; `early`: the
    compile-ahead workers the command started at its start (triton_cache.spawn_early),
    given the sweep's jobs when the ceilings are measured; the caller stops them where
    the run never gets there."""
    # From the process's start when run as the command (start-up and imports count),
    # else from here (a caller's process: tests, a notebook).
    split = TimeSplit(start=started)
    # ---- everything the run needs is checked before any ceiling or kernel is measured
    chk = _check(req, on_cases)
    opened = _open(chk, argv)
    _gpu_setup(chk, opened.writer)
    measured = _measure(chk, opened, split, early)
    return _finish(chk, opened, split, measured)


def _check(req: RunRequest, on_cases: Callable[[list[Case]], None] | None) -> Checked:
    """Everything the run needs, checked before any ceiling or kernel is measured (and
    before any folder is made): the request, the device, the baseline, the cases."""
    allow = parse_allow(req.gate.allow)
    resumed: Resumed | None = None
    if req.output.resume:
        resumed = Resumed(*read_run_doc(req.output.resume))
        req = resumed_request(req, resumed.meta)  # the run's own settings
    elif req.output.run_id is not None:
        check_run_id(req.output.run_id)
    if req.device.fp8_accum:
        kernel_spec.set_fp8_accum(req.device.fp8_accum)
    triton_cache.wait_s()  # a bad GPUBENCH_COMPILE_WAIT_S: refused before the ceilings
    triton_cache.default_workers()  # and a bad GPUBENCH_COMPILE_WORKERS
    dev = resolve_device(req.device.key)
    present, model = dev.present, dev.model
    _warn_of(dev.warnings, model.kind == "cpu" and not req.selection.check_only)
    was = resumed.meta.device.detected_key if resumed is not None else None
    if was not in (None, present.key):
        raise RequestError(f"cannot resume a run of '{was}' on '{present.key}'")
    if req.gate.compare:
        # A bad baseline found after the sweep would waste the whole (GPU) run.
        check_baseline(req.gate.compare, model.key,
                       allow_device_mismatch=req.gate.allow_device_mismatch)
    cfg = sweep_context(req, model, present)
    cases = build_cases(cfg)
    if not cases:
        raise RequestError("nothing to run: no selected kernel has a selected dtype and "
                           "shape (check --kernels, --dtypes and --sizes)")
    if on_cases is not None:
        on_cases(cases)
    return Checked(cfg=cfg, cases=cases, resumed=resumed, allow=allow)


def _warn_of(device_warnings: Sequence[str], timed_on_a_cpu: bool) -> None:
    """The warnings a run starts with: the device's, untested versions, a busy CPU."""
    for w in device_warnings:
        console.print(f"[yellow]warning[/yellow]: {w}")
    untested = warning_line(check_versions())
    if untested:
        console.print(f"[yellow]warning[/yellow]: {untested}")
    if timed_on_a_cpu:
        import torch

        busy = busy_cpu_warning(load_average(), os.cpu_count(), torch.get_num_threads())
        if busy:
            console.print(f"[yellow]warning[/yellow]: {busy}")


def _open(chk: Checked, argv: list[str]) -> Opened:
    """The run's folder: a new one with its metadata, or the resumed one with a record of
    this resume; its writer, and the cases not yet measured."""
    req, cfg = chk.req, chk.cfg
    if chk.resumed is None:
        out_root = writable_dir(Path(req.output.out), "--out")
        writable_dir(_ceilings_dir(req, out_root), "ceiling cache")
        run_dir = new_run_dir(writable_dir(out_root / cfg.model.key, "device folder"),
                               req.output.run_id)
        meta = collect_metadata(cfg, run_dir.name, ["run_bench.py", *argv])
        rows: list[RunRow] = []
    else:
        run_dir = chk.resumed.run_dir
        writable_dir(run_dir, "run folder")
        out_root = run_dir.parent.parent  # <out>/<device>/<run-id>: the ceiling cache's root
        meta, rows = _resumed_meta(chk.resumed, req, argv)
    meta = meta.updated(state__interrupted=False, state__aborted=False,
                        state__abort_reason=None, state__complete=False)
    writer = ResultWriter(run_dir, meta, rows)
    done = {r.key for r in rows}
    todo = [c for c in chk.cases if c.key not in done]
    return Opened(run_dir=run_dir, out_root=out_root, writer=writer, todo=todo)


def _resumed_meta(resumed: Resumed, req: RunRequest, argv: list[str]
                  ) -> tuple[RunMeta, list[RunRow]]:
    """A resumed run's metadata with a record of this resume, and the rows it keeps:
    rows an interrupt cut short (timed in fewer rounds than the rest) are timed again
    in full, and their new rows replace them."""
    meta = resumed.meta
    if meta.request_from_old_keys:
        # A run written before the request was stored keeps the one rebuilt from its
        # old keys, so that its next resume reads it as any other.
        meta = replace(meta, request=req.to_json(), request_from_old_keys=False)
    short = [r for r in resumed.rows if runner.cut_short(r)]
    rows = [r for r in resumed.rows if not runner.cut_short(r)]
    resume = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["run_bench.py", *argv]),
              "rows_before": len(rows) + len(short), "retimed_cut_short": len(short),
              # the split of the process before (time_split_s: this one's)
              "time_split_s": meta.time.time_split_s or None, "wall_s": meta.time.wall_s}
    meta = meta.updated(state__resumed=(*meta.state.resumed, resume),
                        time__time_split_s={}, time__wall_s=None)
    return meta, rows


def _gpu_setup(chk: Checked, writer: ResultWriter) -> None:
    """A compiled GPU run's tuning set-up: tunings kept on disk under this GPU's identity,
    the configs shipped for its model, and --retune for the launches."""
    cfg, present = chk.cfg, chk.cfg.present
    if present.kind != "cuda" or cfg.target.interpret:
        return
    # Tunings on disk are keyed by this GPU's identity (kernels/tuning.py).
    clock = NvmlFacts.of(writer.meta.telemetry.nvml_start).max_sm_clock_mhz
    identity = identity_text(present.name, present.sms, present.memory_gb,
                             present.l2_mb, clock)
    writer.update(compiles__autotune_on_disk=keep_tuning(),
                  compiles__tuning_identity=identity)
    set_device_identity(identity)
    # The tuned configs shipped for this GPU model (kernels/configs/), or why none.
    writer.update(compiles__shipped_configs=shipped_for(
        present.name, present.sms, present.memory_gb).to_json())
    if chk.req.triton.retune:  # read where the launches are made, and by re-timing children
        os.environ[RETUNE_ENV] = "1"


def _measure(chk: Checked, opened: Opened, split: TimeSplit,
             early: triton_cache.CompileAhead | None = None) -> Measured:
    """The ceilings (the sweep's kernels compiling ahead meanwhile, and waited for after:
    triton_cache.after_ceilings), then the sweep; an abort or an interrupt ends it with
    its exit code, at the stage it reached."""
    cfg, writer, run_dir = chk.cfg, opened.writer, opened.run_dir
    code, stage = 0, "ceilings"
    try:
        with split.phase("write"):
            writer.flush()  # the folder holds a readable (empty) run from the start
        cfg = _ceilings(chk, opened, split, early)
        stage = "sweep"
        with compiles_booked(split):
            _sweep(opened.todo, len(chk.cases), cfg, writer, run_dir, split)
        writer.update(state__complete=True)
    except runner.SweepAborted as e:
        c = e.row.case
        meta = writer.update(state__aborted=True, state__abort_reason=(
            f"{c.kernel} {c.provider} {c.dtype} {c.shape}: {e.reason}"))
        console.print(f"[red]ABORTED[/red]: {meta.state.abort_reason}; the CUDA context is "
                      f"unusable, {len(writer.rows)} rows kept (resume with --resume {run_dir})")
        code = 3
    except (KeyboardInterrupt, Terminated) as e:
        writer.update(state__interrupted=True, state__signal=signal_name(e))
        console.print(f"[yellow]interrupted[/yellow] during the {stage}: keeping the "
                      f"{len(writer.rows)} rows measured so far (resume with --resume "
                      f"{run_dir})")
        code = exit_code(e)
    return Measured(code=code, stage=stage, cfg=cfg)


def _ceilings(chk: Checked, opened: Opened, split: TimeSplit,
              early: triton_cache.CompileAhead | None) -> SweepContext:
    """The context with the run's ceilings: a resumed run's own (those of its rows), else
    measured or cached, the sweep's Triton kernels compiling in worker processes
    meanwhile (GPU) and waited for after."""
    cfg, writer, req = chk.cfg, opened.writer, chk.req
    if writer.meta.ceilings_ready:  # a resumed run keeps the ceilings of its rows
        if early is not None:
            early.stop()  # no ceilings to compile beside: not idle for the sweep
        return replace(cfg, ceilings=Ceilings.from_json(writer.meta.ceilings))
    ahead = triton_cache.start(opened.todo, cfg, kernel_spec.fp8_accum(), spawned=early)
    measured = False
    try:
        with split.phase("ceilings"):
            cfg = replace(cfg, ceilings=get_ceilings(
                cfg.model, cfg.present, _ceilings_dir(req, opened.out_root),
                measure_ceilings=req.ceilings.measure, force=req.ceilings.remeasure,
                log=lambda m: console.print(m)))
        measured = True
        # kept before the wait below: an interrupt there leaves a run whose --resume
        # need not measure them again
        writer.update(ceilings=cfg.ceilings.to_json(), ceilings_ready=True)
    finally:
        if ahead is not None:
            try:  # then the sweep waits for them (not after an interrupt or error)
                if measured:
                    triton_cache.after_ceilings(ahead, split, say=console.print)
            finally:
                writer.update(compiles__compiled_ahead=ahead.record())
    with split.phase("write"):
        writer.flush()  # results.json holds the ceilings before the first row
    return cfg


def _finish(chk: Checked, opened: Opened, split: TimeSplit, measured: Measured) -> int:
    """After the measuring, whatever its end: the GPU's end state and clock facts, the
    results, figures and summary written, then the exit code (failed rows; --compare)."""
    req, cfg = chk.req, measured.cfg
    run_dir, writer = opened.run_dir, opened.writer
    code, stage = measured.code, measured.stage
    if cfg.present.kind == "cuda":
        writer.update(telemetry__nvml_end=nvml_snapshot())  # with the sampler's summary
        during = gpu_monitor.stop_gpu_monitor()
        if not cfg.check_only:
            facts = run_clock_facts(during, NvmlFacts.of(writer.meta.telemetry.nvml_start),
                                    writer.rows, cfg.throttle)
            writer.update(**{f"telemetry__{k}": v for k, v in facts.items()})
    try:
        with split.phase("write"):
            _record_split(writer, split)  # as of summary.md; the final one below
            writer.close()  # results.json whole: the row journal is no longer needed
            if code == 0 or stage == "sweep":
                finish_run(writer, run_dir, plots=req.output.plots)
        print_summary(writer.rows)
        console.print(f"results: {run_dir}")
        _record_split(writer, split)
        writer.flush()
        console.print(time_split_line(writer.meta.time.time_split_s, writer.meta.time.wall_s))
    except (KeyboardInterrupt, Terminated) as e:
        writer.update(state__interrupted=True, state__complete=False,
                      state__signal=signal_name(e))
        _record_split(writer, split)
        writer.close()
        console.print(f"[yellow]interrupted[/yellow] while writing figures: the {len(writer.rows)} "
                      f"rows are kept in {run_dir}")
        return exit_code(e)
    if code:
        return code
    return _gate(chk, cfg, run_dir, writer)


def _gate(chk: Checked, cfg: SweepContext, run_dir: Path, writer: ResultWriter) -> int:
    """The exit code of a finished run: 1 with a failed row, and --compare's verdict."""
    req = chk.req
    code = 1 if any(r.status == "failed" for r in writer.rows) else 0
    if req.gate.compare:
        from roofline.gate.render import compare_and_report

        retime = None if cfg.check_only else compare_retimer(chk.cases, cfg, writer.rows)
        code = max(code, compare_and_report(req.gate.compare, run_dir, req.gate.threshold,
                                            req.gate.allow_device_mismatch, allow=chk.allow,
                                            retime=retime))
    return code


def _record_split(writer: ResultWriter, split: TimeSplit) -> None:
    """The run's time split so far into its metadata (benches/sweep/time_split.py): seconds per
    phase and the wall time since the process started, which they add up to, and the
    Triton compiles the sweep asked for (built, or loaded from Triton's cache)."""
    writer.update(time__time_split_s=split.split(), time__wall_s=split.wall_s(),
                  compiles__triton_compiles=dict(split.compiles))


def drain_rows(rows: Iterator[tuple[Case, RunRow]], e: BaseException
               ) -> Iterator[tuple[Case, RunRow]]:
    """After an interrupt `e` that landed while the caller handled a row (writing it):
    throw it into the sweep, which then yields the rows it has timed (runner.iterate keeps
    a chunk's rows until they are yielded), and give those.  A sweep that raised `e`
    itself is finished: nothing more."""
    try:
        item = rows.throw(e)  # type: ignore[attr-defined]
        while True:
            yield item
            item = next(rows)
    except StopIteration:
        return
    except (KeyboardInterrupt, Terminated) as again:
        if again is not e:
            raise


def _progress(total: int) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                    transient=False, disable=not sys.stdout.isatty())


def _sweep(todo: list[Case], total: int, cfg: SweepContext, writer: ResultWriter,
           run_dir: Path, split: TimeSplit) -> None:
    done0 = total - len(todo)
    console.print(f"{total} cases on {cfg.present.name} as '{cfg.model.key}' "
                  f"({'check only' if cfg.check_only else 'timed'}) -> {run_dir}"
                  + (f" ({done0} already done, {len(todo)} to go)" if done0 else ""))
    tty = sys.stdout.isatty()
    with _progress(total) as progress:
        task = progress.add_task("benchmarking", total=total, completed=done0)
        series = None
        splits = RowSplits()
        rows = runner.iterate(todo, cfg, split, splits)
        # Each row's own split, where rows run one by one: where a sweep's time goes by
        # kernel, provider and shape (the time split's phases), for the next estimate.
        own = runner.one_by_one(cfg)
        try:
            for case, row in rows:
                if own:
                    writer.update(time__row_split_s=(*writer.meta.time.row_split_s, {
                        "row": list(row.key), "s": splits.pop(row.key)}))
                with split.phase("write"):
                    writer.add(row)
                progress.update(task, advance=1, description=f"{case.label:<48.48}")
                if not tty and (case.spec.name, case.dtype) != series:
                    # No live bar in logs: one line per (kernel, dtype) series instead.
                    series = (case.spec.name, case.dtype)
                    console.print(f"[{len(writer.rows)}/{total}] {case.spec.name} "
                                  f"{case.dtype}")
                if row.status == "failed":
                    progress.console.print(f"[red]FAILED[/red] {case.label}: {row.reason}")
        except (KeyboardInterrupt, Terminated) as e:
            with split.phase("write"):
                for _, row in drain_rows(rows, e):
                    writer.add(row)
            raise


__all__ = ["USER_ERRORS", "print_devices", "print_kernels", "run"]
