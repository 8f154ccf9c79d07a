"""The performance targets (docs/targets.md) judged from saved runs' rows: the copy
bandwidth each run measured (its ceilings' hbm_gbps), cuBLAS bf16 and fp8 TFLOP/s at
8192^3, and each target ratio the rows allow, marked met, missed (by how much) or not
measured (with why).  Pure analysis: nothing is measured.  Every ratio comes from one
run: a row against its own run's copy bandwidth, Triton against torch rows of the same
run, all of the device's native cache mode (cold on a GPU; _find).  Where several runs
hold a qualifying row, the largest footprint counts, then the run given last.  The
command line and the summary it writes are roofline/report/targets_cli.py.  A run is
read as records (contract/schema.py load_doc): its metadata's typed parts, its rows'
groups.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contract.devices import ROOF_CLASS
from contract.physics import clocks_differ, clocks_text
from contract.record import RunRow
from contract.rows import DTYPE_ORDER, positive_float, run_ceilings
from contract.run_meta import RunMeta
from contract.schema import ROWS_JOURNAL, load_doc, parse_shape
from kernels.spec import PLAIN_DTYPES
from roofline.gate.runs import incomplete_reasons

# ---- The targets (docs/targets.md: "on an H100 or H200, large sizes, in one run"). ----
# "Large" for the vector kernels: a footprint (the row's compulsory bytes) of at least
# 256 MiB, five times the H100's 50 MB L2, so the row streams from HBM.
LARGE_BYTES = 256 * 2**20
ELEMENTWISE = ("add", "mul", "gelu")  # "Triton add/mul/GELU"
ELEMENTWISE_OF_COPY = 0.92  # of the measured copy bandwidth, and ...
NOT_SLOWER_THAN_EAGER = 1.0  # ... never slower than torch eager (torch ms / Triton ms)
FP8_ELEMENTWISE_OF_COPY = 0.85  # fp8 elementwise (e4m3 and e5m2)
DOT_OF_COPY = 0.90
MATVEC_OF_COPY = 0.85
MATVEC_MIN_DIM = 8192  # "matvec (N, K >= 8192)": the matrix's rows (M here) and K
MATMUL_OF_TORCH = 0.95  # Triton TFLOP/s over torch's on the same shape and run
BF16_MATMUL_SIZES = (4096, 8192)  # M = N = K; against torch.matmul (cuBLAS)
FP8_MATMUL_SIZES = (8192,)  # against torch._scaled_mm
HEADLINE_SIZE = 8192  # cuBLAS bf16 and fp8 TFLOP/s are reported at 8192^3
# The step's own kernels: the row ops (softmax, layernorm,
# rmsnorm) stream at >= 0.9 of the copy bandwidth at >= 64 MiB; Triton attention forward,
# bf16, head dim 128, S = 4k..16k, at >= 0.9x torch SDPA (flash) and >= 50% of bf16 peak.
ROW_OPS = ("softmax", "layernorm", "rmsnorm")
ROW_OP_DTYPES = ("fp32", "fp16", "bf16")  # kernels/rowops.py's dtypes
ROW_OP_OF_COPY = 0.90
ROW_OP_BYTES = 64 * 2**20
ATTENTION_OF_SDPA = 0.90
ATTENTION_OF_PEAK = 0.50
ATTENTION_SEQS = (4096, 8192, 16384)
ATTENTION_HEAD_DIM = 128
# The vector kernels' dtypes: every benchmark dtype but tf32, a matmul-only mode.
# Vector kernels run the plain dtypes (block scales run along a GEMM's K); tf32 is a
# tensor-core mode, not a storage type.
VECTOR_DTYPES = tuple(d for d in DTYPE_ORDER if d != "tf32" and d in PLAIN_DTYPES)

MET, MISSED, NOT_MEASURED = "met", "missed", "not measured"
# A ratio of two rows timed at SM clocks more than 2% apart (contract.physics): the
# clocks' as much as the code's, so neither met nor missed.
UNEQUAL = "unequal clocks"
VERDICTS = (MET, MISSED, UNEQUAL, NOT_MEASURED)
# .ci/gpu's steps file: a header line, then one tab-separated line per step.
STEP_FIELDS = ("step", "status", "seconds", "log", "note")
STEP_STATUSES = ("pass", "fail", "timeout", "skipped")


class TargetsError(ValueError):
    """Input that cannot be read (one-line message, exit 2)."""


@dataclass(frozen=True)
class Run:
    path: str
    meta: RunMeta
    rows: tuple[RunRow, ...]
    copy_gbps: float | None  # measured ceilings' hbm_gbps (a large device copy)
    datasheet_gbps: float | None
    incomplete: tuple[str, ...] = ()  # why the run is not whole (empty: it is)

    @property
    def name(self) -> str:
        return str(self.meta.provenance.run_id or Path(self.path).name)

    @property
    def label(self) -> str:
        """'quick' or 'quick (incomplete: ...)'."""
        return self.name + (f" (incomplete: {'; '.join(self.incomplete)})"
                            if self.incomplete else "")


def load(path: str) -> Run:
    """A run as the targets read it: an unfinished run (killed before it wrote
    results.json whole) from its row journal, its ceilings from its rows where the
    metadata has none, and labelled incomplete."""
    doc = load_doc(path)
    ceil = run_ceilings(doc.meta, doc.frame())
    measured, sheet = ceil.get("measured"), ceil.get("datasheet")
    why = incomplete_reasons(doc.meta)
    folder = Path(path) if Path(path).is_dir() else Path(path).parent
    if (folder / ROWS_JOURNAL).exists():
        # Killed outright (SIGKILL, a lost machine): results.json was never rewritten.
        why = [w for w in why if w != "incomplete"] + [
            f"cut short, its {len(doc.rows)} rows read from its row journal"]
    return Run(path, doc.meta, doc.rows, measured.hbm_gbps if measured else None,
               sheet.hbm_gbps if sheet else None, tuple(why))


def _dims(row: RunRow) -> dict[str, int]:
    try:
        return parse_shape(row.case.shape)
    except ValueError:
        return {}


def _size(b: float | None) -> str:
    if b is None:
        return "? bytes"
    return f"{b / 2**30:.3g} GiB" if b >= 2**30 else f"{b / 2**20:.3g} MiB"


def _reason(row: RunRow) -> str:
    """'failed (first line of its reason)', for a row that is not ok; for an ok row whose
    rates the physics check withheld, which and why."""
    rates = [w for w in row.withheld if w.column in ("tflops", "gbps", "ms_median")]
    if row.ok and rates:
        return f"ok, its {rates[0].column} withheld ({rates[0].kind}: {rates[0].reason})"
    lines = row.reason.strip().splitlines() if row.reason else []
    text = lines[0] if lines else "no reason given"
    return f"{row.status} ({text[:80]})"


Found = tuple[int, Run, RunRow]  # (run index, run, row)


def _find(runs: Sequence[Run], kernel: str, provider: str, dtype: str,
          dims: dict[str, int] | None = None, native: bool = True) -> list[Found]:
    """The rows of a case in the runs.  The targets hold rows timed in their device's
    native cache mode (cold on a GPU, L2 flushed: what the targets' numbers are; a row
    without a `cache` cell has it, schema.mode_tag), so every row picked, and every pair
    of rows a ratio is taken of, shares that mode: a warm Triton time over a cold torch
    time, or over the cold copy, is no ratio.  native=False: the rows of the other mode."""
    return [(i, run, r) for i, run in enumerate(runs) for r in run.rows
            if r.case.kernel == kernel and r.case.provider == provider
            and r.case.dtype == dtype and (dims is None or _dims(r) == dims)
            and (r.mode_tag == "") == native]


def _no_row(runs: Sequence[Run], kernel: str, provider: str, dtype: str,
            dims: dict[str, int] | None = None) -> str:
    """Why there is no row to judge: none at all, or only rows of the other cache mode."""
    other = _find(runs, kernel, provider, dtype, dims, native=False)
    modes = sorted({r.case.cache for _, _, r in other})
    name = "Triton" if provider == "triton" else provider
    return f"no {name} row" + (f" (only {'/'.join(modes)}-cache rows, which the targets "
                               "do not hold)" if other else "")


def _gbps(r: RunRow) -> float | None:
    return positive_float(r.metrics.gbps)


def _tflops(r: RunRow) -> float | None:
    return positive_float(r.metrics.tflops)


def _ms(r: RunRow) -> float | None:
    return positive_float(r.timing.ms_median)


def _bytes(r: RunRow) -> float | None:
    return positive_float(r.accounting.bytes)


def _ok(r: RunRow, value: Callable[[RunRow], float | None]) -> bool:
    """An ok row with a positive `value` (_gbps, _tflops, _ms)."""
    return r.ok and value(r) is not None


def _throttled(*rows: RunRow) -> str:
    """', throttled' when a row was timed while the GPU throttled: its ratio is low for
    that reason, said beside it."""
    return ", throttled" if any(r.clocks.throttled is True for r in rows) else ""


@dataclass
class Part:
    """One condition of a target: value against need (None: not measured, with why)."""

    need: float
    unit: str
    value: float | None = None
    why: str = ""
    # A ratio of two rows: the SM clocks of the Triton row and of the other (None: not
    # a ratio of rows; a clock None where not known)
    clocks: tuple[float | None, float | None] | None = None

    def of_rows(self, value: float, triton: RunRow, other: RunRow) -> None:
        """The part measured as a ratio of two rows, their clocks kept beside it."""
        self.value = value
        self.clocks = (triton.clocks.sm_clock_mhz, other.clocks.sm_clock_mhz)

    @property
    def clocks_text(self) -> str | None:
        return clocks_text(*self.clocks) if self.clocks else None

    @property
    def verdict(self) -> str:
        if self.value is None:
            return NOT_MEASURED
        if self.clocks and clocks_differ(*self.clocks):
            return UNEQUAL
        return MET if self.value >= self.need else MISSED


@dataclass
class Check:
    target: str
    case: str = "-"
    parts: list[Part] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        verdicts = [p.verdict for p in self.parts]
        return next((v for v in (MISSED, UNEQUAL, NOT_MEASURED) if v in verdicts), MET)

    def cells(self) -> list[str]:
        measured = "; ".join(
            "-" if p.value is None else f"{_value_text(p)}{p.unit}"
            + (f" ({p.clocks_text})" if p.clocks_text else "") for p in self.parts)
        needs = "; ".join(f">= {p.need:.2f}{p.unit}" for p in self.parts)
        notes = [f"{p.unit.strip()}: {_short_text(p)} short" if p.verdict == MISSED
                 else f"{p.unit.strip()}: timed at {p.clocks_text}, a ratio of the clocks "
                      "as much as of the code" if p.verdict == UNEQUAL else p.why
                 for p in self.parts if p.verdict != MET]
        notes = list(dict.fromkeys(notes))  # parts not measured for one reason: said once
        verdict = self.verdict + (f": {'; '.join(notes)}" if notes else "")
        return [self.target, self.case, measured, needs, verdict]


def _value_text(p: Part) -> str:
    """The measured ratio with 3 decimals, or as many more as it takes for a miss never
    to print as its need (0.9496 against 0.95: "0.9496", not "0.950")."""
    assert p.value is not None
    for digits in range(3, 8):
        text = f"{p.value:.{digits}f}"
        if p.verdict != MISSED or float(text) < p.need:
            return text
    return repr(p.value)


def _short_text(p: Part) -> str:
    """How far a miss is short of its need, in percent, never printed as 0."""
    assert p.value is not None
    short = (p.need - p.value) / p.need
    for digits in range(1, 6):
        text = f"{short:.{digits}%}"
        if float(text.rstrip("%")) > 0:
            return text
    return f"{short:.2e}"


def _tag(run: Run) -> str:
    """The run's name in a table cell, marked where the run is incomplete."""
    return run.name + (", incomplete run" if run.incomplete else "")


