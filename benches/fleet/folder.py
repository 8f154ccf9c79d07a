"""A fleet's rows and folder (benches/fleet/run.py runs the fleet): what every rank must
share, one rank's rows and device as gathered, and the fleet folder written from them
(results, summary.md, fleet.md, fleet.png)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benches.fleet.dist import Rank
from contract.record import RunRow, flat, parse_row
from contract.request import RunRequest
from contract.run_meta import RunMeta, parse_meta
from contract.schema import format_shape

if TYPE_CHECKING:
    from roofline.report.fleet import Outlier

SLOW_FACTOR = 10.0  # the test-only slow-rank hook's factor (benches/fleet/run.py)
# Who a rank folder's rank was (rank, host, world, ...), written before its sweep: a fleet
# killed before rank 0 gathered its rows is rebuilt from the rank folders
# (benches/fleet/finalize.py), and a run folder itself does not name its host.
RANK_FILE = "rank.json"


@dataclass(frozen=True)
class RankInfo:
    """What the fleet keeps of one rank (posted to rank 0, kept in the fleet's
    metadata.fleet.ranks, read by roofline/report/fleet.py): who it was, its device, its
    measured copy bandwidth, its exit code (None: not known, as for a rank a kill ended)
    and where its time went (benches/sweep/time_split.py), from its run's metadata.
    `written`: the keys its document holds (an entry of an older fleet folder, or one
    made of a row alone, holds fewer), `others` the keys of an older version kept as
    they were."""

    rank: int
    host: str
    local_rank: int | None = None
    device_name: str | None = None
    device_key: str | None = None
    gpu_uuid: str | None = None
    copy_gbps: float | None = None
    exit_code: int | None = None
    time_split_s: dict[str, float] | None = None
    wall_s: float | None = None
    written: tuple[str, ...] | None = field(default=None, compare=False)
    others: tuple[tuple[str, Any], ...] = field(default=(), compare=False)

    # metadata.fleet.ranks' entry: written here, read by roofline/report/fleet.py.
    def to_json(self) -> dict[str, Any]:
        names = [f.name for f in fields(self)][:-2]
        keep = names if self.written is None else [n for n in names if n in self.written]
        return {**{n: getattr(self, n) for n in keep}, **dict(self.others)}

    @classmethod
    def from_json(cls, doc: Any) -> RankInfo:
        """An entry of metadata.fleet.ranks as written (any version)."""
        names = [f.name for f in fields(cls)][:-2]
        return cls(**{n: doc[n] for n in names if n in doc},
                   written=tuple(n for n in names if n in doc),
                   others=tuple((k, v) for k, v in doc.items() if k not in names))


def write_rank_file(rank_dir: Path, me: Rank) -> None:
    """rank_dir/RANK_FILE: this rank's identity."""
    (rank_dir / RANK_FILE).write_text(json.dumps(asdict(me), indent=1) + "\n")


# The document dist.agree posts and compares across the ranks (its keys name the parts).
def versions(req: RunRequest) -> dict[str, Any]:
    """What every rank must share: the suite (git commit, package version), torch,
    triton and the request."""
    import importlib.metadata

    import torch

    from benches.sweep.results import head_commit

    try:
        import triton

        triton_v: str | None = triton.__version__
    except ImportError:
        triton_v = None
    try:
        package: str | None = importlib.metadata.version("gpubench")
    except importlib.metadata.PackageNotFoundError:
        package = None
    sel = req.selection
    return {"suite commit": head_commit(), "suite package": package,
            "torch": torch.__version__, "triton": triton_v,
            "kernels": list(sel.kernels), "dtypes": list(sel.dtypes),
            "providers": list(sel.providers), "sizes": sel.sizes,
            "shapes": None if sel.shapes is None else [format_shape(s) for s in sel.shapes],
            "seed": sel.seed, "device": req.device.key, "check only": sel.check_only}


def slow_down(rows: Sequence[RunRow], info: RankInfo) -> tuple[list[RunRow], RankInfo]:
    """Test-only: this rank's timings SLOW_FACTOR times longer (GPUBENCH_TEST_SLOW_RANK),
    its copy bandwidth SLOW_FACTOR times lower."""
    out = []
    for r in rows:
        t, m = r.timing, r.metrics
        if r.ok and t.ms_median is not None:
            r = replace(r, timing=replace(
                t, ms_median=t.ms_median * SLOW_FACTOR,
                ms_p20=None if t.ms_p20 is None else t.ms_p20 * SLOW_FACTOR,
                ms_p80=None if t.ms_p80 is None else t.ms_p80 * SLOW_FACTOR,
                samples_ms=tuple(x * SLOW_FACTOR for x in t.samples_ms)),
                metrics=replace(m, tflops=m.tflops / SLOW_FACTOR if m.tflops else m.tflops,
                                gbps=m.gbps / SLOW_FACTOR if m.gbps else m.gbps))
        out.append(r)
    if info.copy_gbps:
        info = replace(info, copy_gbps=info.copy_gbps / SLOW_FACTOR)
    return out, info


