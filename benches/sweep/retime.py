"""Re-time given rows in fresh processes: the child (`python -m benches.sweep.retime < spec.json`)
and its one client (Retimer), used by run_bench.py --compare and by `python -m roofline
compare|history report --retime`.

Why processes: on a shared machine a whole process can sit in a slow state (seen on the
2-core CI VM: an unchanged bf16 add 1.9x slower in every re-timed round inside the same
process, seconds apart), so rounds in the process that saw the slowdown confirm it,
while a new process gets a new draw.

The spec (RetimeSpec, JSON on stdin): device key, seed, fp8 accumulation mode, the
run's ceilings (so the timing method per case is the run's own), the cases as [kernel,
provider, dtype, shape, cache] (a case of four is cold), the Triton rows' configs by case
id (run as recorded, never tuned again) and the run's throttle settings (a GPU timing
that stays throttled is no evidence of slower code, so it is left out).
The answer (RoundAnswer.to_json, the last line of stdout): {case id: [samples_ms]} for
each case that ran ok, and "throttled": [case ids left out as throttled]; before it, a
ReadyLine as the child is set up ({"ready_s": seconds since the spec's "sent_at"}) and a
CaseLine as each case ends ({"case": id, "s": seconds, "samples": [...] | "throttled":
true | "status": ...}), so that a client bounded in time (Retimer's budget_s) keeps what
a child it stops timed.
A case id is "kernel|provider|dtype|shape" for a cold case (as before cache modes
existed) and "kernel|provider|dtype|shape|warm" for a warm one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from benches.sweep.throttle import ThrottleConfig
from contract.ceilings import Ceilings
from contract.meta_parts import CeilingsJson, NotRecorded, ThrottleSettings
from contract.record import RunRow
from contract.retimed import Retimed
from contract.run_meta import RunMeta
from contract.schema import DEFAULT_CACHE, RowKey, parse_row_key

if TYPE_CHECKING:
    from benches.sweep.cases import SweepContext

# The repository's root, the child's working directory: `python -m benches...` finds the
# project there where it is not installed (a GPU runner runs it from a checkout).
ROOT = Path(__file__).resolve().parents[2]

SEP = "|"

# Rounds of re-timing for rows that look slower than the baseline, interleaved across
# those rows and at least RETIME_SPACING_S apart, so that one slow spell of a shared
# machine (seconds long) cannot cover most of a row's rounds; the gate confirms a row
# only when every round's fast end is past the threshold.  Under a time bound a row gets
# RETIME_MIN_ROUNDS at least (the fewest that confirm or clear a row: the gate's
# CONFIRM_MIN_ROUNDS) or none.
RETIME_ROUNDS = 5
RETIME_MIN_ROUNDS = 3
RETIME_SPACING_S = 2.0

# A row's phases in its run that a re-timing child does not repeat: its kernels load
# from Triton's cache, its recorded configs run untuned.
_NOT_REPEATED = ("compile", "tune")


def case_id(key: Sequence[Any]) -> str:
    """The case's id in the spec and the answer: a cold case's without its mode."""
    k = parse_row_key(key)
    return SEP.join(k[:4] if k[4] == DEFAULT_CACHE else k)


class ForeignRun(ValueError):
    """Rows of another device than this machine's: they cannot be timed again here."""


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)


def row_costs(meta: RunMeta) -> dict[RowKey, float]:
    """Seconds each row of a run would take in a re-timing child, from the run's own
    split of each row (metadata.row_split_s, a serial sweep's): its phases but those a
    child does not repeat.  {} for a run without it."""
    out: dict[RowKey, float] = {}
    for item in meta.time.row_split_s:
        try:
            key = parse_row_key(item["row"])
            out[key] = float(sum(v for k, v in item["s"].items() if k not in _NOT_REPEATED))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return out


@dataclass(frozen=True)
class RetimeSettings:
    """The run's own settings a child times with: its seed, fp8 accumulation mode,
    ceilings (so that each case's timing method is the run's) and throttle settings
    (None: the run recorded none, and the child takes ThrottleConfig's defaults)."""

    seed: int = 0
    fp8_accum: str = "fast"
    ceilings: Ceilings = field(default_factory=lambda: Ceilings(None, None))
    throttle: ThrottleConfig | None = None


