"""Fleet acceptance: `torchrun --nproc-per-node=G run_bench.py --acceptance [--minutes M]`
gives every GPU (rank) and node OK / WARN / CRITICAL / UNKNOWN, as cluster bring-up
checks do (DCGM diagnostics, gpu-fryer, Imbue's host checks, Meta's GCM).

Every rank, all at once: passive NVML readings of its GPU (benches/fleet/
acceptance_nvml.py; none on a CPU rank: UNKNOWN), a matmul stress of M minutes split
over its dtypes with equality checks, sampled by NVML for clock-event reasons and
temperature, a copy bandwidth and its node's all_reduce busbw
(benches/fleet/acceptance_stress.py).  Rank 0 gathers it all, judges it by the rules of
benches/fleet/acceptance_rules.py and writes acceptance.md, acceptance.json and
acceptance.png into <out>/acceptance/<run-id>/ (made before anything is measured, never
over an existing one).

Exit codes are GCM's: 0 OK, 1 WARN, 2 CRITICAL, 3 UNKNOWN only (rank 0; the others exit
0 unless they fail).  torchrun turns a worker's non-zero exit into its own exit 1, so a
job script reads the verdict from rank 0's last stdout line, `verdict: <VERDICT> (exit
N) <path of acceptance.json>`, or from acceptance.json's "verdict".  A usage error or a
refused fleet prints one `error:` line and exits 2 before anything is measured: no
`verdict:` line, no acceptance.json.

Test-only hooks (environment variables; they exist so the verdicts can be tested on one
machine): GPUBENCH_TEST_SLOW_RANK=r (the fleet run's hook) makes rank r's measured
times SLOW_FACTOR (10) times longer; GPUBENCH_TEST_WRONG_RANK=r alters one element of
rank r's second stress product, as silent data corruption would.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from benches.fleet.acceptance_records import AcceptanceDoc, Node, PcieLink, RankRecord
from benches.fleet.acceptance_rules import Thresholds
from contract.cli import positive_problem
from contract.request import AcceptanceOptions, RunRequest

TEST_WRONG = "GPUBENCH_TEST_WRONG_RANK"
DEFAULT_MINUTES = 2.0
_DEFAULTS = {"minutes": DEFAULT_MINUTES, **Thresholds().as_dict()}
_FLAGS = {"minutes": "--minutes", "median_warn_pct": "--median-warn",
          "median_critical_pct": "--median-critical", "busbw_warn_pct": "--busbw-warn",
          "busbw_critical_pct": "--busbw-critical", "expected_busbw": "--expected-busbw"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The --acceptance options (run_bench.py)."""
    t = Thresholds()
    p.add_argument("--acceptance", action="store_true",
                   help="under torchrun: fleet acceptance, OK/WARN/CRITICAL/UNKNOWN per GPU "
                        "and node from NVML readings and an all-GPU stress; exit 0/1/2/3 "
                        "and a last line `verdict: ...` (see README)")
    p.add_argument("--minutes", type=float, default=None, metavar="M",
                   help=f"--acceptance: minutes of matmul stress (default {DEFAULT_MINUTES:g})")
    p.add_argument("--median-warn", dest="median_warn_pct", type=float, default=None,
                   metavar="PCT", help="--acceptance: a GPU's matmul or copy figure more than "
                   f"PCT%% below its node's or fleet's median is WARN (default "
                   f"{t.median_warn_pct:g})")
    p.add_argument("--median-critical", dest="median_critical_pct", type=float,
                   default=None, metavar="PCT", help="--acceptance: ... CRITICAL (default "
                   f"{t.median_critical_pct:g})")
    p.add_argument("--busbw-warn", dest="busbw_warn_pct", type=float, default=None,
                   metavar="PCT", help="--acceptance: a node's all_reduce busbw under PCT%% "
                   f"of the expected link figure is WARN (default {t.busbw_warn_pct:g})")
    p.add_argument("--busbw-critical", dest="busbw_critical_pct", type=float, default=None,
                   metavar="PCT", help="--acceptance: ... CRITICAL (default "
                   f"{t.busbw_critical_pct:g})")
    p.add_argument("--expected-busbw", type=float, default=None, metavar="GBPS",
                   help="--acceptance: the busbw a node should reach, GB/s (default: the "
                        "device model's NVLink GB/s per direction; none on CPUs)")


