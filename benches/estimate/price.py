"""A sweep priced from the runs of its device, read back (load_run): each case at what the
same case, else the nearest, cost in the source run, its Triton compiles and tunings at
the seconds the device's runs measured, and what the run spent once.  The method:
docs/measurement.md, "run_bench.py --estimate"."""

from __future__ import annotations

import math
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from benches.sweep.cases import Case
from benches.timing.plan import bound_ms
from contract.ceilings import Ceilings
from contract.devices import DeviceModel, Present
from contract.phases import PHASES
from contract.request import RunRequest
from contract.rows import Ceiling, TritonBuilds, run_ceilings
from contract.run_meta import DeviceFacts, RunMeta
from contract.schema import load_doc, parse_row_key
from kernels.spec import Target

BASELINES = Path(__file__).resolve().parents[2] / "results" / "baselines"
# Priced from the compile counts and the cache's state, and once: not a row's.
COUNTED = ("compile", "tune", "ceilings")
Key = tuple[str, ...]


@dataclass(frozen=True)
class Item:
    """A case to price: its row key, work and roof."""

    key: Key
    flops: float
    nbytes: float
    roof_class: str | None


@dataclass(frozen=True)
class Row(Item):
    """A run's row: its seconds per phase but COUNTED's, whether it ran, its share of the
    run's Triton compiles, its launches that tune on a cold cache, its samples' seconds."""

    cost: dict[str, float]
    ran: bool
    compiles: float
    tunable: int
    timed: float = 0.0


@dataclass(frozen=True)
class CompileTimes:
    """Seconds of a process's first Triton compile (its set-up), per kernel loaded from
    the cache, per kernel built (compile-ahead's too), per launch tuned; from `runs` runs."""

    first_s: float
    load_s: float
    build_s: float
    tune_s: float
    runs: int = 0


# The one device speed in code, for a device with no run to price from: seconds per case,
# once, per compile and tuning (round figures of the runs docs/measurement.md lists).
FALLBACK_CASE_S = {"inputs": 0.01, "check": 0.02, "capture": 0.05, "timing": 0.1,
                   "profile": 0.01, "write": 0.03, "other": 0.01}
FALLBACK_ONCE_S = {"other": 5.0, "write": 1.0, "ceilings": 5.0}
FALLBACK_COMPILE = CompileTimes(first_s=0.35, load_s=0.001, build_s=0.35, tune_s=0.7)


@dataclass
class Run:
    """A run read back; `once`: seconds per phase spent outside its rows' own split."""

    path: Path
    meta: RunMeta
    phases: list[str]
    rows: dict[Key, Row] = field(default_factory=dict)
    once: dict[str, float] = field(default_factory=dict)
    builds: TritonBuilds = TritonBuilds(0, 0, 0)
    tuned: int = 0
    found: int = 0  # tunings found on disk

    @property
    def name(self) -> str:
        return self.meta.provenance.run_id or self.path.parent.name

    def split(self, phase: str) -> float:
        return float(self.meta.time.time_split_s.get(phase) or 0.0)

    @property
    def ceilings_s(self) -> float:
        """What measuring its ceilings took (when it or an earlier run measured them)."""
        return Ceilings.from_json(self.meta.ceilings).measured_s or self.split("ceilings")

    @property
    def check_only(self) -> bool:  # the stored request's (parse_meta rebuilds an old run's)
        with suppress(TypeError, ValueError):  # RequestError: one this version cannot read
            return RunRequest.from_json(self.meta.request).selection.check_only
        return False

    @cached_property
    def roofs(self) -> Ceiling | None:
        got = run_ceilings(self.meta)
        return got.get("measured") or got.get("datasheet")