class SpecJson(TypedDict, total=False):
    """The spec as it goes to the child's stdin (keys in this order)."""

    seed: int
    fp8_accum: str
    ceilings: CeilingsJson
    throttle: ThrottleSettings | NotRecorded
    device: str
    cases: list[list[str]]
    sent_at: float
    configs: dict[str, str]


@dataclass(frozen=True)
class RetimeSpec:
    """What one child is asked (the module's docstring): the device, the run's settings,
    the cases in the order to time them, when the spec was sent (None: not said) and
    the Triton rows' recorded configs by case id."""

    device: str
    settings: RetimeSettings
    cases: tuple[RowKey, ...]
    sent_at: float | None = None
    configs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> SpecJson:
        s = self.settings
        doc: SpecJson = {"seed": s.seed, "fp8_accum": s.fp8_accum,
                         "ceilings": s.ceilings.to_json(),
                         "throttle": s.throttle.as_dict() if s.throttle else {},
                         "device": self.device, "cases": [list(k) for k in self.cases]}
        if self.sent_at is not None:
            doc["sent_at"] = self.sent_at
        doc["configs"] = self.configs
        return doc

    @classmethod
    def from_json(cls, doc: SpecJson) -> RetimeSpec:
        """The spec a child read (seed and fp8_accum required; the rest may be absent)."""
        throttle = doc.get("throttle")
        sent_at = doc.get("sent_at")
        return cls(
            device=doc["device"],
            settings=RetimeSettings(
                seed=int(doc["seed"]), fp8_accum=doc["fp8_accum"],
                ceilings=Ceilings.from_json(doc.get("ceilings")),
                throttle=ThrottleConfig(**throttle) if throttle else None),
            cases=tuple(parse_row_key(k) for k in doc.get("cases") or ()),
            sent_at=sent_at if isinstance(sent_at, int | float) else None,
            configs=dict(doc.get("configs") or {}))


class ReadyLine(TypedDict):
    ready_s: float  # the child's line once it is set up: seconds since the spec's sent_at


class CaseLine(TypedDict, total=False):
    """The child's line as a case ends: its id and seconds, then its samples, or
    throttled (true), or its status."""

    case: str
    s: float
    samples: list[float]
    throttled: bool
    status: str


@dataclass
class Costs:
    """What a re-timing round costs: a child's seconds before its first row (measured
    by the first round that got that far) and each row's seconds in a child (measured,
    else the run's own split: row_costs)."""

    startup_s: float | None = None
    row_s: dict[RowKey, float] = field(default_factory=dict)

    def fit(self, keys: Sequence[RowKey], share_s: float
            ) -> tuple[list[RowKey], dict[RowKey, str]]:
        """The rows (worst first, as given) one round times within share_s: in order,
        each whose cost still fits what the child's start-up and the rows before it
        leave; a row of unknown cost is kept (the round's deadline stops it).  Returns
        (kept, {left out: why})."""
        used = self.startup_s or 0.0
        kept: list[RowKey] = []
        out: dict[RowKey, str] = {}
        for k in keys:
            c = self.row_s.get(k)
            if c is None or used + c <= share_s:
                kept.append(k)
                used += c or 0.0
            elif self.startup_s is not None and self.startup_s >= share_s:
                out[k] = (f"a round's share of the budget ({share_s:.1f} s) is under a "
                          f"re-timing child's start-up ({self.startup_s:.1f} s)")
            else:
                out[k] = (f"about {c:.1f} s a round, {max(0.0, share_s - used):.1f} s of "
                          f"the round's {share_s:.1f} s were left after the child's "
                          f"start-up and {len(kept)} worse rows")
        return kept, out


