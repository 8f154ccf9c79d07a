"""What the terminal shows: the kernel and device listings (--list, --list-devices) and
the table of a run's headline rows, on one rich console."""

from __future__ import annotations

import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from kernels import REGISTRY
from roofline.devices import DEVICES, ROOF_CLASSES

# Piped output (CI logs, files) gets a wide console instead of rich's 80-column default,
# so tables do not fold.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


def print_kernels() -> None:
    t = Table(title="Kernels: FLOPs and compulsory bytes (b = bytes per element of the "
                    "dtype; b_out of fp8 products is bf16's 2)")
    for col in ("kernel", "providers: dtypes", "FLOPs", "bytes", "roof"):
        t.add_column(col)
    for spec in REGISTRY.values():
        provs = "\n".join(f"{n}: {','.join(p.dtypes)}" for n, p in spec.providers.items())
        roof = "dtype's tensor-core peak" if spec.matrix_unit else "fp32 vector peak"
        t.add_row(spec.name, provs, spec.flops_formula, spec.bytes_formula, roof)
    console.print(t)
    notes = Table(title="How each provider computes")
    for col in ("kernel", "provider", "implementation"):
        notes.add_column(col)
    for spec in REGISTRY.values():
        for n, p in spec.providers.items():
            notes.add_row(spec.name, n, p.note)
    console.print(notes)


def print_devices() -> None:
    t = Table(title="Device models: dense peaks (TFLOP/s), bandwidth, ridge points "
                    "(FLOP/byte = peak / bandwidth)")
    for col in ("key", "name", *ROOF_CLASSES, "HBM TB/s", "L2 MB", "SMs", "ridge FLOP/B"):
        t.add_column(col, overflow="fold")
    for d in DEVICES.values():
        if d.kind == "cpu" or not d.peaks_tflops:
            t.add_row(d.key, d.name, *["measured"] * len(ROOF_CLASSES), "measured", "", "",
                      d.notes)
            continue
        peaks = [f"{d.peaks_tflops[c]:g}" if c in d.peaks_tflops else "-" for c in ROOF_CLASSES]
        ridges = ", ".join(f"{c} {d.ridge(c):.0f}" for c in ROOF_CLASSES if d.ridge(c))
        t.add_row(d.key, d.name, *peaks, f"{d.hbm_tbps:g}", f"{d.l2_mb:g}", str(d.sms), ridges)
    console.print(t)


def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def print_summary(rows: list[dict[str, Any]]) -> None:
    ok = [r for r in rows if r["status"] == "ok"]
    t = Table(title=f"{len(ok)} ok, {sum(r['status'] == 'failed' for r in rows)} failed, "
                    f"{sum(r['status'] == 'skipped' for r in rows)} skipped")
    for col in ("kernel", "provider", "dtype", "shape", "ms", "TFLOP/s", "GB/s", "MFU",
                "% roof", "rel_err"):
        t.add_column(col, justify="right" if col not in ("kernel", "provider", "dtype",
                                                         "shape") else "left")
    # Largest shape per (kernel, provider, dtype): the headline number of each series.
    best: dict[tuple, dict[str, Any]] = {}
    for r in ok:
        key = (r["kernel"], r["provider"], r["dtype"])
        if key not in best or r["flops"] >= best[key]["flops"]:
            best[key] = r
    for r in best.values():
        t.add_row(r["kernel"], r["provider"], r["dtype"], r["shape"],
                  _fmt(r["ms_median"], ".4f"), _fmt(r["tflops"], ".3f"), _fmt(r["gbps"], ".1f"),
                  _fmt(r["mfu"], ".1%"), _fmt(r["pct_roof"], ".1f"), _fmt(r["rel_err"], ".1e"))
    console.print(t)
    bad = [r for r in rows if r["status"] == "failed"]
    for r in bad:
        console.print(f"[red]FAILED[/red] {r['kernel']} {r['provider']} {r['dtype']} "
                      f"{r['shape']}: {r['reason']}")
    reasons: dict[str, int] = {}
    for r in rows:
        if r["status"] == "skipped":
            reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        console.print(f"skipped x{n}: {reason}")
