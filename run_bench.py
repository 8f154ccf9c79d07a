#!/usr/bin/env python
"""Run the benchmark sweep: correctness gate, timing, roofline metrics, plots, summary.

    python run_bench.py                               # detected device, default sweep
    python run_bench.py --device h100 --dtypes bf16,fp8
    python run_bench.py --check-only                  # correctness only (Triton via the
                                                      # interpreter when there is no GPU)
    python run_bench.py --list | --list-devices
    python run_bench.py --inspect [--arch sm_90]      # compile every Triton kernel for a
                                                      # GPU, no GPU needed
    python run_bench.py --resume results/cpu/RUN      # finish an interrupted run
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from benches.fleet.rank_io import say_line
from benches.sweep.interrupt import Terminated, exit_code, exit_now, signals_raise
from contract.cli import Parser, UsageError, positive_problem
from contract.request import (
    Budgets,
    CeilingsChoice,
    DeviceChoice,
    FleetChoice,
    GateChoice,
    Measurement,
    Output,
    RunRequest,
    Selection,
    TritonChoice,
    validated,
)

# roofline.gate needs pandas and scipy only: safe to import before TRITON_INTERPRET is set.
from roofline.gate.cli import threshold_help
from roofline.gate.rules import CompareError, check_threshold

if TYPE_CHECKING:  # the workers' module is imported where they are started
    from benches.sweep.triton_cache import CompileAhead


def _registry_lists() -> dict[str, str]:
    """The names --help lists, from the registries themselves (kernels, dtypes, providers,
    device models), so a new one is listed by its registry line alone.  Imported only
    for --help: the kernel modules must load after TRITON_INTERPRET is settled."""
    from benches.inspect.compile import ARCHES
    from benches.sweep.shapes import PRESETS
    from contract.devices import DEVICES
    from kernels import PROVIDERS, REGISTRY
    from kernels.spec import DTYPE_NAMES

    devices = [k for k in DEVICES if k not in ("cpu", "gpu")]
    return {"kernels": ",".join(REGISTRY), "dtypes": ",".join(DTYPE_NAMES),
            "providers": ",".join(PROVIDERS), "devices": ", ".join(devices),
            "sizes": "|".join(PRESETS), "arches": ", ".join(ARCHES)}


# The parser's defaults are the request's (contract/request.py), read from one place.
DEFAULT = RunRequest()


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line parsed and its flags checked (a UsageError: one `error:` line,
    exit 2); request_of builds the request from it."""
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Lists are validated against the registries once they are imported (request_of).
    names = _registry_lists() if {"-h", "--help"} & set(argv) else {
        k: f"see --{'list-devices' if k == 'devices' else 'list'}"
        for k in ("kernels", "dtypes", "providers", "devices", "sizes", "arches")}
    _selection_args(p, names)
    _run_folder_args(p)
    _timing_args(p)
    _fleet_args(p)
    _mode_args(p, names)
    args = p.parse_args(argv)
    problem = _usage_problem(args)
    if problem:
        raise UsageError(problem)
    return args


def _selection_args(p: argparse.ArgumentParser, names: dict[str, str]) -> None:
    """What is measured, on which device model: the request's selection and device."""
    sel, meas = DEFAULT.selection, DEFAULT.measurement
    p.add_argument("--device", default=DEFAULT.device.key,
                   help=f"device model: auto (detect), cpu, {names['devices']}, gpu (an "
                        "unlisted GPU: measured ceilings); --list-devices shows their peaks")
    p.add_argument("--dtypes", default=",".join(sel.dtypes),
                   help=f"comma list of {names['dtypes']} (fp8 = e4m3, fp8e5 = e5m2); "
                        "default all")
    p.add_argument("--kernels", default=",".join(sel.kernels),
                   help=f"comma list of {names['kernels']}; default all")
    p.add_argument("--providers", default=",".join(sel.providers),
                   help=f"comma list of {names['providers']}; default: torch,triton; all: "
                        "every one but compile-max (opt-in: minutes of autotuning a shape)")
    p.add_argument("--sizes", default=sel.sizes,
                   help=f"{names['sizes']}, or explicit shapes separated by ';', e.g. "
                        "'n=1048576;M=4096,K=4096;M=4096,N=4096,K=4096' or '4096', or a "
                        "model's step: model:NAME[:tokens=N] (a plan preset) or "
                        "model:path/config.json[:tokens=N]")
    p.add_argument("--baseline-provider", default=sel.baseline_provider, metavar="P",
                   help="the provider each row's speedup column is measured against "
                        "(its time / the row's; default torch)")
    p.add_argument("--energy", default=meas.energy, metavar="ROWS",
                   help="GPU rows that get an energy window (their timed loop replayed "
                        "long enough for NVML's energy counter, a few of its periods): "
                        "largest = each kernel, provider, dtype and cache mode's largest "
                        "shape (default), all, off")
    p.add_argument("--cache", default=None, metavar="MODES",
                   help="comma list of cold,warm: cold = caches flushed (GPU) or rotated "
                        "past (CPU) before every call, warm = back-to-back calls on the "
                        "same buffers; each row is timed in each mode, recorded in its "
                        "`cache` column (default: cold on a GPU, warm on a CPU)")


