"""`run_bench.py --estimate [selection] [--device D]`: the cost of the sweep the same
command would run, phase by phase, for the method before and now, from a cold and a warm
Triton cache (benches/estimate/price.py), printed; nothing is measured or written."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from benches.ceilings import cache_dir_of, cache_key, cache_problem
from benches.estimate.calibrate import Calibration, calibrate, calibration
from benches.estimate.price import PLANS, Walk, estimate
from benches.estimate.rows import Reference, find_reference, selection
from benches.estimate.speeds import capability_of, speed_of
from benches.sweep.cases import Case, RunConfig, build_cases
from benches.sweep.console import console
from contract.ceilings import Ceilings, datasheet_of
from contract.devices import DEVICES, DeviceModel, Present, resolve_device
from contract.phases import PHASES
from contract.request import RunRequest


def target_device(req: RunRequest, ref_meta: dict | None = None
                  ) -> tuple[DeviceModel, Present]:
    """The model estimated for and what is present there: this machine for `auto` and
    `cpu` (as a run would resolve them); for a GPU model, which need not be here, the GPU
    its reference run had, else the model's own."""
    model = DEVICES.get(req.device)
    if model is None or model.kind == "cpu":  # None: auto
        dev = resolve_device(req.device)
        return dev.model, dev.present
    meta = ref_meta or {}
    if meta.get("device_key") == model.key:
        cap = meta.get("capability")
        return model, Present(model.key, str(meta.get("device_name") or model.name), "cuda",
                              tuple(cap) if cap else capability_of(model.key),
                              meta.get("sms") or model.sms, meta.get("l2_mb") or model.l2_mb,
                              meta.get("gpu_memory_gb"))
    return model, Present(model.key, model.name, "cuda", capability_of(model.key),
                          model.sms, model.l2_mb, None)


def _cached_ceilings(model: DeviceModel, present: Present, out: Path
                     ) -> tuple[Ceilings, bool]:
    """(ceilings, whether they would come from the cache) as job.run would find them,
    read only: a GPU model's datasheet beside its cached measurement."""
    path = cache_dir_of(out) / f"ceilings-{cache_key(present)}.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = None
    ok = cached is not None and cache_problem(cached) is None
    return Ceilings(datasheet_of(model), cached if ok else None), ok


def _reference_meta(ref: Reference) -> dict | None:
    for p in reversed(ref.paths):
        try:
            return json.loads(p.read_text()).get("metadata")
        except (OSError, ValueError):
            continue
    return None


def run_estimate(req: RunRequest) -> int:
    from benches.sweep import job

    out = Path(req.out)
    first_model, _ = target_device(req)
    ref = find_reference(out, first_model)
    model, present = target_device(req, _reference_meta(ref))
    cfg = job.run_config(req, model, present, interpret=False)
    cfg.ceilings, cached = _cached_ceilings(model, present, out)
    if not req.measure_ceilings and model.kind == "cuda":
        cached = True
    cases = build_cases(cfg)
    if not cases:
        raise job.RequestError("nothing to estimate: no selected kernel has a selected "
                               "dtype and shape (check --kernels, --dtypes and --sizes)")
    sp = speed_of(model.kind)
    plans = PLANS if model.kind == "cuda" else (("now", True),)
    walks = estimate(cfg, cases, ref, sp, cached, plans)
    scaled = calibration(cfg, ref, sp)
    for w in walks.values():
        calibrate(w, scaled.factors)
    _print(cfg, cases, ref, walks, scaled, cached)
    return 0


def _label(method: str, warm: bool) -> str:
    return f"{method}, Triton cache {'warm' if warm else 'cold'}"


def _print(cfg: RunConfig, cases: list[Case], ref: Reference,
           walks: dict[tuple[str, bool], Walk], scaled: Calibration,
           ceilings_cached: bool) -> None:
    sizes = cfg.sizes if cfg.explicit_shapes is None else "explicit sizes"
    source = (f"rows of {len(ref.paths)} run(s) under {ref.paths[-1].parents[1]}"
              if ref.paths else "no earlier run: the assumptions alone")
    console.print(f"estimate: {len(cases)} cases ({sizes}) on {cfg.present.name} as "
                  f"'{cfg.model.key}', nothing measured; row speeds from {source}; device "
                  "assumptions: benches/estimate/speeds.py"
                  + ("" if ceilings_cached else "; ceilings measured (none cached)"))
    if scaled.factors:
        console.print(f"scaled to the time split of {len(scaled.runs)} run(s) of the "
                      f"reference's newest session ({', '.join(scaled.runs)}): " + ", ".join(
                          f"{k} x{v:.2f}" for k, v in scaled.factors.items()))
    t = Table(title="seconds per phase (benches/sweep/phases.py)")
    t.add_column("phase")
    for m, warm in walks:
        t.add_column(_label(m, warm), justify="right")
    for phase in PHASES:
        t.add_row(phase, *[f"{w.phases[phase]:.1f}" for w in walks.values()])
    t.add_row("total", *[f"{w.total:.1f}" for w in walks.values()])
    console.print(t)
    for (m, warm), w in walks.items():
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted(w.counts.items()))
        console.print(f"{_label(m, warm)}: timing {w.phases['timing']:.0f} s of "
                      f"{w.total:.0f} s; {counts}")
    if ref.cut is not None and ("before", False) in walks:
        path, n, chosen = ref.cut
        w = walks[("before", False)]
        if chosen == selection(cfg) and ref.model is cfg.model and 0 < n <= len(w.per_case):
            console.print(f"check: {path.parent} holds the first {n} rows of an "
                          f"interrupted run; the method before, cold, estimates "
                          f"{w.per_case[n - 1]:.0f} s for {n} cases")
