"""What a run's rows cost the device, as summary.md and the energy figure read it: the
best TFLOP/J per kernel and dtype, the rows at the power limit, the rows whose events'
time holds launch gaps (`kernel_ms`, torch.profiler's kernel time, well under
`ms_median`), and the energy roof of the run (its best GEMM's FLOP/J, its best
memory-bound row's bytes/J).  The rows are picked on the run's frame; a table's cells
come from the typed rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from contract.modes import launches_from_host
from contract.record import RunRow
from contract.rows import compute_kernels
from contract.schema import RunDoc
from roofline.report.findings import as_dict, in_canonical_order, records

# Events' time above the kernels' by more than this share: a launch gap (the GPU waited
# between kernels for the host or for launches; tritonbench's latency vs cuda_time).
LAUNCH_GAP_SHARE = 0.10
# Mean power at this share of the enforced limit or above, or NVML's sw_power_cap reason
# in the row's reason: the row ran at the power limit.
AT_LIMIT_SHARE = 0.95
NUMBERS = ("ms_median", "kernel_ms", "energy_j", "tflop_per_j", "gb_per_j", "power_w",
           "power_limit_w", "sm_clock_mhz", "intensity", "flops", "bytes")


def numeric(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with the energy and time columns as numbers (absent ones NaN)."""
    out = df.copy()
    for col in NUMBERS:
        out[col] = pd.to_numeric(out[col], errors="coerce") if col in out.columns \
            else float("nan")
    return out


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df.columns else df.iloc[0:0]


def energy_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows with an energy per call."""
    d = _ok(numeric(df))
    return d[d["energy_j"] > 0]


def at_power_limit(df: pd.DataFrame) -> pd.Series:
    """Which rows ran at the power limit (AT_LIMIT_SHARE, or the sw_power_cap reason)."""
    d = numeric(df)
    near = d["power_w"] >= AT_LIMIT_SHARE * d["power_limit_w"]
    capped = d["reason"].astype(str).str.contains("sw_power_cap", regex=False) \
        if "reason" in d.columns else False
    return (near | capped).fillna(False).astype(bool)


def best_energy(df: pd.DataFrame) -> pd.DataFrame:
    """Per (kernel, dtype), the ok row with the highest TFLOP/J (the GEMMs) or GB/J (the
    memory-bound kernels, whose FLOPs are few)."""
    d = energy_rows(df)
    if d.empty:
        return d
    gemm = d["kernel"].isin(compute_kernels())
    score = d["tflop_per_j"].where(gemm, d["gb_per_j"])
    d = d.assign(_score=score)
    idx = d.groupby(["kernel", "dtype"])["_score"].idxmax().dropna()
    return in_canonical_order(d.loc[idx].drop(columns="_score"))


def launch_gap_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Ok rows timed with a launch from the host per call (not CUDA-graph replays, which
    launch nothing between calls: contract.modes.launches_from_host) whose events' time
    (`ms_median`) exceeds their kernels' time (`kernel_ms`) by more than
    LAUNCH_GAP_SHARE."""
    d = _ok(numeric(df))
    host = d["timer"].map(launches_from_host) if "timer" in d.columns \
        else pd.Series(True, index=d.index)
    return d[host.astype(bool) & (d["kernel_ms"] > 0)
             & (d["ms_median"] > (1 + LAUNCH_GAP_SHARE) * d["kernel_ms"])]


@dataclass(frozen=True)
class EnergyRoof:
    """The run's measured energy ceilings: its best GEMM's FLOP/J per dtype and its best
    memory-bound row's bytes/J; the roof at intensity I is min(gemm, I x copy)."""

    gemm_flop_per_j: dict[str, float] = field(default_factory=dict)
    copy_bytes_per_j: float | None = None

    def at(self, dtype: str, intensity: float) -> float | None:
        flat = self.gemm_flop_per_j.get(dtype)
        slope = intensity * self.copy_bytes_per_j if self.copy_bytes_per_j else None
        got = [x for x in (flat, slope) if x is not None]
        return min(got) if got else None


def energy_roof(df: pd.DataFrame) -> EnergyRoof:
    d = energy_rows(df)
    gemm = d[d["kernel"].isin(compute_kernels()) & (d["tflop_per_j"] > 0)]
    flat = {str(k): float(v) * 1e12 for k, v in gemm.groupby("dtype")["tflop_per_j"].max().items()}
    mem = d[~d["kernel"].isin(compute_kernels()) & (d["gb_per_j"] > 0)]
    copy = float(mem["gb_per_j"].max()) * 1e9 if not mem.empty else None
    return EnergyRoof(flat, copy)


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None or pd.isna(x) else format(float(x), fmt)


