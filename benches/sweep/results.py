"""A run's files while it runs: the metadata that says where and how it was measured,
and the writer that keeps results.csv, results.json and the row journal current at a
cost per row that does not grow with the run.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from benches.sweep.cases import RunConfig
from benches.sweep.energy_counter import energy_metadata
from benches.sweep.gpu_monitor import (
    nvml_snapshot,
)
from benches.sweep.kernel_time import kernel_time_metadata
from benches.sweep.shapes import is_model_sizes
from benches.timing.plan import cpu_cache_bytes, read_llc
from contract.models import parse_model_sizes, step_shapes
from contract.physics import apply as withhold
from contract.physics import apply_row
from contract.request import RunRequest
from contract.schema import (
    ALL_COLUMNS,
    RESULTS_CSV,
    RESULTS_JSON,
    ROWS_JOURNAL,
    SAMPLES,
    atomic_write_text,
    csv_frame,
    format_shape,
)
from contract.speedup import baseline_of, set_speedups, speedup_against
from contract.versions import check_versions


def head_commit() -> str | None:
    here = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                             text=True, timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=here, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _llc_mb() -> float | None:
    """Size of one of the CPU's last-level caches in MiB (Linux sysfs), or None."""
    size, _ = read_llc()
    return size / 2**20 if size else None


def _fp8_accum() -> str | None:
    from kernels import spec as kernel_spec

    mode = getattr(kernel_spec, "fp8_accum", None)  # absent in older kernel modules
    return mode() if callable(mode) else None


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, this one included), None where the
    platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def busy_cpu_warning(load: float | None, cores: int | None, threads: int) -> str | None:
    """A warning when other processes already keep the cores busy as a CPU run starts: a
    parallel op then waits a scheduler slice for a descheduled thread, and rows read as
    multiples of ~8 ms, dozens of times their quiet time; one thread removes the stalls
    (docs/measurement.md, "Figures behind the code's choices").  `load` includes this
    process, which is runnable while it starts, hence the one subtracted."""
    if load is None or not cores or threads < 2:
        return None
    others = load - 1
    if others < cores - threads + 0.5:
        return None
    return (f"the CPU is busy before the run (load average {load:g} on {cores} cores): "
            f"torch's {threads} threads will wait for each other, and times may jump by "
            "~8 ms scheduler slices; a quiet machine, or OMP_NUM_THREADS set to the idle "
            "cores, gives steadier rows")


