"""Fleet runs: `torchrun --nproc-per-node=G run_bench.py [the usual flags]`.

Every rank runs the usual sweep (benches/job.py `run`) on its own device (cuda:LOCAL_RANK,
or a CPU process with its share of the cores), with ceilings measured on that device and
cached per host and local rank, into its own run folder
(<out>/fleet/<run-id>/ranks/rank-<r>/<device>/<run-id>/).  Before measuring, the ranks
agree on the suite's version, torch, triton and the request, then on the case list each
built (a fingerprint of it, so ranks that would select different cases are refused, not
compared).  After the sweep every rank waits for the others, rank 0 gathers every row
(torch.distributed object collectives) into <out>/fleet/<run-id>/: results.csv/json with
`rank`, `host` and `gpu_uuid` on every row; with more than one rank they then time the
collectives together (benches/collectives.py) and rank 0 adds those rows, summary.md,
fleet.md and fleet.png.  A device more than --fleet-tolerance below the fleet median on a
key figure is an outlier, and the exit code is then 1.

Peers that die or hang: after its own sweep a rank waits for the others up to that
sweep's duration plus --dist-timeout (so a peer up to twice as slow on the same cases is
waited for), every other exchange up to --dist-timeout; then it stops with a one-line
error naming the ranks that did not come (exit 1).  Rank 0 keeps what it has: the
fleet folder holds every row gathered so far (its own rows when the gather did not
happen), marked incomplete, and every rank's own run folder is whole.

Test-only hooks (environment variables, read nowhere else; they exist so the outlier and
failure paths can be tested on one machine, and must not be set otherwise):
GPUBENCH_TEST_SLOW_RANK=r makes rank r's measured times (rows and copy ceiling) 10x
longer; GPUBENCH_TEST_EXIT_RANK=r makes rank r leave after its sweep, before the rows are
gathered; GPUBENCH_TEST_HANG_RANK=r makes rank r hang there instead;
GPUBENCH_TEST_CASES_RANK=r drops the first case from rank r's case list.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benches import dist as fdist
from benches.dist import FleetError, FleetRefused, Rank

TEST_SLOW = "GPUBENCH_TEST_SLOW_RANK"
TEST_EXIT = "GPUBENCH_TEST_EXIT_RANK"
TEST_HANG = "GPUBENCH_TEST_HANG_RANK"
TEST_CASES = "GPUBENCH_TEST_CASES_RANK"
SLOW_FACTOR = 10.0
# NVLink bandwidth per direction per GPU (DESIGN.md section 6), the collectives' roof.
LINK_GBPS = {"h100": 450.0, "h200": 450.0, "a100": 300.0}


def run_fleet(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        me = fdist.start(args.dist_timeout)
    except FleetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, FleetRefused) else 1
    try:
        return _fleet(me, args, argv)
    except FleetError as e:
        print(f"error: rank {me.rank} on {me.host}: {e}", file=sys.stderr)
        return 2 if isinstance(e, FleetRefused) else 1
    finally:
        fdist.stop()


def _test_rank(var: str, me: Rank) -> bool:
    return os.environ.get(var) == str(me.rank)


def _versions(args: argparse.Namespace) -> dict[str, Any]:
    """What every rank must share: the suite (git commit, package version), torch,
    triton and the request."""
    import importlib.metadata

    import torch

    from benches.results import _git_commit

    try:
        import triton

        triton_v: str | None = triton.__version__
    except ImportError:
        triton_v = None
    try:
        package: str | None = importlib.metadata.version("gpubench")
    except importlib.metadata.PackageNotFoundError:
        package = None
    return {"suite commit": _git_commit(), "suite package": package,
            "torch": torch.__version__, "triton": triton_v,
            "kernels": list(args.kernels), "dtypes": list(args.dtypes),
            "providers": list(args.providers), "sizes": args.sizes, "seed": args.seed,
            "device": args.device, "check only": bool(args.check_only)}


def _slow_down(rows: list[dict[str, Any]], info: dict[str, Any]) -> None:
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
    if info.get("copy_gbps"):
        info["copy_gbps"] /= SLOW_FACTOR


def _gpu_uuid(meta: dict[str, Any]) -> str | None:
    """NVML's UUID of this rank's GPU, else torch's (None on a CPU)."""
    uuid = (meta.get("nvml_start") or {}).get("nvml_uuid")
    if uuid:
        return str(uuid)
    import torch

    if not torch.cuda.is_available():
        return None
    u = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return f"GPU-{u}" if u else None


