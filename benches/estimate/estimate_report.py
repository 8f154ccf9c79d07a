"""`run_bench.py --estimate`: the sweep the same command would run, priced (price.py)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Column, Table

from benches.estimate import price as pricing
from benches.measured_ceilings import cache_dir_of, cache_problem, cached_entry
from benches.sweep import job
from benches.sweep.cases import build_cases
from benches.sweep.console import console
from contract.devices import DEVICES, DeviceModel, Present, resolve_device
from contract.request import RequestError, RunRequest
from contract.run_meta import DeviceFacts


def target_device(req: RunRequest, facts: DeviceFacts) -> tuple[DeviceModel, Present]:
    """The model and its device: this machine's for `auto` and `cpu`; a GPU model's as its run
    had it (`facts`), else its datasheet's."""
    model = DEVICES.get(req.device.key)
    if model is None or model.kind == "cpu":  # None: auto
        dev = resolve_device(req.device.key)
        return dev.model, dev.present
    d = facts if facts.device_key == model.key else DeviceFacts()
    return model, Present(model.key, str(d.device_name or model.name), "cuda",
                          d.capability or None, d.sms or model.sms, d.l2_mb or model.l2_mb,
                          d.gpu_memory_gb)


def run_estimate(req: RunRequest) -> int:
    model, present = target_device(req, DeviceFacts())  # a GPU's: its run's, once known
    runs = pricing.device_runs(Path(req.output.out), model, present)
    source = pricing.source_run(runs, model)
    if source is not None and model.kind == "cuda":
        model, present = target_device(req, source.meta.device)
    cfg = job.sweep_context(req, model, present, interpret=False)
    cases = build_cases(cfg)
    if not cases:
        raise RequestError("nothing to estimate: no selected kernel has a selected "
                           "dtype and shape (check --kernels, --dtypes and --sizes)")
    record = runs if source is None or any(r is source for r in runs) else [*runs, source]
    times = pricing.compile_times(record, pricing.FALLBACK_COMPILE)
    items = [pricing.item_of(c, cfg.target) for c in cases]
    # As get_ceilings decides, its cache entry read only where it would be (none: a problem)
    measured = (req.ceilings.measure or model.kind != "cuda") and (req.ceilings.remeasure or (
        cache_problem(cached_entry(cache_dir_of(Path(req.output.out)), present)[1]) is not None))
    caches = {"Triton cache cold": pricing.COLD, "Triton cache warm": pricing.WARM}
    walks = {k: pricing.price(items, source, times, c, measured) for k, c in caches.items()
             if model.kind == "cuda" or c is pricing.WARM}
    sizes = cfg.selection.sizes if cfg.selection.shapes is None else "explicit sizes"
    origin = (f"priced from run {source.name} ({source.path.parent}, wall "
              f"{source.meta.time.wall_s} s)" if source else "no run of this device: priced "
              "by the fallback (FALLBACK_* in benches/estimate/price.py)")
    console.print(f"estimate: {len(cases)} cases ({sizes}) on {present.name} as '{model.key}', "
                  f"nothing measured; {origin}" + ("" if measured else "; ceilings cached"))
    if model.kind == "cuda":
        console.print(
            f"per Triton compile: {times.first_s:.2f} s once, {times.load_s * 1e3:.1f} ms "
            f"loaded, {times.build_s:.2f} s built; {times.tune_s:.2f} s per tuning (from "
            + (f"{times.runs} runs of the device)" if times.runs else "the fallback)"))
    _table(walks)
    return 0


def _table(walks: dict[str, pricing.Walk]) -> None:
    t = Table("phase", *(Column(label, justify="right") for label in walks),
              title="seconds per phase (benches/sweep/time_split.py)")
    for phase in next(iter(walks.values())).phases:
        t.add_row(phase, *[f"{w.phases[phase]:.1f}" for w in walks.values()])
    t.add_row("total", *[f"{w.total:.1f}" for w in walks.values()])
    console.print(t)
    for label, w in walks.items():
        counts = ", ".join(f"{k} {v:,}" for k, v in sorted(w.counts.items()) if v)
        console.print(f"{label}: timing {w.phases['timing']:.0f} s of {w.total:.0f} s; {counts}")
