"""Where `run_bench.py --estimate` takes a row's speed from: the rows of earlier runs of
the device (`Reference`), or of another GPU scaled by the two models' roofline bounds;
between two rows of a series, the line through them (a latency plus work at a rate)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benches.estimate.speeds import DeviceSpeed
from benches.sweep.cases import Case, RunConfig
from benches.timing.plan import TIMER_GRAPH_FALLBACK, TimingConfig, bound_ms
from benches.timing.stopping import settled, settled_count
from contract.ceilings import datasheet_of
from contract.devices import DEVICES, DeviceModel
from contract.schema import row_key
from kernels.spec import Target


@dataclass
class Reference:
    """Rows of earlier runs of a device (the newest row of each case wins), their device
    model, and the metadata of the runs that recorded their time split."""

    paths: list[Path] = field(default_factory=list)
    rows: dict[tuple[str, ...], dict[str, Any]] = field(default_factory=dict)
    model: DeviceModel | None = None
    l2_mb: float | None = None
    # metadata of each run with a time split (metadata.time_split_s), oldest first
    splits: list[dict[str, Any]] = field(default_factory=list)
    # each such run's rows' config_source, by run_identity(meta) then row key: which
    # launches ran a shipped config, were tuned or fixed, as that run found its file
    sources: dict[str, dict[tuple[str, ...], str]] = field(default_factory=dict)
    # the newest incomplete run: (path, rows it holds, its selection), a check of the
    # estimate
    cut: tuple[Path, int, tuple[Any, ...]] | None = None
    # Seconds each distinct ceilings measurement of these runs took (their metadata's
    # ceilings.measured.seconds, one per measured_at: runs sharing a cache share one)
    ceilings_measured_s: dict[str, float] = field(default_factory=dict)
    _settles: dict[tuple[float, float, int], int | None] = field(default_factory=dict)

    @property
    def ceilings_s(self) -> float | None:
        """The median measured ceilings time of these runs (None: none recorded one)."""
        times = sorted(self.ceilings_measured_s.values())
        if not times:
            return None
        mid = len(times) // 2
        return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2

    def settles(self, timing: TimingConfig) -> int | None:
        """The median count at which the stopping rule stops these runs' rows (see
        settles_at), computed once per width and level."""
        key = (timing.ci_rel_width, timing.ci_level,
               min(timing.gate_min_samples, timing.min_samples))
        if key not in self._settles:
            self._settles[key] = _median_settles(self.rows.values(), timing)
        return self._settles[key]

    def series(self, case: Case) -> list[dict[str, Any]]:
        return [r for k, r in self.rows.items()
                if k[0] == case.spec.name and k[1] == case.provider and k[2] == case.dtype
                and k[4] == case.cache]


def run_identity(meta: dict[str, Any]) -> str:
    """A run among the reference's: when it was made and its id."""
    return f"{meta.get('created')}|{meta.get('run_id')}"


def selection(meta: dict[str, Any]) -> tuple[Any, ...]:
    """What a run selected (a RunConfig or a run's metadata): kernels, dtypes,
    providers, sizes, cache modes."""
    get = meta.get if isinstance(meta, dict) else lambda k: getattr(meta, k, None)
    return tuple(tuple(get(k) or ()) if k != "sizes" else get(k)
                 for k in ("kernels", "dtypes", "providers", "sizes", "cache"))


def load_reference(paths: Iterable[Path]) -> Reference:
    """The rows of these results.json files, oldest first so the newest win."""
    docs = []
    for p in paths:
        try:
            docs.append((p, json.loads(p.read_text())))
        except (OSError, ValueError):
            continue
    docs.sort(key=lambda d: str(d[1].get("metadata", {}).get("created", "")))
    ref = Reference()
    for p, doc in docs:
        meta, rows = doc.get("metadata") or {}, doc.get("rows") or []
        ref.paths.append(p)
        ref.model = DEVICES.get(str(meta.get("device_key"))) or ref.model
        ref.l2_mb = meta.get("l2_mb") or ref.l2_mb
        for r in rows:
            ref.rows[row_key(r)] = r
        if isinstance(meta.get("time_split_s"), dict):
            ref.splits.append(meta)
            ref.sources[run_identity(meta)] = {
                row_key(r): str(r["config_source"]) for r in rows if r.get("config_source")}
        if meta.get("complete") is False and rows:
            ref.cut = (p, len(rows), selection(meta))
        measured = (meta.get("ceilings") or {}).get("measured") or {}
        seconds = measured.get("seconds") if isinstance(measured, dict) else None
        if isinstance(seconds, (int, float)) and seconds > 0:
            ref.ceilings_measured_s[str(measured.get("measured_at") or p)] = float(seconds)
    return ref


def _runs_under(out_root: Path, pattern: str) -> list[Path]:
    """The results.json files under out_root matching `pattern`, sorted, but a fleet
    rank's own run (<fleet>/ranks/rank-<r>/...): its rows are in the fleet's
    results.json, and its time split holds the fleet's waits and collectives, which no
    sweep's phases price."""
    return sorted(p for p in out_root.glob(pattern)
                  if "ranks" not in p.relative_to(out_root).parts[:-1])


