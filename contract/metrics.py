"""Roofline metrics of one measurement: the single place these formulas live.

Units: FLOPs and bytes are counts, time in milliseconds, compute in TFLOP/s, bandwidth in
GB/s (1e9 byte/s), intensity in FLOP/byte.  mfu is a fraction of the compute peak;
pct_roof is a percentage of the roofline bound min(peak, intensity x bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import fields

from contract.record import Accounting, Metrics


def intensity(flops: float, nbytes: float) -> float:
    return flops / nbytes if nbytes else math.inf


def roof_tflops(ai: float, peak_tflops: float | None, peak_gbps: float | None) -> float | None:
    """Attainable TFLOP/s at arithmetic intensity `ai`: min(peak, ai x bandwidth).

    ai [FLOP/B] x bandwidth [GB/s] is GFLOP/s, hence the /1e3 to TFLOP/s.
    """
    if peak_tflops is None and peak_gbps is None:
        return None
    bounds = []
    if peak_tflops:
        bounds.append(peak_tflops)
    if peak_gbps:
        bounds.append(ai * peak_gbps / 1e3)
    return min(bounds) if bounds else None


def derive(flops: float, nbytes: float, ms: float | None, peak_tflops: float | None,
           peak_gbps: float | None, meas_peak_tflops: float | None = None,
           meas_peak_gbps: float | None = None) -> dict[str, float | None]:
    """All derived columns of a row from its counts, its median time and the ceilings."""
    ai = intensity(flops, nbytes)
    out: dict[str, float | None] = {
        "intensity": ai,
        "peak_tflops": peak_tflops,
        "peak_gbps": peak_gbps,
        "roof_tflops": roof_tflops(ai, peak_tflops, peak_gbps),
        "meas_peak_tflops": meas_peak_tflops,
        "meas_peak_gbps": meas_peak_gbps,
        "meas_roof_tflops": roof_tflops(ai, meas_peak_tflops, meas_peak_gbps),
        "tflops": None, "gbps": None, "mfu": None, "pct_roof": None, "pct_meas_roof": None,
        "above_roof": None,
    }
    if ms is None or not ms > 0:
        return out
    seconds = ms * 1e-3
    tflops = flops / seconds / 1e12
    out["tflops"] = tflops
    out["gbps"] = nbytes / seconds / 1e9
    if peak_tflops:
        out["mfu"] = tflops / peak_tflops
    if out["roof_tflops"]:
        out["pct_roof"] = 100.0 * tflops / out["roof_tflops"]
    if out["meas_roof_tflops"]:
        out["pct_meas_roof"] = 100.0 * tflops / out["meas_roof_tflops"]
    # Faster than the roof allows is a finding (cache-resident data, a time near the
    # timer's resolution, a wrong FLOP/byte count), not a best point: flag it.
    pct = out["pct_roof"] if out["pct_roof"] is not None else out["pct_meas_roof"]
    out["above_roof"] = None if pct is None else bool(pct > 100.0)
    return out


def row_metrics(acc: Accounting, ms: float | None) -> Metrics:
    """A row's Metrics group (contract/record.py) from its accounting and median time:
    derive's columns that the group owns (the accounting keeps the intensity and
    ceilings)."""
    d = derive(acc.flops, acc.bytes, ms, acc.peak_tflops, acc.peak_gbps,
               acc.meas_peak_tflops, acc.meas_peak_gbps)
    return Metrics(**{f.name: d[f.name] for f in fields(Metrics)})


# nccl-tests' bus bandwidth (its docs/PERFORMANCE.md): busbw = algbw x the factor of the
# collective at n ranks, the traffic each link carries relative to the whole array, so
# that busbw is comparable with the link's own speed across rank counts.  At one rank
# nothing crosses a link: the factor is 0 (broadcast's 1 holds from two ranks on).
BUSBW_FACTOR = {
    "all_reduce": lambda g: 2 * (g - 1) / g,
    "all_gather": lambda g: (g - 1) / g,
    "reduce_scatter": lambda g: (g - 1) / g,
    "all_to_all": lambda g: (g - 1) / g,
    "broadcast": lambda g: 1.0,
}