def _run_folder_args(p: argparse.ArgumentParser) -> None:
    """Where the run goes, its seed, and the gate it passes (--compare)."""
    out = DEFAULT.output
    p.add_argument("--out", default=out.out, help="results root (default: results/)")
    p.add_argument("--run-id", default=None,
                   help="run folder name, a plain name never used before (default: a "
                        "timestamp)")
    p.add_argument("--resume", metavar="RUN", default=None,
                   help="finish an interrupted or aborted run folder: only its missing cases, "
                        "with its own settings, appended to its files")
    p.add_argument("--seed", type=int, default=DEFAULT.selection.seed)
    p.add_argument("--compare", metavar="BASELINE", default=None,
                   help="compare with a baseline run (folder or JSON); exit 1 on regression")
    p.add_argument("--threshold", type=float, default=None, metavar="PCT",
                   help=f"regression threshold in percent (default: {threshold_help()})")
    p.add_argument("--allow-device-mismatch", action="store_true",
                   help="compare against a baseline from another device")
    p.add_argument("--allow", default=DEFAULT.gate.allow, metavar="LIST",
                   help="gate failures to tolerate in --compare, comma list of: missing, "
                        "method-change, incomplete, newer-baseline, throttled")


def _timing_args(p: argparse.ArgumentParser) -> None:
    """How rows are timed: the fp8 mode, the throttle rule, the budgets."""
    meas = DEFAULT.measurement
    p.add_argument("--fp8-accum", choices=("fast", "precise"), default=None,
                   help="fp8 matmul accumulation for Triton, torch._scaled_mm and the fp8 "
                        "ceiling alike (default: fast)")
    p.add_argument("--throttle-threshold", type=float, default=meas.throttle_threshold,
                   metavar="PCT",
                   help="GPU: a timing whose median SM clock is below PCT%% of the maximum "
                        "SM clock (or that saw a power/thermal throttle reason) is timed "
                        "again, and the row marked throttled if it stays so (default 75, "
                        "as nvbench)")
    p.add_argument("--throttle-recovery-delay", type=float,
                   default=meas.throttle_recovery_delay, metavar="S",
                   help="GPU: seconds to wait before timing a throttled row again "
                        "(default 0.05, as nvbench)")
    p.add_argument("--row-budget", type=float, default=None, metavar="S",
                   help="seconds one row's timing may take: it then takes fewer samples, "
                        "never fewer than the regression gate needs (10), and a row that "
                        "cannot fit even those is skipped with the reason (default 5)")
    p.add_argument("--run-budget", type=float, default=None, metavar="S",
                   help="seconds the sweep's timing may take in all, shared among the cases "
                        "left: rows then take fewer samples, none is dropped for it "
                        "(default 90 on a CPU, none on a GPU; 'inf' for none)")


def _fleet_args(p: argparse.ArgumentParser) -> None:
    """Under torchrun: the fleet's tolerance, liveness and collectives; --acceptance."""
    from benches.fleet.acceptance import add_arguments

    p.add_argument("--fleet-tolerance", type=float, default=None, metavar="PCT",
                   help="under torchrun: a device more than PCT%% below the fleet median on "
                        "a key figure is an outlier, exit 1 (default 5 on GPUs, 25 on CPUs)")
    p.add_argument("--dist-timeout", type=float, default=DEFAULT.fleet.dist_timeout,
                   metavar="S",
                   help="under torchrun: a rank whose heartbeat stops for S seconds (killed, "
                        "frozen, its host gone) is lost, and the fleet stops with an error "
                        "naming it, keeping every row; a rank that lives but never ends its "
                        "sweep is given up after the waiting rank's own sweep time plus S "
                        "(default 120)")
    p.add_argument("--no-collectives", dest="collectives", action="store_false",
                   help="under torchrun: skip timing the collectives")
    add_arguments(p)  # --acceptance and its options (benches/fleet/acceptance.py)