def _bandwidth(runs: Sequence[Run], target: str, kernel: str, dtype: str, need: float,
               qualifies: Callable[[RunRow], bool], large: str,
               vs_eager: bool) -> Check:
    """A Triton row's GB/s over its run's copy bandwidth (and its speed over torch
    eager's on the same shape and run): the largest qualifying ok row."""
    check = Check(target)
    copy = Part(need, " of copy")
    check.parts.append(copy)
    eager = Part(NOT_SLOWER_THAN_EAGER, "x eager")
    if vs_eager:
        check.parts.append(eager)
    found = _find(runs, kernel, "triton", dtype)
    big = [f for f in found if qualifies(f[2])]
    ok = [f for f in big if _ok(f[2], _gbps)]
    timed = [f for f in ok if f[1].copy_gbps]

    def by_size(f: Found) -> tuple[float, int]:
        return (_bytes(f[2]) or 0.0, f[0])

    if not found:
        why = _no_row(runs, kernel, "triton", dtype)
    elif not big:
        top = max(found, key=by_size)[2]
        why = f"no row {large} (largest: {top.case.shape}, {_size(_bytes(top))})"
    elif not ok:
        why = f"Triton row {_reason(max(big, key=by_size)[2])}"
    elif not timed:
        why = f"run {ok[-1][1].name} has no measured copy bandwidth"
    else:
        _, run, row = max(timed, key=by_size)
        check.case = f"{row.case.shape}, {_size(_bytes(row))} ({_tag(run)}" \
                     f"{_throttled(row)})"
        copy.value = _ratio(row.metrics.gbps, run.copy_gbps)
        torch_rows = _find([run], kernel, "torch", dtype, _dims(row))
        if torch_rows and _ok(torch_rows[0][2], _ms):
            eager.of_rows(_ratio(torch_rows[0][2].timing.ms_median, row.timing.ms_median),
                          row, torch_rows[0][2])
        else:
            eager.why = (f"torch row {_reason(torch_rows[0][2])}" if torch_rows
                         else "no torch row at that shape")
        return check
    for p in check.parts:
        p.why = why
    return check


