"""The runs `--estimate` prices from, read back (each row's seconds per phase, what the
run spent once, its Triton compiles and tunings); the source run of a device; the seconds
per load, build and tuning its runs measured.  The method: docs/measurement.md."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from contract.ceilings import Ceilings
from contract.devices import DeviceModel, Present
from contract.request import RunRequest
from contract.rows import Ceiling, TritonBuilds, run_ceilings
from contract.run_meta import DeviceFacts, RunMeta
from contract.schema import load_doc, parse_row_key

BASELINES = Path(__file__).resolve().parents[2] / "results" / "baselines"
# Priced from the compile counts and the cache's state (price.py), and once: not a row's.
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
    """A run's row: its seconds per phase but COUNTED's, whether it ran (a skipped row
    costs next to nothing), its share of the run's Triton compiles, its launches that
    tune on a cold cache (tuned, or a tuning found on disk), its samples' seconds."""

    cost: dict[str, float]
    ran: bool
    compiles: float
    tunable: int
    timed: float = 0.0


@dataclass
class Run:
    """A run read back (the module's docstring); `once`: seconds per phase it spent
    outside its rows (known where it recorded its rows' own split)."""

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
    """The runs of the device under `out`, oldest first; a fleet rank's own run left out
    (its split holds the fleet's waits)."""
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


@dataclass(frozen=True)
class CompileTimes:
    """Seconds of a process's first Triton compile (its set-up), per kernel loaded from
    Triton's cache, per kernel built (the wait for compile-ahead workers included, the
    kernels they built counted), per launch tuned; how many runs measured them."""

    first_s: float
    load_s: float
    build_s: float
    tune_s: float
    runs: int = 0


def compile_times(runs: list[Run], fallback: CompileTimes) -> CompileTimes:
    """From every run given: the first compile and a load as the line through the runs
    that built nothing (compile seconds against kernels loaded), a build as the rest of
    the compile seconds of the runs that built over their builds, a tuning as the tune
    seconds over the launches tuned; the fallback's where no run measured one."""
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
