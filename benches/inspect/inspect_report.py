"""What `run_bench.py --inspect` writes and prints: inspect.csv / inspect.json, the table,
and the summary lines (per-dtype MMA, tensor memory, TMA) under it."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

COLUMNS = ["kernel", "dtype", "fn", "config", "warps", "stages", "shapes", "registers",
           "spill_stores", "spill_loads", "shared", "mma", "mma_types", "mma_shape", "sass_mma",
           "tmem_cols", "tmem_ops", "tma", "load_bits", "load_bits_all", "load_kinds",
           "fp8_acc", "ptxas_warnings", "ptxas", "status", "flags", "error"]


def write_files(folder: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """inspect.json (metadata and every row) and inspect.csv (COLUMNS) in `folder`."""
    (folder / "inspect.json").write_text(json.dumps({"metadata": meta, "rows": rows},
                                                    indent=1, default=str))
    with open(folder / "inspect.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "ptxas_warnings": " | ".join(r.get("ptxas_warnings") or []),
                        "flags": "; ".join(r["flags"])})


def short_warnings(warnings_: list[str]) -> str:
    """ptxas diagnostics by code (C7515 ...); the full text is in the CSV and JSON."""
    codes = [m.group(0) if (m := re.search(r"C\d{4}", w)) else w[:30] for w in warnings_]
    return ",".join(dict.fromkeys(codes)) or "-"


def _mma_cell(r: dict[str, Any]) -> str:
    """The MMA family, with the SASS opcode ptxas made of it (tcgen05 UTCHMMA)."""
    sass = r.get("sass_mma", "")
    return f"{r['mma']} {sass}" if sass and r["mma"] not in ("none", "FMA only") else r["mma"]


def _tmem_cell(r: dict[str, Any]) -> str:
    cols = r.get("tmem_cols", 0)
    return "?" if cols < 0 else str(cols) if cols else "-"


def print_table(rows: list[dict[str, Any]], title: str, cc: int) -> None:
    """The rich table; tensor-memory columns from sm_100 on, TMA from sm_90 on."""
    from rich.console import Console
    from rich.table import Table

    extra = (["tmem cols"] if cc >= 100 else []) + (["tma"] if cc >= 90 else [])
    t = Table(title=title)
    for col in ("kernel", "fn", "dtype", "config", "w", "st", "regs", "spill", "smem KB",
                "mma", "types", *extra, "ld bits", "fp8 acc", "ptxas", "status"):
        t.add_column(col, overflow="fold")
    for r in rows:
        fn = r["fn"].removesuffix("_kernel")
        if r["error"]:
            t.add_row(r["kernel"], fn, r["dtype"], r["config"], str(r["warps"]),
                      str(r["stages"]), *[""] * (8 + len(extra)), "[red]" + r["error"])
            continue
        status = "ok" if not r["flags"] else "[red]" + "; ".join(r["flags"])
        bits = f"{r['load_bits']} {r['load_kinds']}" if r["load_bits"] else "-"
        if r["load_bits_all"] and r["load_bits_all"] < r["load_bits"]:
            bits += f" ({r['load_bits_all']}*)"
        cells = ([_tmem_cell(r)] if cc >= 100 else []) + \
            ([r.get("tma") or "-"] if cc >= 90 else [])
        t.add_row(r["kernel"], fn, r["dtype"], r["config"], str(r["warps"]), str(r["stages"]),
                  str(r["registers"]), f"{r['spill_stores']}/{r['spill_loads']}",
                  f"{r['shared'] / 1024:.1f}", _mma_cell(r), r["mma_types"] or "-", *cells,
                  bits, r["fp8_acc"] or "-", short_warnings(r["ptxas_warnings"]), status)
    # Wide enough that no cell folds (the tensor-memory columns make sm_100 wider).
    Console(width=max(Console().width, 200 if cc >= 100 else 160)).print(t)
    print("ld bits: narrowest global load / cp.async of a tensor operand, per thread; "
          "(N*): N bits where the tile gives a thread fewer than 128")


def summary_lines(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The lines under the table: cases, registers, spills, shared memory; the MMA each
    tensor-core dtype got; tensor memory and TMA where the arch has them."""
    ok = [r for r in rows if not r["error"]]
    spilled = sum(1 for r in ok if r["spill_stores"] or r["spill_loads"])
    lo, hi = meta["registers_range"]
    out = [f"{len(rows)} cases, {len(ok)} compiled: registers {lo}-{hi}, "
           f"{spilled} with spills, largest shared memory {meta['max_shared']} B of "
           f"{meta['smem_limit']}"]
    mma = [f"{d} {', '.join(v)}" for d, v in meta["mma_per_dtype"].items() if v]
    if mma:
        out.append("MMA per dtype: " + "; ".join(mma))
    if meta["capability"] >= 100:
        cols = sorted({r["tmem_cols"] for r in ok if r.get("tmem_cols")})
        out.append("tensor memory: " + (f"{cols[0]}-{cols[-1]} of {meta['tmem_columns']} "
                                        f"columns in {sum(1 for r in ok if r.get('tmem_cols'))}"
                                        " cases" if cols else "none"))
    if meta["capability"] >= 90:
        tma = sorted({r["tma"] for r in ok if r.get("tma")})
        loads = sorted({k for r in ok for k in r["load_kinds"].split(",") if k})
        out.append("TMA: " + (", ".join(tma) if tma else
                              f"none (tensor operands loaded by {', '.join(loads) or '-'})"))
    return out
