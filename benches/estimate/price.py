"""A sweep priced from its device's runs (the method: docs/measurement.md, "--estimate")."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benches.sweep.cases import Case
from benches.timing.plan import bound_ms
from contract.ceilings import Ceilings
from contract.devices import DeviceModel, Present
from contract.phases import PHASES
from contract.request import stored_selection
from contract.rows import Ceiling, TritonBuilds, run_ceilings
from contract.run_meta import RunMeta
from contract.schema import RowKey, load_doc, parse_row_key
from kernels.spec import Target

BASELINES = Path(__file__).resolve().parents[2] / "results" / "baselines"
# Priced from the compile counts and the cache's state, and once: never part of a row's cost.
COUNTED = ("compile", "tune", "ceilings")
# The one device speed in code, for a device with no run: docs/measurement.md's runs, rounded.
FALLBACK_CASE_S = {"inputs": 0.01, "check": 0.02, "capture": 0.05, "timing": 0.1,
                   "profile": 0.01, "write": 0.03, "other": 0.01}
FALLBACK_ONCE_S = {"other": 5.0, "write": 1.0}
FALLBACK_CEILINGS_S = 5.0


@dataclass(frozen=True)
class Row:
    """A case to price, or a run's row with what it cost (seconds per phase but COUNTED's)."""

    key: RowKey
    flops: float
    nbytes: float
    roof_class: str | None
    cost: dict[str, float] = field(default_factory=dict)
    ran: bool = True
    compiles: float = 0.0  # its share of the run's Triton compiles
    tunable: int = 0  # its launches that tune on a cold cache
    timed: float = 0.0  # its samples' seconds


@dataclass(frozen=True)
class CompileTimes:
    """Seconds of a process's first Triton compile (its set-up), a load, a build, a tuning."""

    first_s: float
    load_s: float
    build_s: float
    tune_s: float
    runs: int = 0  # the runs that measured them


@dataclass(frozen=True)
class Cache:
    """Triton's cache: the share of compiles built, of tuning launches tuned (not loaded)."""

    built: float
    tuned: float


FALLBACK_COMPILE = CompileTimes(first_s=0.35, load_s=0.001, build_s=0.35, tune_s=0.7)
COLD, WARM = Cache(1.0, 1.0), Cache(0.0, 0.0)


@dataclass(frozen=True)
class Run:
    """A run read back; `once`: what it spent outside its rows' own split, per phase."""

    path: Path
    name: str
    meta: RunMeta
    phases: dict[str, float]
    rows: dict[RowKey, Row]
    once: dict[str, float]
    builds: TritonBuilds
    tuned: int  # launches tuned
    cache: Cache  # the cache it had, from what it counted (compile-ahead's builds too)
    roofs: Ceiling  # measured, else the datasheet's (empty: none known)
    whole: bool  # complete, in one process (not resumed, not a fleet's), not --check-only

    def bound(self, row: Row) -> float | None:  # ms, under the run's ceilings
        return bound_ms(row.flops, row.nbytes, self.roofs.tflops.get(row.roof_class or ""),
                        self.roofs.hbm_gbps)


