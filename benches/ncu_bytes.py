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
ncu is looked for on PATH, then under Nsight Compute's own installs
(/opt/nvidia/nsight-compute/<version>/ncu) and CUDA's (/usr/local/cuda*/bin/ncu), newest
version first; the one that ran (path and version) is printed and kept in the JSON.

Where ncu is missing or may not read the counters (ERR_NVGPUCTRPERM), nothing is
measured: the reason is printed and the exit code is SKIPPED (77), which .ci/gpu records
as a skipped step.  ncu's "No kernels were profiled" is a skip only when the child ran to
its end (it writes a done file as its last act): a child that died before its first
profiled range (an import or compile error, out of memory) gets the same warning from
ncu, and is a failure (exit 1) naming the child's exit code and its last line.  Writes
OUT_DIR/ncu-bytes.json (the ncu that ran, the status and reason, the families) and, when
measured, ncu-bytes.md.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

SKIPPED = 77  # "skipped" exit code (automake's convention), read by .ci/gpu
MARKER = "ncu_family_marker"
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
DTYPE = "bf16"
# What ncu says where it may not read the counters: a reason, not a failure.
NO_COUNTERS = ("ERR_NVGPUCTRPERM", "does not have permission")
# ncu's warning when no range held a kernel: a skip only if the child ran to its end.
NO_KERNELS = "No kernels were profiled"
# How ncu reports the profiled process's exit status ("==ERROR== The application
# returned an error code (1).").
CHILD_EXIT = re.compile(r"(?:returned an error code|exited with code)\s*\(?(-?\d+)\)?")
# Where ncu is installed besides PATH: Nsight Compute's own installs, one folder per
# version, and CUDA toolkits' bin/.  Parameters of find_ncu, so tests can point them at
# a folder of their own.
NSIGHT_ROOT = Path("/opt/nvidia/nsight-compute")
CUDA_ROOT = Path("/usr/local")


@dataclass(frozen=True)
class NcuTool:
    """The ncu that runs: its path, its version ("unknown" if it did not say) and where
    it was found."""

    path: str
    version: str
    found_in: str


def _version_key(name: str) -> tuple[int, ...]:
    """A folder name's version as numbers ("2024.1.1" -> (2024, 1, 1), "cuda-12.10" ->
    (12, 10)); a name without one ("cuda") sorts below every version."""
    return tuple(int(n) for n in re.findall(r"\d+", name))


def _newest_first(folders: list[Path]) -> list[Path]:
    return sorted(folders, key=lambda d: (_version_key(d.name), d.name), reverse=True)


def find_ncu(path: str | None, nsight_root: Path = NSIGHT_ROOT,
             cuda_root: Path = CUDA_ROOT) -> tuple[Path, str] | None:
    """(ncu, where it was found): on `path` (a PATH string) first, else the newest
    version under `nsight_root`/<version>/ncu, else under `cuda_root`/cuda*/bin/ncu;
    None if there is none."""
    on_path = shutil.which("ncu", path=path)
    if on_path:
        return Path(on_path), "PATH"
    places = [(d / "ncu", f"{nsight_root}/<version>")
              for d in _newest_first([d for d in _listing(nsight_root) if d.is_dir()])]
    places += [(d / "bin" / "ncu", f"{cuda_root}/cuda*/bin")
               for d in _newest_first([d for d in _listing(cuda_root)
                                       if d.name.startswith("cuda") and d.is_dir()])]
    for exe, where in places:
        if exe.is_file() and os.access(exe, os.X_OK):
            return exe, where
    return None


def _listing(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:  # missing, or not readable: nothing installed there
        return []


def ncu_version(ncu: Path) -> str:
    """ncu's version as `ncu --version` says it ("2024.1.1.0"), "unknown" if it did not."""
    try:
        p = subprocess.run([str(ncu), "--version"], capture_output=True, text=True,
                           timeout=60)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"Version\s+(\S+)", p.stdout + p.stderr)
    return m.group(1) if m else "unknown"


@dataclass(frozen=True)
class Outcome:
    """What ncu's run came to before its CSV is read: `code` 0 (go on and read it),
    SKIPPED or 1, and the line that says why."""

    code: int
    line: str


def judge_run(ncu_said: str, ncu_code: int, child_done: bool, child_said: str) -> Outcome:
    """ncu's own messages (its log: lines starting "=="), its exit code, whether the
    child wrote its done file (it ran to its end) and the child's output."""
    own = [ln.strip() for ln in ncu_said.splitlines() if ln.startswith("==")]

    def first(text: str) -> str | None:
        return next((ln for ln in own if text in ln), None)

    for reason in NO_COUNTERS:
        line = first(reason)
        if line is not None:
            return Outcome(SKIPPED, "skipped: ncu cannot read the DRAM counters here: "
                                    f"{line[:200]}")
    if not child_done:
        codes = [m.group(1) for ln in own if (m := CHILD_EXIT.search(ln))]
        child = f"exit {codes[-1]}" if codes else "exit status unknown"
        last = _last_line(child_said) or (own[-1] if own else "no output")
        return Outcome(1, f"error: the profiled child died before it finished ({child}; "
                          f"ncu exit {ncu_code}): {last[:200]}")
    line = first(NO_KERNELS)
    if line is not None:
        return Outcome(SKIPPED, "skipped: ncu profiled no kernel though the child ran to "
                                f"its end (exit 0): {line[:200]}")
    if ncu_code != 0:
        last = own[-1] if own else _last_line(child_said) or "no output"
        return Outcome(1, f"error: ncu exited {ncu_code} though the child ran to its end: "
                          f"{last[:200]}")
    return Outcome(0, "")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.startswith("==")]
    return lines[-1] if lines else ""


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


