"""The main job behind run_bench.py: validate the request, resolve the device, measure
or load ceilings, run the sweep with a progress bar, then plots, summary and compare."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterator
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

from benches.ceilings import get_ceilings
from benches.sweep import gpu_monitor, runner, triton_cache
from benches.sweep.budget import DEFAULT_CPU_RUN_BUDGET_S
from benches.sweep.cases import Case, RunConfig, build_cases
from benches.sweep.console import console, print_devices, print_kernels, print_summary
from benches.sweep.gpu_monitor import ThrottleConfig, nvml_snapshot, run_clock_facts
from benches.sweep.interrupt import Terminated, exit_code, signal_name
from benches.sweep.phases import TimeSplit, compiles_booked
from benches.sweep.results import ResultWriter, busy_cpu_warning, collect_metadata, load_average
from benches.sweep.retime import RETIME_ROUNDS, Retimer
from benches.sweep.run_folder import (
    RequestError,
    check_run_id,
    new_run_dir,
    read_run_doc,
    writable_dir,
)
from benches.sweep.shapes import PRESETS, ShapeError, parse_sizes
from benches.timing.plan import TimingConfig
from contract.ceilings import Ceilings
from contract.devices import (
    DEVICES,
    DeviceError,
    DeviceModel,
    Present,
    detect,
    host_cpu,
    resolve,
)
from contract.schema import (
    CACHE_MODES,
    DEFAULT_CACHE,
    RowKey,
    RunLoadError,
    format_shape,
    parse_row_key,
    row_key,
)
from contract.versions import check_versions, warning_line
from kernels import DTYPE_NAMES, PROVIDERS, REGISTRY
from kernels import spec as kernel_spec
from kernels.spec import Target, interpreter_enabled
from kernels.tuning import identity_text, set_device_identity
from roofline.gate.rules import CompareError, parse_allow
from roofline.gate.runs import check_baseline
from roofline.report.summary import time_split_line

USER_ERRORS: tuple[type[Exception], ...] = (ShapeError, DeviceError, RunLoadError,
                                             CompareError, RequestError)


def _choose(value: str | list[str], allowed: tuple[str, ...], flag: str) -> list[str]:
    if isinstance(value, list):  # already a list (a resumed run's metadata)
        value = ",".join(map(str, value))
    if value.strip() == "all":
        return list(allowed)
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise RequestError(f"--{flag} is empty (choose from {','.join(allowed)})")
    for v in items:
        if v not in allowed:
            raise RequestError(f"unknown {flag.rstrip('s')} '{v}' "
                               f"(choose from {','.join(allowed)})")
    return list(dict.fromkeys(items))


def validate(args: argparse.Namespace) -> None:
    """Turn the comma lists into validated lists; parse explicit sizes."""
    validate_lists(args)
    if args.device != "auto" and args.device not in DEVICES:
        raise RequestError(f"unknown device '{args.device}' "
                           f"(choose from auto, {', '.join(DEVICES)})")
    args.explicit_shapes = None if args.sizes in PRESETS else parse_sizes(args.sizes)


def validate_lists(args: argparse.Namespace) -> None:
    args.kernels = _choose(args.kernels, tuple(REGISTRY), "kernels")
    args.dtypes = _choose(args.dtypes, DTYPE_NAMES, "dtypes")
    args.providers = _choose(args.providers, PROVIDERS, "providers")
    if getattr(args, "cache", None) is not None:
        args.cache = cache_modes(args.cache)


def cache_modes(value: str | list[str] | None, gpu: bool = True) -> list[str]:
    """--cache as a list of modes.  By default cold on a GPU (L2 flushed or rotated
    past); warm on a CPU: what its timer has always measured (blocks of calls on the same
    buffers), and its cold rotation, on request, still shows scheduler artifacts on this
    project's 2-core VM (matmuls quantized to ~8 ms)."""
    if value is None:
        return [DEFAULT_CACHE] if gpu else ["warm"]
    return _choose(value, CACHE_MODES, "cache")


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


