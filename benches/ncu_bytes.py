"""DRAM bytes read by Nsight Compute against the suite's counted compulsory bytes: one
large case per kernel family, its Triton provider, bf16.

    python -m benches.ncu_bytes OUT_DIR [--kernels add,matmul,...]

The roofline places a row by its analytic bytes (each input read once, each output
written once); a kernel whose real DRAM traffic is well above them (re-reads, spills,
a bad tile order) sits lower than its bytes say.  ncu's `dram__bytes_read.sum` and
`dram__bytes_write.sum` read the traffic itself.  One ncu process profiles one child
process that runs every family: its inputs are made, its kernel compiled and autotuned
outside the profiled ranges; then, per family, a profiled range (cudaProfilerStart/Stop)
holds a marker kernel and one call.  The marker's name splits ncu's kernels by family,
so each family's bytes are the sum over every kernel its call launched.

`--clock-control none` leaves the GPU's clocks alone (ncu locks them to base otherwise).
Where ncu is missing or may not read the counters (ERR_NVGPUCTRPERM), nothing is
measured: the reason is printed and the exit code is SKIPPED (77), which .ci/gpu records
as a skipped step.  Writes OUT_DIR/ncu-bytes.json and ncu-bytes.md.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SKIPPED = 77  # "skipped" exit code (automake's convention), read by .ci/gpu
MARKER = "ncu_family_marker"
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
DTYPE = "bf16"
# What ncu says where it may not read the counters: a reason, not a failure.
NO_COUNTERS = ("ERR_NVGPUCTRPERM", "does not have permission", "No kernels were profiled")


def cases(kernels: list[str] | None) -> list[tuple[str, dict[str, int]]]:
    """(kernel, shape): the largest quick GPU shape of each family with a Triton bf16
    provider, by its counted bytes."""
    from benches.sweep.shapes import preset_shapes
    from kernels import REGISTRY

    out = []
    for name, spec in REGISTRY.items():
        if kernels is not None and name not in kernels:
            continue
        prov = spec.providers.get("triton")
        if prov is None or DTYPE not in prov.dtypes:
            continue
        shapes = preset_shapes(spec, "quick", on_gpu=True)
        out.append((name, max(shapes, key=lambda s: spec.nbytes(s, DTYPE))))
    return out


def child(kernels: list[str] | None) -> int:
    """Under ncu: each family warmed outside the profiled ranges, then one profiled
    range per family holding the marker and one call.  Prints the families in order."""
    import torch
    import triton
    import triton.language as tl

    from kernels import REGISTRY

    @triton.jit
    def ncu_family_marker(x):  # a 1-element store: its name marks a family's start
        tl.store(x, 1.0)

    flag = torch.zeros(1, device="cuda")
    ncu_family_marker[(1,)](flag)
    done = []
    for name, shape in cases(kernels):
        spec = REGISTRY[name]
        inputs = spec.make_inputs(shape, DTYPE, 0, "cuda")
        out = spec.alloc_out(inputs, DTYPE)
        fn = spec.providers["triton"].fn
        fn(inputs, out)  # compile and tune (every candidate runs here, unprofiled)
        fn(inputs, out)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        ncu_family_marker[(1,)](flag)
        fn(inputs, out)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        done.append({"kernel": name, "dtype": DTYPE,
                     "shape": ",".join(f"{k}={v}" for k, v in shape.items()),
                     "counted_bytes": int(spec.nbytes(shape, DTYPE))})
        del inputs, out
        torch.cuda.empty_cache()
    print("NCU_FAMILIES " + json.dumps(done), flush=True)
    return 0


def parse_ncu_csv(text: str) -> list[tuple[str, str, str, float]]:
    """(launch ID, kernel name, metric, value in bytes) per row of ncu's --csv
    --print-units base output, in profiling order.  Lines before the header (ncu's own messages) are
    skipped; values may carry thousands separators."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    out = []
    for rec in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        metric = rec.get("Metric Name", "")
        if metric not in METRICS:
            continue
        unit = (rec.get("Metric Unit") or "byte").strip().lower()
        scale = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(unit)
        if scale is None:
            raise ValueError(f"unexpected unit {unit!r} for {metric}")
        value = float((rec.get("Metric Value") or "0").replace(",", ""))
        out.append((rec.get("ID", ""), rec.get("Kernel Name", ""), metric, value * scale))
    return out


def by_family(rows: list[tuple[str, str, str, float]], families: list[dict[str, Any]]
              ) -> list[dict[str, Any]]:
    """Each family's DRAM bytes: the kernels launched after its marker, up to the next
    marker."""
    groups: list[list[tuple[str, str, float]]] = []
    markers: set[str] = set()
    for launch, name, metric, value in rows:
        if name.startswith(MARKER):
            if launch not in markers:
                markers.add(launch)
                groups.append([])
            continue
        if groups:
            groups[-1].append((name, metric, value))
    if len(groups) != len(families):
        raise ValueError(f"ncu saw {len(groups)} marked ranges for {len(families)} "
                         "families")
    out = []
    for fam, group in zip(families, groups, strict=True):
        read = sum(v for _, m, v in group if m == METRICS[0])
        write = sum(v for _, m, v in group if m == METRICS[1])
        total = read + write
        out.append({**fam, "dram_read": read, "dram_write": write, "ncu_bytes": total,
                    "ratio": total / fam["counted_bytes"] if fam["counted_bytes"] else None,
                    "kernels": sorted({n for n, _, _ in group})})
    return out


def render(results: list[dict[str, Any]]) -> str:
    lines = ["# DRAM bytes (ncu) against the counted compulsory bytes", "",
             "| kernel | dtype | shape | counted MB | ncu read MB | ncu write MB | ncu / counted"
             " | kernels |", "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in results:
        lines.append(f"| {r['kernel']} | {r['dtype']} | {r['shape']} | "
                     f"{r['counted_bytes'] / 1e6:.1f} | {r['dram_read'] / 1e6:.1f} | "
                     f"{r['dram_write'] / 1e6:.1f} | {r['ratio']:.3f} | "
                     f"{', '.join(r['kernels'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        return child(argv[1].split(",") if len(argv) > 1 and argv[1] else None)
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--kernels") \
            or argv[0].startswith("-"):
        print("error: usage: python -m benches.ncu_bytes OUT_DIR [--kernels LIST]",
              file=sys.stderr)
        return 2
    out = Path(argv[0])
    kernels = argv[2] if len(argv) == 3 else ""
    ncu = shutil.which("ncu")
    if ncu is None:
        print("skipped: ncu (Nsight Compute) is not on PATH")
        return SKIPPED
    out.mkdir(parents=True, exist_ok=True)
    log = out / "ncu.csv"
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off",
           "--metrics", ",".join(METRICS), "--csv", "--print-units", "base",
           "--log-file", str(log), sys.executable, "-m", "benches.ncu_bytes", "--child",
           kernels]
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = log.read_text() if log.exists() else ""
    said = text + p.stdout + p.stderr
    problem = next((s for s in NO_COUNTERS if s in said), None)
    if problem is not None:
        line = next(ln for ln in said.splitlines() if problem in ln)
        print(f"skipped: ncu cannot read the DRAM counters here: {line.strip()[:200]}")
        return SKIPPED
    marks = [ln for ln in p.stdout.splitlines() if ln.startswith("NCU_FAMILIES ")]
    if p.returncode != 0 or not marks:
        last = (p.stderr.strip() or p.stdout.strip() or "no output").splitlines()[-1]
        print(f"error: ncu run failed (exit {p.returncode}): {last[:200]}", file=sys.stderr)
        return 1
    families = json.loads(marks[-1].split(" ", 1)[1])
    try:
        results = by_family(parse_ncu_csv(text), families)
    except ValueError as e:
        print(f"error: {log}: {e}", file=sys.stderr)
        return 1
    (out / "ncu-bytes.json").write_text(json.dumps(results, indent=1) + "\n")
    md = render(results)
    (out / "ncu-bytes.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