def collect_metadata(cfg: RunConfig, run_id: str, argv: list[str],
                     request: RunRequest | None = None) -> dict[str, Any]:
    """The run's metadata; `request`: what it was asked (stored whole, so that --resume
    rebuilds it: contract/request.py); the keys beside it are what readers use."""
    try:
        import triton

        triton_v = triton.__version__
    except ImportError:
        triton_v = None
    p = cfg.present
    t = cfg.timing
    meta: dict[str, Any] = {
        "run_id": run_id,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device_key": cfg.model.key,
        "device_name": p.name,
        "device_model": cfg.model.name,
        "device_kind": p.kind,
        "detected_key": p.key,
        "capability": list(p.capability) if p.capability else None,
        "sms": p.sms,
        "l2_mb": p.l2_mb,
        "llc_mb": _llc_mb() if p.kind == "cpu" else None,
        # What a cold CPU row's copies rotate past: every last-level cache serving this
        # process's CPUs (sysfs; 32 MiB where it says nothing).
        "llc_rotation_mb": cpu_cache_bytes() / 2**20 if p.kind == "cpu" else None,
        "gpu_memory_gb": p.memory_gb,
        "cpu_cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_avg_1m": load_average(),  # as the run started (busy_cpu_warning)
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_v,
        "triton_interpret": cfg.target.interpret,
        # installed dependencies outside pyproject.toml's (tested) bounds; [] when none
        "version_warnings": [str(p) for p in check_versions()],
        "platform": platform.platform(),
        "git_commit": head_commit(),
        "command": " ".join([Path(sys.executable).name, *argv]),
        "seed": cfg.seed,
        "sizes": cfg.sizes if cfg.explicit_shapes is None else "explicit",
        "model_step": model_step(cfg.sizes),
        "kernels": cfg.kernels,
        "dtypes": cfg.dtypes,
        "providers": cfg.providers,
        "check_only": cfg.check_only,
        "cache": list(cfg.cache),
        "fp8_accum": _fp8_accum(),
        "timing": {
            **t.as_dict(),
            "gpu_method": (
                "one method per (kernel, dtype, shape) for both providers, from its "
                f"roofline bound: below {t.cudagraph_below_ms} ms, CUDA-graph replays "
                "over rotated copies of inputs and outputs totalling more than twice the "
                f"L2 (rounds of at least {t.graph_min_calls} calls, split over graphs "
                f"of ~{t.graph_replay_ms:g} ms replayed in turn; {t.graph_rep_ms:g} ms of "
                f"replays, at least {t.gate_min_samples}; time / calls); else "
                "triton.testing.do_bench (CUDA events, L2 flushed between samples)"),
            "cpu_method": f"blocks of calls lasting >= {t.cpu_block_s * 1e3:g} ms (timeit), "
                          f"{t.min_samples} blocks or more, in {t.cpu_rounds} rounds on "
                          "fresh copies of the inputs, interleaved over chunks of "
                          f"~{t.cpu_chunk_s:g} s of cases; cold: each block's calls cycle "
                          "over copies of inputs and output totalling more than twice the "
                          "last-level cache (a footprint past that: the same buffers); "
                          "warm: every call on the same buffers",
            "warm_gpu_method": (
                "back-to-back calls on the same buffers, nothing flushed: CUDA-graph "
                "replays of one copy's calls for the CUDA-graph cases, else CUDA events "
                "around each call (the GPU kept busy before each as after a flush)"),
            "gpu_sampling": (
                "the providers of a case sample in turns, batches of about "
                f"{t.interleave_ms:g} ms each, after every provider's timer is ready; a "
                "compute-bound case first warms up until its SM clock stops falling (it "
                f"came down or held {t.sustain_min_ms:g} ms; {t.sustain_cap_ms:g} ms at "
                "most); the stopping rule judges the case, each row's clock the median of "
                "its own samples'"),
            "stopping": (
                f"a row stops sampling once the {t.ci_level:.0%} interval of its median "
                f"(order statistics) is within {t.ci_rel_width:.2%} of it, after "
                f"{t.gate_min_samples} samples at least, within the time above (a CPU row: "
                f"its later rounds skipped after {t.cpu_min_rounds} of {t.cpu_rounds})"
                if t.ci_rel_width > 0 else "off: every row takes the time above"),
            "budget": (f"each row's timing within {t.row_budget_s:g} s (never fewer than "
                       f"{t.gate_min_samples} samples; a row that cannot fit them is "
                       "skipped)" + (f"; the sweep's timing within {cfg.run_budget_s:g} s, "
                                     "shared among the cases left"
                                     if cfg.run_budget_s is not None else "")),
        },
        "run_budget_s": cfg.run_budget_s,
        "ceilings": cfg.ceilings.to_json(),
        "throttle_settings": cfg.throttle.as_dict(),
        "interrupted": False,
        "complete": False,
    }
    if request is not None:
        meta["request"] = request.to_json()
    meta["energy"] = energy_metadata(p.kind)
    meta["kernel_time"] = kernel_time_metadata(p.kind)
    if p.kind == "cuda":
        snap = nvml_snapshot()
        meta["nvml_start"] = snap
        meta["driver"] = (snap or {}).get("driver")
    return meta


def model_step(sizes: str) -> dict[str, Any] | None:
    """`--sizes model:NAME`'s model and the kernel shapes of its forward pass, each with
    its layer and how many times one forward pass runs it (the summary's step table
    reads them); None for other sizes."""
    if not is_model_sizes(sizes):
        return None
    ms = parse_model_sizes(sizes)
    return {"model": ms.model.name, "describe": ms.model.describe(), "tokens": ms.tokens,
            "layers": [{"kernel": s.kernel, "layer": s.layer, "shape": format_shape(s.shape),
                        "count": s.count} for s in step_shapes(ms)]}