def _mode_args(p: argparse.ArgumentParser, names: dict[str, str]) -> None:
    """What the command does besides a timed sweep, and the run's extras."""
    p.add_argument("--check-only", action="store_true",
                   help="check every selected kernel's correctness, no timing")
    p.add_argument("--estimate", action="store_true",
                   help="print what the selected sweep would cost on --device, phase by "
                        "phase, from its plan and earlier runs' rows under --out; "
                        "nothing is measured")
    p.add_argument("--retune", action="store_true",
                   help="GPU: autotune every Triton launch even where this GPU model has "
                        "shipped configs (kernels/configs/), and say in each row by how "
                        "much the shipped config was slower")
    p.add_argument("--remeasure-ceilings", action="store_true",
                   help="measure the device's ceilings again instead of using the cache")
    p.add_argument("--no-measure-ceilings", action="store_true",
                   help="on a GPU with a datasheet, skip measuring ceilings")
    p.add_argument("--no-plots", action="store_true", help="write no PNGs")
    p.add_argument("--history", metavar="STORE", default=None,
                   help="add the finished run to this history store (python -m roofline "
                        "history add RUN --store STORE)")
    p.add_argument("--list", action="store_true", help="list kernels, providers, dtypes, formulas")
    p.add_argument("--list-devices", action="store_true",
                   help="list device models with peaks and ridge points")
    p.add_argument("--inspect", action="store_true",
                   help="compile every Triton kernel x config x dtype for --arch (no GPU "
                        "needed) and report registers, spills, shared memory, MMA, loads")
    p.add_argument("--arch", default=DEFAULT.triton.arch,
                   help=f"--inspect target: {names['arches']} (sm_100: B200 class, tcgen05 "
                        "MMA, tensor memory)")


def _usage_problem(args: argparse.Namespace) -> str | None:
    """The first flag value out of its range (None: every one is fine)."""
    from benches.fleet.acceptance import check_args

    problem = check_args(args)
    if problem:
        return problem
    try:
        check_threshold(args.threshold)
    except CompareError as e:
        return str(e)
    if not 0 < args.throttle_threshold <= 100:  # NaN fails this too
        return f"--throttle-threshold must be in (0, 100], got {args.throttle_threshold:g}"
    if args.fleet_tolerance is not None and not 0 <= args.fleet_tolerance < 100:
        return f"--fleet-tolerance must be in [0, 100), got {args.fleet_tolerance:g}"
    for flag, v in (("--row-budget", args.row_budget), ("--run-budget", args.run_budget),
                    ("--dist-timeout", args.dist_timeout)):
        problem = positive_problem(flag, v, "seconds", infinite_ok=True)
        if problem:
            return problem
    if not 0 <= args.throttle_recovery_delay <= 60:
        return (f"--throttle-recovery-delay must be between 0 and 60 seconds, got "
                f"{args.throttle_recovery_delay:g}")
    return None


def _items(text: str) -> tuple[str, ...]:
    """A comma list's items, as given (validated checks them)."""
    return tuple(text.split(","))


