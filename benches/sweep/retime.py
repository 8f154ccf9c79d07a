"""Re-time given rows in fresh processes: the child (`python -m benches.sweep.retime < spec.json`)
and its one client (Retimer), used by run_bench.py --compare and by `python -m roofline
compare|history report --retime`.

Why processes: on a shared machine a whole process can sit in a slow state (seen on the
2-core CI VM: an unchanged bf16 add 1.9x slower in every re-timed round inside the same
process, seconds apart), so rounds in the process that saw the slowdown confirm it,
while a new process gets a new draw.

The spec (JSON on stdin): device key, seed, fp8 accumulation mode, the run's ceilings (so
the timing method per case is the run's own), the cases as [kernel, provider, dtype,
shape, cache] (a case of four is cold), the Triton rows' configs by case id (run as
recorded, never tuned again) and the run's throttle settings (a GPU timing that stays
throttled is no evidence of slower code, so it is left out).
The answer (last line of stdout): {case id: [samples_ms]} for each case that ran ok,
and "throttled": [case ids left out as throttled].  A case id is
"kernel|provider|dtype|shape" for a cold case (as before cache modes existed) and
"kernel|provider|dtype|shape|warm" for a warm one.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from contract.schema import DEFAULT_CACHE, RowKey, parse_row_key, row_key

# The repository's root, the child's working directory: `python -m benches...` finds the
# project there where it is not installed (a GPU runner runs it from a checkout).
ROOT = Path(__file__).resolve().parents[2]

SEP = "|"

# Rounds of re-timing for rows that look slower than the baseline, interleaved across
# those rows and at least RETIME_SPACING_S apart, so that one slow spell of a shared
# machine (seconds long) cannot cover most of a row's rounds; the gate confirms a row
# only when every round's fast end is past the threshold.
RETIME_ROUNDS = 5
RETIME_SPACING_S = 2.0


def case_id(key: Sequence[Any]) -> str:
    """The case's id in the spec and the answer: a cold case's without its mode."""
    k = parse_row_key(key)
    return SEP.join(k[:4] if k[4] == DEFAULT_CACHE else k)


class ForeignRun(ValueError):
    """Rows of another device than this machine's: they cannot be timed again here."""


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)


class Retimer:
    """Fresh samples of a run's rows: RETIME_ROUNDS child processes at least
    RETIME_SPACING_S apart, each timing every asked row in turn with the run's own
    `settings` (seed, fp8_accum, ceilings, throttle) and each Triton row's recorded
    configs (a child that autotuned again could pick another).  Calling it with row
    keys gives {key: [samples of each round that timed it]}."""

    def __init__(self, device: str, settings: dict[str, Any], rows: list[dict[str, Any]],
                 say: Callable[[str], None] = _warn) -> None:
        self.device = device
        self.settings = settings
        self.configs = {case_id(row_key(r)): r["config"] for r in rows if r.get("config")}
        self.say = say

    def __call__(self, keys: Sequence[RowKey]) -> dict[RowKey, list[list[float]]]:
        todo = [parse_row_key(k) for k in keys]
        got: dict[RowKey, list[list[float]]] = {k: [] for k in todo}
        if not todo:
            return got
        spec = json.dumps({**self.settings, "device": self.device,
                           "cases": [list(k) for k in todo],
                           "configs": {case_id(k): self.configs[case_id(k)] for k in todo
                                       if case_id(k) in self.configs}})
        started = 0.0
        for r in range(RETIME_ROUNDS):
            time.sleep(max(0.0, started + RETIME_SPACING_S - time.monotonic()))
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "benches.sweep.retime"], input=spec,
                                  capture_output=True, text=True,
                                  cwd=ROOT)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                self.say(f"re-timing round {r + 1} failed: {why}")
                continue
            answer = json.loads(lines[-1])
            if answer.get("throttled"):
                self.say(f"re-timing round {r + 1}: the GPU throttled in "
                         f"{len(answer['throttled'])} rows' timings (left out of the round)")
            for k in todo:
                if case_id(k) in answer:
                    got[k].append(answer[case_id(k)])
        return got


def retimer_of_run(device: str, meta: dict[str, Any], rows: list[dict[str, Any]]
                   ) -> Retimer:
    """The Retimer of a saved run's rows, with the run's own settings from its metadata;
    refuses (ForeignRun) a run of another device than this machine's."""
    from contract.devices import detect

    here = detect().key
    if device != here:
        raise ForeignRun(f"--retime times rows on this machine, a '{here}'; the rows are "
                         f"'{device}'")
    return Retimer(device, {"seed": meta.get("seed", 0),
                            "fp8_accum": meta.get("fp8_accum") or "fast",
                            "ceilings": meta.get("ceilings") or {},
                            "throttle": meta.get("throttle_settings") or {}}, rows)


def retime(spec: dict[str, Any]) -> dict[str, Any]:
    from benches.sweep.cases import Case, RunConfig
    from benches.sweep.gpu_monitor import ThrottleConfig
    from benches.sweep.runner import run_case
    from benches.sweep.timers import sweep_cache
    from benches.timing.plan import TimingConfig
    from contract.ceilings import Ceilings
    from contract.devices import resolve_device
    from contract.schema import parse_shape
    from kernels import REGISTRY
    from kernels.spec import Target, interpreter_enabled, set_fp8_accum

    set_fp8_accum(spec["fp8_accum"])
    dev = resolve_device(spec["device"])
    model, present = dev.model, dev.present
    c = spec.get("ceilings") or {}
    cfg = RunConfig(kernels=[], dtypes=[], providers=[], sizes="explicit",
                    explicit_shapes=None, seed=int(spec["seed"]), check_only=False,
                    model=model, present=present,
                    target=Target(present.kind, present.capability, interpreter_enabled(),
                                  present.name),
                    ceilings=Ceilings(c.get("datasheet"), c.get("measured")),
                    timing=TimingConfig(),
                    throttle=ThrottleConfig(**(spec.get("throttle") or {})),
                    configs={parse_row_key(k.split(SEP)): v
                             for k, v in (spec.get("configs") or {}).items()})
    out: dict[str, Any] = {}
    throttled: list[str] = []
    inputs = sweep_cache(cfg)  # inputs shared as in the sweep, copies' memory reused
    for key in spec["cases"]:
        kernel, provider, dtype, shape, cache = parse_row_key(key)
        case = Case(REGISTRY[kernel], provider, dtype, parse_shape(shape), cache)
        row = run_case(case, cfg, inputs)
        if row.get("throttled") is True:
            throttled.append(case_id(key))
        elif row["status"] == "ok" and row.get("samples_ms"):
            out[case_id(key)] = list(row["samples_ms"])
    if throttled:
        out["throttled"] = throttled
    return out


def main() -> int:
    print(json.dumps(retime(json.loads(sys.stdin.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
