"""A run's files while it runs: the metadata that says where and how it was measured,
and the writer that keeps results.csv, results.json and the row journal current at a
cost per row that does not grow with the run.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypedDict

import pandas as pd
import torch

from benches.sweep.cases import SweepContext
from benches.sweep.energy_counter import energy_metadata
from benches.sweep.gpu_monitor import nvml_snapshot
from benches.sweep.kernel_time import kernel_time_metadata
from benches.sweep.nvml_doc import NvmlFacts
from benches.sweep.shapes import is_model_sizes
from benches.timing.plan import TimingConfig, cpu_cache_bytes, read_llc
from contract import physics
from contract.bounds import RunBounds
from contract.meta_parts import ModelStep
from contract.models import parse_model_sizes, step_shapes
from contract.record import RunRow, flat
from contract.run_meta import (
    DeviceFacts,
    Provenance,
    RunMeta,
    Settings,
    Software,
    Telemetry,
)
from contract.schema import (
    ALL_COLUMNS,
    RESULTS_CSV,
    ROWS_JOURNAL,
    atomic_write_text,
    csv_text,
    format_shape,
    journal_line,
    write_results,
)
from contract.speedup import speedup_against, with_speedups
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


def collect_metadata(cfg: SweepContext, run_id: str, argv: list[str]) -> RunMeta:
    """A new run's metadata, from the parts each stage records at its start: where and
    when (provenance), the request (stored once, so that --resume rebuilds it:
    contract/request.py), the device, the software, the timing settings, the ceilings
    so far, and where the rows' energy and kernel times come from."""
    snap = nvml_snapshot() if cfg.present.kind == "cuda" else None
    return RunMeta(
        provenance=Provenance(
            run_id=run_id, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            command=" ".join([Path(sys.executable).name, *argv]), git_commit=head_commit()),
        request=cfg.request.to_json(), device=device_facts(cfg),
        software=software(NvmlFacts.of(snap).driver, cfg.target.interpret),
        settings=run_settings(cfg), ceilings=cfg.ceilings.to_json(),
        telemetry=Telemetry(nvml_start=snap, energy=energy_metadata(cfg.present.kind),
                            kernel_time=kernel_time_metadata(cfg.present.kind)))


def device_facts(cfg: SweepContext) -> DeviceFacts:
    """The device model the rows are held against, the device present and its figures;
    on a CPU the host's caches, threads and load as the run starts."""
    p = cfg.present
    cpu = p.kind == "cpu"
    return DeviceFacts(
        device_key=cfg.model.key, device_name=p.name, device_model=cfg.model.name,
        device_kind=p.kind, detected_key=p.key,
        capability=tuple(p.capability) if p.capability else None, sms=p.sms,
        l2_mb=p.l2_mb, llc_mb=_llc_mb() if cpu else None,
        # What a cold CPU row's copies rotate past: every last-level cache serving this
        # process's CPUs (sysfs; 32 MiB where it says nothing).
        llc_rotation_mb=cpu_cache_bytes() / 2**20 if cpu else None,
        gpu_memory_gb=p.memory_gb, cpu_cores=os.cpu_count(),
        threads=torch.get_num_threads(),
        load_avg_1m=load_average())  # as the run started (busy_cpu_warning)


def software(driver: str | None, interpret: bool) -> Software:
    """The versions the run ran under (the driver from its NVML snapshot; Triton
    interpreted or not), and the installed dependencies outside pyproject.toml's tested
    bounds ([] when none)."""
    try:
        import triton

        triton_v: str | None = triton.__version__
    except ImportError:
        triton_v = None
    return Software(python=platform.python_version(), torch=torch.__version__,
                    triton=triton_v, triton_interpret=interpret,
                    cuda=torch.version.cuda,
                    driver=driver,
                    platform=platform.platform(),
                    version_warnings=tuple(str(p) for p in check_versions()))


def run_settings(cfg: SweepContext) -> Settings:
    """How the rows are timed: the timing settings with the methods in words, the run
    budget, the throttle rule, the fp8 mode, a model's step."""
    return Settings(timing=timing_settings(cfg).to_json(), run_budget_s=cfg.run_budget_s,
                    throttle_settings=cfg.throttle.as_dict(), fp8_accum=_fp8_accum(),
                    model_step=model_step(cfg.selection.sizes))


class TimingMethods(TypedDict):
    """Each timing method in words, after TimingConfig's values in metadata.timing."""

    gpu_method: str
    cpu_method: str
    warm_gpu_method: str
    gpu_sampling: str
    stopping: str
    budget: str


@dataclass(frozen=True)
class TimingSettings:
    """metadata.timing (summary.md's settings table reads it): the timing settings'
    values, then the methods they give in words."""

    config: TimingConfig
    methods: TimingMethods

    def to_json(self) -> dict[str, float | str]:
        # TimingConfig's fields (numbers) then the texts: its keys follow TimingConfig.
        return {**self.config.as_dict(), **self.methods}