@dataclass
class RoundAnswer:
    """One child's answer: {case id: samples} for the cases that ran ok, the throttled
    ones left out, the cases it reached (timed or not), its start-up seconds and each
    case's seconds (where it said them), and whether its deadline stopped it."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    throttled: list[str] = field(default_factory=list)
    reached: set[str] = field(default_factory=set)
    ready_s: float | None = None
    case_s: dict[str, float] = field(default_factory=dict)
    cut: bool = False

    def to_json(self) -> dict[str, list[float] | list[str]]:
        """The whole answer, the child's last line: {case id: samples} and, where any
        were left out, "throttled": [case ids]."""
        doc: dict[str, list[float] | list[str]] = dict(self.samples)
        if self.throttled:
            doc["throttled"] = self.throttled
        return doc


def parse_answer(stdout: str, cut: bool) -> RoundAnswer:
    """A child's stdout: its streamed lines ({"ready_s"}, then {"case", "s", "samples" |
    "throttled" | "status"} per case) and, from a child that ran to its end, the whole
    answer as its last line ({case id: samples, "throttled": [...]})."""
    a = RoundAnswer(cut=cut)
    for line in stdout.splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill, or not ours
        if not isinstance(doc, dict):
            continue
        if "ready_s" in doc:
            a.ready_s = float(doc["ready_s"])
        elif "case" in doc:
            cid = str(doc["case"])
            a.reached.add(cid)
            if isinstance(doc.get("s"), int | float):
                a.case_s[cid] = float(doc["s"])
            if doc.get("throttled"):
                a.throttled.append(cid)
            elif doc.get("samples"):
                a.samples[cid] = list(doc["samples"])
        elif not cut:  # the whole answer
            a.throttled = list(doc.pop("throttled", None) or a.throttled)
            a.samples.update({k: v for k, v in doc.items() if isinstance(v, list)})
            a.reached.update(a.samples, a.throttled)
    return a


class Retimer:
    """Fresh samples of a run's rows: up to RETIME_ROUNDS child processes at least
    RETIME_SPACING_S apart, each timing the asked rows in turn with the run's own
    `settings` (seed, fp8_accum, ceilings, throttle) and each Triton row's recorded
    configs (a child that autotuned again could pick another).  Calling it with row
    keys, worst first, gives a Retimed: {key: [samples of each round that timed it]}.

    `budget_s` bounds the whole re-timing (None: every row, RETIME_ROUNDS rounds): the
    first round may take a RETIME_MIN_ROUNDS-th of it and times the rows in the order
    given until its deadline (the child is stopped there, what it timed kept); the
    rows it reached get the later rounds, as many as the rest of the budget fits (up to
    RETIME_ROUNDS), each round the rows, worst first, that its share fits by their
    measured cost.  The rows left out, and why, are in the answer's left_out.  A SIGINT
    stops the re-timing with what it has (`interrupted`)."""

    def __init__(self, device: str, settings: RetimeSettings, rows: Sequence[RunRow],
                 say: Callable[[str], None] = _warn, budget_s: float | None = None,
                 costs: Mapping[RowKey, float] | None = None) -> None:
        self.device = device
        self.settings = settings
        self.configs = {case_id(r.key): r.build.config for r in rows if r.build.config}
        self.say = say
        self.budget_s = budget_s
        self.costs = Costs(row_s=dict(costs or {}))

    def __call__(self, keys: Sequence[RowKey]) -> Retimed:
        todo = [parse_row_key(k) for k in keys]
        got = Retimed({k: [] for k in todo}, budget_s=self.budget_s)
        if not todo:
            return got
        try:
            self._rounds(todo, got)
        except KeyboardInterrupt:  # the step's cap: keep what was timed, say what was not
            got.interrupted = True
            for k in todo:
                if not got.rounds[k]:
                    got.left_out.setdefault(k, "the re-timing was interrupted (SIGINT) "
                                               "before it")
        return got

    def _rounds(self, todo: list[RowKey], got: Retimed) -> None:
        end = None if self.budget_s is None else time.monotonic() + self.budget_s
        active, rounds, started, r = todo, RETIME_ROUNDS, -math.inf, 0
        while r < rounds and active:
            time.sleep(max(0.0, started + RETIME_SPACING_S - time.monotonic()))
            started = time.monotonic()
            share = None
            if end is not None:
                share = (end - started) / (RETIME_MIN_ROUNDS if r == 0 else rounds - r)
                active, dropped = self.costs.fit(active, share)
                for k, why in dropped.items():
                    got.left_out.setdefault(k, self._why(got, k, why))
                if not active:
                    break
            answer = self._round(r, active, share)
            if answer is None:
                r += 1
                continue
            self._learn(answer, active)
            for k in active:
                if case_id(k) in answer.samples:
                    got.rounds[k].append(answer.samples[case_id(k)])
            if r == 0 and share is not None and end is not None:
                active, again = self._first_reached(answer, active, share, got)
                if again:  # the worst row alone outlasted the share: the others again
                    continue
                rounds = self._rounds_that_fit(active, end - time.monotonic())
            r += 1

    def _why(self, got: Retimed, key: RowKey, why: str) -> str:
        """Why a row was left out (of every round, or of the later ones)."""
        n = len(got.rounds[key])
        head = f"re-timed in {n} round{'s' if n > 1 else ''} only: " if n else ""
        return f"{head}{why} (re-timing bound {self.budget_s:g} s)"

    def _first_reached(self, answer: RoundAnswer, active: list[RowKey], share: float,
                       got: Retimed) -> tuple[list[RowKey], bool]:
        """The first round's rows that its child reached (it times them in order),
        and whether to run the first round again: when its deadline stopped it inside
        the first row, that row is left out and the others get the first round anew.
        Otherwise the rows it did not reach are left out."""
        if not answer.cut:
            return active, False
        reached = [k for k in active if case_id(k) in answer.reached]
        if answer.ready_s is None:
            self.costs.startup_s = max(self.costs.startup_s or 0.0, share)
            why = f"the first round's {share:.1f} s share of the budget ended before its " \
                  "child was ready"
        elif not reached:
            slow, over = active[0], share - answer.ready_s
            self.costs.row_s[slow] = max(self.costs.row_s.get(slow, 0.0), over)
            got.left_out.setdefault(slow, self._why(got, slow, (
                f"one round of it takes over {over:.1f} s, more than the first round's "
                f"{share:.1f} s share of the budget left after the child's start-up")))
            return active[1:], len(active) > 1
        else:
            why = f"the first round's {share:.1f} s share of the budget ended before this row"
        for k in active:
            if k not in reached:
                got.left_out.setdefault(k, self._why(got, k, why))
        return reached, False

    def _rounds_that_fit(self, active: list[RowKey], left_s: float) -> int:
        """Rounds in all (the first included) that the rest of the budget gives the
        first round's rows: RETIME_ROUNDS where they fit, else fewer, never under
        RETIME_MIN_ROUNDS (each later round then times the rows its share fits)."""
        one = (self.costs.startup_s or 0.0) + sum(self.costs.row_s.get(k, 0.0)
                                                   for k in active)
        more = RETIME_ROUNDS - 1 if one <= 0 else int(left_s // one)
        return max(RETIME_MIN_ROUNDS, min(RETIME_ROUNDS, 1 + more))

    def _learn(self, answer: RoundAnswer, active: list[RowKey]) -> None:
        if answer.ready_s is not None:
            self.costs.startup_s = max(self.costs.startup_s or 0.0, answer.ready_s)
        for k in active:
            if case_id(k) in answer.case_s:
                self.costs.row_s[k] = answer.case_s[case_id(k)]

    def _round(self, r: int, keys: list[RowKey], share: float | None) -> RoundAnswer | None:
        """One child timing `keys` in turn, stopped at `share` seconds; None when it
        failed (said)."""
        spec = json.dumps(RetimeSpec(
            self.device, self.settings, tuple(keys), sent_at=time.time(),
            configs={case_id(k): self.configs[case_id(k)] for k in keys
                     if case_id(k) in self.configs}).to_json())
        try:
            proc = subprocess.run([sys.executable, "-m", "benches.sweep.retime"], input=spec,
                                  capture_output=True, text=True, cwd=ROOT,
                                  timeout=share)
        except subprocess.TimeoutExpired as e:  # killed at its deadline: what it said
            out = e.stdout or b""
            return parse_answer(out.decode(errors="replace") if isinstance(out, bytes)
                                else out, cut=True)
        if proc.returncode != 0 or not proc.stdout.strip():
            why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            self.say(f"re-timing round {r + 1} failed: {why}")
            return None
        answer = parse_answer(proc.stdout, cut=False)
        if answer.throttled:
            self.say(f"re-timing round {r + 1}: the GPU throttled in "
                     f"{len(answer.throttled)} rows' timings (left out of the round)")
        return answer


def retimer_of_run(device: str, meta: RunMeta, rows: Sequence[RunRow],
                   budget_s: float | None = None) -> Retimer:
    """The Retimer of a saved run's rows, with the run's own settings from its metadata
    and its rows' costs (row_costs); refuses (ForeignRun) a run of another device than
    this machine's."""
    from contract.devices import detect
    from contract.request import RunRequest

    here = detect().key
    if device != here:
        raise ForeignRun(f"--retime times rows on this machine, a '{here}'; the rows are "
                         f"'{device}'")
    seed = RunRequest.from_json(meta.request).selection.seed if meta.request else 0
    throttle = meta.settings.throttle_settings
    settings = RetimeSettings(seed, meta.settings.fp8_accum or "fast",
                              Ceilings.from_json(meta.ceilings),
                              ThrottleConfig(**throttle) if throttle else None)
    return Retimer(device, settings, rows, budget_s=budget_s, costs=row_costs(meta))


