"""`python -m roofline plot`: re-plot a saved run (roofline.png and scaling.png), or
several runs' rooflines on one figure (--devices)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from contract.cli import Parser, UsageError
from contract.schema import (
    ROOFLINE_PNG,
    SCALING_PNG,
    RunDoc,
    RunLoadError,
    check_metrics,
    load_doc,
    read_doc,
    resolve_results_json,
)
from roofline.report.plot import plot_roofline
from roofline.report.plot_devices import plot_devices
from roofline.report.plot_energy import ENERGY_PNG, NoEnergy, plot_energy
from roofline.report.plot_scaling import plot_scaling

# `plot RUN_A RUN_B ... --devices` writes this, in the first RUN's folder unless --out.
DEVICES_PNG = "devices.png"


def figure_paths(run: str, out: str | None) -> tuple[Path, Path]:
    """(roofline path, scaling path).  Default: RUN's folder.  --out names the roofline PNG
    or a folder for it (an existing folder, or a name with no suffix).  The scaling figure
    goes beside it: scaling.png when the roofline keeps its default name, else
    <stem>-scaling.png, so two runs plotted into one folder keep both scaling figures."""
    run_path = Path(run)
    run_dir = run_path if run_path.is_dir() else run_path.parent
    if out is None:
        roof = run_dir / ROOFLINE_PNG
    else:
        o = Path(out)
        is_dir = o.is_dir() or out.endswith(("/", os.sep)) or not o.suffix
        roof = o / ROOFLINE_PNG if is_dir else o
    if roof.name == ROOFLINE_PNG:
        return roof, roof.with_name(SCALING_PNG)
    return roof, roof.with_name(f"{roof.stem}-scaling{roof.suffix or '.png'}")


USAGE = ("python -m roofline plot RUN [--out PNG] [--baseline RUN] | "
         "plot RUN_A RUN_B [...] --devices [--out PNG] | plot RUN --energy [--out PNG]")


def _parser() -> Parser:
    parser = Parser(prog="python -m roofline plot", usage=USAGE,
                    description="Re-plot a saved run: roofline.png and scaling.png; or "
                                "compare devices: several runs' rooflines on one figure.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run folder or its results.json (several with --devices)")
    parser.add_argument("--out", metavar="PNG",
                        help="roofline PNG path or folder (default: RUN's folder); "
                             "the scaling figure is written beside it")
    parser.add_argument("--baseline", metavar="RUN",
                        help="overlay an earlier run: arrows from its points to this run's")
    parser.add_argument("--devices", action="store_true",
                        help=f"one figure ({DEVICES_PNG}, in the first RUN's folder unless "
                             "--out) with every RUN's roofs and points, one colour per device")
    parser.add_argument("--energy", action="store_true",
                        help=f"the energy roofline instead ({ENERGY_PNG}, in RUN's folder "
                             "unless --out): FLOP/J against intensity under the run's best "
                             "GEMM and memory-bound row")
    return parser


def _refuse_combinations(args: argparse.Namespace) -> None:
    """UsageError for options that do not go together."""
    if args.energy and (args.devices or args.baseline):
        raise UsageError("--energy draws one run: it does not combine with --devices "
                         "or --baseline")
    if args.devices and len(args.runs) < 2:
        raise UsageError(f"--devices compares at least two runs, got {len(args.runs)}")
    if args.devices and args.baseline:
        raise UsageError("--baseline overlays one run; it does not combine with --devices")
    if not args.devices and len(args.runs) > 1:
        raise UsageError(f"{len(args.runs)} runs given: several runs go on one figure "
                         "only with --devices")


def _load(run: str) -> RunDoc:
    """A run to plot, its ok rows' metrics first checked as the file holds them
    (check_metrics: a hand-edited "tflops": "abc" or "flops": null is refused, named,
    rather than drawn or dropped without a word; RunLoadError, one line)."""
    rows = read_doc(resolve_results_json(run)).get("rows")
    if isinstance(rows, list) and all(isinstance(r, dict) for r in rows):
        check_metrics(pd.DataFrame(rows), run)
    return load_doc(run)


def main(argv: list[str]) -> int:
    """`python -m roofline plot RUN [--out PNG] [--baseline RUN]`, or several runs on one
    figure with `--devices` (roofline/report/plot_devices.py); returns the exit code."""
    try:
        args = _parser().parse_args(argv)
        _refuse_combinations(args)
    except UsageError as e:
        print(f"error: {e} (usage: {USAGE})", file=sys.stderr)
        return 2
    except SystemExit as e:  # --help prints and exits 0
        return e.code if isinstance(e.code, int) else 0
    if args.devices:
        return _main_devices(args.runs, args.out)
    run = args.runs[0]
    try:
        doc = _load(run)
        base = _load(args.baseline) if args.baseline else None
    except RunLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.energy:
        return _main_energy(run, doc, args.out)
    roof_png, scaling_png = figure_paths(run, args.out)

    def draw() -> None:
        plot_roofline(doc, roof_png, baseline=base)
        plot_scaling(doc, scaling_png)

    return _drawn(run, draw, [roof_png, scaling_png])


def _drawn(run: str, draw: Callable[[], None], pngs: list[Path]) -> int:
    """Draw the figures `pngs` (exit 0, their paths printed); a run with nothing to draw
    (NoEnergy), a figure that cannot be written or rows that load but cannot be plotted
    (hand-edited, wrong types): one line, no traceback, exit 2, per the CLI contract."""
    try:
        draw()
    except NoEnergy as e:
        print(f"error: cannot plot {run}'s energy: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write {'the figure' if len(pngs) == 1 else 'figures'}: {e}",
              file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        print(f"error: cannot plot {run}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for png in pngs:
        print(png)
    return 0


def _main_devices(runs: list[str], out: str | None) -> int:
    """`plot RUN_A RUN_B ... --devices`: every run loaded and checked before anything is
    drawn, so an unreadable one is refused (one line, exit 2) without a partial figure."""
    loaded: list[RunDoc] = []
    seen: dict[Path, str] = {}
    try:
        for run in runs:
            path = resolve_results_json(run).resolve()
            if path in seen:
                raise RunLoadError(f"{run} is the same run as {seen[path]}: give each run once")
            seen[path] = run
            loaded.append(_load(run))
    except RunLoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    first = Path(runs[0])
    png = (first if first.is_dir() else first.parent) / DEVICES_PNG
    if out is not None:
        o = Path(out)
        png = o / DEVICES_PNG if o.is_dir() or out.endswith(("/", os.sep)) or not o.suffix \
            else o
    try:
        plot_devices(loaded, png)
    except OSError as e:
        print(f"error: cannot write the figure: {e}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        print(f"error: cannot plot {' '.join(runs)}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 2
    print(png)
    return 0


def _main_energy(run: str, doc: RunDoc, out: str | None) -> int:
    """`plot RUN --energy`: energy.png beside the run's figures (or at --out)."""
    run_path = Path(run)
    png = (run_path if run_path.is_dir() else run_path.parent) / ENERGY_PNG
    if out is not None:
        o = Path(out)
        png = o / ENERGY_PNG if o.is_dir() or out.endswith(("/", os.sep)) or not o.suffix \
            else o
    return _drawn(run, lambda: plot_energy(doc, png), [png])