def request_of(args: argparse.Namespace) -> RunRequest:
    """The run request of a parsed command line, each group from its flags, checked
    against the registries (which it loads: the interpreter must be settled first).
    The one place the parsed arguments become the request."""
    from benches.fleet.acceptance import acceptance_options
    from benches.sweep.shapes import parse_sizes
    from contract.models import MODEL_SIZES
    from kernels.spec import SIZE_PRESETS

    explicit = args.sizes not in SIZE_PRESETS and not args.sizes.startswith(MODEL_SIZES)
    return validated(RunRequest(
        selection=Selection(
            kernels=_items(args.kernels), dtypes=_items(args.dtypes),
            providers=_items(args.providers), sizes="explicit" if explicit else args.sizes,
            shapes=tuple(parse_sizes(args.sizes)) if explicit else None,
            cache=None if args.cache is None else _items(args.cache), seed=args.seed,
            check_only=args.check_only, baseline_provider=args.baseline_provider),
        device=DeviceChoice(args.device, args.fp8_accum),
        measurement=Measurement(args.throttle_threshold, args.throttle_recovery_delay,
                                args.energy),
        budgets=Budgets(args.row_budget, args.run_budget),
        ceilings=CeilingsChoice(measure=not args.no_measure_ceilings,
                                remeasure=args.remeasure_ceilings),
        output=Output(args.out, args.run_id, args.resume, not args.no_plots, args.history),
        gate=GateChoice(args.compare, args.threshold, args.allow,
                        args.allow_device_mismatch),
        fleet=FleetChoice(args.fleet_tolerance, args.dist_timeout, args.collectives,
                          acceptance_options(args)),
        triton=TritonChoice(args.arch, args.retune)))


def main(argv: list[str] | None = None, started: float | None = None) -> int:
    """The command; `started`: the perf_counter reading at which this process started
    (the run's time split then counts start-up and imports; default: from job.run on)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        with signals_raise():
            return _main(argv, started)
    except (KeyboardInterrupt, Terminated) as e:
        # Reached only outside a run's own handling (start-up, listings, inspect): the
        # sweep itself keeps its rows and returns the same codes.
        print("interrupted" if isinstance(e, KeyboardInterrupt) else "terminated",
              file=sys.stderr)
        return exit_code(e)


def _early_workers(args: argparse.Namespace) -> CompileAhead | None:
    """The sweep's compile-ahead workers, started as soon as the arguments are parsed,
    before this process loads its kernels and sets up the GPU (benches/sweep/
    triton_cache.py, spawn_early): for a single-process sweep that may run Triton kernels
    on a GPU and will measure its ceilings; None otherwise."""
    if (args.inspect or args.estimate or args.list or args.list_devices or args.acceptance
            or args.check_only or (args.device or "").lower() == "cpu"):
        return None
    providers = {p.strip() for p in str(args.providers).split(",")}
    if not providers & {"triton", "default", "all"}:
        return None
    from pathlib import Path

    from benches.fleet.dist import launched
    from benches.measured_ceilings import any_cached
    from benches.sweep.triton_cache import default_workers, spawn_early, wait_s

    # They compile while the ceilings are measured and the sweep waits for them after
    # (triton_cache.after_ceilings).  Without that wait (GPUBENCH_COMPILE_WAIT_S=0) and
    # no ceilings to measure (a cache entry, very likely this GPU's, or
    # --no-measure-ceilings) there is no time for them.
    try:
        waits = wait_s() > 0
        default_workers()
    except ValueError:  # refused by the request's own check, in one line
        return None
    no_ceilings = args.no_measure_ceilings or (not args.remeasure_ceilings
                                               and any_cached(Path(args.out)))
    if no_ceilings and not waits:
        return None
    return None if launched() else spawn_early()


def _main(argv: list[str], started: float | None = None) -> int:
    switched_on = False
    early: CompileAhead | None = None
    try:
        args = parse_args(argv)
        switched_on = _interpreter_for_check_only(args)
        early = _early_workers(args)
        # The one request every job below reads (the kernel registry loads here, after
        # the interpreter was settled).
        req = request_of(args)
        return _dispatch(args, req, argv, started, early)
    except UsageError as e:
        say_line(f"error: {e}")  # one write: under torchrun every rank says it at once
        return 2
    except Exception as e:  # the library's one-line errors (bad shape, device, baseline)
        from benches.sweep.job import USER_ERRORS

        if isinstance(e, USER_ERRORS):
            say_line(f"error: {e}")
            return 2
        raise
    finally:
        if early is not None:
            early.stop()  # unless the sweep took them (its own stop ends them)
        if switched_on:
            # It did its work when the kernels were decorated; left set, it would leak
            # into every child process (re-timing rounds, a caller's later runs).
            os.environ.pop("TRITON_INTERPRET", None)


def _dispatch(args: argparse.Namespace, req: RunRequest, argv: list[str],
              started: float | None, early: CompileAhead | None) -> int:
    """The job the command line asks for: inspect, estimate, a listing, acceptance, a
    fleet rank's run, or the sweep (and its --history)."""
    from benches.fleet.dist import launched
    from benches.sweep import job

    if args.inspect:
        from benches.inspect.compile import run_inspect

        return run_inspect(req)
    if args.estimate:
        from benches.estimate.estimate_report import run_estimate

        return run_estimate(req)
    if args.list or args.list_devices:
        from benches.fleet.listing import print_collectives
        from benches.sweep.console import print_devices, print_kernels

        if args.list:
            print_kernels()
            print_collectives()
        else:
            print_devices()
        return 0
    if args.acceptance:
        if not launched():
            raise UsageError("--acceptance runs every GPU at once under torchrun: "
                             "torchrun --nproc-per-node=G run_bench.py --acceptance")
        from benches.fleet.acceptance import run_acceptance

        return run_acceptance(req, argv)
    if launched():
        # torchrun started this process: one rank of a fleet run (benches/fleet/run.py).
        _refuse_in_a_fleet(req)
        from benches.fleet.run import run_fleet

        return run_fleet(req, argv, started)
    if req.output.history:
        return _run_and_add(req, argv, started, early)
    return job.run(req, argv, started=started, early=early)


