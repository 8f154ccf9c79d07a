"""Fleet runs: `torchrun --nproc-per-node=G run_bench.py [the usual flags]`.

Every rank runs the usual sweep on its own device (cuda:LOCAL_RANK, or a CPU process with
its share of the cores), with ceilings measured on that device, into its own run folder
(<out>/fleet/<run-id>/ranks/rank-<r>/).  Before measuring, the ranks agree on the suite's
version, torch, triton and the request (kernels, dtypes, providers, sizes, seed,
device); with more than one rank they then time the collectives together.  Rank 0
gathers every row (torch.distributed object collectives) into <out>/fleet/<run-id>/:
results.csv/json with `rank`, `host` and `gpu_uuid` on every row, summary.md, fleet.md
and fleet.png; a device more than --fleet-tolerance below the fleet median on a key
figure is an outlier, and the exit code is then 1.

Test-only hooks (environment variables, read nowhere else; they exist so the outlier and
failure paths can be tested on one machine): GPUBENCH_TEST_SLOW_RANK=r multiplies rank
r's measured times by 10; GPUBENCH_TEST_EXIT_RANK=r makes rank r leave before the rows
are gathered; GPUBENCH_TEST_CASES_RANK=r gives rank r a different case list.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from benches import dist as fdist
from benches.dist import FleetError, FleetRefused, Rank

TEST_SLOW = "GPUBENCH_TEST_SLOW_RANK"
TEST_EXIT = "GPUBENCH_TEST_EXIT_RANK"
TEST_CASES = "GPUBENCH_TEST_CASES_RANK"
SLOW_FACTOR = 10.0
# NVLink bandwidth per direction per GPU (DESIGN.md section 6), the collectives' roof.
LINK_GBPS = {"h100": 450.0, "h200": 450.0, "a100": 300.0}


def run_fleet(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        me = fdist.start(args.dist_timeout)
    except FleetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return _fleet(me, args, argv)
    except FleetError as e:
        print(f"error: rank {me.rank} on {me.host}: {e}", file=sys.stderr)
        return 2 if isinstance(e, FleetRefused) else 1
    finally:
        fdist.stop()


def _suite_version() -> str:
    from benches.results import _git_commit

    return _git_commit() or "unknown"


def _request(me: Rank, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    try:
        import triton

        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    parts = {"suite": _suite_version(), "torch": torch.__version__, "triton": triton_v,
             "kernels": list(args.kernels), "dtypes": list(args.dtypes),
             "providers": list(args.providers), "sizes": args.sizes, "seed": args.seed,
             "device": args.device, "check_only": bool(args.check_only)}
    if os.environ.get(TEST_CASES) == str(me.rank):
        parts["kernels"] = [*parts["kernels"], "(test: another case list)"]
    return parts


def _broadcast(value: Any) -> Any:
    box = [value]
    fdist.collective("sharing the run id", fdist.dist.broadcast_object_list, box, src=0)
    return box[0]


def _slow_down(rows: list[dict[str, Any]]) -> None:
    """Test-only: this rank's timings SLOW_FACTOR times longer (GPUBENCH_TEST_SLOW_RANK)."""
    for r in rows:
        if r.get("status") != "ok" or r.get("ms_median") is None:
            continue
        for k in ("ms_median", "ms_p20", "ms_p80"):
            r[k] = r[k] * SLOW_FACTOR
        for k in ("tflops", "gbps"):
            if r.get(k):
                r[k] = r[k] / SLOW_FACTOR
        r["samples_ms"] = [x * SLOW_FACTOR for x in r.get("samples_ms") or []]


