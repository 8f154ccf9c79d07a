"""`history report --retime`: time the rows of new slowdowns again on this machine, as
run_bench.py --compare does (benches/retime.py in a fresh child process per round,
rounds spaced apart), with the newest stored run's own settings: device, seed, fp8
accumulation, ceilings (so each row keeps its timing method), throttle settings and the
Triton configs it ran."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from roofline.gate.rules import Key, Retime, RetimerFactory
from roofline.history.errors import HistoryError
from roofline.model.schema import row_cache


def make_retimer(command: Sequence[str], rounds: int, spacing_s: float, present_key: str,
                 cwd: str | Path, case_id: Callable[[Key], str]) -> RetimerFactory:
    """A factory of Retime callbacks that run `command` (reading the spec on stdin) once
    per round; `case_id` names a case in the spec and the answer (the child's own
    function); refuses (HistoryError) a store of another device than `present_key`."""

    def factory(device: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> Retime:
        if device != present_key:
            raise HistoryError(f"--retime times rows on this machine, a '{present_key}'; "
                               f"the store's runs are '{device}'")
        configs = {case_id((str(r["kernel"]), str(r["provider"]), str(r["dtype"]),
                            str(r["shape"]), row_cache(r))): r["config"]
                   for r in rows if r.get("config")}

        def retime(keys: list[Key]) -> dict[Key, list[list[float]]]:
            spec = json.dumps({
                "device": device, "seed": meta.get("seed", 0),
                "fp8_accum": meta.get("fp8_accum") or "fast",
                "ceilings": meta.get("ceilings") or {},
                "cases": [list(k) for k in keys],
                "throttle": meta.get("throttle_settings") or {},
                "configs": {case_id(k): configs[case_id(k)] for k in keys
                            if case_id(k) in configs}})
            got: dict[Key, list[list[float]]] = {k: [] for k in keys}
            started = 0.0
            for r in range(rounds):
                time.sleep(max(0.0, started + spacing_s - time.monotonic()))
                started = time.monotonic()
                proc = subprocess.run(list(command), input=spec, capture_output=True,
                                      text=True, cwd=cwd)
                lines = proc.stdout.strip().splitlines()
                if proc.returncode != 0 or not lines:
                    why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
                    print(f"warning: re-timing round {r + 1} failed: {why}", file=sys.stderr)
                    continue
                answer = json.loads(lines[-1])
                for k in keys:
                    if case_id(k) in answer:
                        got[k].append(answer[case_id(k)])
            return got

        return retime

    return factory
