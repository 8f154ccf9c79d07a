"""`run_bench.py --estimate`: what a sweep will cost on a device, phase by phase (the
phases of benches/sweep/phases.py), from the plan the sweep runs, without running anything.

The walk takes the sweep's cases (build_cases) in order and, for each row, what the
sweep would do: its method (timers.timing_method), its samples (timing_plan's
sample_count, graph_sample_count, plan_cpu within the run budget, budget.RunBudget),
its rotation (rotation_copies, graph_calls, graph_split), its Triton compiles and
autotuning (its launches, built on meta tensors for the device's architecture).  Each
is priced with the row's call time and host dispatch from a reference run's rows
(`Reference`) and the device assumptions of benches/estimate/speeds.py.

Two methods: "now" (this code) and "before" (the sweep before the time split was
recorded: a fixed 25 replays of whole rotations of at least 100 ms of samples, a clone
per copy and provider, the whole rotation run eagerly before its capture, compiles in
turn, tuning never kept), each from a cold Triton cache and a warm one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from benches.estimate.rows import Reference, RowSpeed, row_speed
from benches.estimate.speeds import DeviceSpeed
from benches.sweep.budget import RowBudget, RunBudget
from benches.sweep.cases import Case, RunConfig
from benches.sweep.compile_wait import wait_s
from benches.sweep.kernel_time import calls_to_profile
from benches.sweep.row_setup import footprint_reason, shipped_configs_of
from benches.sweep.timers import rotation_of, timing_method
from benches.timing.clock import DISPATCH_BUDGET_S, estimate_needed, warmup_calls
from benches.timing.plan import (
    TIMER_FLUSHED,
    OverBudget,
    TimingConfig,
    cpu_round_config,
    graph_calls,
    graph_sample_count,
    graph_split,
    plan_cpu,
    sample_count,
)
from contract.phases import PHASES
from contract.schema import DEFAULT_CACHE
from kernels.shipped import retune_requested
from kernels.triton_utils import config_str

# (method, Triton's cache warm) of each column, in print order.
PLANS = (("before", False), ("before", True), ("now", False), ("now", True))
# A graph launch's own device time, added to a call's for the one-call probe's replay.
GRAPH_LAUNCH_MS = 0.003
# The method before: every GPU row took at least 25 samples (a graph row's each a
# replay of its whole rotation, for rep_ms), and measuring a row's host dispatch could
# take 0.25 s of calls.
BEFORE = TimingConfig(min_samples=25, graph_rep_ms=100.0, gate_min_samples=25,
                      graph_replay_ms=math.inf)
BEFORE_DISPATCH_BUDGET_S = 0.25


@dataclass
class Walk:
    """The priced plan of one method: seconds per phase, per case, and counts."""

    method: str
    warm: bool
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    per_case: list[float] = field(default_factory=list)  # cumulative wall after each
    compile_by_case: list[float] = field(default_factory=list)  # cumulative compile
    counts: dict[str, int] = field(default_factory=dict)
    compile_serial_s: float = 0.0

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] += seconds

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    @property
    def total(self) -> float:
        return sum(self.phases.values())


def _launches(case: Case, cfg: RunConfig) -> list[Any]:
    """A Triton row's launches on meta tensors for the device's architecture ([] for a
    torch row, or where they cannot be built)."""
    spec = case.spec
    if case.provider != "triton" or spec.triton_launches is None:
        return []
    try:
        ins = spec.make_inputs(case.shape, case.dtype, 0, "meta")
        return spec.launches(ins, spec.alloc_out(ins, case.dtype), cfg.present.sms or 0,
                             cfg.target)
    except Exception:
        return []


def _arg_dtypes(launch: Any) -> tuple[str, ...]:
    return tuple(str(getattr(a, "dtype", type(a).__name__)) for a in launch.args)


def _tune_key(launch: Any) -> tuple[Any, ...]:
    """What Triton's autotuner keys a tuning on: the tune_key arguments' values and the
    tensors' dtypes (with the candidates: one tuner per candidate list)."""
    names = getattr(launch.fn, "arg_names", None) or []
    named = dict(zip(names, launch.args, strict=False))
    values = tuple(named.get(k) for k in launch.tune_key) if named else \
        tuple(a for a in launch.args if isinstance(a, int))
    return (launch.name, launch.tuner, tuple(config_str(c) for c in launch.configs),
            values, _arg_dtypes(launch))