def find_reference(out_root: Path, model: DeviceModel) -> Reference:
    """The runs of `model` under out_root (any depth), else, for a GPU, of any GPU;
    fleet ranks' own runs left out."""
    own = _runs_under(out_root, f"{model.key}/**/results.json")
    if own or model.kind != "cuda":
        return load_reference(own)
    gpus = []
    for p in _runs_under(out_root, "*/**/results.json"):
        try:
            kind = json.loads(p.read_text()).get("metadata", {}).get("device_kind")
        except (OSError, ValueError):
            continue
        if kind == "cuda":
            gpus.append(p)
    return load_reference(gpus)


def _bound(case: Case, model: DeviceModel | None, target: Target) -> float | None:
    if model is None:
        return None
    sheet = datasheet_of(model) or {}
    rc = case.spec.roof_class(case.dtype, target)
    return bound_ms(case.spec.flops(case.shape, case.dtype),
                    case.spec.nbytes(case.shape, case.dtype),
                    (sheet.get("tflops") or {}).get(rc), sheet.get("hbm_gbps"))


@dataclass(frozen=True)
class RowSpeed:
    call_ms: float
    host_us: float
    fallback: bool = False  # its graph could not be used (the reference row says)
    # The samples after which the stopping rule stops this row, simulated on the
    # reference's recorded samples (settles_at); None: it runs to its time cap.
    settles: int | None = None


def settles_at(row: dict[str, Any], timing: TimingConfig) -> int | None:
    """How many of a recorded row's samples (in the order taken) the stopping rule
    would have taken (benches/timing/stopping.py, with `timing`'s width and level);
    None when they never meet it (the row runs to its time cap) or it has none."""
    samples = [float(x) for x in row.get("samples_ms") or []]
    floor = min(timing.gate_min_samples, timing.min_samples)
    if timing.ci_rel_width <= 0 or len(samples) < floor:
        return None
    n = settled_count(samples, timing.ci_rel_width, timing.ci_level, floor)
    return n if settled(samples[:n], timing.ci_rel_width, timing.ci_level, floor) else None


def _median_settles(rows: Iterable[dict[str, Any]], timing: TimingConfig) -> int | None:
    """The median of settles_at over rows with samples (a row that never settles counts
    as None, above every count); None when there are none or the median never settles."""
    got = [settles_at(r, timing) for r in rows if r.get("samples_ms")]
    if not got:
        return None
    got.sort(key=lambda n: float("inf") if n is None else n)
    return got[len(got) // 2]


def row_speed(case: Case, cfg: RunConfig, ref: Reference, sp: DeviceSpeed) -> RowSpeed:
    """A row's call time and host dispatch: its reference row's (scaled by the two
    devices' roofline bounds when the reference ran on another model), else its
    series' fraction of the roof at the nearest size, else the assumptions."""
    mine = _bound(case, cfg.model, cfg.target)
    theirs = _bound(case, ref.model, cfg.target)
    scale = mine / theirs if mine and theirs and ref.model is not cfg.model else 1.0
    row = ref.rows.get(case.key)
    series = [r for r in ref.series(case) if r.get("ms_median")]
    hosts = sorted(float(r["host_us"]) for r in series if r.get("host_us"))
    host = (row or {}).get("host_us") or (hosts[len(hosts) // 2] if hosts else
                                          sp.host_us.get(case.provider, 10.0))
    fallback = str((row or {}).get("timer")) == TIMER_GRAPH_FALLBACK
    # The rule's count: the row's own samples, else its series', else those of every
    # reference row (the samples of a case of another size are the nearest measure).
    timing = cfg.timing
    settles = settles_at(row, timing) if row and row.get("samples_ms") else (
        _median_settles(series, timing) if any(r.get("samples_ms") for r in series)
        else ref.settles(timing))
    if row is not None and row.get("ms_median"):
        return RowSpeed(float(row["ms_median"]) * scale, float(host), fallback, settles)
    call = _over_budget_call_s(row)
    if call is not None:
        return RowSpeed(call * 1e3, float(host), settles=settles)
    if series:
        work = case.spec.flops(case.shape, case.dtype) + case.spec.nbytes(case.shape,
                                                                            case.dtype)
        return RowSpeed(_interpolate(series, work) * scale, float(host), settles=settles)
    return RowSpeed(max(sp.floor_ms, (mine or 0.0) / sp.roof_fraction), float(host),
                    settles=settles)


def _interpolate(series: list[dict[str, Any]], work: float) -> float:
    """A call's ms at `work` (FLOPs + bytes) from its series' rows: a call costs a
    latency plus work at a rate, so between two rows the line through them; past the
    largest, its rate (ms in proportion); under the smallest, its ms (the latency)."""
    pts = sorted((float(r["flops"] or 0) + float(r["bytes"] or 0), float(r["ms_median"]))
                 for r in series)
    if work <= pts[0][0]:
        return pts[0][1]
    if work >= pts[-1][0]:
        return pts[-1][1] * work / max(pts[-1][0], 1.0)
    for (w0, t0), (w1, t1) in zip(pts, pts[1:], strict=False):
        if w0 <= work <= w1:
            return t0 + (t1 - t0) * (work - w0) / max(w1 - w0, 1.0)
    return pts[-1][1]


def _over_budget_call_s(row: dict[str, Any] | None) -> float | None:
    """A skipped row's call time, from its "one call takes X s" reason."""
    m = re.search(r"one call takes ([0-9.e+-]+) s", str((row or {}).get("reason") or ""))
    return float(m.group(1)) if m else None
