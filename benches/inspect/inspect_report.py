"""What `run_bench.py --inspect` writes and prints: inspect.csv / inspect.json, the table,
and the summary lines (per-dtype MMA, tensor memory, TMA) under it."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from benches.inspect.inspected import Compiled, Inspected, InspectMeta

COLUMNS = ["kernel", "dtype", "fn", "config", "warps", "stages", "shapes", "registers",
           "spill_stores", "spill_loads", "shared", "mma", "mma_types", "mma_shape", "sass_mma",
           "tmem_cols", "tmem_ops", "tma", "load_bits", "load_bits_all", "load_kinds",
           "fp8_acc", "ptxas_warnings", "ptxas", "status", "flags", "error"]


def write_files(folder: Path, meta: InspectMeta, rows: list[Inspected]) -> None:
    """inspect.json (metadata and every row) and inspect.csv (COLUMNS) in `folder`."""
    docs = [r.to_json() for r in rows]
    (folder / "inspect.json").write_text(json.dumps({"metadata": meta.to_json(), "rows": docs},
                                                    indent=1, default=str))
    with open(folder / "inspect.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r, doc in zip(rows, docs, strict=True):
            warnings_ = r.compiled.ptxas_warnings if r.compiled is not None else ()
            w.writerow({**doc, "ptxas_warnings": " | ".join(warnings_),
                        "flags": "; ".join(r.flags)})


def short_warnings(warnings_: tuple[str, ...]) -> str:
    """ptxas diagnostics by code (C7515 ...); the full text is in the CSV and JSON."""
    codes = [m.group(0) if (m := re.search(r"C\d{4}", w)) else w[:30] for w in warnings_]
    return ",".join(dict.fromkeys(codes)) or "-"


def _mma_cell(c: Compiled) -> str:
    """The MMA family, with the SASS opcode ptxas made of it (tcgen05 UTCHMMA)."""
    return f"{c.mma} {c.sass_mma}" if c.sass_mma and c.mma not in ("none", "FMA only") \
        else c.mma


def _tmem_cell(c: Compiled) -> str:
    return "?" if c.tmem_cols < 0 else str(c.tmem_cols) if c.tmem_cols else "-"


def _cells(c: Compiled, cc: int) -> list[str]:
    """A compiled case's cells from `regs` to `ptxas` (tensor memory from sm_100 on, TMA
    from sm_90 on)."""
    bits = f"{c.load_bits} {c.load_kinds}" if c.load_bits else "-"
    if c.load_bits_all and c.load_bits_all < c.load_bits:
        bits += f" ({c.load_bits_all}*)"
    extra = ([_tmem_cell(c)] if cc >= 100 else []) + ([c.tma or "-"] if cc >= 90 else [])
    return [str(c.registers), f"{c.spill_stores}/{c.spill_loads}", f"{c.shared / 1024:.1f}",
            _mma_cell(c), c.mma_types or "-", *extra, bits, c.fp8_acc or "-",
            short_warnings(c.ptxas_warnings)]


def print_table(rows: list[Inspected], title: str, cc: int) -> None:
    """The rich table; tensor-memory columns from sm_100 on, TMA from sm_90 on."""
    from rich.console import Console
    from rich.table import Table

    extra = (["tmem cols"] if cc >= 100 else []) + (["tma"] if cc >= 90 else [])
    t = Table(title=title)
    for col in ("kernel", "fn", "dtype", "config", "w", "st", "regs", "spill", "smem KB",
                "mma", "types", *extra, "ld bits", "fp8 acc", "ptxas", "status"):
        t.add_column(col, overflow="fold")
    for r in rows:
        case = [r.kernel, r.fn.removesuffix("_kernel"), r.dtype, r.config, str(r.warps),
                str(r.stages)]
        if r.compiled is None:
            t.add_row(*case, *[""] * (8 + len(extra)), "[red]" + r.error)
            continue
        status = "ok" if not r.flags else "[red]" + "; ".join(r.flags)
        t.add_row(*case, *_cells(r.compiled, cc), status)
    # Wide enough that no cell folds (the tensor-memory columns make sm_100 wider).
    Console(width=max(Console().width, 200 if cc >= 100 else 160)).print(t)
    print("ld bits: narrowest global load / cp.async of a tensor operand, per thread; "
          "(N*): N bits where the tile gives a thread fewer than 128")


def summary_lines(rows: list[Inspected], meta: InspectMeta) -> list[str]:
    """The lines under the table: cases, registers, spills, shared memory; the MMA each
    tensor-core dtype got; tensor memory and TMA where the arch has them."""
    ok = [c for r in rows if (c := r.compiled) is not None]
    spilled = sum(1 for c in ok if c.spills)
    lo, hi = meta.registers_range
    out = [f"{len(rows)} cases, {len(ok)} compiled: registers {lo}-{hi}, "
           f"{spilled} with spills, largest shared memory {meta.max_shared} B of "
           f"{meta.smem_limit}"]
    mma = [f"{d} {', '.join(v)}" for d, v in meta.mma_per_dtype.items() if v]
    if mma:
        out.append("MMA per dtype: " + "; ".join(mma))
    if meta.capability >= 100:
        cols = sorted({c.tmem_cols for c in ok if c.tmem_cols})
        out.append("tensor memory: " + (f"{cols[0]}-{cols[-1]} of {meta.tmem_columns} "
                                        f"columns in {sum(1 for c in ok if c.tmem_cols)}"
                                        " cases" if cols else "none"))
    if meta.capability >= 90:
        tma = sorted({c.tma for c in ok if c.tma})
        loads = sorted({k for c in ok for k in c.load_kinds.split(",") if k})
        out.append("TMA: " + (", ".join(tma) if tma else
                              f"none (tensor operands loaded by {', '.join(loads) or '-'})"))
    return out
