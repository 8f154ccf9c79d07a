"""The main job behind run_bench.py: validate the request, resolve the device, measure
or load ceilings, run the sweep with a progress bar, then plots, summary and compare."""

from __future__ import annotations

import argparse
import math
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from benches.runner import (
    ResultWriter,
    RunConfig,
    build_cases,
    collect_metadata,
    iterate,
    nvml_snapshot,
)
from benches.shapes import PRESETS, ShapeError, parse_sizes
from benches.timing import TimingConfig
from kernels import DTYPE_NAMES, PROVIDERS, REGISTRY
from kernels.spec import Target, interpreter_enabled
from roofline.ceilings import get_ceilings
from roofline.devices import DEVICES, ROOF_CLASSES, DeviceError, detect, host_cpu, resolve
from roofline.schema import RunLoadError

USER_ERRORS: tuple[type[Exception], ...] = (ShapeError, DeviceError, RunLoadError)
try:
    from roofline.compare import CompareError

    USER_ERRORS += (CompareError,)
except ImportError:  # pragma: no cover - compare is part of the package
    pass

# Piped output (CI logs, files) gets a wide console instead of rich's 80-column default,
# so tables do not fold.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class RequestError(ValueError):
    """A flag value the registry does not know (one-line message)."""


USER_ERRORS += (RequestError,)


def _choose(value: str, allowed: tuple[str, ...], flag: str) -> list[str]:
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
    args.kernels = _choose(args.kernels, tuple(REGISTRY), "kernels")
    args.dtypes = _choose(args.dtypes, DTYPE_NAMES, "dtypes")
    args.providers = _choose(args.providers, PROVIDERS, "providers")
    if args.device != "auto" and args.device not in DEVICES:
        raise RequestError(f"unknown device '{args.device}' "
                           f"(choose from auto, {', '.join(DEVICES)})")
    args.explicit_shapes = None if args.sizes in PRESETS else parse_sizes(args.sizes)


# ---- listings ---------------------------------------------------------------------------

def print_kernels() -> None:
    t = Table(title="Kernels: FLOPs and compulsory bytes (b = bytes per element of the "
                    "dtype; b_out of fp8 products is bf16's 2)")
    for col in ("kernel", "providers: dtypes", "FLOPs", "bytes", "roof"):
        t.add_column(col)
    for spec in REGISTRY.values():
        provs = "\n".join(f"{n}: {','.join(p.dtypes)}" for n, p in spec.providers.items())
        roof = "dtype's tensor-core peak" if spec.matrix_unit else "fp32 vector peak"
        t.add_row(spec.name, provs, spec.flops_formula, spec.bytes_formula, roof)
    console.print(t)
    notes = Table(title="How each provider computes")
    for col in ("kernel", "provider", "implementation"):
        notes.add_column(col)
    for spec in REGISTRY.values():
        for n, p in spec.providers.items():
            notes.add_row(spec.name, n, p.note)
    console.print(notes)


def print_devices() -> None:
    t = Table(title="Device models: dense peaks (TFLOP/s), bandwidth, ridge points "
                    "(FLOP/byte = peak / bandwidth)")
    for col in ("key", "name", *ROOF_CLASSES, "HBM TB/s", "L2 MB", "SMs", "ridge FLOP/B"):
        t.add_column(col, overflow="fold")
    for d in DEVICES.values():
        if d.kind == "cpu" or not d.peaks_tflops:
            t.add_row(d.key, d.name, *["measured"] * len(ROOF_CLASSES), "measured", "", "",
                      d.notes)
            continue
        peaks = [f"{d.peaks_tflops[c]:g}" if c in d.peaks_tflops else "-" for c in ROOF_CLASSES]
        ridges = ", ".join(f"{c} {d.ridge(c):.0f}" for c in ROOF_CLASSES if d.ridge(c))
        t.add_row(d.key, d.name, *peaks, f"{d.hbm_tbps:g}", f"{d.l2_mb:g}", str(d.sms), ridges)
    console.print(t)


# ---- the run ----------------------------------------------------------------------------

def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def print_summary(rows: list[dict[str, Any]]) -> None:
    ok = [r for r in rows if r["status"] == "ok"]
    t = Table(title=f"{len(ok)} ok, {sum(r['status'] == 'failed' for r in rows)} failed, "
                    f"{sum(r['status'] == 'skipped' for r in rows)} skipped")
    for col in ("kernel", "provider", "dtype", "shape", "ms", "TFLOP/s", "GB/s", "MFU",
                "% roof", "rel_err"):
        t.add_column(col, justify="right" if col not in ("kernel", "provider", "dtype",
                                                         "shape") else "left")
    # Largest shape per (kernel, provider, dtype): the headline number of each series.
    best: dict[tuple, dict[str, Any]] = {}
    for r in ok:
        key = (r["kernel"], r["provider"], r["dtype"])
        if key not in best or r["flops"] >= best[key]["flops"]:
            best[key] = r
    for r in best.values():
        t.add_row(r["kernel"], r["provider"], r["dtype"], r["shape"],
                  _fmt(r["ms_median"], ".4f"), _fmt(r["tflops"], ".3f"), _fmt(r["gbps"], ".1f"),
                  _fmt(r["mfu"], ".1%"), _fmt(r["pct_roof"], ".1f"), _fmt(r["rel_err"], ".1e"))
    console.print(t)
    bad = [r for r in rows if r["status"] == "failed"]
    for r in bad:
        console.print(f"[red]FAILED[/red] {r['kernel']} {r['provider']} {r['dtype']} "
                      f"{r['shape']}: {r['reason']}")
    reasons: dict[str, int] = {}
    for r in rows:
        if r["status"] == "skipped":
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        console.print(f"skipped x{n}: {reason}")