class Pricer:
    """Walks one method's plan over the cases, pricing each row (see the module)."""

    def __init__(self, cfg: RunConfig, ref: Reference, sp: DeviceSpeed, method: str,
                 warm: bool, ceilings_cached: bool,
                 sources: Mapping[tuple[str, ...], str] | None = None,
                 calls_before_profile_phase: bool = False) -> None:
        self.cfg, self.ref, self.sp, self.method, self.warm = cfg, ref, sp, method, warm
        # A past run priced as it ran: its rows' config_source says which launches ran a
        # shipped config (the file it had, not today's) and which were tuned.
        self.sources = sources
        # A past run made before the profiler pass had its phase (2026-11-28) also ran
        # the calls that change removed: a warm-up call after a long timed call, and an
        # unprofiled call before the profiler; priced as it ran.
        self.extra_calls = calls_before_profile_phase or method == "before"
        self.walk = Walk(method, warm)
        self.cases_seen: set[tuple[str, ...]] = set()
        self.compiled: set[tuple[Any, ...]] = set()
        self.tuned: set[tuple[Any, ...]] = set()
        self.timing = cfg.timing if method == "now" else dataclasses.replace(
            cfg.timing, min_samples=BEFORE.min_samples, graph_rep_ms=BEFORE.graph_rep_ms,
            gate_min_samples=BEFORE.gate_min_samples, graph_replay_ms=BEFORE.graph_replay_ms)
        self.dispatch_ms = 1e3 * (DISPATCH_BUDGET_S if method == "now"
                                  else BEFORE_DISPATCH_BUDGET_S)
        self.budget = RunBudget(cfg.timing.row_budget_s, cfg.run_budget_s, started=0.0)
        # the reference runs' own measured ceilings time where they recorded one
        self.ceilings_s = 0.0 if ceilings_cached else (ref.ceilings_s or sp.ceilings_s)

    def run(self, cases: list[Case]) -> Walk:
        w = self.walk
        w.add("other", self.sp.startup_s)
        w.add("ceilings", self.ceilings_s)
        self.sweep_start = w.total  # the run budget's clock starts with the sweep
        for i, case in enumerate(cases):
            self.row(case, len(cases) - i)
            w.add("other", self.sp.row_s)
            w.add("write", self.sp.write_row_s)
            w.per_case.append(w.total)
            w.compile_by_case.append(w.phases["compile"])
        if self.method == "now" and not self.warm and w.compile_serial_s:
            # compiled ahead by the workers, while the ceilings are measured and while the
            # sweep waits for them after (benches/sweep/compile_wait.py); the sweep loads
            # those from Triton's cache and compiles what they did not finish
            waited, ahead = self.compiled_ahead(w.compile_serial_s)
            loads = ahead / self.sp.compile_s * self.sp.cached_compile_s
            w.phases["compile"] += waited + loads - ahead
            w.per_case = [t + waited + loads - min(ahead, c)
                          for t, c in zip(w.per_case, w.compile_by_case, strict=True)]
        w.add("write", self.end_write_s(w.counts.get("rows", 0)))
        return w

    def end_write_s(self, rows: int) -> float:
        """The run's files after its last row: results, summary and figures, whose
        points and labels are the rows that ran (`rows`, skipped ones left out)."""
        return self.sp.write_end_s + self.sp.figure_row_s * rows

    def compiled_ahead(self, serial_s: float) -> tuple[float, float]:
        """(seconds the sweep waits after its ceilings, compile seconds done ahead) for
        `serial_s` seconds of compiles: the workers get their jobs when the ceilings'
        measuring starts and compile from when they are up (started
        compile_worker_spawn_s into the process, compile_worker_startup_s to import; a
        wait may include what is left of that), compile_workers at a time, until every
        job is done or the wait's deadline (GPUBENCH_COMPILE_WAIT_S; 0: stopped when the
        ceilings end)."""
        sp = self.sp
        up = sp.compile_worker_spawn_s + sp.compile_worker_startup_s
        window = min(self.ceilings_s, sp.startup_s + self.ceilings_s - up)
        waited = min(max(0.0, serial_s / sp.compile_workers - window), wait_s())
        return waited, min(serial_s, max(0.0, window + waited) * sp.compile_workers)

    # ---- one row -------------------------------------------------------------------

    def row(self, case: Case, cases_left: int) -> None:
        cfg, w = self.cfg, self.walk
        if case.spec.skip_reason(case.provider, case.dtype, cfg.target) \
                or footprint_reason(case, cfg) or (
                    case.provider == "triton" and cfg.target.kind != "cuda"):
            w.count("skipped")
            return
        granted = RowBudget()
        if cfg.target.kind != "cuda":
            if self.budget.skip_reason(case) is not None:
                w.count("skipped")
                return
            granted = self.budget.row(cases_left, now=w.total - self.sweep_start)
        rs = row_speed(case, cfg, self.ref, self.sp)
        call_s = rs.call_ms * 1e-3
        self.inputs(case)
        self.first_call(case, rs)
        self.check(case, rs)
        if cfg.check_only:
            w.count("rows")
            return
        if cfg.target.kind == "cuda":
            self.gpu_timing(case, rs)
            self.profile(rs)
        else:
            self.cpu_timing(case, call_s, granted)
        w.count("rows")

    def inputs(self, case: Case) -> None:
        """A case's inputs and float64 reference, once for all its rows."""
        key = (case.spec.name, case.dtype, case.shape_str)
        if key in self.cases_seen:
            return
        self.cases_seen.add(key)
        nbytes = case.spec.nbytes(case.shape, case.dtype)
        flops = case.spec.flops(case.shape, case.dtype)
        self.walk.add("inputs", 3 * nbytes / (self.sp.fill_gbps * 1e9)
                      + flops / (self.sp.fp64_tflops * 1e12))

    def first_call(self, case: Case, rs: RowSpeed) -> None:
        """The untimed first call: a Triton row's compiles and autotuning, else a call.
        Now, a launch with a shipped config for the device (kernels/shipped.py, as the
        runner finds it) runs that config untuned, unless GPUBENCH_RETUNE asks."""
        w, sp = self.walk, self.sp
        launches = _launches(case, self.cfg)
        one = rs.call_ms * 1e-3 + rs.host_us * 1e-6
        tuned = False
        shipped: list[Any] = [None] * len(launches)
        # as a past run ran (its rows' config_source): "cached", a tuning Triton found
        # on disk
        ran = (self.sources or {}).get(case.key, "").split("; ")
        on_disk = [False] * len(launches)
        if self.sources is not None and launches and len(ran) == len(launches):
            shipped = [ln.configs[0] if src == "shipped" else None
                       for ln, src in zip(launches, ran, strict=True)]
            on_disk = [src == "cached" for src in ran]
        elif self.method == "now" and launches and not retune_requested():
            shipped = shipped_configs_of(case, self.cfg, launches, None)[0]
        for ln, ship, found in zip(launches, shipped, on_disk, strict=True):
            if ship is not None:
                self.compile_one(ln, ship)
                continue
            tunes = len(ln.configs) > 1 and self.cfg.target.kind == "cuda"
            kept = tunes and self.method == "now" and (self.warm or found)
            key = _tune_key(ln)
            if tunes and key not in self.tuned:
                self.tuned.add(key)
                if not kept:
                    w.add("tune", len(ln.configs) * sp.tune_candidate_s)
                    w.count("tunings")
                tuned = True
            # compiled: every candidate when timed, the chosen one when the tuning is kept
            for c in ln.configs[:1] if kept or not tunes else ln.configs:
                self.compile_one(ln, c)
        if not tuned:
            w.add("check", one)

    def compile_one(self, ln: Any, config: Any) -> None:
        """One compile of a launch with a config, once per run (cached when warm)."""
        w, sp = self.walk, self.sp
        ck = (ln.name, _arg_dtypes(ln), config_str(config))
        if ck in self.compiled:
            return
        self.compiled.add(ck)
        w.count("compiles")
        if self.warm:
            w.add("compile", sp.cached_compile_s)
        else:
            w.add("compile", sp.compile_s)
            w.compile_serial_s += sp.compile_s

    def check(self, case: Case, rs: RowSpeed) -> None:
        nbytes = case.spec.nbytes(case.shape, case.dtype)
        self.walk.add("check", rs.call_ms * 1e-3 + rs.host_us * 1e-6
                      + 2 * nbytes / (self.sp.fill_gbps * 1e9) + self.sp.sync_s)

    # ---- timing on a GPU --------------------------------------------------------------

    def gpu_timing(self, case: Case, rs: RowSpeed) -> None:
        w, sp, t = self.walk, self.sp, self.timing
        call, host_ms = rs.call_ms, rs.host_us * 1e-3
        eager = max(call, host_ms)  # back-to-back calls: the slower of host and device
        once = call + host_ms
        # measure_dispatch: 100 calls, or what its budget allows in 3 bursts of 2 at
        # least; now, none where those 6 do not fit (the two single calls say)
        bursts = min(100 * eager, self.dispatch_ms + 6 * once)
        if self.method == "now" and self.dispatch_ms < 6 * once:
            bursts = 0.0
        w.add("timing", (2 * once + bursts) * 1e-3)
        copies = rotation_of(case, self.cfg) if case.cache == DEFAULT_CACHE else 1
        if timing_method(case, self.cfg) == TIMER_FLUSHED or rs.fallback or copies is None:
            if rs.fallback:  # its graph was tried first
                w.add("capture", 2 * once * 1e-3)
            self.flushed(case, call, rs)
            return
        w.count("graph rows")
        total = graph_calls(copies, t)
        cap = rs.host_us * sp.capture_per_host * 1e-6
        if self.method == "before":
            w.add("inputs", (copies - 1) * sp.clone_us * 1e-6)
            w.count("copies made", copies - 1)
            w.add("capture", copies * eager * 1e-3 + total * cap + 2 * total * call * 1e-3)
            replay = total * call
            reps = sample_count(replay, t)
        else:
            key = ("copies", case.spec.name, case.dtype, case.shape_str)
            if copies > 1 and key not in self.cases_seen:
                self.cases_seen.add(key)
                nbytes = case.spec.nbytes(case.shape, case.dtype)
                w.add("inputs", (copies - 1) * (nbytes / (sp.fill_gbps * 1e9)
                                                + sp.view_us * 1e-6))
                w.count("copies made", copies - 1)
            sizes = graph_split(total, call + GRAPH_LAUNCH_MS, t)
            w.add("capture", (copies - 1) * sp.view_us * 1e-6 + 2 * eager * 1e-3
                  + 5 * once * 1e-3 + total * cap + total * call * 1e-3)
            replay = sizes[0] * call
            reps = self.stopped(graph_sample_count(replay, t), rs)
        w.count("replays", reps)
        w.add("timing", (reps + 1) * replay * 1e-3)

    def profile(self, rs: RowSpeed) -> None:
        """The row's torch.profiler pass after its timing (kernel_time.row_columns): its
        calls (calls_to_profile; before, one unprofiled call more), the profiler's own
        cost, and CUPTI's start on the run's first."""
        once = rs.call_ms * 1e-3 + rs.host_us * 1e-6
        calls = calls_to_profile(once) + (1 if self.extra_calls else 0)
        first = self.sp.profile_first_s if not self.walk.counts.get("profiled") else 0.0
        self.walk.count("profiled")
        self.walk.add("profile", first + self.sp.profile_s + calls * once)

    def stopped(self, cap: int, rs: RowSpeed) -> int:
        """A GPU row's samples: now, as many as the stopping rule took on the reference
        row's recorded samples (RowSpeed.settles), within the time cap `cap`; before,
        the cap."""
        if self.method != "now" or rs.settles is None:
            return cap
        floor = min(self.timing.gate_min_samples, self.timing.min_samples)
        self.walk.count("rows stopped by the rule")
        return min(cap, max(floor, rs.settles))

    def flushed(self, case: Case, call: float, rs: RowSpeed) -> None:
        """do_bench's loop with the GPU kept busy after each flush (timing.time_flushed);
        the warm twin without the flush."""
        flush = self.sp.flush_ms if case.cache == DEFAULT_CACHE else 0.0
        per = call + flush + (2 * rs.host_us + 10) * 1e-3
        # the estimate: a call and 5 samples; now, none for a call long enough to be its
        # own (benches/timing/clock.py, estimate_needed), whose warm-up counts it
        once = call + rs.host_us * 1e-3
        estimate = call + 5 * per
        timed_once = None
        if self.method == "now" and not estimate_needed(once, self.timing):
            estimate = 0.0
            timed_once = None if self.extra_calls else once
        n = self.stopped(sample_count(per, self.timing), rs)
        warm_up = warmup_calls(per, self.timing, timed_once) * call
        self.walk.count("do_bench rows")
        self.walk.add("timing", (estimate + warm_up + n * per) * 1e-3)

    # ---- timing on a CPU --------------------------------------------------------------

    def cpu_timing(self, case: Case, call_s: float, granted: RowBudget) -> None:
        """The CPU timers (benches/sweep/timers.py) over the rounds, each sized by plan_cpu
        within the row's share of the run budget; rows past the row budget are skipped
        after the check."""
        w, t = self.walk, self.cfg.timing
        round_cfg = cpu_round_config(t)
        share = None if granted.share_s is None \
            else granted.share_s / round_cfg.cpu_rounds_of_row
        try:
            plan = plan_cpu(call_s, round_cfg, share)
        except OverBudget as e:
            self.budget.record(case, {"status": "skipped", "reason": str(e)},
                               RowBudget(call_s=call_s))
            w.count("skipped after the check")
            return
        self.budget.record(case, {"status": "ok"}, RowBudget(call_s=call_s))
        block = t.cpu_block_s
        if plan.number is None:  # blocks sized to cpu_block_s each round (block_number)
            per_sample = max(call_s, 1.2 * block)
            sizing = call_s + 2.2 * block
        else:
            per_sample, sizing = call_s, 0.0
        rounds = max(1, t.cpu_rounds)
        w.add("timing", rounds * (sizing + plan.samples * per_sample))
        nbytes = case.spec.nbytes(case.shape, case.dtype)
        w.add("inputs", (rounds - 1) * nbytes / (self.sp.fill_gbps * 1e9))


def estimate(cfg: RunConfig, cases: list[Case], ref: Reference, sp: DeviceSpeed,
             ceilings_cached: bool, plans: Iterable[tuple[str, bool]] = PLANS
             ) -> dict[tuple[str, bool], Walk]:
    """The priced walk of each (method, warm cache) plan over `cases`."""
    return {(m, warm): Pricer(cfg, ref, sp, m, warm, ceilings_cached).run(cases)
            for m, warm in plans}
