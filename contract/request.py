"""The run request: what `run_bench.py` was asked to do, typed and frozen, built once from
the command line (`RunRequest.from_args`) and read by every job below it (the sweep, the
estimate, inspect, fleet runs and acceptance).  A run's results.json keeps it
(`metadata["request"]`), and `--resume RUN` rebuilds it from there (`resumed_request`); a
run written before the request was stored is rebuilt from its old metadata keys by
`request_from_old_metadata`."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from contract.devices import DEVICES
from contract.models import MODEL_SIZES, ModelConfigError, parse_model_sizes
from contract.schema import CACHE_MODES, DEFAULT_CACHE, parse_shape
from kernels.spec import SIZE_PRESETS, Shape


class RequestError(ValueError):
    """A request that cannot be run (one-line message; exit 2 before anything runs)."""


@dataclass(frozen=True)
class AcceptanceOptions:
    """--acceptance's settings (benches/fleet/acceptance.py fills in the defaults)."""

    minutes: float
    median_warn_pct: float
    median_critical_pct: float
    busbw_warn_pct: float
    busbw_critical_pct: float
    expected_busbw: float | None = None


@dataclass(frozen=True)
class RunRequest:
    """One run_bench.py request.  The selection is validated against the registries and
    "all" expanded; `sizes` is a preset name, a model (`model:NAME[:tokens=N]`,
    contract/models.py) or "explicit" (then `shapes` holds them);
    `cache` None means the device's default (cold on a GPU, warm on a CPU)."""

    kernels: tuple[str, ...]
    dtypes: tuple[str, ...]
    providers: tuple[str, ...]
    sizes: str = "default"
    shapes: tuple[Shape, ...] | None = None
    cache: tuple[str, ...] | None = None
    device: str = "auto"  # the requested key; resolved by contract.devices.resolve_device
    seed: int = 0
    check_only: bool = False
    fp8_accum: str | None = None  # None: kernels.spec's default
    throttle_threshold: float = 75.0
    throttle_recovery_delay: float = 0.05
    row_budget: float | None = None
    run_budget: float | None = None  # inf: none
    out: str = "results"
    run_id: str | None = None
    resume: str | None = None
    compare: str | None = None
    threshold: float | None = None
    allow: str = ""
    allow_device_mismatch: bool = False
    plots: bool = True
    history: str | None = None
    remeasure_ceilings: bool = False
    measure_ceilings: bool = True
    ceilings_dir: str | None = None  # a fleet rank's own ceiling cache (default <out>/.ceilings)
    fleet_tolerance: float | None = None
    dist_timeout: float = 120.0
    collectives: bool = True
    acceptance: AcceptanceOptions | None = None
    arch: str = "sm_90"  # --inspect's target
    retune: bool = False  # tune every launch even where a shipped config exists
    baseline_provider: str = "torch"  # rows' speedup: this provider's time / the row's
    energy: str = "largest"  # which GPU rows get an energy window: ENERGY_ROWS

    @classmethod
    def from_args(cls, ns: argparse.Namespace,
                  parse_sizes: Callable[[str], list[Shape]],
                  acceptance: AcceptanceOptions | None = None) -> RunRequest:
        """The request of run_bench.py's parsed command line; RequestError (or
        parse_sizes' own error) for a bad list, device or size.  `parse_sizes` reads
        explicit --sizes (benches.sweep.shapes.parse_sizes: it knows the kernel
        families); `acceptance`: --acceptance's options (benches/fleet/acceptance.py)."""
        explicit = ns.sizes not in SIZE_PRESETS and not ns.sizes.startswith(MODEL_SIZES)
        return validated(cls(
            kernels=ns.kernels, dtypes=ns.dtypes, providers=ns.providers,
            sizes="explicit" if explicit else ns.sizes,
            shapes=tuple(parse_sizes(ns.sizes)) if explicit else None,
            cache=ns.cache, device=ns.device, seed=ns.seed, check_only=ns.check_only,
            fp8_accum=ns.fp8_accum, throttle_threshold=ns.throttle_threshold,
            throttle_recovery_delay=ns.throttle_recovery_delay, row_budget=ns.row_budget,
            run_budget=ns.run_budget, out=ns.out, run_id=ns.run_id, resume=ns.resume,
            compare=ns.compare, threshold=ns.threshold, allow=ns.allow,
            allow_device_mismatch=ns.allow_device_mismatch, plots=not ns.no_plots,
            history=ns.history, remeasure_ceilings=ns.remeasure_ceilings,
            measure_ceilings=not ns.no_measure_ceilings, fleet_tolerance=ns.fleet_tolerance,
            dist_timeout=ns.dist_timeout, collectives=ns.collectives, acceptance=acceptance,
            arch=ns.arch, retune=ns.retune, baseline_provider=ns.baseline_provider,
            energy=ns.energy))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (results.json's metadata["request"]); inf budgets as "inf"."""
        d = asdict(self)
        for k in _FLOATS_MAYBE_INF:
            if isinstance(d[k], float) and math.isinf(d[k]):
                d[k] = "inf"
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunRequest:
        """The request to_json wrote; RequestError for keys this version does not know."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise RequestError(f"cannot read the stored request: unknown field(s) "
                               f"{', '.join(unknown)} (written by a newer version?)")
        d = dict(d)
        for k in ("kernels", "dtypes", "providers", "cache", "shapes"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        for k in _FLOATS_MAYBE_INF:
            if d.get(k) == "inf":
                d[k] = math.inf
        if d.get("acceptance") is not None:
            d["acceptance"] = AcceptanceOptions(**d["acceptance"])
        return cls(**d)


_FLOATS_MAYBE_INF = ("row_budget", "run_budget", "dist_timeout")

# What a resume takes from its own command line; everything else is the run's own
# (its selection, sizes, cache modes, seed, check-only, device, fp8 mode, throttle).
RESUME_FROM_COMMAND_LINE: tuple[str, ...] = (
    "out", "run_id", "resume", "compare", "threshold", "allow", "allow_device_mismatch",
    "plots", "history", "remeasure_ceilings", "measure_ceilings", "ceilings_dir",
    "row_budget", "run_budget", "fleet_tolerance", "dist_timeout", "collectives",
    "acceptance", "arch", "retune")


def choose(value: str | Sequence[str], allowed: Sequence[str], flag: str,
           named: dict[str, Sequence[str]] | None = None) -> tuple[str, ...]:
    """A comma list (or a list) checked against `allowed`, "all" expanded (to `named`'s
    "all" where given, else to `allowed`) and so is any other name of `named` (the
    providers' "default"), duplicates dropped in order; RequestError naming the first
    unknown value."""
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) \
        else [str(v).strip() for v in value]
    items = [v for v in items if v]
    if len(items) == 1 and items[0] in (named or {}):
        return tuple((named or {})[items[0]])
    if items == ["all"]:
        return tuple(allowed)
    if not items:
        raise RequestError(f"--{flag} is empty (choose from {','.join(allowed)})")
    for v in items:
        if v not in allowed:
            raise RequestError(f"unknown {flag.rstrip('s')} '{v}' "
                               f"(choose from {','.join(allowed)})")
    return tuple(dict.fromkeys(items))


# Which GPU rows get an energy window (a replay of their timed loop long enough for
# NVML's energy counter, benches/sweep/energy_counter.py): each (kernel, provider, dtype,
# cache mode) series' largest shape, every row, or none.
ENERGY_ROWS = ("largest", "all", "off")


def validated(req: RunRequest) -> RunRequest:
    """The one validation of a request's selection against the registries (the command
    line's and a resumed run's alike): lists as checked tuples, the device name known."""
    from kernels import ALL_PROVIDERS, DEFAULT_PROVIDERS, PROVIDERS, REGISTRY
    from kernels.spec import DTYPE_NAMES

    if req.device != "auto" and req.device not in DEVICES:
        raise RequestError(f"unknown device '{req.device}' "
                           f"(choose from auto, {', '.join(DEVICES)})")
    if req.baseline_provider not in PROVIDERS:
        raise RequestError(f"unknown baseline provider '{req.baseline_provider}' "
                           f"(choose from {','.join(PROVIDERS)})")
    if req.energy not in ENERGY_ROWS:
        raise RequestError(f"unknown --energy '{req.energy}' "
                           f"(choose from {','.join(ENERGY_ROWS)})")
    if req.sizes.startswith(MODEL_SIZES):
        try:
            parse_model_sizes(req.sizes)
        except ModelConfigError as e:
            raise RequestError(str(e)) from None
    return replace(
        req, kernels=choose(req.kernels, tuple(REGISTRY), "kernels"),
        dtypes=choose(req.dtypes, DTYPE_NAMES, "dtypes"),
        providers=choose(req.providers, PROVIDERS, "providers",
                         {"all": ALL_PROVIDERS, "default": DEFAULT_PROVIDERS}),
        cache=None if req.cache is None else choose(req.cache, CACHE_MODES, "cache"))


def resumed_request(command_line: RunRequest, meta: dict[str, Any]) -> RunRequest:
    """The request of `--resume RUN`: the run's own stored request with what a resume
    may change taken from this command line (RESUME_FROM_COMMAND_LINE)."""
    if "request" not in meta:
        return request_from_old_metadata(meta, command_line)
    stored = validated(RunRequest.from_json(meta["request"]))
    return replace(stored, **{k: getattr(command_line, k) for k in RESUME_FROM_COMMAND_LINE})


def request_from_old_metadata(meta: dict[str, Any], command_line: RunRequest) -> RunRequest:
    """The request of a run written before results.json stored one, from its old keys
    (kernels, dtypes, providers, cache, seed, check_only, device_key, fp8_accum,
    throttle_settings, sizes, explicit_shapes); what they do not hold is the command
    line's."""
    throttle = meta.get("throttle_settings") or {}
    if meta["sizes"] == "explicit":
        shapes = meta.get("explicit_shapes")
        if not shapes:
            raise RequestError("cannot resume: the run used explicit --sizes that its "
                               "metadata does not list")
        explicit: tuple[Shape, ...] | None = tuple(parse_shape(s) for s in shapes)
    else:
        explicit = None
    return validated(replace(
        command_line, kernels=tuple(meta["kernels"]), dtypes=tuple(meta["dtypes"]),
        providers=tuple(meta["providers"]),
        # A run written before --cache existed was timed cold.
        cache=tuple(meta.get("cache") or [DEFAULT_CACHE]),
        seed=meta["seed"], check_only=bool(meta.get("check_only")),
        device=meta["device_key"],
        fp8_accum=meta.get("fp8_accum") or command_line.fp8_accum,
        throttle_threshold=throttle.get("threshold_pct", command_line.throttle_threshold),
        throttle_recovery_delay=throttle.get("recovery_delay_s",
                                             command_line.throttle_recovery_delay),
        sizes=meta["sizes"], shapes=explicit))