def _ratio(a: float | None, b: float | None) -> float:
    """a / b of two rows' values (NaN where one is empty)."""
    def f(x: float | None) -> float:
        return float("nan") if x is None else float(x)

    return f(a) / f(b)


def _square(s: int) -> dict[str, int]:
    return {"M": s, "N": s, "K": s}


def _matmul(runs: Sequence[Run], dtype: str, size: int, torch_name: str) -> Check:
    """Triton matmul TFLOP/s over torch's at size^3, both ok in the same run (the last
    such run given)."""
    part = Part(MATMUL_OF_TORCH, f"x {torch_name}")
    check = Check(f"matmul {dtype} {size}^3", parts=[part])
    dims = _square(size)
    triton_rows = _find(runs, "matmul", "triton", dtype, dims)
    torch_rows = _find(runs, "matmul", "torch", dtype, dims)
    for i in reversed(range(len(runs))):
        t = [r for j, _, r in triton_rows if j == i and _ok(r, _tflops)]
        c = [r for j, _, r in torch_rows if j == i and _ok(r, _tflops)]
        if t and c:
            part.of_rows(_ratio(t[0].metrics.tflops, c[0].metrics.tflops), t[0], c[0])
            check.case = f"{t[0].case.shape} ({_tag(runs[i])}{_throttled(t[0], c[0])})"
            return check
    whys = []
    for provider, found in (("triton", triton_rows), ("torch", torch_rows)):
        if not found:
            whys.append(_no_row(runs, "matmul", provider, dtype, dims))
        elif not any(_ok(r, _tflops) for _, _, r in found):
            name = "Triton" if provider == "triton" else provider
            whys.append(f"{name} row {_reason(found[-1][2])}")
    part.why = ", ".join(whys) or "the Triton and torch rows come from different runs"
    return check