def gpu_uuid(meta: RunMeta, me: Rank) -> str | None:
    """NVML's UUID of this rank's GPU, else torch's (None for a rank on a CPU, GPUs
    present or not)."""
    if me.device != "cuda":
        return None
    uuid = (meta.telemetry.nvml_start or {}).get("nvml_uuid")
    if uuid:
        return str(uuid)
    import torch

    u = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    return f"GPU-{u}" if u else None


def own_rows(me: Rank, run_root: Path, run_id: str, code: int, slow: bool = False
             ) -> tuple[list[RunRow], RunMeta, RankInfo]:
    """(rows, metadata, device info) of this rank's own run folder; `slow`: the test-only
    slow-rank hook's 10x longer times."""
    from contract.schema import read_doc

    found = sorted(run_root.glob(f"*/{run_id}/results.json"))
    doc = read_doc(found[0]) if found else {"metadata": {}, "rows": []}
    rows, meta = [parse_row(r) for r in doc["rows"]], parse_meta(doc["metadata"])
    uuid = gpu_uuid(meta, me)
    info = rank_info(meta, me.rank, me.host, me.local_rank, uuid, code)
    if slow:
        rows, info = slow_down(rows, info)
    return mark_rows(rows, info), meta, info


def rank_info(meta: RunMeta, rank: int, host: str, local_rank: int | None,
              uuid: str | None, code: int | None) -> RankInfo:
    """What the fleet keeps of one rank (RankInfo), from its run's metadata."""
    measured = meta.ceilings.get("measured") or {}
    return RankInfo(rank, host, local_rank, meta.device.device_name, meta.device.device_key,
                    uuid, measured.get("hbm_gbps"), code, meta.time.time_split_s or None,
                    meta.time.wall_s)


def mark_rows(rows: Sequence[RunRow], info: RankInfo) -> list[RunRow]:
    """Every row of a rank names its rank, host and GPU."""
    return [replace(r, fleet=replace(r.fleet, rank=info.rank, host=info.host,
                                     gpu_uuid=info.gpu_uuid)) for r in rows]


Gathered = list[tuple[RankInfo, list[RunRow]]]  # each rank's own facts and rows


def write_folder(fleet_dir: Path, me: Rank, req: RunRequest, argv: list[str],
                 meta: RunMeta, gathered: Gathered,
                 coll_rows: list[RunRow], *, final: bool, problem: str | None = None,
                 signal_name: str | None = None) -> list[Outlier]:
    """The fleet folder from the rows gathered so far: results.csv/json always; with
    `final`, summary.md, fleet.md and the figures too.  Returns the outliers."""
    from benches.sweep.job import finish_run
    from benches.sweep.results import ResultWriter

    infos = [g[0] for g in gathered]
    rows = [r for g in gathered for r in g[1]] + coll_rows
    missing = sorted(set(range(me.world)) - {i.rank for i in infos})
    complete = problem is None and all(i.exit_code in (0, 1) for i in infos)
    fleet_meta = meta.updated(
        provenance__run_id=fleet_dir.name, state__complete=complete and final,
        state__interrupted=signal_name is not None, state__signal=signal_name,
        fleet={"world": me.world, "backend": me.backend,
               "ranks": [i.to_json() for i in infos],
               "missing_ranks": missing, "problem": problem,
               "command": " ".join(["run_bench.py", *argv])})
    writer = ResultWriter(fleet_dir, fleet_meta, rows)
    writer.close()
    if not final:
        return []
    finish_run(writer, fleet_dir, plots=req.output.plots)
    return _fleet_report(fleet_dir, me, req, writer.frame(), infos, coll_rows, missing,
                         problem)


def _fleet_report(fleet_dir: Path, me: Rank, req: RunRequest, frame: Any,
                  infos: list[RankInfo], coll_rows: list[RunRow], missing: list[int],
                  problem: str | None) -> list[Outlier]:
    """fleet.md and fleet.png: each device's key figures, the collectives, the outliers
    (returned)."""
    import pandas as pd

    from contract.devices import DEVICES
    from contract.schema import ALL_COLUMNS
    from roofline.report.fleet import DEFAULT_TOLERANCE, device_figures, write_fleet

    tol = req.fleet.tolerance if req.fleet.tolerance is not None \
        else DEFAULT_TOLERANCE[me.device]
    devices = [device_figures(i.to_json(), frame[frame["rank"] == i.rank]) for i in infos]
    coll = pd.DataFrame([flat(r, ALL_COLUMNS) for r in coll_rows]) if coll_rows \
        else pd.DataFrame(columns=["status"])
    note = None
    if problem or missing:
        note = (f"Incomplete: {problem or 'rows missing'}"
                + (f"; no rows from rank(s) {missing}" if missing else ""))
    # The collectives' roof: the device's NVLink bandwidth per direction (device models).
    model = DEVICES.get(str(infos[0].device_key)) if infos else None
    link = model.nvlink_gbps if model is not None else None
    return write_fleet(fleet_dir, devices, coll, tol, link, plot=req.output.plots,
                       note=note)