def acceptance_options(ns: argparse.Namespace) -> AcceptanceOptions | None:
    """The --acceptance options of a parsed command line, defaults filled in; None
    without --acceptance."""
    if not ns.acceptance:
        return None
    given = {key: getattr(ns, key) for key in _FLAGS}
    return AcceptanceOptions(**{k: _DEFAULTS.get(k) if v is None else v
                                for k, v in given.items()})


def check_args(ns: argparse.Namespace) -> str | None:
    """The usage error in the acceptance options of a parsed command line (None: fine)."""
    given = [flag for key, flag in _FLAGS.items() if getattr(ns, key) is not None]
    o = acceptance_options(ns)
    if o is None:
        return f"{given[0]} needs --acceptance" if given else None
    for flag in ("resume", "compare", "check_only", "inspect"):
        if getattr(ns, flag, None):
            return f"--acceptance does not take --{flag.replace('_', '-')}"
    problem = positive_problem("--minutes", o.minutes)
    if problem:
        return problem
    w, c = o.median_warn_pct, o.median_critical_pct
    if not 0 <= w < c < 100:
        return (f"--median-warn and --median-critical must satisfy 0 <= warn < critical < "
                f"100, got {w:g} and {c:g}")
    w, c = o.busbw_warn_pct, o.busbw_critical_pct
    if not 0 < c < w <= 100:
        return (f"--busbw-critical and --busbw-warn must satisfy 0 < critical < warn <= "
                f"100, got {c:g} and {w:g}")
    return positive_problem("--expected-busbw", o.expected_busbw, "GB/s")


def thresholds(o: AcceptanceOptions) -> Thresholds:
    return Thresholds(o.median_warn_pct, o.median_critical_pct, o.busbw_warn_pct,
                      o.busbw_critical_pct)


def run_acceptance(req: RunRequest, argv: list[str]) -> int:
    """One rank's part; returns its exit code (rank 0: the fleet's verdict's)."""
    from benches.fleet import dist as fdist
    from benches.fleet.liveness import FleetError
    from benches.fleet.rank_io import say_line

    try:
        me = fdist.start(req.fleet.dist_timeout, req.device.key)
    except FleetError as e:
        fdist.stop()
        say_line(f"error: {e}")
        return e.code
    try:
        return _run(me, req, argv)
    except FleetError as e:
        say_line(f"error: rank {me.rank} on {me.host}: {e}")
        return e.code
    finally:
        fdist.stop()


def _folder(me: Any, req: RunRequest) -> Path:
    """<out>/acceptance/<run-id>/, made by rank 0 before anything is measured; refused
    (exit 2) where it exists: nothing measured is overwritten."""
    from benches.fleet import dist as fdist
    from benches.fleet.dist import FleetRefused

    run_id = fdist.broadcast_object("sharing the run id", req.output.run_id
                                    or datetime.now().strftime("%Y%m%d-%H%M%S"))
    folder = Path(req.output.out) / "acceptance" / run_id
    problem = None
    if me.rank == 0:
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            problem = f"{folder} exists already (runs are never overwritten)"
        except OSError as e:
            problem = f"cannot create {folder}: {e.strerror or e}"
    problem = fdist.broadcast_object("making the acceptance folder", problem)
    if problem:
        raise FleetRefused(problem)
    return folder


def _device(me: Any, opts: AcceptanceOptions) -> tuple[str, str, float | None]:
    """(device key, device name, expected busbw GB/s): the device model's NVLink figure
    per direction (contract/devices.py, as the fleet run's collectives roof) unless
    --expected-busbw."""
    from contract.devices import DEVICES, detect, host_cpu

    present = detect() if me.device == "cuda" else host_cpu()
    model = DEVICES.get(present.key)
    link = model.nvlink_gbps if model is not None else None
    return present.key, present.name, opts.expected_busbw or link


def _nvml(me: Any) -> tuple[Any, Any, str]:
    """(pynvml, handle, why not) for this rank's GPU."""
    if me.device != "cuda":
        return None, None, "a CPU rank: no NVML (GPU-only check)"
    from benches.sweep.failures import error_message
    from benches.sweep.gpu_monitor import load_pynvml, nvml_handle

    nv = load_pynvml()
    if nv is None:
        return None, None, "nvidia-ml-py is not installed"
    try:
        nv.nvmlInit()
        h, how = nvml_handle(nv)
    except Exception as e:
        return None, None, f"NVML: {error_message(e)}"
    return (nv, h, "") if h is not None else (None, None, f"NVML: {how}")