def retime(spec: RetimeSpec, emit: Callable[[ReadyLine | CaseLine], None] | None = None
           ) -> RoundAnswer:
    """Time the spec's cases in turn; the answer (RoundAnswer.to_json: {case id: samples,
    "throttled": [...]}).  `emit` is given a ReadyLine once the child is set up (where
    the spec says when it was sent) and a CaseLine as each case ends, so that a client
    that stops the child at a deadline keeps what it timed and learns the costs."""
    from benches.sweep.cases import Case
    from benches.sweep.runner import run_case
    from benches.sweep.timers import sweep_cache
    from contract.schema import parse_shape
    from kernels import REGISTRY

    cfg = _child_context(spec)
    out = RoundAnswer()
    inputs = sweep_cache(cfg)  # inputs shared as in the sweep, copies' memory reused
    say = emit or (lambda line: None)
    if spec.sent_at is not None:
        say({"ready_s": round(time.time() - spec.sent_at, 3)})
    for key in spec.cases:
        kernel, provider, dtype, shape, cache = key
        case = Case(REGISTRY[kernel], provider, dtype, parse_shape(shape), cache)
        t0 = time.perf_counter()
        row = run_case(case, cfg, inputs)
        cid = case_id(key)
        said: CaseLine = {"case": cid, "s": round(time.perf_counter() - t0, 3)}
        out.reached.add(cid)
        if row.clocks.throttled is True:
            out.throttled.append(cid)
            said["throttled"] = True
        elif row.ok and row.timing.samples_ms:
            out.samples[cid] = said["samples"] = list(row.timing.samples_ms)
        else:
            said["status"] = row.status
        say(said)
    return out