def _own_rows(me: Rank, run_root: Path, run_id: str, code: int
              ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(rows, metadata, device info) of this rank's own run folder."""
    from roofline.schema import read_doc

    found = sorted(run_root.glob(f"*/{run_id}/results.json"))
    doc = read_doc(found[0]) if found else {"metadata": {}, "rows": []}
    rows, meta = doc["rows"], doc["metadata"]
    uuid = _gpu_uuid(meta)
    measured = (meta.get("ceilings") or {}).get("measured") or {}
    info = {"rank": me.rank, "host": me.host, "local_rank": me.local_rank,
            "device_name": meta.get("device_name"), "device_key": meta.get("device_key"),
            "gpu_uuid": uuid, "copy_gbps": measured.get("hbm_gbps"), "exit_code": code}
    if _test_rank(TEST_SLOW, me):
        _slow_down(rows, info)
    for r in rows:
        r.update(rank=me.rank, host=me.host, gpu_uuid=uuid)
    return rows, meta, info


def _write(fleet_dir: Path, me: Rank, args: argparse.Namespace, argv: list[str],
           meta: dict[str, Any], gathered: list[tuple[dict[str, Any], list[dict[str, Any]]]],
           coll_rows: list[dict[str, Any]], *, final: bool, problem: str | None = None
           ) -> list[dict[str, Any]]:
    """The fleet folder from the rows gathered so far: results.csv/json always; with
    `final`, summary.md, fleet.md and the figures too.  Returns the outliers."""
    import pandas as pd

    from benches.job import _finish
    from benches.results import ResultWriter
    from roofline.fleet import DEFAULT_TOLERANCE, device_figures, write_fleet

    infos = [g[0] for g in gathered]
    rows = [r for g in gathered for r in g[1]] + coll_rows
    missing = sorted(set(range(me.world)) - {i["rank"] for i in infos})
    complete = problem is None and all(i["exit_code"] in (0, 1) for i in infos)
    fleet_meta = {**meta, "run_id": fleet_dir.name, "complete": complete and final,
                  "fleet": {"world": me.world, "backend": me.backend, "ranks": infos,
                            "missing_ranks": missing, "problem": problem,
                            "command": " ".join(["run_bench.py", *argv])}}
    writer = ResultWriter(fleet_dir, fleet_meta, rows)
    writer.close()
    if not final:
        return []
    _finish(writer, fleet_dir, plots=not args.no_plots)
    frame = writer.frame()
    tol = args.fleet_tolerance if args.fleet_tolerance is not None \
        else DEFAULT_TOLERANCE["cuda" if me.backend == "nccl" else "cpu"]
    devices = [device_figures(i, frame[frame["rank"] == i["rank"]]) for i in infos]
    coll = pd.DataFrame(coll_rows) if coll_rows else pd.DataFrame(columns=["status"])
    note = None
    if problem or missing:
        note = (f"Incomplete: {problem or 'rows missing'}"
                + (f"; no rows from rank(s) {missing}" if missing else ""))
    link = LINK_GBPS.get(str(infos[0].get("device_key"))) if infos else None
    return write_fleet(fleet_dir, devices, coll, tol, link, plot=not args.no_plots,
                       note=note)


def _fleet(me: Rank, args: argparse.Namespace, argv: list[str]) -> int:
    from benches import collectives, job

    fdist.agree("versions and request", _versions(args))
    run_id = fdist.broadcast_object("sharing the run id", args.run_id
                                    or datetime.now().strftime("%Y%m%d-%H%M%S"))
    fleet_dir = Path(args.out) / "fleet" / run_id

    def agree_on_cases(cases: list[Any]) -> None:
        keys = [list(job._case_key(c)) for c in cases]
        if _test_rank(TEST_CASES, me):
            keys = keys[1:]
        fdist.agree("case list", {"cases": keys, "number of cases": len(keys)})
        problem = None
        if me.rank == 0:
            try:
                fleet_dir.mkdir(parents=True)
            except FileExistsError:
                problem = f"fleet folder {fleet_dir} exists already (runs are never overwritten)"
            except OSError as e:
                problem = f"cannot create {fleet_dir}: {e.strerror or e}"
        problem = fdist.broadcast_object("making the fleet folder", problem)
        if problem:
            raise FleetRefused(problem)

    mine = copy.copy(args)
    mine.out = str(fleet_dir / "ranks" / f"rank-{me.rank}")
    mine.run_id, mine.compare, mine.no_plots = run_id, None, True
    mine.ceilings_dir = str(Path(args.out) / ".ceilings" / f"{me.host}-rank{me.local_rank}")
    t0 = time.monotonic()
    code = job.run(mine, argv, on_cases=agree_on_cases)
    sweep_s = time.monotonic() - t0
    rows, meta, info = _own_rows(me, Path(mine.out), run_id, code)
    if _test_rank(TEST_EXIT, me):
        os._exit(0)  # test-only: a rank that leaves without a word
    if _test_rank(TEST_HANG, me):
        time.sleep(10**6)  # test-only: a rank that hangs (torchrun ends it)

    try:
        fdist.wait_for_peers("waiting for every rank's sweep", me.timeout_s + sweep_s,
                            tag=f"{run_id}/swept")
        gathered = fdist.gather_object("gathering every rank's rows", (info, rows))
    except FleetError as e:
        if me.rank == 0:
            _write(fleet_dir, me, args, argv, meta, [(info, rows)], [], final=True,
                   problem=str(e))
            raise FleetError(f"{e}; rank 0's rows are kept in {fleet_dir}") from None
        raise
    if me.rank == 0:
        assert gathered is not None
        _write(fleet_dir, me, args, argv, meta, gathered, [], final=False)

    coll_rows: list[dict[str, Any]] = []
    if me.world > 1 and args.collectives and not args.check_only:
        device = "cuda" if me.backend == "nccl" else "cpu"
        try:
            coll_rows = fdist.collective("timing the collectives", collectives.sweep, device)
        except FleetError as e:
            if me.rank == 0:
                assert gathered is not None
                _write(fleet_dir, me, args, argv, meta, gathered, [], final=True,
                       problem=str(e))
                raise FleetError(f"{e}; every rank's sweep rows are kept in {fleet_dir}"
                                 ) from None
            raise
        for r in coll_rows:  # the fleet's rows, not one rank's
            r.update(rank=None, host="fleet", device=info["device_key"],
                     gpu_name=info["device_name"])
    if me.rank != 0:
        return code
    assert gathered is not None
    outliers = _write(fleet_dir, me, args, argv, meta, gathered, coll_rows, final=True)
    n_rows = sum(len(g[1]) for g in gathered) + len(coll_rows)
    print(f"fleet of {me.world}: {n_rows} rows in {fleet_dir} "
          f"({len(coll_rows)} collective rows); outliers: {len(outliers)}")
    for o in outliers:
        print(f"OUTLIER rank {o['rank']} on {o['host']}: {o['why']}")
    worst = max([i["exit_code"] or 0 for i in (g[0] for g in gathered)] + [code])
    return max(worst, 1 if outliers else 0)