def _refuse_in_a_fleet(req: RunRequest) -> None:
    """UsageError for what only a single-process run does (resume, gate, history)."""
    if req.output.resume:
        raise UsageError("--resume continues a single-process run; start a fleet "
                         "run again under torchrun (its rows are kept per rank)")
    if req.gate.compare:
        raise UsageError("--compare gates a single-process run; gate a fleet's "
                         "rank folders afterwards (python -m roofline compare "
                         "BASELINE <out>/fleet/<run-id>/ranks/rank-<r>/<device>/"
                         "<run-id>)")
    if req.output.history:
        raise UsageError("--history adds a single-process run; add a fleet's rank "
                         "folders afterwards (python -m roofline history add RUN)")


def _run_and_add(req: RunRequest, argv: list[str], started: float | None,
                 early: CompileAhead | None = None) -> int:
    """--history STORE: the store is checked (and made) before anything is measured, the
    run made, then its folder added.  The folder is the one this run created under
    <out>/<device>/ (the --resume folder when resuming); a run that did not finish
    (interrupted, aborted) is not added: resuming it adds it."""
    from pathlib import Path

    from benches.sweep import job
    from roofline.history.errors import HistoryError
    from roofline.history.store import add_run, prepare_store

    store = req.output.history
    assert store is not None
    if req.selection.check_only:
        raise UsageError("--history keeps timings: a --check-only run has none")
    try:
        prepare_store(store)
    except HistoryError as e:
        raise UsageError(str(e)) from None
    out = Path(req.output.out)
    before = set(out.glob("*/*/results.json"))
    code = job.run(req, argv, started=started, early=early)
    if req.output.resume:
        made = [Path(req.output.resume)]
    else:
        made = [p.parent for p in set(out.glob("*/*/results.json")) - before
                if req.output.run_id is None or p.parent.name == req.output.run_id]
    if len(made) != 1:
        say_line(f"error: --history: {len(made)} new run folders under {out} (another run "
                 "wrote there at the same time?): add this run with python -m roofline "
                 "history add RUN")
        return max(code, 2)
    if code not in (0, 1):  # 1: failed rows, a whole run all the same
        print(f"note: the run did not finish: not added to {store} (resume it with "
              f"--resume {made[0]} --history {store})", file=sys.stderr)
        return code
    try:
        added = add_run(made[0], store)
    except HistoryError as e:
        say_line(f"error: --history: {e}")
        return 2
    print(f"history: run #{added.seq} of {added.path} ({added.rows} rows)")
    return code


def _interpreter_for_check_only(args: argparse.Namespace) -> bool:
    """Switch the Triton interpreter on for --check-only without a GPU, so Triton
    kernels are checked too.  Triton reads TRITON_INTERPRET when it decorates a kernel,
    so this works only before the kernel modules are imported; after that (a caller that
    imported them already) it would change nothing, and the Triton rows are skipped with
    a reason instead.  Returns whether it set the variable."""
    if not args.check_only or "TRITON_INTERPRET" in os.environ \
            or "kernels.triton_utils" in sys.modules:  # loaded first by every family
        return False
    import torch

    if args.device == "cpu" or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
        return True
    return False


if __name__ == "__main__":
    from benches.sweep.time_split import process_start

    exit_now(main(started=process_start()))
