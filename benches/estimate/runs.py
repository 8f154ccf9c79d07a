"""The runs `--estimate` prices from, read back (each row's seconds per phase, what the
run spent once, its Triton compiles and tunings); the source run of a device; the seconds
per load, build and tuning its runs measured.  The method: docs/measurement.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from contract.devices import DeviceModel, Present
from contract.rows import Ceiling, TritonBuilds, run_ceilings
from contract.schema import ROW_SPLIT, parse_row_key, row_key

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
    meta: dict[str, Any]
    phases: list[str]
    rows: dict[Key, Row] = field(default_factory=dict)
    once: dict[str, float] = field(default_factory=dict)
    builds: TritonBuilds = TritonBuilds(0, 0, 0)
    tuned: int = 0
    found: int = 0  # tunings found on disk

    @property
    def name(self) -> str:
        return str(self.meta.get("run_id") or self.path.parent.name)

    def split(self, phase: str) -> float:
        return float((self.meta.get("time_split_s") or {}).get(phase) or 0.0)

    @property
    def ceilings_s(self) -> float:
        """What measuring its ceilings took (when it or an earlier run measured them)."""
        measured = (self.meta.get("ceilings") or {}).get("measured") or {}
        return float(measured.get("seconds") or 0.0) or self.split("ceilings")

    @cached_property
    def roofs(self) -> Ceiling | None:
        got = run_ceilings(self.meta)
        return got.get("measured") or got.get("datasheet")


def load_run(path: Path) -> Run | None:
    """The run of a results.json, None where unreadable or without a time split."""
    try:
        doc = json.loads(path.read_text())
        meta, rows = doc["metadata"], doc["rows"]
        split = {str(k): float(v or 0.0) for k, v in meta["time_split_s"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    run = Run(path, meta, list(split), builds=TritonBuilds.of(meta))
    # The run's Triton compiles, spread over the rows that compile (a Triton launch's
    # config, torch.compile's compile_s); its phases, without its rows' own split, over
    # the rows that ran
    ran = [r.get("status") != "skipped" for r in rows]
    compiling = [go and bool(r.get("config") or r.get("compile_s") is not None)
                 for r, go in zip(rows, ran, strict=True)]
    each = (run.builds.built + run.builds.from_cache) / max(1, sum(compiling))
    own = {parse_row_key(e["row"]): e["s"] for e in meta.get(ROW_SPLIT) or []}
    weights = ran if any(ran) else [True] * len(rows)
    for r, go, builds, w in zip(rows, ran, compiling, weights, strict=True):
        cost = {p: float(own.get(row_key(r), {}).get(p, 0.0)) if own
                else split[p] * w / sum(weights) for p in split if p not in COUNTED}
        tunable = sum(s in ("tuned", "cached") for s in str(r.get("config_source")).split("; "))
        timed = float(r.get("ms_median") or 0) * float(r.get("n_samples") or 0) / 1e3
        run.rows[row_key(r)] = Row(row_key(r), float(r.get("flops") or 0),
                                   float(r.get("bytes") or 0), r.get("roof_class"), cost, go,
                                   each * builds, tunable, timed)
    if own:
        run.once = {p: max(0.0, split[p] - sum(x.cost.get(p, 0.0) for x in run.rows.values()))
                    for p in split if p not in COUNTED}
    sources = [s for r in rows for s in str(r.get("config_source")).split("; ")]
    run.tuned, run.found = sources.count("tuned"), sources.count("cached")
    return run


def _of(m: dict[str, Any], model: DeviceModel, present: Present) -> bool:
    """A run of `model`; for a CPU, of this machine (its CPU model and core count)."""
    return m.get("device_key") == model.key and (model.kind != "cpu" or (
        m.get("device_name") == present.name and m.get("cpu_cores") == present.cores))


def device_runs(out: Path, model: DeviceModel, present: Present) -> list[Run]:
    """The runs of the device under `out`, oldest first; a fleet rank's own run left out
    (its split holds the fleet's waits)."""
    paths = (p for p in out.glob("**/results.json")
             if "ranks" not in p.relative_to(out).parts[:-1])
    runs = [r for p in paths if (r := load_run(p)) and _of(r.meta, model, present)]
    return sorted(runs, key=lambda r: str(r.meta.get("created") or ""))


def source_run(runs: list[Run], model: DeviceModel) -> Run | None:
    """The newest whole run (complete, in one process) among `runs`, else the committed
    baseline of the model (the run it names, else the baseline itself)."""
    whole = [r for r in runs if r.meta.get("complete") is True and not (
        r.meta.get("resumed") or r.meta.get("check_only") or r.meta.get("fleet"))]
    if whole or model.kind == "cpu":  # a CPU's baseline is another machine's
        return whole[-1] if whole else None
    base = load_run(BASELINES / f"{model.key}.json")
    origin = Path(str(base.meta.get("promoted_from") if base else ""))
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
