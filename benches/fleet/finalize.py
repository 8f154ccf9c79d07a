"""`python -m benches.fleet.finalize DIR [--no-plots]`: every run under DIR that a kill
left unfinished written whole, fleet runs and their ranks included.

A killed plain run has its rows only in its journal (rows.jsonl beside its results.json);
`python -m roofline finalize RUN` writes one such run whole.  A fleet run keeps a run
folder per rank, <fleet>/ranks/rank-<r>/<device>/<run-id>/, each with its own journal,
and rank 0 writes the fleet folder <fleet>/ (results, summary.md, fleet.md) only after it
gathered the ranks' rows; a fleet killed before then (SIGKILL, a lost machine, a job's
hard limit) has journals only in its rank folders, which a glob for
<fleet>/rows.jsonl never finds.  Here:

1. every journal under DIR is written whole (roofline.report.finalize_run: the run stays
   incomplete, its journal removed once results.json holds its rows);
2. every fleet folder under DIR without its fleet.md (rank 0 never finished writing it)
   is written from its rank folders: each rank's rows with its rank, host and GPU (from
   the rank.json each rank writes before its sweep), the rows of ranks it gathered whose
   folders are on another machine, and any collective rows it had written, marked
   incomplete with a `cut_short` saying so, with summary.md and fleet.md.

Finalizing twice changes nothing.  Exit 0 when every unfinished run was written, 1 when
one was refused (one `error:` line each), 2 on a usage error.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from benches.fleet.dist import Rank
from benches.fleet.folder import (
    RANK_FILE,
    Gathered,
    RankInfo,
    mark_rows,
    rank_info,
    write_folder,
)
from benches.fleet.rank_io import say_line
from contract.cli import UsageError, one_path_and_plots
from contract.record import RunRow, parse_row
from contract.request import RunRequest
from contract.run_meta import RunMeta, parse_meta
from contract.schema import RESULTS_JSON, ROWS_JOURNAL, RunLoadError, read_doc
from roofline.report.finalize_run import FinalizeError, finalize

USAGE = "python -m benches.fleet.finalize DIR [--no-plots]"
FLEET_MD = "fleet.md"
RANK_DIR = re.compile(r"rank-(\d+)")


@dataclass(frozen=True)
class Finalized:
    """A run written whole: a plain run or rank's from its journal ("run"), or a fleet
    folder from its ranks ("fleet")."""

    folder: Path
    rows: int
    what: str


@dataclass(frozen=True)
class Refused:
    """A run left as it is, and why."""

    folder: Path
    why: str


@dataclass
class TreeResult:
    done: list[Finalized] = field(default_factory=list)
    refused: list[Refused] = field(default_factory=list)


def fleet_folders(root: Path) -> list[Path]:
    """The fleet folders under root (root too): folders with a ranks/rank-<r>/ inside."""
    found = [root] if (root / "ranks").is_dir() else []
    found += [d.parent for d in root.rglob("ranks") if d.is_dir() and d.parent != root]
    return sorted(f for f in set(found) if _rank_dirs(f))


def _rank_dirs(fleet: Path) -> list[tuple[int, Path]]:
    out = []
    for d in (fleet / "ranks").iterdir():
        m = RANK_DIR.fullmatch(d.name)
        if m and d.is_dir():
            out.append((int(m.group(1)), d))
    return sorted(out)


def finalize_tree(root: Path, plots: bool = True) -> TreeResult:
    """Every unfinished run under `root` written whole (the module's docstring)."""
    result = TreeResult()
    fleets = fleet_folders(root)
    # The ranks' journals first (deepest first), so a fleet is written from whole runs;
    # a fleet folder's own journal is left to the fleet's rebuild, which replaces it.
    journals = sorted(root.rglob(ROWS_JOURNAL), key=lambda j: -len(j.parts))
    for journal in journals:
        folder = journal.parent
        if folder in fleets:
            continue
        try:
            _, n = finalize(folder, plots=plots)
        except (FinalizeError, RunLoadError, OSError) as e:
            result.refused.append(Refused(folder, str(e)))
            continue
        result.done.append(Finalized(folder, n, "run"))
    for fleet in fleets:
        if (fleet / FLEET_MD).exists() and not (fleet / ROWS_JOURNAL).exists():
            continue  # rank 0 wrote it to its end
        try:
            n = rebuild_fleet(fleet, plots)
        except (FinalizeError, RunLoadError, OSError, ValueError) as e:
            result.refused.append(Refused(fleet, str(e)))
            continue
        result.done.append(Finalized(fleet, n, "fleet"))
    return result


@dataclass(frozen=True)
class RankFile:
    """What the rebuild reads of a rank's rank.json (benches/fleet/folder.py
    write_rank_file: the rank's Rank)."""

    host: str | None = None
    local_rank: int | None = None
    world: int | None = None
    backend: str | None = None


def _rank_file(rank_dir: Path) -> RankFile | None:
    """None for a fleet from before rank.json, or one killed as it wrote it."""
    try:
        doc = json.loads((rank_dir / RANK_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not doc:
        return None
    return RankFile(doc.get("host"), doc.get("local_rank"), doc.get("world"),
                    doc.get("backend"))


def _argv(command: str) -> list[str]:
    """A run's arguments from its metadata's command ("python3 run_bench.py --a b")."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    at = next((i for i, w in enumerate(words) if w.endswith("run_bench.py")), None)
    return words[at + 1:] if at is not None else words


@dataclass(frozen=True)
class OldFleet:
    """What a fleet folder's own metadata said of the fleet (metadata.fleet, as
    benches/fleet/folder.py write_folder wrote it), where rank 0 wrote one."""

    world: int | None = None
    backend: str | None = None
    problem: str | None = None
    ranks: dict[int, RankInfo] = field(default_factory=dict)

    @classmethod
    def of(cls, meta: RunMeta) -> OldFleet:
        doc = meta.fleet or {}
        infos = [RankInfo.from_json(i) for i in doc.get("ranks") or []
                 if isinstance(i, dict) and "rank" in i and "host" in i]
        return cls(doc.get("world"), doc.get("backend"), doc.get("problem"),
                   {i.rank: i for i in infos})


def _fleet_doc(fleet: Path) -> tuple[RunMeta, list[RunRow]]:
    """The fleet folder's own metadata and rows (none where rank 0 wrote none)."""
    if not (fleet / RESULTS_JSON).exists():
        return parse_meta({}), []
    doc = read_doc(fleet / RESULTS_JSON)
    return parse_meta(doc.get("metadata")), [parse_row(r) for r in doc.get("rows") or []]


def rebuild_fleet(fleet: Path, plots: bool = True) -> int:
    """Write the fleet folder `fleet` from its rank folders (and what it already held);
    returns its rows.  Refused (FinalizeError) where no rank has a run folder."""
    run_id = fleet.name
    old_meta, old_rows = _fleet_doc(fleet)
    old = OldFleet.of(old_meta)
    gathered, ident, meta = _rank_folders(fleet, run_id, old.ranks)
    here = {info.rank for info, _ in gathered}
    gathered += _elsewhere(old_rows, here, old.ranks)
    coll_rows = [r for r in old_rows if r.fleet.rank is None]
    gathered.sort(key=lambda g: g[0].rank)
    if not gathered:
        raise FinalizeError(f"{fleet}: no rank has a run folder with rows ({run_id})")
    meta = meta or old_meta
    when = datetime.now(timezone.utc).isoformat(timespec="seconds")
    cut = (f"killed before rank 0 wrote the fleet folder; written from {len(here)} rank "
           f"folder(s) on {when}")
    meta = meta.updated(state__cut_short=cut)
    ident = ident or RankFile()
    world = int(ident.world or old.world or max(g[0].rank for g in gathered) + 1)
    me = Rank(rank=0, world=world, local_rank=0, local_world=1,
              host=str(ident.host or "unknown"),
              backend=str(ident.backend or old.backend or "unknown"),
              timeout_s=0.0, device=str(meta.device.device_kind or "cpu"))
    problem = old.problem or "the fleet was killed before rank 0 finished"
    write_folder(fleet, me, _request_of(meta, plots), _argv(meta.provenance.command or ""),
                 meta, gathered, coll_rows, final=True, problem=f"{problem}; {cut}")
    return sum(len(g[1]) for g in gathered) + len(coll_rows)


def _rank_folders(fleet: Path, run_id: str, old_infos: dict[int, RankInfo]
                  ) -> tuple[Gathered, RankFile | None, RunMeta | None]:
    """Each rank folder's rows with its rank, host and GPU (from the rank.json it wrote
    before its sweep, else what the fleet folder said of it), the first rank file found,
    and the first rank's metadata."""
    gathered: Gathered = []
    ident: RankFile | None = None
    meta: RunMeta | None = None
    for r, rank_dir in _rank_dirs(fleet):
        found = sorted(rank_dir.glob(f"*/{run_id}/{RESULTS_JSON}"))
        if not found:
            continue  # killed before its run folder existed: nothing measured
        doc = read_doc(found[0])
        me = _rank_file(rank_dir)
        ident = ident or me
        m = parse_meta(doc.get("metadata"))
        meta = meta or m
        old = old_infos.get(r)
        host = (me.host if me else None) or (old.host if old else None) or "unknown"
        local_rank = me.local_rank if me else (old.local_rank if old else None)
        uuid = (m.telemetry.nvml_start or {}).get("nvml_uuid") \
            or (old.gpu_uuid if old else None)
        info = rank_info(m, r, str(host), local_rank, uuid, old.exit_code if old else None)
        gathered.append((info, mark_rows([parse_row(x) for x in doc["rows"]], info)))
    return gathered, ident, meta


def _elsewhere(rows: list[RunRow], here: set[int], old_infos: dict[int, RankInfo]
               ) -> Gathered:
    """Rows rank 0 had gathered from ranks whose folders are elsewhere (another node's
    disk), kept with what the fleet folder said of their rank."""
    by_rank: dict[int, list[RunRow]] = {}
    for row in rows:
        if row.fleet.rank is not None and row.fleet.rank not in here:
            by_rank.setdefault(int(row.fleet.rank), []).append(row)
    return [(old_infos.get(r) or RankInfo(r, rs[0].fleet.host,  # type: ignore[arg-type]
                                          written=("rank", "host", "exit_code")), rs)
            for r, rs in sorted(by_rank.items())]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {USAGE}\n{__doc__}")
        return 0 if argv else 2
    try:
        path, plots = one_path_and_plots(argv, "DIR", USAGE)
    except UsageError as e:
        say_line(f"error: {e}")
        return 2
    root = Path(path)
    if not root.is_dir():
        say_line(f"error: {root} is not a folder (usage: {USAGE})")
        return 2
    result = finalize_tree(root, plots=plots)
    for d in result.done:
        how = "from its journal" if d.what == "run" else "from its rank folders"
        print(f"{d.folder}: {d.rows} rows written whole {how}; still incomplete")
    for r in result.refused:
        say_line(f"error: {r.folder}: {r.why}")
    if not result.done and not result.refused:
        print(f"nothing to finalize under {root}")
    return 1 if result.refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def _request_of(meta: RunMeta, plots: bool) -> RunRequest:
    """The request the killed fleet was made with: the one its rank stored (or rebuilt
    from its older metadata's keys); the fleet's tolerance is the report's default."""
    req = RunRequest.from_json(meta.request) if meta.request else RunRequest()
    return replace(req, output=replace(req.output, plots=plots),
                   fleet=replace(req.fleet, tolerance=None))
