"""A sweep priced from a run that measured it (source_runs.py): each case at what the same case
cost there, a case it lacks at the nearest measured case of its family scaled by their
roofline bounds under the run's ceilings, its Triton compiles and tunings at the seconds
the device's runs measured for the cache's state, and what the run spent once (start-up,
ceilings, end) as it recorded it."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from benches.estimate.source_runs import COUNTED, CompileTimes, Item, Row, Run
from benches.sweep.cases import Case
from benches.timing.plan import bound_ms
from contract.ceilings import Ceilings
from contract.phases import PHASES
from kernels.spec import Target

# The one device speed in code, for a device with no run to price from: seconds per case,
# once, per compile and tuning (round figures of the runs docs/measurement.md lists).
FALLBACK_CASE_S = {"inputs": 0.01, "check": 0.02, "capture": 0.05, "timing": 0.1,
                   "profile": 0.01, "write": 0.03, "other": 0.01}
FALLBACK_ONCE_S = {"other": 5.0, "write": 1.0, "ceilings": 5.0}
FALLBACK_COMPILE = CompileTimes(first_s=0.35, load_s=0.001, build_s=0.35, tune_s=0.7)


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
    """The run's row for `item` and the factor on its samples' time: its own (1), else
    the nearest of its kernel's rows (of any kernel's if none; the same provider, cache
    mode and dtype first, then the nearest roofline bound) at the ratio of the bounds,
    never under 1 (a call's latency does not shrink with its work); the fallback's
    without a run."""
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
    """`items` priced from `run` (the module's docstring); every phase it recorded, in
    contract.phases or not."""
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
    """`target` priced from `source` as it ran: its rows (as far as it got), its cache's
    state, its ceilings measured by it or loaded (measured before it started)."""
    at = Ceilings.from_json(target.meta.ceilings).measured_at
    fresh = at >= str(target.meta.provenance.created or "~")
    return price(list(target.rows.values()), source, times, cache_of(target), fresh)
