"""`python -m roofline plan`: the command line.  It parses the flags
(roofline/plan/flags.py), builds the plan's request from them once
(roofline/plan/plan_request.py), and writes the plan build_plan makes of it
(roofline/plan/planner.py) as files and on stdout.  This is the one module of the plan
that reads the parsed arguments.  Measuring is passed in by the entry point
(roofline/__main__.py), since roofline/ never imports benches/."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from contract.devices import DeviceError
from roofline.plan.flags import build_parser
from roofline.plan.harness import Harness
from roofline.plan.model import PlanError
from roofline.plan.plan_record import Plan
from roofline.plan.plan_request import (
    EfficiencyRequest,
    HardwareRequest,
    MemoryRequest,
    ModelRequest,
    OutputRequest,
    PlanRequest,
    TrainingRequest,
)
from roofline.plan.plan_text import print_tables, render_markdown
from roofline.plan.planner import build_plan


def request_of(args: argparse.Namespace) -> PlanRequest:
    """The plan's request from the parsed flags (build_parser's), each group its record;
    --vs's comma list becomes its device keys."""
    return PlanRequest(
        model=ModelRequest(
            preset=args.preset, params=args.params, d_model=args.d_model,
            layers=args.layers, d_ff=args.d_ff, vocab=args.vocab, seq_len=args.seq_len,
            heads=args.heads, kv_heads=args.kv_heads, gated=args.gated, tied=args.tied),
        training=TrainingRequest(tokens=args.tokens, chinchilla=args.chinchilla,
                                 days=args.days, micro_batch=args.micro_batch),
        hardware=HardwareRequest(
            device=args.device, gpus=args.gpus, gpu_memory_gb=args.gpu_memory_gb,
            vs=tuple(k.strip() for k in (args.vs or "").split(",") if k.strip()),
            busbw=args.busbw, busbw_run=args.busbw_run,
            force_busbw_run=args.force_busbw_run),
        efficiency=EfficiencyRequest(
            mfu=args.mfu, from_run=args.from_run, measure=args.measure,
            measure_layers=args.measure_layers, explain=args.explain, steps=args.steps,
            dtype=args.dtype, provider=args.provider, rep_ms=args.rep_ms),
        memory=MemoryRequest(policy=args.policy, bytes_per_param=args.bytes_per_param,
                             weight_format=args.weight_format),
        output=OutputRequest(out=args.out, save=not args.no_save, json=args.json))


def parse_request(argv: list[str]) -> PlanRequest | int:
    """The request of a command line, or the exit code the command returns instead: 2
    after one `error:` line, 0 after --help."""
    args = build_parser().parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        return request_of(args)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def out_dir(requested: str | None) -> Path:
    """The folder to write into; never one that already holds a plan."""
    if requested:
        p = Path(requested)
        if (p / "plan.md").exists() or (p / "plan.json").exists():
            raise PlanError(f"{p} already holds a plan (choose another --out)")
        return p
    base = Path("results") / "plans" / datetime.now().strftime("%Y%m%d-%H%M%S")
    p, i = base, 1
    while p.exists():
        i += 1
        p = base.with_name(f"{base.name}-{i}")
    return p


def check_writable(dest: Path) -> None:
    """OSError unless `dest` can be created: its nearest existing ancestor must be a
    folder this process may write into.  Nothing is created."""
    p = dest
    while not p.exists() and p.parent != p:
        p = p.parent
    if not p.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(p))
    if not os.access(p, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "not writable", str(p))


def _write(plan: Plan, dest: Path) -> str | None:
    """plan.json, plan.md and the figures into `dest` (made now); the roofline figure's
    name, None when there is none (no step timed).  OSError when they cannot be
    written."""
    dest.mkdir(parents=True, exist_ok=True)
    png = None
    if plan.step.ms is not None:
        from roofline.plan.gemm_plot import plot_plan

        plot_plan(plan, dest / "plan.png")
        png = "plan.png"
    if plan.step_measured is not None:
        from roofline.plan.step_plot import plot_step

        plot_step(plan, dest / "step.png")
    from contract.schema import atomic_write_text

    atomic_write_text(dest / "plan.json", json.dumps(plan.to_json(), indent=1) + "\n")
    atomic_write_text(dest / "plan.md", render_markdown(plan, png))
    return png


def main(argv: list[str], harness: Harness | None = None) -> int:
    """`python -m roofline plan ...`; returns the exit code.  The entry point passes the
    harness (roofline/plan/harness.py) for --measure, --explain and measured ceilings."""
    request = parse_request(argv)
    if isinstance(request, int):
        return request
    from contract.schema import RunLoadError

    dest = None
    try:
        if request.output.save:
            dest = out_dir(request.output.out)
            # Checked before any measurement, so an unwritable --out fails in a second,
            # not after minutes of timing; made only once there is a plan to write, so a
            # plan refused for its input leaves nothing behind.
            check_writable(dest)
        plan = build_plan(request, harness=harness)
    except (PlanError, DeviceError, RunLoadError, OSError) as e:
        what = f"cannot create {dest}: " if isinstance(e, OSError) else ""
        print(f"error: {what}{e}", file=sys.stderr)
        return 2
    png = None
    if dest is not None:
        try:
            plan = replace(plan, out_dir=str(dest))
            png = _write(plan, dest)
        except OSError as e:
            print(f"error: cannot write the plan to {dest}: {e}", file=sys.stderr)
            return 2
    if request.output.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print_tables(plan)
        if dest is not None:
            print(f"plan: {dest / 'plan.md'}" + (f", {dest / png}" if png else ""))
    return 0
