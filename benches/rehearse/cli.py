"""`python -m benches.rehearse`: the rehearsal's command line (docs/rehearsal.md).

    python -m benches.rehearse [--arch sm_90|sm_100] [--kernels a,b] [--dtypes x,y]
                               [--out DIR] [--device h100|h200|b200] [--sizes quick]
                               [--cache-dir DIR]

Exit 0 when every case passed, 1 when any failed, 2 on bad input (one `error:` line).
Several arches (the default: sm_90,sm_100) run one after another, each in a process of
its own (Triton's JIT and the autotuners keep per-process state); so does one arch when
the Triton interpreter is on (TRITON_INTERPRET=1 replaced every @triton.jit function at
import, and those cannot be compiled).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benches.rehearse.driver import ARCH_DEFAULT_MODEL, GPU_MODELS
from benches.rehearse.rehearsal_report import (
    RehearsalRun,
    error,
    from_json,
    print_report,
    to_json,
    verdict,
    write_report,
)

ROOT = Path(__file__).resolve().parents[2]  # the repository root


@dataclass(frozen=True)
class Options:
    """The rehearsal's command line, checked: arches, kernels and dtypes as tuples."""

    arches: tuple[str, ...]
    kernels: tuple[str, ...]
    dtypes: tuple[str, ...]
    sizes: str = "quick"
    device: str | None = None  # the stand-in GPU model (default: the arch's own)
    out: str | None = None
    cache_dir: str | None = None
    child_report: str | None = None


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benches.rehearse",
        description="Every Triton launch of the sweep through Triton's real JIT, "
                    "autotuner and launcher, on a stand-in CUDA driver (no GPU).")
    p.add_argument("--arch", default=",".join(ARCH_DEFAULT_MODEL),
                   help="sm_90, sm_100 or both, comma-separated (default: both, each in "
                        "a process of its own)")
    p.add_argument("--kernels", default=None, help="kernels, comma-separated (default: all)")
    p.add_argument("--dtypes", default=None, help="dtypes, comma-separated (default: all)")
    p.add_argument("--out", default=None, help="write rehearsal.json in this folder")
    p.add_argument("--device", default=None,
                   help="the stand-in GPU: h100 or h200 for sm_90, b200 for sm_100 "
                        "(default: h100, b200)")
    p.add_argument("--sizes", default="quick", help="shape preset (default: quick)")
    p.add_argument("--cache-dir", default=None,
                   help="Triton's cache for the rehearsal (default: a temporary folder, "
                        "removed after).  Never a GPU runner's own cache: the tunings "
                        "written there hold stand-in timings")
    p.add_argument("--child-report", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _list(text: str | None, known: list[str] | tuple[str, ...], what: str) -> list[str]:
    if text is None:
        return list(known)
    items = [x for x in text.split(",") if x]
    bad = [x for x in items if x not in known]
    if bad or not items:
        raise ValueError(f"unknown {what}: {', '.join(bad) or '(none given)'} "
                         f"(choose from {', '.join(known)})")
    return items


def options(ns: argparse.Namespace) -> Options:
    """The checked options of a parsed command line; ValueError (one line) when bad."""
    from benches.sweep.shapes import PRESETS
    from kernels import DTYPE_NAMES, REGISTRY

    o = Options(arches=tuple(_list(ns.arch, tuple(ARCH_DEFAULT_MODEL), "--arch")),
                kernels=tuple(_list(ns.kernels, tuple(REGISTRY), "kernel")),
                dtypes=tuple(_list(ns.dtypes, DTYPE_NAMES, "dtype")), sizes=ns.sizes,
                device=ns.device, out=ns.out, cache_dir=ns.cache_dir,
                child_report=ns.child_report)
    if o.sizes not in PRESETS:
        raise ValueError(f"unknown --sizes {o.sizes} (choose from {', '.join(PRESETS)})")
    if o.device is not None:
        model = GPU_MODELS.get(o.device)
        if model is None:
            raise ValueError(f"unknown --device {o.device} "
                             f"(choose from {', '.join(GPU_MODELS)})")
        wrong = [a for a in o.arches if f"sm_{model.arch}" != a]
        if wrong:
            raise ValueError(f"--device {o.device} is sm_{model.arch}, not "
                             f"{', '.join(wrong)}")
    return o


def main(argv: list[str] | None = None) -> int:
    from kernels.spec import interpreter_enabled

    try:
        opts = options(parse(argv))
    except ValueError as e:
        return error(str(e))
    if len(opts.arches) > 1 or interpreter_enabled():
        return _in_children(opts)
    return _in_process(opts, opts.arches[0])


def _meta(argv: list[str]) -> RehearsalRun:
    import torch
    import triton

    return {"command": " ".join(["python -m benches.rehearse", *argv]),
            "triton": triton.__version__, "torch": torch.__version__,
            "python": sys.version.split()[0],
            "created": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _in_process(opts: Options, arch: str) -> int:
    from benches.rehearse.rehearsal import ArchReport, registry_cases, rehearse
    from benches.sweep.interrupt import Terminated, exit_code, signals_raise
    from kernels.spec import fp8_accum

    model = GPU_MODELS[opts.device or ARCH_DEFAULT_MODEL[arch]]
    cache_dir = opts.cache_dir or tempfile.mkdtemp(prefix="rehearse-triton-")
    report = ArchReport(arch, model.key, list(model.capability), "", cache_dir)

    def progress(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        with signals_raise():
            cases = registry_cases(arch, model, list(opts.kernels), list(opts.dtypes),
                                   opts.sizes, fp8_accum(), report)
            rehearse(cases, model, report, progress)
    except (KeyboardInterrupt, Terminated) as e:  # Ctrl-C, SIGTERM: 130, 143
        print("interrupted", file=sys.stderr)
        return exit_code(e)
    finally:
        if opts.cache_dir is None:
            shutil.rmtree(cache_dir, ignore_errors=True)
    print_report(report)
    if opts.child_report:
        Path(opts.child_report).write_text(json.dumps(to_json(report)))
    if opts.out:
        path = write_report(Path(opts.out), [report], _meta(sys.argv[1:]))
        print(f"wrote {path}")
    return 1 if report.failures else 0


def _in_children(opts: Options) -> int:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    reports, codes = [], []
    with tempfile.TemporaryDirectory(prefix="rehearse-") as tmp:
        for arch in opts.arches:
            child = Path(tmp) / f"{arch}.json"
            cmd = [sys.executable, "-m", "benches.rehearse", "--arch", arch,
                   "--kernels", ",".join(opts.kernels), "--dtypes", ",".join(opts.dtypes),
                   "--sizes", opts.sizes, "--child-report", str(child)]
            cmd += ["--device", opts.device] if opts.device else []
            cmd += ["--cache-dir", opts.cache_dir] if opts.cache_dir else []
            code = subprocess.run(cmd, env=env, cwd=ROOT).returncode
            codes.append(code)
            if child.exists():
                reports.append(from_json(json.loads(child.read_text())))
            elif code not in (0, 1):
                return code  # bad input or an interrupt: the child said why
    for r in reports:
        print(f"{r.arch}: {verdict(r)} ({r.wall_s:.1f} s, triton {r.triton})")
    if opts.out:
        path = write_report(Path(opts.out), reports, _meta(sys.argv[1:]))
        print(f"wrote {path}")
    return 1 if any(c != 0 for c in codes) else 0
