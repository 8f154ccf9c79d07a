"""How much to time and how: the timing settings (TimingConfig), the timer names written
to the `timer` column, the method of a case (CUDA graphs or flushed do_bench, from its
roofline bound), the sample counts within a row's budget, the rotation that keeps a case's
calls cold (copies past twice the L2 or the CPU's last-level cache), and the size of that
cache.  Plain arithmetic on numbers: nothing here launches a kernel (benches/timing/clock.py
measures, and re-exports these names).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# Timer names written to the `timer` column.  The comparison treats a change of timer
# between two runs as a changed row, so these strings are part of the result contract.
TIMER_FLUSHED = "do_bench"
TIMER_GRAPH = "cudagraph"
TIMER_GRAPH_FALLBACK = "do_bench (cudagraph not possible)"
TIMER_CPU = "timeit blocks"
# Cold CPU rows whose footprint fits in twice the last-level cache: each block's calls
# cycle over copies of inputs and output (Rotation), so every call starts cold.
TIMER_CPU_ROTATED = "timeit blocks, rotated copies"
# Warm GPU rows of the flushed class: CUDA events around back-to-back calls on the same
# buffers, nothing flushed (time_warm); and where a warm graph could not be captured.
TIMER_WARM = "back-to-back events"
TIMER_WARM_FALLBACK = "back-to-back events (cudagraph not possible)"


@dataclass(frozen=True)
class TimingConfig:
    """How rows are sampled.  docs/measurement.md ("The timing settings, and why") gives
    the measurements behind each value."""

    warmup_ms: float = 25.0  # do_bench's warm-up
    rep_ms: float = 100.0  # a GPU row's measuring time (do_bench's rep)
    # Samples of a CPU row at least; a GPU row samples for rep_ms (a graph row for
    # graph_rep_ms), at least gate_min_samples.
    min_samples: int = 25
    # Cases whose roofline bound is under this are replayed in CUDA graphs, where launch
    # overhead no longer dominates; the rest are timed with the L2 flushed before each call.
    cudagraph_below_ms: float = 0.02
    # Calls per captured graph at least, so the graph's own launch is < 1% of a replay.
    graph_min_calls: int = 200
    # A graph row samples replays for graph_rep_ms (do_bench_cudagraph's rep); a rotation
    # longer than graph_replay_ms is split over several graphs replayed in turn
    # (graph_split), so a sample lasts about that long.
    graph_rep_ms: float = 20.0
    graph_replay_ms: float = 2.0
    max_samples: int = 1000  # of one GPU timing: more than the gate can use
    # Bounds of one capture (graph_plan): past them a graph holds one round over the
    # copies, and past that the row is timed with L2 flushes, its reason saying why.
    max_graph_nodes: int = 100_000
    max_capture_s: float = 10.0
    # Graph nodes per call assumed where they cannot be counted: above the most one eager
    # torch call of this suite launches (14).
    assumed_launches: int = 16
    # CPU: a sample is a block of calls of at least cpu_block_s (the timer's ~1 us per
    # block stays under 0.1% of it); a row's samples last cpu_min_run_time_s at least.
    cpu_block_s: float = 1e-3
    cpu_min_run_time_s: float = 0.05
    # Every row's timing has a budget (as nvbench's timeout): it samples until
    # min_samples or row_budget_s, never under gate_min_samples, the fewest with which the
    # gate's rank test can call a change in a 1,000-row comparison (tests/test_budget.py);
    # a row whose gate_min_samples cannot fit is skipped with its call time in the reason.
    row_budget_s: float = 5.0
    gate_min_samples: int = 10
    # CPU samples come in cpu_rounds rounds on fresh buffers, interleaved over chunks of
    # about cpu_chunk_s seconds of cases (runner.iterate), so that a row's samples span
    # several of a shared machine's slow and fast spells, not one.
    cpu_rounds: int = 5
    cpu_chunk_s: float = 3.0
    # The stopping rule (benches/timing/stopping.py): a row stops sampling once the
    # distribution-free ci_level interval of its median is narrower than ci_rel_width of
    # the median, after gate_min_samples at least and within its time cap (rep_ms,
    # graph_rep_ms; a CPU row: after cpu_min_rounds of its cpu_rounds).  0 turns it off.
    ci_rel_width: float = 0.005
    ci_level: float = 0.95
    cpu_min_rounds: int = 3
    # GPU providers of one case are timed in rounds of batches of about interleave_ms
    # each (benches/timing/interleave.py), so that they share the GPU's clocks and power.
    interleave_ms: float = 10.0
    # A compute-bound case first warms up to a sustained clock: until the SM clock's
    # median has changed by under sustain_drop over each of the last sustain_still
    # rounds, and has either come down or held for sustain_min_ms; sustain_cap_ms at most
    # (0 turns the warm-up off).  docs/measurement.md ("Providers at equal clocks").
    sustain_min_ms: float = 100.0
    sustain_cap_ms: float = 500.0
    sustain_drop: float = 0.01
    sustain_still: int = 2
    # Set by cpu_round_config: the rounds of the row a one-round config belongs to (the
    # budget's messages speak of the whole row).
    cpu_rounds_of_row: int = 1

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def bound_ms(flops: float, nbytes: float, peak_tflops: float | None,
             peak_gbps: float | None) -> float | None:
    """The roofline lower bound of a case's time in ms: max(flops / peak, bytes / bw).
    None when neither ceiling is known."""
    parts = []
    if peak_tflops:
        parts.append(flops / (peak_tflops * 1e12) * 1e3)
    if peak_gbps:
        parts.append(nbytes / (peak_gbps * 1e9) * 1e3)
    return max(parts) if parts else None


def choose_method(flops: float, nbytes: float, peak_tflops: float | None,
                  peak_gbps: float | None, cfg: TimingConfig) -> str:
    """TIMER_GRAPH or TIMER_FLUSHED for a (kernel, dtype, shape) on this device.

    Decided from the analytic bound, not from a measurement: the same for both providers
    of a case and for every run on the same device model.  A case that cannot finish in
    cfg.cudagraph_below_ms even at the roof is long enough for flushed do_bench."""
    b = bound_ms(flops, nbytes, peak_tflops, peak_gbps)
    if b is None:
        return TIMER_FLUSHED
    return TIMER_GRAPH if b < cfg.cudagraph_below_ms else TIMER_FLUSHED


class OverBudget(Exception):
    """A row whose minimum samples cannot fit in its time budget (the message says why)."""


@dataclass(frozen=True)
class CpuPlan:
    """How one round of a CPU row is sampled: `samples` blocks of `number` calls each
    (number None: sized to cfg.cpu_block_s when the round starts); `note` says when the
    budget cut the samples."""

    samples: int
    number: int | None = None
    note: str = ""


def plan_cpu(call_s: float, cfg: TimingConfig, budget_s: float | None = None) -> CpuPlan:
    """The samples of one CPU round (cfg is a round's config: cpu_round_config) from the
    time of one call, `call_s` (the checked call: on a CPU the call is synchronous).

    Wanted: cfg.min_samples, more while they last less than cfg.cpu_min_run_time_s
    together; at most what fits in the budget (cfg.row_budget_s, or the run's smaller
    share `budget_s`); never fewer than cfg.gate_min_samples.  Raises OverBudget when
    even those would take longer than cfg.row_budget_s."""
    floor = min(cfg.gate_min_samples, cfg.min_samples)
    per_sample = max(call_s, cfg.cpu_block_s)
    if call_s * floor > cfg.row_budget_s:
        rounds = cfg.cpu_rounds_of_row
        raise OverBudget(
            f"over the row budget: one call takes {call_s:.3g} s here, so the "
            f"{floor * rounds} samples the regression gate needs would take "
            f"{call_s * floor * rounds:.3g} s, past the row budget of "
            f"{cfg.row_budget_s * rounds:.3g} s (--row-budget)")
    want = max(cfg.min_samples, math.ceil(cfg.cpu_min_run_time_s / per_sample))
    budget = cfg.row_budget_s if budget_s is None else max(0.0, min(budget_s,
                                                                    cfg.row_budget_s))
    fit = int(budget / per_sample)
    samples = max(floor, min(want, fit))
    number = 1 if call_s >= cfg.cpu_block_s else None
    note = ""
    if samples < want:
        rounds = cfg.cpu_rounds_of_row
        note = (f"row budget applied: {samples * rounds} of {want * rounds} "
                f"samples (one call {call_s:.3g} s, budget "
                f"{budget * rounds:.3g} s)")
    return CpuPlan(samples, number, note)


def plan_best_of_cpu(call_s: float, cfg: TimingConfig) -> CpuPlan:
    """The samples of a CPU timing whose estimator is its fastest sample (a measured
    ceiling), from the time of one call: as plan_cpu wants them (cfg.min_samples, more
    while they last less than cfg.cpu_min_run_time_s), as many as fit in
    cfg.row_budget_s, and never fewer than one.  A best-of feeds no rank test, so it
    has no gate floor to keep: a call too slow for the budget (a 256 MiB copy on a
    loaded 2-core host: 3.8 s a call) is timed fewer times, never refused (plan_cpu
    raises OverBudget there); the note says when the budget cut the samples."""
    per_sample = max(call_s, cfg.cpu_block_s)
    want = max(cfg.min_samples, math.ceil(cfg.cpu_min_run_time_s / per_sample))
    samples = max(1, min(want, int(cfg.row_budget_s / per_sample)))
    note = "" if samples >= want else (
        f"budget applied: {samples} of {want} samples (one call {call_s:.3g} s, budget "
        f"{cfg.row_budget_s:.3g} s)")
    return CpuPlan(samples, 1 if call_s >= cfg.cpu_block_s else None, note)


def cpu_round_config(cfg: TimingConfig) -> TimingConfig:
    """The budget of one of cfg.cpu_rounds rounds: its share of the samples, run time and
    row budget (so that the rounds together give what the row asks).  A config of one
    round is its own."""
    rounds = cfg.cpu_rounds
    if rounds <= 1:
        return cfg
    return replace(cfg, cpu_rounds=1, cpu_rounds_of_row=rounds,
                   min_samples=math.ceil(cfg.min_samples / rounds),
                   gate_min_samples=math.ceil(cfg.gate_min_samples / rounds),
                   cpu_min_run_time_s=cfg.cpu_min_run_time_s / rounds,
                   row_budget_s=cfg.row_budget_s / rounds)


def sample_count(per_sample_ms: float, cfg: TimingConfig) -> int:
    """Samples of a GPU timing whose samples each take `per_sample_ms` of device time
    (flush and padding included): as do_bench, cfg.rep_ms of them, at least
    cfg.gate_min_samples (or cfg.min_samples when lower) and at most cfg.max_samples,
    within cfg.row_budget_s unless that leaves fewer than that floor."""
    per = max(per_sample_ms, 1e-4)
    want = max(min(cfg.gate_min_samples, cfg.min_samples), int(cfg.rep_ms / per))
    fit = int(cfg.row_budget_s * 1e3 / per)
    return max(min(cfg.gate_min_samples, cfg.min_samples), min(want, fit, cfg.max_samples))


def graph_split(total: int, call_ms: float | None, cfg: TimingConfig) -> list[int]:
    """The calls of each graph that a rotation's `total` calls are captured in, in
    order: one graph when they last at most cfg.graph_replay_ms together (`call_ms`: the
    time of one call, from a one-call graph's replay, launch included, so an upper bound;
    None: unknown, one graph), else as few graphs of equal size (within one call) as
    keep each replay under it."""
    if not call_ms or call_ms <= 0 or total * call_ms <= cfg.graph_replay_ms:
        return [total]
    per = max(1, int(cfg.graph_replay_ms / call_ms))
    graphs = -(-total // per)
    base, extra = divmod(total, graphs)
    return [base + (i < extra) for i in range(graphs)]


def graph_sample_count(replay_ms: float, cfg: TimingConfig) -> int:
    """Replays a CUDA-graph row times, each `replay_ms` long: cfg.graph_rep_ms of them,
    at least cfg.gate_min_samples (or cfg.min_samples when lower) and at most
    cfg.max_samples, within cfg.row_budget_s unless that leaves fewer than the floor."""
    per = max(replay_ms, 1e-4)
    want = int(cfg.graph_rep_ms / per)
    fit = int(cfg.row_budget_s * 1e3 / per)
    return max(min(cfg.gate_min_samples, cfg.min_samples), min(want, fit, cfg.max_samples))


def graph_plan(copies: int, launches: int, host_us: float | None,
               cfg: TimingConfig, counted: bool = True) -> tuple[int | None, str]:
    """(calls per captured graph, note): graph_calls(copies) when the capture stays under
    cfg.max_graph_nodes nodes (calls x launches per call) and cfg.max_capture_s of
    capture (about twice the host dispatch time per captured call); else one round over
    the copies; None when even that is past a bound (time with L2 flushes instead).
    The note says which bound applied (and when the launches per call were assumed,
    `counted` False, rather than counted)."""
    per_call = f"{launches} launches a call" + ("" if counted else ", assumed: not counted")

    def too_big(calls: int) -> str | None:
        nodes = calls * launches
        if nodes > cfg.max_graph_nodes:
            return f"{calls:,} calls x {per_call} = {nodes:,} graph nodes > " \
                   f"{cfg.max_graph_nodes:,}"
        if host_us and calls * 2 * host_us * 1e-6 > cfg.max_capture_s:
            return (f"~{calls * 2 * host_us * 1e-6:.0f} s of capture for {calls:,} calls "
                    f"> {cfg.max_capture_s:g} s")
        return None

    full = graph_calls(copies, cfg)
    why = too_big(full)
    if why is None:
        return full, ""
    why_round = too_big(copies)
    if why_round is None:
        return copies, f"graph of one round over the {copies} copies instead of {full} " \
                       f"calls ({why})"
    return None, f"CUDA graph too large even for one round ({why_round})"


def rotation_copies(footprint_bytes: int, l2_bytes: int | None) -> int | None:
    """How many copies of a case (inputs + output, `footprint_bytes` each) make a
    rotation that really exceeds twice the L2: the smallest N with N x footprint > 2 L2.
    None when the L2 size is unknown (then no rotation can be shown to be cold)."""
    if not l2_bytes or footprint_bytes <= 0:
        return None
    return 2 * l2_bytes // footprint_bytes + 1


def graph_calls(copies: int, cfg: TimingConfig) -> int:
    """Calls captured in one graph: whole rounds over the copies, at least
    cfg.graph_min_calls.  Depends on the copy count only, never on the kernel's speed,
    so both providers of a case replay the same number of calls."""
    return copies * max(1, math.ceil(cfg.graph_min_calls / copies))


# Where sysfs says nothing about the CPU's caches: larger than most desktop and laptop
# last-level caches, so a rotation sized by it errs on the cold side.
FALLBACK_LLC_BYTES = 32 * 2**20

_SIZE_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def _cache_size(text: str) -> int | None:
    """Bytes of a sysfs cache size ("32768K", "1M", "512"), or None."""
    text = text.strip().upper()
    unit = _SIZE_UNITS.get(text[-1:], 1)
    try:
        return int(float(text.rstrip("KMG")) * unit)
    except ValueError:
        return None


def read_llc(base: str | os.PathLike = "/sys/devices/system/cpu",
             cpus: set[int] | None = None) -> tuple[int | None, int]:
    """(bytes of one last-level cache, how many of them serve `cpus`): the level-3 cache
    of cpu0's sysfs description, else its largest data or unified cache; the copies are
    counted by their distinct shared_cpu_list over `cpus` (default: the CPUs this process
    may run on), since a multi-threaded op on a two-socket host or a chiplet CPU spreads
    over several.  (None, 0) when sysfs says nothing."""
    root = Path(base)
    found: list[tuple[bool, int, str]] = []  # (level 3, bytes, index folder name)
    for idx in sorted((root / "cpu0" / "cache").glob("index*")):
        try:
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = _cache_size((idx / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and size:
            found.append((level == 3, size, idx.name))
    if not found:
        return None, 0
    best = max(found)  # a level-3 cache first, then the largest
    if cpus is None:
        try:
            cpus = set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = {0}
    shared: set[str] = set()
    for cpu in cpus:
        try:
            shared.add((root / f"cpu{cpu}" / "cache" / best[2] / "shared_cpu_list")
                       .read_text().strip())
        except OSError:
            continue
    return best[1], max(1, len(shared))


def cpu_cache_bytes(base: str | os.PathLike = "/sys/devices/system/cpu") -> int:
    """The last-level cache a multi-threaded op on this host can use: one cache times the
    copies serving this process's CPUs (read_llc), else FALLBACK_LLC_BYTES."""
    size, copies = read_llc(base)
    return size * copies if size else FALLBACK_LLC_BYTES


def cpu_rotation(footprint_bytes: int, llc_bytes: int) -> tuple[int | None, str]:
    """(copies, note) for a cold CPU row whose inputs and output take `footprint_bytes`:
    rotation_copies against the last-level cache, so that the copies a block cycles over
    total more than twice it (and at most twice it plus one footprint: 4x the cache).  A
    footprint already past twice the cache is cold by size: no copies (None), and the
    note says so for the row's reason."""
    if footprint_bytes > 2 * llc_bytes:
        return None, (f"cold by size: inputs and output ({footprint_bytes / 2**20:.4g} MiB) "
                      f"exceed twice the last-level cache ({llc_bytes / 2**20:.4g} MiB), so "
                      "the calls run on the same buffers without rotation")
    return rotation_copies(footprint_bytes, llc_bytes), ""