def _fleet(me: Rank, args: argparse.Namespace, argv: list[str]) -> int:
    from benches import collectives, job
    from benches.results import ResultWriter
    from roofline.fleet import DEFAULT_TOLERANCE, device_figures, write_fleet
    from roofline.report import write_summary
    from roofline.schema import read_doc

    fdist.agree("versions and cases", _request(me, args))
    run_id = _broadcast(args.run_id or datetime.now().strftime("%Y%m%d-%H%M%S"))
    fleet_dir = Path(args.out) / "fleet" / run_id
    problem = None
    if me.rank == 0:
        try:
            fleet_dir.mkdir(parents=True)
        except OSError as e:
            problem = (f"fleet folder {fleet_dir} exists already (runs are never "
                       f"overwritten)" if isinstance(e, FileExistsError)
                       else f"cannot create {fleet_dir}: {e.strerror or e}")
    problem = _broadcast(problem)
    if problem:
        raise FleetRefused(problem)

    mine = copy.copy(args)
    mine.out = str(fleet_dir / "ranks" / f"rank-{me.rank}")
    mine.run_id, mine.compare, mine.no_plots = run_id, None, True
    mine.ceilings_dir = str(Path(args.out) / ".ceilings" / f"{me.host}-rank{me.local_rank}")
    code = job.run(mine, argv)
    found = sorted(Path(mine.out).glob(f"*/{run_id}/results.json"))
    doc = read_doc(found[0]) if found else {"metadata": {}, "rows": []}
    rows, meta = doc["rows"], doc["metadata"]
    if os.environ.get(TEST_SLOW) == str(me.rank):
        _slow_down(rows)
    uuid = ((meta.get("nvml_start") or {}).get("nvml_uuid"))
    for r in rows:
        r.update(rank=me.rank, host=me.host, gpu_uuid=uuid)
    measured = ((meta.get("ceilings") or {}).get("measured") or {})
    info = {"rank": me.rank, "host": me.host, "device_name": meta.get("device_name"),
            "device_key": meta.get("device_key"), "device_kind": meta.get("device_kind"),
            "gpu_uuid": uuid, "copy_gbps": measured.get("hbm_gbps"), "exit_code": code}
    if os.environ.get(TEST_EXIT) == str(me.rank):
        os._exit(0)  # test-only: a rank that leaves without a word

    coll_rows: list[dict[str, Any]] = []
    if me.world > 1 and args.collectives and not args.check_only:
        device = "cuda" if me.backend == "nccl" else "cpu"
        coll_rows = fdist.collective("timing the collectives", collectives.sweep, device)
        for r in coll_rows:
            r.update(rank=None, host="fleet", device=info["device_key"],
                     gpu_name=info["device_name"])
    gathered: list[Any] | None = [None] * me.world if me.rank == 0 else None
    fdist.collective("gathering every rank's rows", fdist.dist.gather_object,
                     (info, rows), gathered, dst=0)
    if me.rank != 0:
        return code
    assert gathered is not None
    infos = [g[0] for g in gathered]
    all_rows = [r for g in gathered for r in g[1]] + coll_rows
    fleet_meta = {**meta, "run_id": run_id, "complete": all(i["exit_code"] in (0, 1)
                                                             for i in infos),
                  "fleet": {"world": me.world, "backend": me.backend,
                            "ranks": infos, "command": " ".join(["run_bench.py", *argv])}}
    writer = ResultWriter(fleet_dir, fleet_meta, all_rows)
    writer.close()
    write_summary(fleet_dir, fleet_meta, writer.frame())
    kind = "cuda" if me.backend == "nccl" else "cpu"
    tol = args.fleet_tolerance if args.fleet_tolerance is not None \
        else DEFAULT_TOLERANCE[kind]
    frame = writer.frame()
    devices = [device_figures(i, frame[frame["rank"] == i["rank"]]) for i in infos]
    coll = pd.DataFrame(coll_rows) if coll_rows else pd.DataFrame(columns=["status"])
    outliers = write_fleet(fleet_dir, devices, coll, tol,
                           LINK_GBPS.get(str(info["device_key"])))
    print(f"fleet of {me.world}: {len(all_rows)} rows in {fleet_dir} "
          f"({len(coll_rows)} collective rows); outliers: {len(outliers)}")
    for o in outliers:
        print(f"OUTLIER rank {o['rank']} on {o['host']}: {o['why']}")
    worst = max([i["exit_code"] or 0 for i in infos] + [code])
    return max(worst, 1 if outliers else 0)
