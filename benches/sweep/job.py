"""The main job behind run_bench.py: validate the request, resolve the device, measure
or load ceilings, run the sweep with a progress bar, then plots, summary and compare."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from benches.measured_ceilings import get_ceilings
from benches.sweep import compile_wait, gpu_monitor, runner, triton_cache
from benches.sweep.budget import DEFAULT_CPU_RUN_BUDGET_S
from benches.sweep.cases import Case, RunConfig, build_cases
from benches.sweep.console import console, print_devices, print_kernels, print_summary
from benches.sweep.gpu_monitor import nvml_snapshot
from benches.sweep.interrupt import Terminated, exit_code, signal_name
from benches.sweep.phases import RowSplits, TimeSplit, compiles_booked
from benches.sweep.results import ResultWriter, busy_cpu_warning, collect_metadata, load_average
from benches.sweep.retime import RETIME_ROUNDS, Retimer
from benches.sweep.run_folder import (
    RequestError,
    check_run_id,
    new_run_dir,
    read_run_doc,
    writable_dir,
)
from benches.sweep.shapes import ShapeError
from benches.sweep.throttle import ThrottleConfig, run_clock_facts
from benches.timing.plan import TimingConfig
from contract.ceilings import Ceilings
from contract.devices import DeviceError, DeviceModel, Present, resolve_device
from contract.request import RequestError as BadRequest
from contract.request import RunRequest, resumed_request
from contract.schema import (
    DEFAULT_CACHE,
    ROW_SPLIT,
    RowKey,
    RunLoadError,
    format_shape,
    parse_row_key,
    row_key,
)
from contract.versions import check_versions, warning_line
from kernels import spec as kernel_spec
from kernels.shipped import RETUNE_ENV, shipped_for
from kernels.spec import Target, interpreter_enabled
from kernels.tuning import identity_text, set_device_identity
from roofline.gate.rules import CompareError, parse_allow
from roofline.gate.runs import check_baseline
from roofline.report.run_time import time_split_line

USER_ERRORS: tuple[type[Exception], ...] = (ShapeError, DeviceError, RunLoadError,
                                             CompareError, RequestError, BadRequest)


def cache_modes(value: tuple[str, ...] | None, gpu: bool = True) -> list[str]:
    """--cache (validated: contract/request.py) as a list of modes.  By default cold on a
    GPU (L2 flushed or rotated past); warm on a CPU: what its timer has always measured
    (blocks of calls on the same buffers), and its cold rotation, on request, still shows
    scheduler artifacts on a loaded host with few cores (matmuls quantized to ~8 ms)."""
    if value is None:
        return [DEFAULT_CACHE] if gpu else ["warm"]
    return list(value)


def finish_run(writer: ResultWriter, run_dir: Path, plots: bool) -> None:
    """Figures and summary.md from whatever rows exist (also after an interrupt)."""
    df = writer.frame()
    meta = writer.metadata
    try:
        from contract.schema import ROOFLINE_PNG, SCALING_PNG
        from roofline.report.plot import plot_roofline
        from roofline.report.plot_scaling import plot_scaling
        from roofline.report.summary import write_summary

        if plots:
            import matplotlib.pyplot as plt

            plt.close(plot_roofline(meta, df, run_dir / ROOFLINE_PNG))
            plt.close(plot_scaling(meta, df, run_dir / SCALING_PNG))
        write_summary(run_dir, meta, df)
    except Exception as e:  # a plotting problem must not lose the measurements
        console.print(f"[yellow]warning[/yellow]: figures/summary failed: "
                      f"{type(e).__name__}: {e}")


def compare_retimer(cases: list[Case], cfg: RunConfig, rows: list[dict[str, Any]]
             ) -> Callable[[list[RowKey]], dict[RowKey, list[list[float]]]]:
    """The compare step's `retime` callback: this run's settings, the rows of its cases
    only (benches/sweep/retime.py's Retimer)."""
    client = Retimer(cfg.model.key, {"seed": cfg.seed, "fp8_accum": kernel_spec.fp8_accum(),
                                     "ceilings": cfg.ceilings.to_json(),
                                     "throttle": cfg.throttle.as_dict()}, rows,
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
    """The ceiling cache: <out>/.ceilings, or the fleet rank's own (req.ceilings_dir)."""
    return Path(req.ceilings_dir) if req.ceilings_dir else out_root / ".ceilings"


def timing_config(req: RunRequest) -> TimingConfig:
    row = req.row_budget
    return TimingConfig() if row is None else TimingConfig(row_budget_s=row)


def run_budget_s_of(req: RunRequest, present: Present) -> float | None:
    """--run-budget: seconds, None for none ('inf'); by default the CPU's (a GPU's sweep
    is bounded by its rows' budgets alone)."""
    v = req.run_budget
    if v is None:
        return DEFAULT_CPU_RUN_BUDGET_S if present.kind != "cuda" else None
    return None if math.isinf(v) else float(v)


def run_config(req: RunRequest, model: DeviceModel, present: Present,
               interpret: bool | None = None) -> RunConfig:
    """The run's configuration from the request, its ceilings still unknown;
    `interpret`: Triton's interpreter (default: as this process has it)."""
    interpret = interpreter_enabled() if interpret is None else interpret
    return RunConfig(
        kernels=list(req.kernels), dtypes=list(req.dtypes), providers=list(req.providers),
        sizes=req.sizes,
        explicit_shapes=None if req.shapes is None else [dict(s) for s in req.shapes],
        seed=req.seed, check_only=req.check_only,
        model=model, present=present,
        target=Target(present.kind, present.capability, interpret, present.name),
        ceilings=Ceilings(None, None), timing=timing_config(req),
        run_budget_s=run_budget_s_of(req, present),
        throttle=ThrottleConfig(threshold_pct=req.throttle_threshold,
                                recovery_delay_s=req.throttle_recovery_delay),
        cache=cache_modes(req.cache, gpu=present.kind == "cuda"),
        energy=req.energy,
    )


@dataclass(frozen=True)
class Checked:
    """The request as checked before anything is measured (a resume's: the run's own
    settings), with what it resolved to; `resume_dir`, `old_meta`, `resume_rows`: the
    resumed run's folder, metadata and rows (None, None, [] for a new run)."""
    req: RunRequest
    present: Present
    model: DeviceModel
    cfg: RunConfig
    cases: list[Case]
    old_meta: dict[str, Any] | None
    resume_rows: list[dict[str, Any]]
    resume_dir: Path | None
    allow: frozenset[str]


@dataclass(frozen=True)
class Opened:
    """The run's folder (new or resumed), its output root, metadata, writer and the cases
    it has still to measure."""
    run_dir: Path
    out_root: Path
    meta: dict[str, Any]
    writer: ResultWriter
    todo: list[Case]


@dataclass(frozen=True)
class Measured:
    """How the measuring ended: its exit code so far (0, or an abort's or interrupt's)
    and the stage it reached ('ceilings' or 'sweep')."""
    code: int
    stage: str


def run(req: RunRequest, argv: list[str],
        on_cases: Callable[[list[Case]], None] | None = None,
        started: float | None = None,
        early: triton_cache.Spawned | None = None) -> int:
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
    _gpu_setup(chk, opened.meta)
    measured = _measure(chk, opened, split, early)
    return _finish(chk, opened, split, measured)


def _check(req: RunRequest, on_cases: Callable[[list[Case]], None] | None) -> Checked:
    """Everything the run needs, checked before any ceiling or kernel is measured (and
    before any folder is made): the request, the device, the baseline, the cases."""
    allow = parse_allow(req.allow)
    resume_rows: list[dict[str, Any]] = []
    old_meta: dict[str, Any] | None = None
    run_dir: Path | None = None
    if req.resume:
        run_dir, old_meta, resume_rows = read_run_doc(req.resume)
        req = resumed_request(req, old_meta)  # the run's own settings
    elif req.run_id is not None:
        check_run_id(req.run_id)
    if req.fp8_accum:
        kernel_spec.set_fp8_accum(req.fp8_accum)
    compile_wait.wait_s()  # a bad GPUBENCH_COMPILE_WAIT_S: refused before the ceilings
    triton_cache.default_workers()  # and a bad GPUBENCH_COMPILE_WORKERS
    dev = resolve_device(req.device)
    present, model = dev.present, dev.model
    for w in dev.warnings:
        console.print(f"[yellow]warning[/yellow]: {w}")
    untested = warning_line(check_versions())
    if untested:
        console.print(f"[yellow]warning[/yellow]: {untested}")
    if model.kind == "cpu" and not req.check_only:
        import torch

        busy = busy_cpu_warning(load_average(), os.cpu_count(), torch.get_num_threads())
        if busy:
            console.print(f"[yellow]warning[/yellow]: {busy}")
    if old_meta is not None and old_meta.get("detected_key") not in (None, present.key):
        raise RequestError(f"cannot resume a run of '{old_meta.get('detected_key')}' on "
                           f"'{present.key}'")
    if req.compare:
        # A bad baseline found after the sweep would waste the whole (GPU) run.
        check_baseline(req.compare, model.key,
                       allow_device_mismatch=req.allow_device_mismatch)
    cfg = run_config(req, model, present)
    cases = build_cases(cfg)
    if not cases:
        raise RequestError("nothing to run: no selected kernel has a selected dtype and "
                           "shape (check --kernels, --dtypes and --sizes)")
    if on_cases is not None:
        on_cases(cases)
    return Checked(req=req, present=present, model=model, cfg=cfg, cases=cases,
                   old_meta=old_meta, resume_rows=resume_rows, resume_dir=run_dir,
                   allow=allow)


def _open(chk: Checked, argv: list[str]) -> Opened:
    """The run's folder: a new one with its metadata, or the resumed one with a record of
    this resume; its writer, and the cases not yet measured."""
    req, model, cfg, cases = chk.req, chk.model, chk.cfg, chk.cases
    old_meta, resume_rows = chk.old_meta, chk.resume_rows
    out_root = Path(req.out)
    if old_meta is None:
        out_root = writable_dir(out_root, "--out")
        writable_dir(_ceilings_dir(req, out_root), "ceiling cache")
        run_dir = new_run_dir(writable_dir(out_root / model.key, "device folder"),
                               req.run_id)
        meta = collect_metadata(cfg, run_dir.name, ["run_bench.py", *argv], req)
        if cfg.explicit_shapes is not None:
            meta["explicit_shapes"] = [format_shape(s) for s in cfg.explicit_shapes]
    else:
        run_dir = chk.resume_dir  # type: ignore[assignment]  # set with old_meta
        writable_dir(run_dir, "run folder")
        out_root = run_dir.parent.parent  # <out>/<device>/<run-id>: the ceiling cache's root
        meta = old_meta
        # A run written before the request was stored keeps the one rebuilt from its
        # old keys, so that its next resume reads it as any other.
        meta.setdefault("request", req.to_json())
        # Rows an interrupt cut short (timed in fewer rounds than the rest) are timed
        # again in full, and their new rows replace them.
        short = [r for r in resume_rows if runner.cut_short(r)]
        resume_rows = [r for r in resume_rows if not runner.cut_short(r)]
        meta.setdefault("resumed", []).append(
            {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
             "command": " ".join(["run_bench.py", *argv]),
             "rows_before": len(resume_rows) + len(short), "retimed_cut_short": len(short),
             # the split of the process before (time_split_s: this one's)
             "time_split_s": meta.pop("time_split_s", None),
             "wall_s": meta.pop("wall_s", None)})
    meta.update(interrupted=False, aborted=False, abort_reason=None, complete=False)
    writer = ResultWriter(run_dir, meta, resume_rows)
    done = {row_key(r) for r in resume_rows}
    todo = [c for c in cases if c.key not in done]
    return Opened(run_dir=run_dir, out_root=out_root, meta=meta, writer=writer, todo=todo)


def _gpu_setup(chk: Checked, meta: dict[str, Any]) -> None:
    """A compiled GPU run's tuning set-up: tunings kept on disk under this GPU's identity,
    the configs shipped for its model, and --retune for the launches."""
    req, present, cfg = chk.req, chk.present, chk.cfg
    if present.kind == "cuda" and not cfg.target.interpret:
        meta["autotune_on_disk"] = triton_cache.keep_tuning()
        # Tunings on disk are keyed by this GPU's identity (kernels/tuning.py).
        clock = (meta.get("nvml_start") or {}).get("max_sm_clock_mhz")
        meta["tuning_identity"] = identity_text(present.name, present.sms, present.memory_gb,
                                                present.l2_mb, clock)
        set_device_identity(meta["tuning_identity"])
        # The tuned configs shipped for this GPU model (kernels/configs/), or why none.
        meta["shipped_configs"] = shipped_for(present.name, present.sms,
                                              present.memory_gb).to_json()
        if req.retune:  # read where the launches are made, and by re-timing children
            os.environ[RETUNE_ENV] = "1"


def _measure(chk: Checked, opened: Opened, split: TimeSplit,
             early: triton_cache.Spawned | None = None) -> Measured:
    """The ceilings (the sweep's kernels compiling ahead meanwhile, and waited for after:
    compile_wait.after_ceilings), then the sweep; an abort or an interrupt ends it with
    its exit code, at the stage it reached."""
    req, present, model, cfg, cases = chk.req, chk.present, chk.model, chk.cfg, chk.cases
    run_dir, out_root, meta = opened.run_dir, opened.out_root, opened.meta
    writer, todo = opened.writer, opened.todo
    code, stage = 0, "ceilings"
    try:
        with split.phase("write"):
            writer.flush()  # the folder holds a readable (empty) run from the start
        if meta.get("ceilings_ready"):  # a resumed run keeps the ceilings of its rows
            c = meta.get("ceilings") or {}
            cfg.ceilings = Ceilings(c.get("datasheet"), c.get("measured"))
            if early is not None:
                early.stop()  # no ceilings to compile beside: not idle for the sweep
        else:
            # The sweep's Triton kernels compile in worker processes meanwhile (GPU).
            ahead = triton_cache.start(todo, cfg, kernel_spec.fp8_accum(), spawned=early)
            measured = False
            try:
                with split.phase("ceilings"):
                    cfg.ceilings = get_ceilings(model, present, _ceilings_dir(req, out_root),
                                                measure_ceilings=req.measure_ceilings,
                                                force=req.remeasure_ceilings,
                                                log=lambda m: console.print(m))
                measured = True
                # kept before the wait below: an interrupt there leaves a run whose
                # --resume need not measure them again
                meta.update(ceilings=cfg.ceilings.to_json(), ceilings_ready=True)
            finally:
                if ahead is not None:
                    try:  # then the sweep waits for them (not after an interrupt or error)
                        if measured:
                            compile_wait.after_ceilings(ahead, split, say=console.print)
                    finally:
                        meta["compiled_ahead"] = ahead.record()
            with split.phase("write"):
                writer.flush()  # results.json holds the ceilings before the first row
        stage = "sweep"
        with compiles_booked(split):
            _sweep(todo, len(cases), cfg, writer, present, model, run_dir, split)
        meta["complete"] = True
    except runner.SweepAborted as e:
        meta.update(aborted=True, abort_reason=f"{e.row['kernel']} {e.row['provider']} "
                    f"{e.row['dtype']} {e.row['shape']}: {e.reason}")
        console.print(f"[red]ABORTED[/red]: {meta['abort_reason']}; the CUDA context is "
                      f"unusable, {len(writer.rows)} rows kept (resume with --resume {run_dir})")
        code = 3
    except (KeyboardInterrupt, Terminated) as e:
        meta.update(interrupted=True, signal=signal_name(e))
        console.print(f"[yellow]interrupted[/yellow] during the {stage}: keeping the "
                      f"{len(writer.rows)} rows measured so far (resume with --resume "
                      f"{run_dir})")
        code = exit_code(e)
    return Measured(code=code, stage=stage)


def _finish(chk: Checked, opened: Opened, split: TimeSplit, measured: Measured) -> int:
    """After the measuring, whatever its end: the GPU's end state and clock facts, the
    results, figures and summary written, then the exit code (failed rows; --compare)."""
    req, present, cfg, cases = chk.req, chk.present, chk.cfg, chk.cases
    run_dir, meta, writer = opened.run_dir, opened.meta, opened.writer
    code, stage = measured.code, measured.stage
    if present.kind == "cuda":
        meta["nvml_end"] = nvml_snapshot()  # includes the run's sampler summary
        during = gpu_monitor.stop_gpu_monitor()
        if not cfg.check_only:
            meta.update(run_clock_facts(during, meta.get("nvml_start"), writer.rows,
                                        cfg.throttle))
    try:
        with split.phase("write"):
            _record_split(meta, split)  # as of summary.md; the final one below
            writer.close()  # results.json whole: the row journal is no longer needed
            if code == 0 or stage == "sweep":
                finish_run(writer, run_dir, plots=req.plots)
        print_summary(writer.rows)
        console.print(f"results: {run_dir}")
        _record_split(meta, split)
        writer.flush()
        console.print(time_split_line(meta))
    except (KeyboardInterrupt, Terminated) as e:
        meta.update(interrupted=True, complete=False, signal=signal_name(e))
        _record_split(meta, split)
        writer.close()
        console.print(f"[yellow]interrupted[/yellow] while writing figures: the {len(writer.rows)} "
                      f"rows are kept in {run_dir}")
        return exit_code(e)
    if code:
        return code
    code = 1 if any(r["status"] == "failed" for r in writer.rows) else 0
    if req.compare:
        from roofline.gate.render import compare_and_report

        retime = None if cfg.check_only else compare_retimer(cases, cfg, writer.rows)
        code = max(code, compare_and_report(req.compare, run_dir, req.threshold,
                                            req.allow_device_mismatch, allow=chk.allow,
                                            retime=retime))
    return code


def _record_split(meta: dict[str, Any], split: TimeSplit) -> None:
    """The run's time split so far into its metadata (benches/sweep/phases.py): seconds per
    phase and the wall time since the process started, which they add up to, and the
    Triton compiles the sweep asked for (built, or loaded from Triton's cache)."""
    meta.update(time_split_s=split.split(), wall_s=split.wall_s(),
                triton_compiles=dict(split.compiles))


def drain_rows(rows: Iterator[tuple[Case, dict[str, Any]]], e: BaseException
           ) -> Iterator[tuple[Case, dict[str, Any]]]:
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


def _sweep(todo: list[Case], total: int, cfg: RunConfig, writer: ResultWriter,
           present: Present, model: DeviceModel, run_dir: Path, split: TimeSplit) -> None:
    done0 = total - len(todo)
    console.print(f"{total} cases on {present.name} as '{model.key}' "
                  f"({'check only' if cfg.check_only else 'timed'}) -> {run_dir}"
                  + (f" ({done0} already done, {len(todo)} to go)" if done0 else ""))
    tty = sys.stdout.isatty()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                        transient=False, disable=not tty)
    with progress:
        task = progress.add_task("benchmarking", total=total, completed=done0)
        series = None
        splits = RowSplits()
        rows = runner.iterate(todo, cfg, split, splits)
        # Each row's own split, where rows run one by one: where a sweep's time goes by
        # kernel, provider and shape (the time split's phases), for the next estimate.
        own: list[dict[str, Any]] | None = writer.metadata.setdefault(
            ROW_SPLIT, []) if runner.one_by_one(cfg) else None
        try:
            for case, row in rows:
                if own is not None:
                    own.append({"row": list(row_key(row)), "s": splits.pop(row_key(row))})
                with split.phase("write"):
                    writer.add(row)
                progress.update(task, advance=1, description=f"{case.label:<48.48}")
                if not tty and (case.spec.name, case.dtype) != series:
                    # No live bar in logs: one line per (kernel, dtype) series instead.
                    series = (case.spec.name, case.dtype)
                    console.print(f"[{len(writer.rows)}/{total}] {case.spec.name} "
                                  f"{case.dtype}")
                if row["status"] == "failed":
                    progress.console.print(f"[red]FAILED[/red] {case.label}: "
                                           f"{row['reason']}")
        except (KeyboardInterrupt, Terminated) as e:
            with split.phase("write"):
                for _, row in drain_rows(rows, e):
                    writer.add(row)
            raise


__all__ = ["USER_ERRORS", "print_devices", "print_kernels", "run"]