def timing_settings(cfg: SweepContext) -> TimingSettings:
    """The run's timing settings, each method described from their values."""
    t = cfg.timing
    return TimingSettings(t, {
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
    })


def model_step(sizes: str) -> ModelStep | None:
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

    A row (a contract.record.RunRow) is appended to the journal
    (contract.schema.ROWS_JOURNAL, one JSON row with its raw samples per line) and to
    results.csv, in the flat form contract.record.flat writes; results.json and
    results.csv are rewritten whole (atomically) only by flush(): at the run's start,
    after its ceilings and at its end, also after an interrupt or abort.  Rewriting them
    after every row cost time quadratic in the rows (measured: 242 s of writing by row
    700 of 900 samples each).  A process killed between flushes leaves every row it
    finished in the journal, which readers (schema.read_doc, hence load_doc and --resume)
    take over results.json's rows.

    The folder itself is created (exclusively) by the caller; `rows` are those already in
    the folder when a run is resumed, kept as read so nothing measured is rewritten.
    `meta` is the run's metadata as it stands (the job replaces it as the run goes:
    `update`).
    """

    def __init__(self, run_dir: Path, meta: RunMeta, rows: Sequence[RunRow] = ()) -> None:
        self.run_dir = run_dir
        self.meta = meta
        # A resumed run's rows: checked as any (idempotent).
        self.rows: list[RunRow] = physics.apply(rows, meta)
        self._bounds: tuple[tuple[object, ...], RunBounds] | None = None
        run_dir.mkdir(parents=True, exist_ok=True)
        self.journal = run_dir / ROWS_JOURNAL
        # The journal holds every row of the run, so it alone can stand for results.json:
        # a resumed run's earlier rows go in first (once, atomically).
        atomic_write_text(self.journal, "".join(journal_line(r) for r in self.rows))
        self._csv_rows: int | None = None  # rows results.csv holds (None: unknown)

    def update(self, **parts: Any) -> RunMeta:
        """The metadata with some parts replaced (RunMeta.updated), kept and returned."""
        self.meta = self.meta.updated(**parts)
        return self.meta

    def bounds(self) -> RunBounds:
        """The run's physical bounds, from its metadata as it stands (its ceilings are
        known after the first rows may have been written); read again only when a part
        they come from was replaced, not at each row's own split."""
        m = self.meta
        parts = (m.device, m.telemetry, m.ceilings, m.request)
        if self._bounds is None or any(a is not b for a, b in
                                       zip(self._bounds[0], parts, strict=True)):
            self._bounds = (parts, RunBounds.of(m))
        return self._bounds[1]

    def add(self, row: RunRow) -> RunRow:
        """Write one finished row; returns it as written.  Its speedup where its
        baseline row is already in (flush sets every row's), then the physics check, so
        no written line carries a value no device can produce (contract/physics.py;
        flush checks every row again, against every baseline row)."""
        row = replace(row, comparison=speedup_against(row, self.rows,
                                                      self.meta.baseline_provider))
        row = physics.apply_row(row, self.bounds(), self.rows)
        self.rows.append(row)
        # One write() per line and file: a kill mid-row leaves at most a partial last
        # line, which readers drop.  Files are reopened each time because flush()
        # replaces them (a handle kept open would append to the replaced file).
        with open(self.journal, "a", encoding="utf-8") as f:
            f.write(journal_line(row))
        if self._csv_rows != len(self.rows) - 1:  # no flush yet: written whole, once
            atomic_write_text(self.run_dir / RESULTS_CSV, csv_text(self.rows))
        else:
            with open(self.run_dir / RESULTS_CSV, "a", encoding="utf-8") as f:
                f.write(csv_text([row], header=False))
        self._csv_rows = len(self.rows)
        return row

    def frame(self) -> pd.DataFrame:
        """The rows as a frame of ALL_COLUMNS (the figures' and summary's input)."""
        return pd.DataFrame([flat(r, ALL_COLUMNS, samples=False) for r in self.rows],
                            columns=ALL_COLUMNS)

    def flush(self) -> None:
        """Rewrite results.csv and results.json whole (metadata included), atomically,
        each row's speedup against the run's baseline provider set first, then the
        physics check applied to every row (a speedup at unequal clocks withheld again)."""
        self.rows = physics.apply(with_speedups(self.rows, self.meta.baseline_provider),
                                  self.meta)
        write_results(self.run_dir, self.meta, self.rows)
        self._csv_rows = len(self.rows)

    def close(self) -> None:
        """Final flush; the journal goes once results.json holds every row."""
        self.flush()
        self.journal.unlink(missing_ok=True)
