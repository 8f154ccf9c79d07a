"""An estimate scaled to what runs of the machine measured: per phase, the seconds the
runs recorded (metadata.time_split_s) over what the estimate's model gives for those
runs' own cases, as they ran (Triton's cache cold or warm, ceilings measured or cached).

Which runs: those of the estimated kind of device (a CPU's runs for a CPU estimate, any
GPU's for a GPU's) that ran whole in one process (complete, not resumed, not
--check-only, not a fleet's) within a day of the newest of them: one session of one machine, whose
load (a CPU shared with other jobs changes its speed by 2x) and host (a GPU runner's
start-up, its CPU's capture and Python) the estimate should carry.  Their sums are
compared phase by phase, so a large run weighs more than a short one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from benches.estimate.price import Pricer, Walk
from benches.estimate.rows import Reference, run_identity
from benches.estimate.speeds import DeviceSpeed
from benches.sweep.cases import RunConfig, build_cases
from benches.sweep.shapes import parse_sizes
from contract.phases import PHASES
from contract.rows import TritonBuilds

# Runs within this of the newest one calibrate together (see the module's docstring).
SESSION = timedelta(days=1)
# A factor is never taken past these: a phase 4x off is a different machine or a broken
# record, not a speed.
FACTOR_RANGE = (0.25, 4.0)
# A phase the model prices under this (seconds, over the runs) is not scaled: its ratio
# would be noise.
MIN_MODELLED_S = 0.05


@dataclass(frozen=True)
class Calibration:
    """Per phase, measured over modelled seconds ({}: nothing to scale to), and the runs
    (their run ids, cold or warm) they come from."""

    factors: dict[str, float]
    runs: list[str]


def _created(meta: Mapping[str, Any]) -> datetime | None:
    """When a run was made (metadata.created; a time without its zone read as UTC, so
    that any two compare), None where unreadable."""
    try:
        made = datetime.fromisoformat(str(meta.get("created")))
    except ValueError:
        return None
    return made if made.tzinfo else made.replace(tzinfo=timezone.utc)


def calibration_runs(ref: Reference, kind: str) -> list[dict[str, Any]]:
    """The metadata of the runs an estimate for a device of `kind` is scaled to (see the
    module's docstring), oldest first.  A fleet's folder is left out: its split is rank
    0's, beside collectives no sweep prices."""
    whole = [(made, m) for m in ref.splits
             if m.get("device_kind") == kind and m.get("complete") is True
             and not m.get("resumed") and not m.get("check_only") and not m.get("fleet")
             and (made := _created(m)) is not None]
    if not whole:
        return []
    newest = max(made for made, _ in whole)
    return [m for made, m in whole if newest - made <= SESSION]


def _config_of(cfg: RunConfig, meta: Mapping[str, Any]) -> RunConfig:
    """`cfg` with the selection a run recorded (its kernels, dtypes, providers, sizes,
    cache modes and run budget)."""
    explicit = meta.get("explicit_shapes")
    return dataclasses.replace(
        cfg, kernels=list(meta.get("kernels") or cfg.kernels),
        dtypes=list(meta.get("dtypes") or cfg.dtypes),
        providers=list(meta.get("providers") or cfg.providers),
        sizes=str(meta.get("sizes") or cfg.sizes),
        explicit_shapes=parse_sizes(";".join(explicit)) if explicit else None,
        cache=list(meta.get("cache") or cfg.cache),
        run_budget_s=meta.get("run_budget_s", cfg.run_budget_s))


def calibration(cfg: RunConfig, ref: Reference, sp: DeviceSpeed) -> Calibration:
    """Per phase but the ceilings (priced from the runs' own record of them), the
    seconds the calibration runs measured over what the model gives for their cases,
    each priced as it ran; factors within FACTOR_RANGE."""
    got = dict.fromkeys(PHASES, 0.0)
    want = dict.fromkeys(PHASES, 0.0)
    used = []
    folded = 0.0  # the profiler passes priced into the older runs' timing
    for meta in calibration_runs(ref, cfg.target.kind):
        try:
            rcfg = _config_of(cfg, meta)
            cases = build_cases(rcfg)
        except (KeyError, ValueError):  # a kernel, dtype or size this code no longer has
            continue
        split = dict(meta["time_split_s"])
        cached = float(split.get("ceilings") or 0.0) < 1.0
        builds = TritonBuilds.of(meta)
        cold = builds.cold  # an older or a CPU run: warm
        # made before the profiler pass had a phase of its own: booked in timing, and
        # it ran the calls that change removed (Pricer's calls_before_profile_phase)
        older = "profile" not in split
        model: Walk = Pricer(rcfg, ref, sp, "now", not cold, cached,
                             sources=ref.sources.get(run_identity(meta), {}),
                             calls_before_profile_phase=older).run(cases)
        if isinstance(meta.get("triton_compiles"), dict):
            # Its own process's compiles as it counted them (a cache partly warm, workers
            # that compiled some or none), without the seconds it waited for the
            # workers: the factor is then the machine's time per build and load.
            split["compile"] = max(0.0, float(split.get("compile") or 0.0)
                                   - builds.waited_s)
            model.phases["compile"] = (builds.built * sp.compile_s
                                       + builds.from_cache * sp.cached_compile_s)
        if older:
            folded += model.phases["profile"]
            model.phases["timing"] += model.phases["profile"]
            model.phases["profile"] = 0.0
        for phase in PHASES:
            got[phase] += model.phases[phase]
            want[phase] += float(split.get(phase) or 0.0)
        used.append(f"{meta.get('run_id') or '?'} ({'cold' if cold else 'warm'})")
    lo, hi = FACTOR_RANGE
    factors = {phase: min(hi, max(lo, want[phase] / got[phase])) for phase in PHASES
               if phase != "ceilings" and got[phase] > MIN_MODELLED_S and want[phase] > 0}
    if folded > MIN_MODELLED_S and "timing" in factors and not want["profile"]:
        # no run measured the profiler pass apart: the timing's factor was fit to both
        factors["profile"] = factors["timing"]
    return Calibration(factors, used)


def calibrate(walk: Walk, factors: Mapping[str, float]) -> Walk:
    """`walk` with each phase scaled by its factor (the cumulative times by the total's)."""
    before = walk.total
    for phase, f in factors.items():
        walk.phases[phase] *= f
    ratio = walk.total / before if before else 1.0
    walk.per_case = [t * ratio for t in walk.per_case]
    return walk