class ResultWriter:
    """Keeps the run folder's results current after every row, at a cost per row that
    does not grow with the rows before it.

    A row is appended to the journal (contract.schema.ROWS_JOURNAL, one JSON row with its
    raw samples per line) and to results.csv; results.json and results.csv are rewritten
    whole (atomically) only by flush(): at the run's start, after its ceilings and at its
    end, also after an interrupt or abort.  Rewriting them after every row cost time
    quadratic in the rows (measured: 242 s of writing by row 700 of 900 samples each).
    A process killed between flushes leaves every row it finished in the journal, which
    readers (schema.read_doc, hence load_run and --resume) take over results.json's rows.

    The folder itself is created (exclusively) by the caller; `rows` are those already in
    the folder when a run is resumed, kept as read so nothing measured is rewritten.
    """

    def __init__(self, run_dir: Path, metadata: dict[str, Any],
                 rows: list[dict[str, Any]] | None = None) -> None:
        self.run_dir = run_dir
        self.metadata = metadata
        self.rows: list[dict[str, Any]] = list(rows or [])
        withhold(self.rows, metadata)  # a resumed run's rows: checked as any (idempotent)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.journal = run_dir / ROWS_JOURNAL
        # The journal holds every row of the run, so it alone can stand for results.json:
        # a resumed run's earlier rows go in first (once, atomically).
        atomic_write_text(self.journal, "".join(_journal_line(r) for r in self.rows))
        self._csv_rows: int | None = None  # rows results.csv holds (None: unknown)

    def add(self, row: dict[str, Any]) -> None:
        # Its speedup where its baseline row is already in (flush sets every row's), then
        # the physics check, so no written line carries a value no device can produce
        # (contract/physics.py; flush checks every row again, against every baseline row).
        row["speedup"] = speedup_against(row, self.rows, baseline_of(self.metadata))
        apply_row(row, self.metadata, self.rows)
        self.rows.append(row)
        # One write() per line and file: a kill mid-row leaves at most a partial last
        # line, which readers drop.  Files are reopened each time because flush()
        # replaces them (a handle kept open would append to the replaced file).
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(_journal_line(row))
        if self._csv_rows != len(self.rows) - 1:  # no flush yet: written whole, once
            self._write_csv()
            return
        with open(self.run_dir / RESULTS_CSV, "a", encoding="utf-8") as f:
            f.write(csv_frame([row]).to_csv(index=False, header=False))
        self._csv_rows += 1

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=ALL_COLUMNS)

    def flush(self) -> None:
        """Rewrite results.csv and results.json whole (metadata included), atomically,
        each row's speedup against the run's baseline provider set first, then the
        physics check applied to every row (a speedup at unequal clocks withheld again)."""
        set_speedups(self.rows, baseline_of(self.metadata))
        withhold(self.rows, self.metadata)
        self._write_csv()
        doc = {"metadata": self.metadata, "rows": [_jsonable(r) for r in self.rows]}
        atomic_write_text(self.run_dir / RESULTS_JSON, json.dumps(doc, indent=1) + "\n")

    def _write_csv(self) -> None:
        atomic_write_text(self.run_dir / RESULTS_CSV, csv_frame(self.rows).to_csv(index=False))
        self._csv_rows = len(self.rows)

    def close(self) -> None:
        """Final flush; the journal goes once results.json holds every row."""
        self.flush()
        self.journal.unlink(missing_ok=True)


def _journal_line(row: dict[str, Any]) -> str:
    return json.dumps(_jsonable(row), separators=(",", ":")) + "\n"


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None  # JSON has no NaN/inf
    return v


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: _finite_or_none(row.get(k)) for k in ALL_COLUMNS}
    samples = row.get(SAMPLES)
    if samples is not None:
        out[SAMPLES] = [_finite_or_none(float(x)) for x in samples]
    return out
