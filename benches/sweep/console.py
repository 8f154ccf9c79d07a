"""What the terminal shows: the kernel and device listings (--list, --list-devices) and
the table of a run's headline rows, on one rich console."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from contract.devices import DEVICES, ROOF_CLASS, ROOF_CLASSES
from contract.record import RunRow
from kernels import REGISTRY

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
    print_block_formats()


def print_block_formats() -> None:
    """The block-scaled dtypes: element, scales, and stored bits per element."""
    from kernels.blockscaled import element_format, scale_format
    from kernels.spec import BLOCK_SCALED, DTYPES

    t = Table(title="Block-scaled dtypes (matmul): quantized when the inputs are made, "
                    "not timed; checked against float64 of the dequantized inputs")
    for col in ("dtype", "element", "one scale per", "scale", "tensor scale",
                "bits/element", "roof (sm_100; elsewhere bf16, emulated)", "tolerance"):
        t.add_column(col)
    for name in BLOCK_SCALED:
        d = DTYPES[name]
        t.add_row(name, element_format(name), f"{d.block} along K", scale_format(name),
                  "fp32" if d.tensor_scale else "-", f"{8 * d.bytes_per_element:g}",
                  ROOF_CLASS[name], f"{d.tol:g}")
    console.print(t)


def print_devices() -> None:
    t = Table(title="Device models: dense peaks (TFLOP/s), bandwidth, cache, SMs, NVLink",
              caption=_roof_caption())
    for col in ("key", "name", *ROOF_CLASSES, "HBM TB/s", "L2 MB", "SMs", "NVLink GB/s"):
        t.add_column(col, overflow="fold")
    # The ridges get a table of their own: beside the peaks they would fold mid-entry.
    r = Table(title="Ridge points (FLOP/byte = dense peak / HBM bandwidth)")
    r.add_column("key")
    r.add_column("ridge FLOP/B", no_wrap=True)
    for d in DEVICES.values():
        if d.kind == "cpu" or not d.peaks_tflops:
            t.add_row(d.key, d.name, *["measured"] * len(ROOF_CLASSES), "measured", "", "", "")
            r.add_row(d.key, d.notes)
            continue
        peaks = [f"{d.peaks_tflops[c]:g}" if c in d.peaks_tflops else "-" for c in ROOF_CLASSES]
        link = f"{d.nvlink_gbps:g} per direction" if d.nvlink_gbps else "-"
        t.add_row(d.key, d.name, *peaks, f"{d.hbm_tbps:g}", f"{d.l2_mb:g}", str(d.sms), link)
        # fp16 and bf16 share one roof on every listed part: one ridge, named by both.
        ridges: dict[int, list[str]] = {}
        for c in ROOF_CLASSES:
            x = d.ridge(c)
            if x:
                ridges.setdefault(round(x), []).append(c)
        r.add_row(d.key, ", ".join(f"{'/'.join(cs)} {x}" for x, cs in ridges.items()))
    console.print(t)
    console.print(r)


def _roof_caption() -> str:
    """Which dtypes each roof holds, from kernels/spec.py's mapping (so block-scaled
    formats show under the roof they are held against), and where a '-' comes from."""
    by_roof: dict[str, list[str]] = {}
    for dtype, roof in ROOF_CLASS.items():
        by_roof.setdefault(roof, []).append(dtype)
    shared = [f"{roof}: {', '.join(dts)}" for roof, dts in by_roof.items()
              if dts != [roof]]
    return ("'-': no such unit (fp4 tensor cores: Blackwell only); NVLink '-': no NVLink "
            "switch (PCIe cards, NVL bridges: measure)"
            + ("; roofs shared by dtypes: " + "; ".join(shared) if shared else ""))


def _fmt(v: Any, spec: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def print_summary(rows: Sequence[RunRow]) -> None:
    ok = [r for r in rows if r.ok]
    t = Table(title=f"{len(ok)} ok, {sum(r.status == 'failed' for r in rows)} failed, "
                    f"{sum(r.status == 'skipped' for r in rows)} skipped")
    for col in ("kernel", "provider", "dtype", "shape", "ms", "TFLOP/s", "GB/s", "MFU",
                "% roof", "rel_err"):
        t.add_column(col, justify="right" if col not in ("kernel", "provider", "dtype",
                                                         "shape") else "left")
    # Largest shape per (kernel, provider, dtype): the headline number of each series.
    best: dict[tuple[str, str, str], RunRow] = {}
    for r in ok:
        key = (r.case.kernel, r.case.provider, r.case.dtype)
        if key not in best or r.accounting.flops >= best[key].accounting.flops:
            best[key] = r
    for r in best.values():
        c, m = r.case, r.metrics
        t.add_row(c.kernel, c.provider, c.dtype, c.shape, _fmt(r.timing.ms_median, ".4f"),
                  _fmt(m.tflops, ".3f"), _fmt(m.gbps, ".1f"), _fmt(m.mfu, ".1%"),
                  _fmt(m.pct_roof, ".1f"), _fmt(r.check.rel_err, ".1e"))
    console.print(t)
    for r in rows:
        if r.status == "failed":
            c = r.case
            console.print(f"[red]FAILED[/red] {c.kernel} {c.provider} {c.dtype} "
                          f"{c.shape}: {r.reason}")
    reasons: dict[str | None, int] = {}
    for r in rows:
        if r.status == "skipped":
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        console.print(f"skipped x{n}: {reason}")