def _finish(writer: ResultWriter, run_dir: Path, plots: bool) -> None:
    """Figures and summary.md from whatever rows exist (also after an interrupt)."""
    df = writer.frame()
    meta = writer.metadata
    try:
        from roofline.plot import plot_roofline, plot_scaling
        from roofline.report import write_summary
        from roofline.schema import ROOFLINE_PNG, SCALING_PNG

        if plots:
            import matplotlib.pyplot as plt

            plt.close(plot_roofline(meta, df, run_dir / ROOFLINE_PNG))
            plt.close(plot_scaling(meta, df, run_dir / SCALING_PNG))
        write_summary(run_dir, meta, df)
    except Exception as e:  # a plotting problem must not lose the measurements
        console.print(f"[yellow]warning[/yellow]: figures/summary failed: "
                      f"{type(e).__name__}: {e}")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.compare:
        from roofline.schema import resolve_results_json

        resolve_results_json(args.compare)  # a missing baseline fails now, not after the run
    present = detect()
    model, warnings = resolve(args.device, present)
    for w in warnings:
        console.print(f"[yellow]warning[/yellow]: {w}")
    if model.kind == "cpu" and present.kind != "cpu":
        present = host_cpu()  # --device cpu on a GPU machine benchmarks the host
    target = Target(present.kind, present.capability, interpreter_enabled(), present.name)
    out_root = Path(args.out)
    ceilings = get_ceilings(model, present, out_root / ".ceilings",
                            measure_ceilings=not args.no_measure_ceilings,
                            force=args.remeasure_ceilings,
                            log=lambda m: console.print(m))
    cfg = RunConfig(
        kernels=args.kernels, dtypes=args.dtypes, providers=args.providers,
        sizes=args.sizes if args.explicit_shapes is None else "explicit",
        explicit_shapes=args.explicit_shapes, seed=args.seed, check_only=args.check_only,
        model=model, present=present, target=target, ceilings=ceilings,
        timing=TimingConfig(),
    )
    cases = build_cases(cfg)
    if not cases:
        raise RequestError("nothing to run: no selected kernel has a selected dtype and "
                           "shape (check --kernels, --dtypes and --sizes)")
    run_id = args.run_id or datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = out_root / model.key / run_id
    meta = collect_metadata(cfg, run_id, ["run_bench.py", *argv])
    writer = ResultWriter(run_dir, meta)
    console.print(f"{len(cases)} cases on {present.name} as '{model.key}' "
                  f"({'check only' if cfg.check_only else 'timed'}) -> {run_dir}")
    interrupted = False
    tty = sys.stdout.isatty()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
                        transient=False, disable=not tty)
    try:
        with progress:
            task = progress.add_task("benchmarking", total=len(cases))
            series = None
            for i, (case, row) in enumerate(iterate(cases, cfg)):
                writer.add(row)
                if not tty and (case.spec.name, case.dtype) != series:
                    # No live bar in logs: one line per (kernel, dtype) series instead.
                    series = (case.spec.name, case.dtype)
                    console.print(f"[{i + 1}/{len(cases)}] {case.spec.name} {case.dtype}")
                progress.update(task, advance=1, description=f"{case.label:<48.48}")
                if row["status"] == "failed":
                    progress.console.print(f"[red]FAILED[/red] {case.label}: {row['reason']}")
    except KeyboardInterrupt:
        interrupted = True
        console.print(f"[yellow]interrupted[/yellow]: keeping the {len(writer.rows)} rows "
                      "measured so far")
    meta["interrupted"] = interrupted
    meta["complete"] = not interrupted
    if present.kind == "cuda":
        meta["nvml_end"] = nvml_snapshot()
    writer.flush()
    _finish(writer, run_dir, plots=not args.no_plots)
    print_summary(writer.rows)
    console.print(f"results: {run_dir}")
    if interrupted:
        return 130
    code = 1 if any(r["status"] == "failed" for r in writer.rows) else 0
    if args.compare:
        from roofline.compare import compare_and_report

        code = max(code, compare_and_report(args.compare, run_dir, args.threshold,
                                            args.allow_device_mismatch))
    return code


__all__ = ["USER_ERRORS", "print_devices", "print_kernels", "run", "validate"]