def apply_resume(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    """The resumed run's own settings replace the command line's."""
    args.kernels, args.dtypes, args.providers = meta["kernels"], meta["dtypes"], meta["providers"]
    # A run written before --cache existed was timed cold.
    args.cache = meta.get("cache") or [DEFAULT_CACHE]
    args.seed, args.check_only = meta["seed"], bool(meta.get("check_only"))
    args.device = meta["device_key"]
    if meta.get("fp8_accum"):
        args.fp8_accum = meta["fp8_accum"]
    throttle = meta.get("throttle_settings") or {}
    args.throttle_threshold = throttle.get("threshold_pct", args.throttle_threshold)
    args.throttle_recovery_delay = throttle.get("recovery_delay_s",
                                                args.throttle_recovery_delay)
    if meta["sizes"] == "explicit":
        shapes = meta.get("explicit_shapes")
        if not shapes:
            raise RequestError("cannot resume: the run used explicit --sizes that its "
                               "metadata does not list")
        args.sizes = ";".join(shapes)
        args.explicit_shapes = parse_sizes(args.sizes)
    else:
        args.sizes, args.explicit_shapes = meta["sizes"], None


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


def _ceilings_dir(args: argparse.Namespace, out_root: Path) -> Path:
    """The ceiling cache: <out>/.ceilings, or the fleet rank's own (args.ceilings_dir)."""
    own = getattr(args, "ceilings_dir", None)
    return Path(own) if own else out_root / ".ceilings"


def timing_config(args: argparse.Namespace) -> TimingConfig:
    row = getattr(args, "row_budget", None)
    return TimingConfig() if row is None else TimingConfig(row_budget_s=row)


def run_budget_s_of(args: argparse.Namespace, present: Present) -> float | None:
    """--run-budget: seconds, None for none ('inf'); by default the CPU's (a GPU's sweep
    is bounded by its rows' budgets alone)."""
    v = getattr(args, "run_budget", None)
    if v is None:
        return DEFAULT_CPU_RUN_BUDGET_S if present.kind != "cuda" else None
    return None if math.isinf(v) else float(v)


def run_config(args: argparse.Namespace, model: DeviceModel, present: Present,
               interpret: bool | None = None) -> RunConfig:
    """The run's configuration from the (validated) command line, its ceilings still
    unknown; `interpret`: Triton's interpreter (default: as this process has it)."""
    interpret = interpreter_enabled() if interpret is None else interpret
    return RunConfig(
        kernels=args.kernels, dtypes=args.dtypes, providers=args.providers,
        sizes=args.sizes if args.explicit_shapes is None else "explicit",
        explicit_shapes=args.explicit_shapes, seed=args.seed, check_only=args.check_only,
        model=model, present=present,
        target=Target(present.kind, present.capability, interpret, present.name),
        ceilings=Ceilings(None, None), timing=timing_config(args),
        run_budget_s=run_budget_s_of(args, present),
        throttle=ThrottleConfig(threshold_pct=args.throttle_threshold,
                                recovery_delay_s=args.throttle_recovery_delay),
        cache=cache_modes(getattr(args, "cache", None), gpu=present.kind == "cuda"),
    )


def run(args: argparse.Namespace, argv: list[str],
        on_cases: Callable[[list[Case]], None] | None = None) -> int:
    """One run; `on_cases` sees the selected cases before any folder is made or anything
    measured (a fleet's ranks agree on them there: benches/fleet/run.py)."""
    # From the process's start when run as the command (start-up and imports count),
    # else from here (a caller's process: tests, a notebook).
    split = TimeSplit(start=getattr(args, "started", None))
    # ---- everything the run needs is checked before any ceiling or kernel is measured
    allow = parse_allow(args.allow)
    resume_rows: list[dict[str, Any]] = []
    old_meta: dict[str, Any] | None = None
    if args.resume:
        run_dir, old_meta, resume_rows = read_run_doc(args.resume)
        apply_resume(args, old_meta)
        validate_lists(args)
    elif args.run_id is not None:
        check_run_id(args.run_id)
    if args.fp8_accum:
        kernel_spec.set_fp8_accum(args.fp8_accum)
    present = detect()
    model, warnings = resolve(args.device, present)
    for w in warnings:
        console.print(f"[yellow]warning[/yellow]: {w}")
    untested = warning_line(check_versions())
    if untested:
        console.print(f"[yellow]warning[/yellow]: {untested}")
    if model.kind == "cpu" and present.kind != "cpu":
        present = host_cpu()  # --device cpu on a GPU machine benchmarks the host
    if model.kind == "cpu" and not args.check_only:
        import torch

        busy = busy_cpu_warning(load_average(), os.cpu_count(), torch.get_num_threads())
        if busy:
            console.print(f"[yellow]warning[/yellow]: {busy}")
    if old_meta is not None and old_meta.get("detected_key") not in (None, present.key):
        raise RequestError(f"cannot resume a run of '{old_meta.get('detected_key')}' on "
                           f"'{present.key}'")
    if args.compare:
        # A bad baseline found after the sweep would waste the whole (GPU) run.
        check_baseline(args.compare, model.key,
                       allow_device_mismatch=args.allow_device_mismatch)
    cfg = run_config(args, model, present)
    cases = build_cases(cfg)
    if not cases:
        raise RequestError("nothing to run: no selected kernel has a selected dtype and "
                           "shape (check --kernels, --dtypes and --sizes)")
    if on_cases is not None:
        on_cases(cases)
    out_root = Path(args.out)
    if old_meta is None:
        out_root = writable_dir(out_root, "--out")
        writable_dir(_ceilings_dir(args, out_root), "ceiling cache")
        run_dir = new_run_dir(writable_dir(out_root / model.key, "device folder"),
                               args.run_id)
        meta = collect_metadata(cfg, run_dir.name, ["run_bench.py", *argv])
        if cfg.explicit_shapes is not None:
            meta["explicit_shapes"] = [format_shape(s) for s in cfg.explicit_shapes]
    else:
        writable_dir(run_dir, "run folder")
        out_root = run_dir.parent.parent  # <out>/<device>/<run-id>: the ceiling cache's root
        meta = old_meta
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

    if present.kind == "cuda" and not cfg.target.interpret:
        meta["autotune_on_disk"] = triton_cache.keep_tuning()
        # Tunings on disk are keyed by this GPU's identity (kernels/tuning.py).
        clock = (meta.get("nvml_start") or {}).get("max_sm_clock_mhz")
        meta["tuning_identity"] = identity_text(present.name, present.sms, present.memory_gb,
                                                present.l2_mb, clock)
        set_device_identity(meta["tuning_identity"])
    code, stage = 0, "ceilings"
    try:
        with split.phase("write"):
            writer.flush()  # the folder holds a readable (empty) run from the start
        if meta.get("ceilings_ready"):  # a resumed run keeps the ceilings of its rows
            c = meta.get("ceilings") or {}
            cfg.ceilings = Ceilings(c.get("datasheet"), c.get("measured"))
        else:
            # The sweep's Triton kernels compile in worker processes meanwhile (GPU).
            ahead = triton_cache.start(todo, cfg, kernel_spec.fp8_accum())
            try:
                with split.phase("ceilings"):
                    cfg.ceilings = get_ceilings(model, present, _ceilings_dir(args, out_root),
                                                measure_ceilings=not args.no_measure_ceilings,
                                                force=args.remeasure_ceilings,
                                                log=lambda m: console.print(m))
            finally:
                if ahead is not None:
                    meta["compiled_ahead"] = ahead.stop()
            meta.update(ceilings=cfg.ceilings.to_json(), ceilings_ready=True)
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
                finish_run(writer, run_dir, plots=not args.no_plots)
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
    if args.compare:
        from roofline.gate.render import compare_and_report

        retime = None if cfg.check_only else compare_retimer(cases, cfg, writer.rows)
        code = max(code, compare_and_report(args.compare, run_dir, args.threshold,
                                            args.allow_device_mismatch, allow=allow,
                                            retime=retime))
    return code


def _record_split(meta: dict[str, Any], split: TimeSplit) -> None:
    """The run's time split so far into its metadata (benches/sweep/phases.py): seconds per
    phase and the wall time since the process started, which they add up to."""
    meta.update(time_split_s=split.split(), wall_s=split.wall_s())


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
        rows = runner.iterate(todo, cfg, split)
        try:
            for case, row in rows:
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


__all__ = ["USER_ERRORS", "print_devices", "print_kernels", "run", "validate"]