def _attention(runs: Sequence[Run], seq: int, causal: int) -> Check:
    """Triton attention forward bf16 at head dim 128 and sequence length `seq`: its speed
    over torch SDPA's on the same shape and run (SDPA's backend named in the case: the
    target is against flash), and its TFLOP/s over the row's bf16 peak."""
    sdpa, peak = Part(ATTENTION_OF_SDPA, "x SDPA"), Part(ATTENTION_OF_PEAK, " of peak")
    check = Check(f"attention bf16 D={ATTENTION_HEAD_DIM} S={seq}"
                  + (" causal" if causal else ""), parts=[sdpa, peak])

    def fits(r: RunRow) -> bool:
        d = _dims(r)
        return (d.get("S"), d.get("D"), d.get("causal")) == (seq, ATTENTION_HEAD_DIM, causal)

    found = [f for f in _find(runs, "attention", "triton", "bf16") if fits(f[2])]
    ok = [f for f in found if _ok(f[2], _tflops)]
    if not ok:
        why = f"Triton row {_reason(found[-1][2])}" if found else \
            _no_row(runs, "attention", "triton", "bf16")
        sdpa.why = peak.why = why + f" at S={seq}, D={ATTENTION_HEAD_DIM}"
        return check
    _, run, row = ok[-1]
    check.case = f"{row.case.shape} ({_tag(run)}{_throttled(row)})"
    top = positive_float(row.accounting.peak_tflops)
    peak.value = _ratio(row.metrics.tflops, top) if top else None
    peak.why = "" if top else "the row has no bf16 peak"
    torch_rows = [r for _, _, r in _find([run], "attention", "torch", "bf16", _dims(row))]
    if torch_rows and _ok(torch_rows[0], _ms):
        sdpa.of_rows(_ratio(torch_rows[0].timing.ms_median, row.timing.ms_median), row,
                     torch_rows[0])
        backend = str(torch_rows[0].reason or "").strip().splitlines()
        if backend:
            check.case += f"; torch: {backend[0][:60]}"
    else:
        sdpa.why = (f"torch row {_reason(torch_rows[0])}" if torch_rows
                    else "no torch row at that shape")
    return check