def load_run(path: Path) -> Run | None:
    """The run of a results.json (load_doc), None where unreadable or without a time split."""
    try:
        doc = load_doc(path)
        split = {str(k): float(v or 0.0) for k, v in doc.meta.time.time_split_s.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # RunLoadError too
        return None
    if not split:
        return None
    builds, rows = TritonBuilds.of(doc.meta), doc.rows
    # Compiles spread over the rows that compile; phases (but rows' own splits) over those that ran
    ran = [r.status != "skipped" for r in rows]
    compiling = [go and bool(r.build.config or r.build.compile_s is not None)
                 for r, go in zip(rows, ran, strict=True)]
    each = (builds.built + builds.from_cache) / max(1, sum(compiling))
    own = {parse_row_key(e["row"]): e["s"] for e in doc.meta.time.row_split_s}
    weights = ran if any(ran) else [True] * len(rows)
    priced: dict[RowKey, Row] = {}
    for r, go, compiles, w in zip(rows, ran, compiling, weights, strict=True):
        cost = {p: float(own.get(r.key, {}).get(p, 0.0)) if own
                else split[p] * w / sum(weights) for p in split if p not in COUNTED}
        tunable = sum(s in ("tuned", "cached") for s in str(r.build.config_source).split("; "))
        timed = float(r.timing.ms_median or 0) * r.timing.n_samples / 1e3
        priced[r.key] = Row(r.key, r.accounting.flops, r.accounting.bytes,
                            r.accounting.roof_class, cost, go, each * compiles, tunable, timed)
    once = {p: max(0.0, split[p] - sum(x.cost.get(p, 0.0) for x in priced.values()))
            for p in split if p not in COUNTED} if own else {}
    sources = Counter(s for r in rows for s in str(r.build.config_source).split("; "))
    seen, tuned, found = builds.built + builds.from_cache, sources["tuned"], sources["cached"]
    cache = Cache(min(1.0, (builds.built + builds.built_ahead) / seen) if seen else 0.0,
                  tuned / (tuned + found) if tuned + found else 0.0)  # found: on disk
    asked = stored_selection(doc.meta)
    got, state = run_ceilings(doc.meta), doc.meta.state
    return Run(path, doc.meta.provenance.run_id or path.parent.name, doc.meta, split, priced,
               once, builds, tuned, cache,
               got.get("measured") or got.get("datasheet") or Ceiling("datasheet"),
               state.complete is True and not (state.resumed or doc.meta.fleet
                                               or (asked and asked.check_only)))


def device_runs(out: Path, model: DeviceModel, present: Present) -> list[Run]:
    """`model`'s runs under `out`, oldest first: a CPU's of this machine, not a fleet rank's."""
    paths = (p for p in out.glob("**/results.json")
             if "ranks" not in p.relative_to(out).parts[:-1])
    runs = [r for p in paths if (r := load_run(p)) and r.meta.device.device_key == model.key
            and (model.kind != "cpu" or (r.meta.device.device_name, r.meta.device.cpu_cores)
                 == (present.name, present.cores))]
    return sorted(runs, key=lambda r: str(r.meta.provenance.created or ""))


def source_run(runs: list[Run], model: DeviceModel) -> Run | None:
    """The newest whole run, else the model's committed baseline (the run it names, else it)."""
    whole = [r for r in runs if r.whole]
    if whole or model.kind == "cpu":  # a CPU's baseline is another machine's
        return whole[-1] if whole else None
    base = load_run(BASELINES / f"{model.key}.json")
    origin = Path(str(base.meta.promotion.promoted_from) if base else "")
    return load_run(origin) or load_run(BASELINES.parents[1] / origin) or base


def compile_times(runs: list[Run], fallback: CompileTimes) -> CompileTimes:
    """The seconds per compile and tuning `runs` measured, else the fallback's."""
    warm = [(r.builds.from_cache, r.phases.get("compile", 0.0)) for r in runs
            if r.builds.from_cache and not r.builds.cold]
    first, load = fallback.first_s, fallback.load_s
    if warm:  # one run: its seconds are the set-up's
        slope, cut = np.polyfit(*zip(*warm, strict=True), 1) \
            if len({n for n, _ in warm}) > 1 else (0.0, min(s for _, s in warm))
        first, load = max(0.0, float(cut)), max(0.0, float(slope))
    built = [r for r in runs if r.builds.cold]
    n = sum(r.builds.built + r.builds.built_ahead for r in built)
    build = sum(r.phases.get("compile", 0.0) - first - r.builds.from_cache * load
                for r in built) / n if n else fallback.build_s
    tuned = [r for r in runs if r.tuned]
    tune = sum(r.phases.get("tune", 0.0) for r in tuned) / sum(r.tuned for r in tuned) \
        if tuned else fallback.tune_s
    n_runs = sum(bool(r.builds.from_cache or r.builds.cold or r.tuned) for r in runs)
    return CompileTimes(first, load, max(0.0, build), tune, n_runs)


def item_of(case: Case, target: Target) -> Row:
    s, shape, dt = case.spec, case.shape, case.dtype
    return Row(case.key, s.flops(shape, dt), s.nbytes(shape, dt), s.roof_class(dt, target))


@dataclass(frozen=True)
class Walk:
    phases: Counter[str]  # seconds
    counts: Counter[str]
    total: float


def nearest(item: Row, run: Run | None) -> tuple[Row, float]:
    """The run's row for `item` and the factor on its samples' time: its own, else its kernel's
    nearest at the bounds' ratio, never under 1 (a call's latency does not shrink with work)."""
    if run is None or not run.rows:
        return Row(item.key, item.flops, item.nbytes, item.roof_class, FALLBACK_CASE_S,
                   compiles=float(item.key[1] == "triton")), 1.0
    if item.key in run.rows:
        return run.rows[item.key], 1.0
    mine, k = run.bound(item), item.key
    family = [r for r in run.rows.values() if r.key[0] == k[0]] or list(run.rows.values())
    # the same provider, cache mode and dtype first, then the nearest bound (where both known)
    ratio = {r.key: mine / theirs if mine and (theirs := run.bound(r)) else None for r in family}
    near = min(family, key=lambda r: (r.key[1] != k[1], r.key[4] != k[4], r.key[2] != k[2],
                                      abs(math.log(ratio[r.key] or math.inf))))
    return near, max(1.0, ratio[near.key] or 1.0)


def price(items: list[Row], run: Run | None, times: CompileTimes, cache: Cache,
          ceilings: bool) -> Walk:
    """`items` priced from `run`: every phase it recorded, in contract.phases or not."""
    phases = Counter(dict.fromkeys([*PHASES, *(run.phases if run else ())], 0.0))
    phases.update(run.once if run else FALLBACK_ONCE_S)
    if ceilings:  # what measuring them took (where it or an earlier run measured them)
        phases["ceilings"] = (Ceilings.from_json(run.meta.ceilings).measured_s
                              or run.phases.get("ceilings", 0.0)) if run else FALLBACK_CEILINGS_S
    counts: Counter[str] = Counter()
    compiles = tunings = 0.0
    for item in items:
        row, scale = nearest(item, run)
        phases.update(row.cost)
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
    return Walk(phases, counts, sum(phases.values()))


def price_run(target: Run, source: Run, times: CompileTimes) -> Walk:
    """`target` priced from `source` as it ran: its rows, cache and ceilings."""
    at = Ceilings.from_json(target.meta.ceilings).measured_at
    fresh = at >= str(target.meta.provenance.created or "~")
    return price(list(target.rows.values()), source, times, target.cache, fresh)