def _mj(x: float | None) -> float | None:
    return None if x is None else x * 1e3


def _name(r: RunRow) -> list[str]:
    """A row's kernel, provider, dtype and shape cells."""
    return [r.case.kernel, r.case.provider, r.case.dtype, r.case.shape.replace(",", ", ")]


def energy_table(doc: RunDoc, df: pd.DataFrame) -> list[list[str]]:
    """The best TFLOP/J (GB/J) row per kernel and dtype of `df` (the run's frame)."""
    limit = at_power_limit(df)
    best = best_energy(df)
    return [[*_name(r), _f(r.energy.tflop_per_j, ".4g"), _f(r.energy.gb_per_j, ".4g"),
             _f(_mj(r.energy.energy_j), ".4g"), _f(r.energy.power_w, ".0f"),
             _f(r.clocks.sm_clock_mhz, ".0f"), "yes" if limit.get(i, False) else ""]
            for i, r in zip(best.index, records(doc.rows, best), strict=True)]


def _capped_table(doc: RunDoc, capped: pd.DataFrame, table: Any) -> str:
    return table(["kernel", "provider", "dtype", "shape", "W", "limit W", "SM MHz",
                  "TFLOP/J"],
                 [[*_name(r), _f(r.energy.power_w, ".0f"), _f(r.energy.power_limit_w, ".0f"),
                   _f(r.clocks.sm_clock_mhz, ".0f"), _f(r.energy.tflop_per_j, ".4g")]
                  for r in records(doc.rows, capped)], "llllrrrr")


def _gaps_table(doc: RunDoc, gaps: pd.DataFrame, table: Any) -> str:
    def ratio(r: RunRow) -> str:
        return f"{(r.timing.ms_median or 0.0) / (r.profile.kernel_ms or 0.0):.2f}x"

    return table(["kernel", "provider", "dtype", "shape", "events ms", "kernel ms",
                  "events / kernel", "kernels"],
                 [[*_name(r), _f(r.timing.ms_median, ".4g"), _f(r.profile.kernel_ms, ".4g"),
                   ratio(r), r.profile.kernels or ""] for r in records(doc.rows, gaps)],
                 "llllrrrl")


def energy_sections(doc: RunDoc, table: Any) -> list[str]:
    """summary.md's energy and launch-gap sections (`table`: its md_table): the best
    TFLOP/J per kernel and dtype, the rows at the power limit, the launch gaps; for a
    run whose rows have no energy, the metadata's reason."""
    parts: list[str] = []
    df = doc.frame()
    energy = as_dict(doc.meta.telemetry.energy)
    rows = energy_table(doc, df)
    d = energy_rows(df)
    limited = at_power_limit(d)
    if rows:
        n_limit = int(limited.sum())
        parts += ["## Energy per call", (
            "Per kernel and dtype, the row with the most TFLOP per joule (GEMMs) or GB per "
            "joule (the rest): energy per call = the mean power over the timed samples x "
            f"the median time ({energy.get('source') or 'source not recorded'}). "
            f"{n_limit} of {len(d)} rows with energy ran at the power limit (mean power "
            f"at {AT_LIMIT_SHARE:.0%} of it or above, or NVML's sw_power_cap).\n\n")
            + table(["kernel", "provider", "dtype", "shape", "TFLOP/J", "GB/J", "mJ/call",
                     "W", "SM MHz", "at limit"], rows, "llllrrrrrl")]
    elif energy:
        parts += ["## Energy per call",
                  f"No energy per call in this run: {energy.get('reason') or 'no source'}."]
    capped = in_canonical_order(d[limited])
    if len(capped):
        parts += [f"## Rows at the power limit ({len(capped)})", (
            "Mean power over the timed samples at "
            f"{AT_LIMIT_SHARE:.0%} of the enforced limit or above, or NVML's sw_power_cap "
            "reason: what these rows reach is the power budget's, at the clock shown.\n\n")
            + _capped_table(doc, capped, table)]
    gaps = in_canonical_order(launch_gap_rows(df))
    if len(gaps):
        parts += [f"## Launch gaps ({len(gaps)})", (
            "Events' time (ms_median) above the kernels' own time under torch.profiler "
            f"(kernel_ms) by more than {LAUNCH_GAP_SHARE:.0%}, in rows whose timer "
            "launches each call from the host: the GPU waited between kernels, for the "
            "host or for launches (host-bound or launch-bound). CUDA-graph rows (timer "
            "`cudagraph`) launch nothing between calls and are not listed.\n\n")
            + _gaps_table(doc, gaps, table)]
    return parts
