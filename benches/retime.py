"""Re-time given cases in a fresh process: `python -m benches.retime < spec.json`.

run_bench.py --compare confirms each row that looks slower than the baseline by timing
it again in several child processes, one per round.  Why processes: on a shared machine
a whole process can sit in a slow state (seen on the 2-core CI VM: an unchanged bf16 add
1.9x slower in every re-timed round inside the same process, seconds apart), so rounds in
the process that saw the slowdown confirm it, while a new process gets a new draw.

The spec (JSON on stdin): device key, seed, fp8 accumulation mode, the run's ceilings (so
the timing method per case is the run's own), the cases as [kernel, provider, dtype,
shape, cache] (cache "cold" or "warm", each timed in its own mode; a case of four is
cold), the Triton rows' configs by case id (run as recorded, never tuned again) and
the run's throttle settings (a GPU timing that stays throttled is no evidence of slower
code, so it is left out).
The answer (last line of stdout): {case id: [samples_ms]} for each case that ran ok,
and "throttled": [case ids left out as throttled].  A case id is
"kernel|provider|dtype|shape" for a cold case (as before cache modes existed) and
"kernel|provider|dtype|shape|warm" for a warm one.
"""

from __future__ import annotations

import json
import sys
from typing import Any

SEP = "|"
COLD = "cold"  # roofline.model.schema.DEFAULT_CACHE (imported lazily with the rest)


def case_key(key: tuple[str, ...] | list[str]) -> tuple[str, str, str, str, str]:
    """(kernel, provider, dtype, shape, cache) of a key of four (cold) or five parts."""
    parts = [str(x) for x in key]
    if len(parts) == 4:
        parts.append(COLD)
    if len(parts) != 5:
        raise ValueError(f"a case is kernel, provider, dtype, shape[, cache], not {key!r}")
    return (parts[0], parts[1], parts[2], parts[3], parts[4])


def case_id(key: tuple[str, ...] | list[str]) -> str:
    """The case's id in the spec and the answer: a cold case's without its mode."""
    k = case_key(key)
    return SEP.join(k[:4] if k[4] == COLD else k)


def retime(spec: dict[str, Any]) -> dict[str, Any]:
    from benches.cases import Case, RunConfig
    from benches.cpu_rows import sweep_cache
    from benches.gpu_monitor import ThrottleConfig
    from benches.runner import run_case
    from benches.timing import TimingConfig
    from kernels import REGISTRY
    from kernels.spec import Target, interpreter_enabled, set_fp8_accum
    from roofline.model.ceilings import Ceilings
    from roofline.model.devices import detect, host_cpu, resolve
    from roofline.model.schema import parse_shape

    set_fp8_accum(spec["fp8_accum"])
    present = detect()
    model, _ = resolve(spec["device"], present)
    if model.kind == "cpu" and present.kind != "cpu":
        present = host_cpu()
    c = spec.get("ceilings") or {}
    cfg = RunConfig(kernels=[], dtypes=[], providers=[], sizes="explicit",
                    explicit_shapes=None, seed=int(spec["seed"]), check_only=False,
                    model=model, present=present,
                    target=Target(present.kind, present.capability, interpreter_enabled(),
                                  present.name),
                    ceilings=Ceilings(c.get("datasheet"), c.get("measured")),
                    timing=TimingConfig(),
                    throttle=ThrottleConfig(**(spec.get("throttle") or {})),
                    configs={case_key(k.split(SEP)): v
                             for k, v in (spec.get("configs") or {}).items()})
    out: dict[str, Any] = {}
    throttled: list[str] = []
    inputs = sweep_cache(cfg)  # inputs shared as in the sweep, copies' memory reused
    for key in spec["cases"]:
        kernel, provider, dtype, shape, cache = case_key(key)
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