def checks(runs: Sequence[Run]) -> list[Check]:
    """Every target ratio a set of runs can hold, in docs/targets.md's order."""
    def large(r: RunRow) -> bool:
        return (_bytes(r) or 0) >= LARGE_BYTES

    def big_matrix(r: RunRow) -> bool:
        d = _dims(r)
        return min(d.get("M", 0), d.get("K", 0)) >= MATVEC_MIN_DIM

    at_large = f"at >= {_size(LARGE_BYTES)}"
    out = []
    for kernel in ELEMENTWISE:
        for dtype in VECTOR_DTYPES:
            fp8 = ROOF_CLASS.get(dtype) == "fp8"
            need = FP8_ELEMENTWISE_OF_COPY if fp8 else ELEMENTWISE_OF_COPY
            out.append(_bandwidth(runs, f"{kernel} {dtype}", kernel, dtype, need, large,
                                  at_large, vs_eager=True))
    for kernel, need, qualifies, text in (
            ("dot", DOT_OF_COPY, large, at_large),
            ("matvec", MATVEC_OF_COPY, big_matrix, f"with M, K >= {MATVEC_MIN_DIM}")):
        for dtype in VECTOR_DTYPES:
            out.append(_bandwidth(runs, f"{kernel} {dtype}", kernel, dtype, need, qualifies,
                                  text, vs_eager=False))
    out += [_matmul(runs, "bf16", s, "cuBLAS") for s in BF16_MATMUL_SIZES]
    out += [_matmul(runs, "fp8", s, "_scaled_mm") for s in FP8_MATMUL_SIZES]

    def row_op_large(r: RunRow) -> bool:
        return (_bytes(r) or 0) >= ROW_OP_BYTES

    for kernel in ROW_OPS:
        for dtype in ROW_OP_DTYPES:
            out.append(_bandwidth(runs, f"{kernel} {dtype}", kernel, dtype, ROW_OP_OF_COPY,
                                  row_op_large, f"at >= {_size(ROW_OP_BYTES)}",
                                  vs_eager=False))
    out += [_attention(runs, seq, causal) for seq in ATTENTION_SEQS for causal in (0, 1)]
    return out


def headline(runs: Sequence[Run]) -> list[list[str]]:
    """[figure, value, run] rows: copy bandwidth, cuBLAS bf16 and fp8 at 8192^3."""
    out = []
    copies = [r for r in runs if r.copy_gbps]
    distinct = {r.copy_gbps for r in copies}
    # Runs sharing one ceiling cache report the same copy: one line for all of them.
    for run in copies if len(distinct) > 1 else copies[:1]:
        gbps = run.copy_gbps
        sheet = f" ({gbps / run.datasheet_gbps:.2f} of the datasheet's " \
                f"{run.datasheet_gbps:.0f})" if run.datasheet_gbps else ""
        where = run.name if len(distinct) > 1 or len(copies) == 1 \
            else f"all {len(copies)} runs that measured it"
        out.append(["copy bandwidth (measured)", f"{gbps:.0f} GB/s{sheet}", where])
    if not copies:
        out.append(["copy bandwidth (measured)", NOT_MEASURED,
                    "no run measured its ceilings"])
    size = f"{HEADLINE_SIZE}^3"
    for dtype, what in (("bf16", "cuBLAS bf16 (torch.matmul)"),
                        ("fp8", "cuBLAS fp8 (torch._scaled_mm)")):
        rows = _find(runs, "matmul", "torch", dtype, _square(HEADLINE_SIZE))
        by_mode: dict[str, Found] = {}
        for f in rows:
            if _ok(f[2], _tflops):
                mode = f[1].meta.settings.fp8_accum if dtype == "fp8" else None
                by_mode[f"{mode} accumulation" if mode else ""] = f  # the last run wins
        for mode, (_, run, r) in by_mode.items():
            label = f"{what} {size}" + (f", {mode}" if mode else "")
            mhz = positive_float(r.clocks.sm_clock_mhz)
            out.append([label, f"{float(r.metrics.tflops or 0.0):.0f} TFLOP/s"
                        + (f" at {mhz:,.0f} MHz" if mhz else ""), run.name])
        if not by_mode:
            why = _reason(rows[-1][2]) if rows else \
                _no_row(runs, "matmul", "torch", dtype, _square(HEADLINE_SIZE))
            out.append([f"{what} {size}", NOT_MEASURED, why])
    return out