def _child_context(spec: RetimeSpec) -> SweepContext:
    """The child's sweep context: the run's seed, fp8 mode, ceilings, throttle settings
    and recorded configs on this machine's device."""
    from benches.sweep.cases import SweepContext
    from benches.timing.plan import TimingConfig
    from contract.devices import resolve_device
    from contract.request import Measurement, RunRequest, Selection
    from kernels.spec import Target, interpreter_enabled, set_fp8_accum

    s = spec.settings
    set_fp8_accum(s.fp8_accum)
    dev = resolve_device(spec.device)
    model, present = dev.model, dev.present
    # Re-timing confirms times: no energy window (its rows are kept for their samples
    # only); each case is timed in the cache mode its key names.
    request = RunRequest(Selection(seed=s.seed), measurement=Measurement(energy="off"))
    return SweepContext(request, model, present,
                        Target(present.kind, present.capability, interpreter_enabled(),
                               present.name),
                        ceilings=s.ceilings, timing=TimingConfig(),
                        throttle=s.throttle or ThrottleConfig(),
                        configs={parse_row_key(k.split(SEP)): v
                                 for k, v in spec.configs.items()})


def main() -> int:
    """The child: the spec on stdin; each case's line as it ends (flushed: a client that
    stops the child at its deadline reads them), then the whole answer as the last."""
    def emit(line: ReadyLine | CaseLine) -> None:
        print(json.dumps(line), flush=True)

    spec = RetimeSpec.from_json(json.loads(sys.stdin.read()))
    print(json.dumps(retime(spec, emit).to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