def _run(me: Any, req: RunRequest, argv: list[str]) -> int:
    from benches.fleet import acceptance_stress as stress
    from benches.fleet import dist as fdist
    from benches.fleet.acceptance_report import finish
    from benches.fleet.acceptance_rules import judge_fleet
    from benches.fleet.folder import versions

    t_begin = time.monotonic()
    opts = req.fleet.acceptance
    if opts is None:
        raise ValueError("run_acceptance needs a request with --acceptance's options")
    fdist.agree("versions and request", {**versions(req), **asdict(opts)})
    folder = _folder(me, req)
    key, name, expected = _device(me, opts)
    dtypes = stress.stress_dtypes(me.device)
    seconds = opts.minutes * 60 / len(dtypes)
    mine = RankRecord(me.rank, me.host, me.local_rank, me.device, key, name)
    record, hosts = _measure(me, mine, dtypes, seconds)
    every: list[RankRecord] = fdist.all_gather_object("gathering the results", record)
    if me.rank != 0:
        return 0
    t = thresholds(opts)
    judged = judge_fleet(every, _nodes(hosts, every, expected), t)
    doc = AcceptanceDoc(folder.name, " ".join(["run_bench.py", *argv]), me.world, me.backend,
                        opts, tuple(dtypes), seconds, time.monotonic() - t_begin, judged,
                        tuple(every))
    return finish(folder, doc, t, plot_png=req.output.plots)


def _measure(me: Any, mine: RankRecord, dtypes: tuple[str, ...], seconds: float
             ) -> tuple[RankRecord, list[str]]:
    """This rank's part, every rank at once: the stress of each dtype (NVML sampling it,
    the PCIe link read half way), the passive NVML readings, the copy, the node's
    all_reduce; `mine` filled in, and every rank's host."""
    from benches.fleet import acceptance_stress as stress
    from benches.fleet import dist as fdist
    from benches.fleet.acceptance_nvml import read_passive, read_pcie, stress_summary
    from benches.fleet.folder import SLOW_FACTOR
    from benches.fleet.run import TEST_SLOW
    from benches.sweep.gpu_monitor import GpuMonitor

    nv, h, why = _nvml(me)
    monitor = GpuMonitor(nv, h).start() if nv is not None else None
    slow = SLOW_FACTOR if os.environ.get(TEST_SLOW) == str(me.rank) else 1.0
    wrong = os.environ.get(TEST_WRONG) == str(me.rank)
    hosts = fdist.all_gather_object("starting the stress together", me.host)
    pcie: list[PcieLink] = []

    def midway() -> None:
        if nv is not None and not pcie:
            pcie.append(read_pcie(nv, h))

    results, t0 = {}, time.monotonic()
    for dtype in dtypes:
        results[dtype] = stress.matmul_stress(dtype, seconds, me.device, slow=slow,
                                              wrong=wrong, midway=midway)
    t1 = time.monotonic()
    record = replace(mine, stress=results, nvml_why=why)
    if monitor is not None:
        monitor.stop()
        during = [s for s in list(monitor.readings) if t0 <= s.t <= t1]
        record = replace(record, stress_nvml=stress_summary(during, monitor.max_sm_clock_mhz),
                         nvml=replace(read_passive(nv, h), pcie=pcie[0] if pcie else None))
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()
    fdist.all_gather_object("starting the copies together", me.rank)
    record = replace(record, copy_gbps=stress.copy_bandwidth(me.device, slow))
    fdist.all_gather_object("finishing the copies together", me.rank)
    busbw = fdist.collective("timing the node's all_reduce", stress.node_busbw, hosts,
                             me.rank, me.device, slow)
    return replace(record, busbw=busbw), hosts


def _nodes(hosts: list[str], every: list[RankRecord], expected: float | None) -> list[Node]:
    """The fleet's nodes in the order their first rank came, each with its ranks and the
    all_reduce its first rank measured (every rank of a node took part in the same)."""
    nodes = []
    for host in sorted(set(hosts), key=hosts.index):
        ranks = tuple(r for r, x in enumerate(hosts) if x == host)
        b = every[ranks[0]].busbw
        nodes.append(Node(host, ranks, b.busbw_gbps if b else None, expected, b))
    return nodes