def load_run(path: Path) -> Run | None:
    """The run of a results.json (load_doc), None where unreadable or without a time split."""
    try:
        doc = load_doc(path)
        split = {str(k): float(v or 0.0) for k, v in doc.meta.time.time_split_s.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # RunLoadError too
        return None
    if not split:
        return None
    run, rows = Run(path, doc.meta, list(split), builds=TritonBuilds.of(doc.meta)), doc.rows
    # The run's Triton compiles, spread over the rows that compile (a Triton launch's
    # config, torch.compile's compile_s); its phases, without its rows' own split, over
    # the rows that ran
    ran = [r.status != "skipped" for r in rows]
    compiling = [go and bool(r.build.config or r.build.compile_s is not None)
                 for r, go in zip(rows, ran, strict=True)]
    each = (run.builds.built + run.builds.from_cache) / max(1, sum(compiling))
    own = {parse_row_key(e["row"]): e["s"] for e in doc.meta.time.row_split_s}
    weights = ran if any(ran) else [True] * len(rows)
    for r, go, builds, w in zip(rows, ran, compiling, weights, strict=True):
        cost = {p: float(own.get(r.key, {}).get(p, 0.0)) if own
                else split[p] * w / sum(weights) for p in split if p not in COUNTED}
        tunable = sum(s in ("tuned", "cached") for s in str(r.build.config_source).split("; "))
        timed = float(r.timing.ms_median or 0) * float(r.timing.n_samples or 0) / 1e3
        run.rows[r.key] = Row(r.key, float(r.accounting.flops or 0),
                              float(r.accounting.bytes or 0), r.accounting.roof_class, cost,
                              go, each * builds, tunable, timed)
    if own:
        run.once = {p: max(0.0, split[p] - sum(x.cost.get(p, 0.0) for x in run.rows.values()))
                    for p in split if p not in COUNTED}
    sources = [s for r in rows for s in str(r.build.config_source).split("; ")]
    run.tuned, run.found = sources.count("tuned"), sources.count("cached")
    return run


def device_runs(out: Path, model: DeviceModel, present: Present) -> list[Run]:
    """The runs of the device under `out`, oldest first, but a fleet rank's (its waits)."""
    def of(d: DeviceFacts) -> bool:  # `model`'s; a CPU's: this machine's (model, cores)
        return d.device_key == model.key and (model.kind != "cpu" or (
            d.device_name == present.name and d.cpu_cores == present.cores))

    paths = (p for p in out.glob("**/results.json")
             if "ranks" not in p.relative_to(out).parts[:-1])
    runs = [r for p in paths if (r := load_run(p)) and of(r.meta.device)]
    return sorted(runs, key=lambda r: str(r.meta.provenance.created or ""))


def source_run(runs: list[Run], model: DeviceModel) -> Run | None:
    """The newest whole run (complete, in one process) among `runs`, else the committed
    baseline of the model (the run it names, else the baseline itself)."""
    whole = [r for r in runs if r.meta.state.complete is True and not (
        r.meta.state.resumed or r.check_only or r.meta.fleet)]
    if whole or model.kind == "cpu":  # a CPU's baseline is another machine's
        return whole[-1] if whole else None
    base = load_run(BASELINES / f"{model.key}.json")
    origin = Path(str(base.meta.promotion.promoted_from) if base else "")
    return load_run(origin) or load_run(BASELINES.parents[1] / origin) or base


def compile_times(runs: list[Run], fallback: CompileTimes) -> CompileTimes:
    """The seconds per compile and tuning of `runs` (the method: docs/measurement.md), the
    fallback's where no run measured one."""
    warm = [(r.builds.from_cache, r.split("compile")) for r in runs
            if r.builds.from_cache and not r.builds.cold]
    first, load = fallback.first_s, fallback.load_s
    if warm:  # one run: its seconds are the set-up's
        slope, cut = np.polyfit(*zip(*warm, strict=True), 1) \
            if len({n for n, _ in warm}) > 1 else (0.0, min(s for _, s in warm))
        first, load = max(0.0, float(cut)), max(0.0, float(slope))
    built = [r for r in runs if r.builds.cold]
    n = sum(r.builds.built + r.builds.built_ahead for r in built)
    build = sum(r.split("compile") - first - r.builds.from_cache * load for r in built) / n \
        if n else fallback.build_s
    tuned = [r for r in runs if r.tuned]
    tune = sum(r.split("tune") for r in tuned) / sum(r.tuned for r in tuned) \
        if tuned else fallback.tune_s
    n_runs = sum(bool(r.builds.from_cache or r.builds.cold or r.tuned) for r in runs)
    return CompileTimes(first, load, max(0.0, build), tune, n_runs)


# ---- the pricing -------------------------------------------------------------------------

def item_of(case: Case, target: Target) -> Item:
    s, shape, dt = case.spec, case.shape, case.dtype
    return Item(case.key, s.flops(shape, dt), s.nbytes(shape, dt), s.roof_class(dt, target))


@dataclass(frozen=True)
class Cache:
    """Triton's cache: the share of compiles built, of tuning launches tuned (not loaded)."""

    built: float
    tuned: float


COLD, WARM = Cache(1.0, 1.0), Cache(0.0, 0.0)


def cache_of(run: Run) -> Cache:
    """The cache a run had, from what it counted (compile-ahead workers' builds too)."""
    b, seen = run.builds, run.builds.built + run.builds.from_cache
    return Cache(min(1.0, (b.built + b.built_ahead) / seen) if seen else 0.0,
                 run.tuned / (run.tuned + run.found) if run.tuned + run.found else 0.0)


@dataclass
class Walk:
    phases: dict[str, float]
    counts: Counter[str]

    @property
    def total(self) -> float:
        return sum(self.phases.values())


def _bound(item: Item, run: Run) -> float | None:
    roofs = run.roofs
    return None if roofs is None else bound_ms(
        item.flops, item.nbytes, roofs.tflops.get(item.roof_class or ""), roofs.hbm_gbps)


def nearest(item: Item, run: Run | None) -> tuple[Row, float]:
    """The run's row for `item` and the factor on its samples' time: its own, else the
    nearest of its kernel's (the same provider, cache mode, dtype, then roofline bound)
    at the ratio of the bounds, never under 1 (a call's latency does not shrink with
    its work); the fallback's without a run."""
    if run is None or not run.rows:
        return Row(item.key, item.flops, item.nbytes, item.roof_class, FALLBACK_CASE_S, True,
                   float(item.key[1] == "triton"), 0), 1.0
    if item.key in run.rows:
        return run.rows[item.key], 1.0
    mine = _bound(item, run)

    def log_ratio(r: Row) -> float:
        theirs = _bound(r, run)
        return abs(math.log(mine / theirs)) if mine and theirs else math.inf

    k = item.key
    family = [r for r in run.rows.values() if r.key[0] == k[0]] or list(run.rows.values())
    near = min(family, key=lambda r: (r.key[1] != k[1], r.key[4] != k[4], r.key[2] != k[2],
                                      log_ratio(r)))
    theirs = _bound(near, run)
    return near, max(1.0, mine / theirs) if mine and theirs else 1.0


def price(items: list[Item], run: Run | None, times: CompileTimes, cache: Cache,
          ceilings: bool) -> Walk:
    """`items` priced from `run`: every phase it recorded, in contract.phases or not."""
    phases = dict.fromkeys([*PHASES, *(run.phases if run else ())], 0.0)
    for p, s in (run.once if run else FALLBACK_ONCE_S).items():
        phases[p] += s if p not in COUNTED else 0.0
    if ceilings:
        phases["ceilings"] = run.ceilings_s if run else FALLBACK_ONCE_S["ceilings"]
    counts: Counter[str] = Counter()
    compiles = tunings = 0.0
    for item in items:
        row, scale = nearest(item, run)
        for p, s in row.cost.items():
            phases[p] += s if p not in COUNTED else 0.0
        phases["timing"] += row.timed * (scale - 1)  # its samples, the rest as they were
        compiles += row.compiles
        tunings += row.tunable * cache.tuned
        counts["priced from its own row" if row.key == item.key and run else
               "priced from a row near it" if run else "priced by the fallback"] += 1
        counts["rows" if row.ran else "skipped"] += 1
    each = cache.built * times.build_s + (1 - cache.built) * times.load_s
    phases["compile"] += compiles * each + (times.first_s if compiles else 0.0)
    phases["tune"] += tunings * times.tune_s
    counts.update(compiles=round(compiles), tunings=round(tunings))
    return Walk(phases, counts)


def price_run(target: Run, source: Run, times: CompileTimes) -> Walk:
    """`target` priced from `source` as it ran: its rows, cache and ceilings."""
    at = Ceilings.from_json(target.meta.ceilings).measured_at
    fresh = at >= str(target.meta.provenance.created or "~")
    return price(list(target.rows.values()), source, times, cache_of(target), fresh)