@dataclass(frozen=True)
class Family:
    """One family profiled: its case (kernel, dtype, shape) and the compulsory bytes the
    suite counts for it.  The child writes the list it profiled (ncu-child-done.json)."""

    kernel: str
    dtype: str
    shape: str
    counted_bytes: int


@dataclass(frozen=True)
class FamilyBytes:
    """A family's DRAM bytes as ncu counted them over its marked range (read, written,
    both), their ratio to the counted bytes, and the kernels that moved them."""

    family: Family
    dram_read: float
    dram_write: float
    kernels: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ncu_bytes(self) -> float:
        return self.dram_read + self.dram_write

    @property
    def ratio(self) -> float | None:
        counted = self.family.counted_bytes
        return self.ncu_bytes / counted if counted else None

    def to_json(self) -> dict[str, object]:
        """ncu-bytes.json's entry: the family's fields, then ncu's."""
        return {**asdict(self.family), "dram_read": self.dram_read,
                "dram_write": self.dram_write, "ncu_bytes": self.ncu_bytes,
                "ratio": self.ratio, "kernels": list(self.kernels)}


def child(kernels: list[str] | None, done_file: Path) -> int:
    """Under ncu: each family warmed outside the profiled ranges, then one profiled
    range per family holding the marker and one call.  Its last act writes the families,
    in order, to `done_file`: that it exists says the child ran to its end."""
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
        done.append(Family(name, DTYPE, ",".join(f"{k}={v}" for k, v in shape.items()),
                           int(spec.nbytes(shape, DTYPE))))
        del inputs, out
        torch.cuda.empty_cache()
    done_file.write_text(json.dumps([asdict(f) for f in done]))
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


def by_family(rows: list[tuple[str, str, str, float]], families: list[Family]
              ) -> list[FamilyBytes]:
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
        out.append(FamilyBytes(fam, sum(v for _, m, v in group if m == METRICS[0]),
                               sum(v for _, m, v in group if m == METRICS[1]),
                               tuple(sorted({n for n, _, _ in group}))))
    return out


def render(results: list[FamilyBytes], tool: NcuTool) -> str:
    from contract.markdown import md_table_lines

    lines = ["# DRAM bytes (ncu) against the counted compulsory bytes", "",
             f"ncu {tool.version}: `{tool.path}`", "", *md_table_lines(
                 ["kernel", "dtype", "shape", "counted MB", "ncu read MB", "ncu write MB",
                  "ncu / counted", "kernels"],
                 [[r.family.kernel, r.family.dtype, r.family.shape,
                   f"{r.family.counted_bytes / 1e6:.1f}", f"{r.dram_read / 1e6:.1f}",
                   f"{r.dram_write / 1e6:.1f}", f"{r.ratio:.3f}", ", ".join(r.kernels)]
                  for r in results],
                 "lllrrrrl")]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"] and len(argv) == 3:
        return child(argv[1].split(",") if argv[1] else None, Path(argv[2]))
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--kernels") \
            or argv[0].startswith("-"):
        print("error: usage: python -m benches.ncu_bytes OUT_DIR [--kernels LIST]",
              file=sys.stderr)
        return 2
    out = Path(argv[0])
    kernels = argv[2] if len(argv) == 3 else ""
    found = find_ncu(os.environ.get("PATH"), NSIGHT_ROOT, CUDA_ROOT)
    if found is None:
        print(f"skipped: ncu (Nsight Compute) not found: not on PATH, nor under "
              f"{NSIGHT_ROOT}/<version>/ or {CUDA_ROOT}/cuda*/bin/")
        return SKIPPED
    tool = NcuTool(str(found[0]), ncu_version(found[0]), found[1])
    print(f"ncu: {tool.path} (version {tool.version}, found in {tool.found_in})", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    log, done = out / "ncu.csv", out / "ncu-child-done.json"
    done.unlink(missing_ok=True)
    cmd = [tool.path, "--clock-control", "none", "--profile-from-start", "off",
           "--metrics", ",".join(METRICS), "--csv", "--print-units", "base",
           "--log-file", str(log), sys.executable, "-m", "benches.ncu_bytes", "--child",
           kernels, str(done)]
    p = subprocess.run(cmd, capture_output=True, text=True,
                       env={**os.environ, "PYTHONUNBUFFERED": "1"})
    text = log.read_text() if log.exists() else ""
    # ncu's own messages go to its log; the child's output to ncu's stdout and stderr.
    outcome = judge_run(text + p.stdout + p.stderr, p.returncode, done.exists(),
                        p.stdout + p.stderr)
    families = [Family(**f) for f in json.loads(done.read_text())] if done.exists() else []
    results: list[FamilyBytes] = []
    if outcome.code == 0:
        try:
            results = by_family(parse_ncu_csv(text), families)
        except ValueError as e:
            outcome = Outcome(1, f"error: {log}: {e}")
    status = {0: "ok", SKIPPED: "skipped"}.get(outcome.code, "failed")
    (out / "ncu-bytes.json").write_text(json.dumps(
        {"ncu": asdict(tool), "status": status, "reason": outcome.line,
         "families": [r.to_json() for r in results]}, indent=1) + "\n")
    if outcome.code != 0:
        print(outcome.line, file=sys.stderr if outcome.code != SKIPPED else sys.stdout)
        return outcome.code
    md = render(results, tool)
    (out / "ncu-bytes.md").write_text(md)
    print(md, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
