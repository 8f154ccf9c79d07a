"""Re-time given cases in a fresh process: `python -m benches.retime < spec.json`.

run_bench.py --compare confirms each row that looks slower than the baseline by timing
it again in several child processes, one per round.  Why processes: on a shared machine
a whole process can sit in a slow state (seen on the 2-core CI VM: an unchanged bf16 add
1.9x slower in every re-timed round inside the same process, seconds apart), so rounds in
the process that saw the slowdown confirm it, while a new process gets a new draw.

The spec (JSON on stdin): device key, seed, fp8 accumulation mode, the run's ceilings (so
the timing method per case is the run's own), the cases as [kernel, provider, dtype,
shape], the Triton rows' configs by case id (run as recorded, never tuned again) and
the run's throttle settings (a GPU timing that stays throttled is no evidence of slower
code, so it is left out).
The answer (last line of stdout): {"kernel|provider|dtype|shape": [samples_ms]}
for each case that ran ok, and "throttled": [case ids left out as throttled].
"""

from __future__ import annotations

import json
import sys
from typing import Any

SEP = "|"


def case_id(key: tuple[str, str, str, str] | list[str]) -> str:
    return SEP.join(key)


def retime(spec: dict[str, Any]) -> dict[str, Any]:
    from benches.cases import Case, RunConfig, _InputCache
    from benches.gpu_monitor import ThrottleConfig
    from benches.runner import run_case
    from benches.timing import TimingConfig
    from kernels import REGISTRY
    from kernels.spec import Target, interpreter_enabled, set_fp8_accum
    from roofline.ceilings import Ceilings
    from roofline.devices import detect, host_cpu, resolve
    from roofline.schema import parse_shape

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
                    configs={tuple(k.split(SEP)): v  # type: ignore[misc]
                             for k, v in (spec.get("configs") or {}).items()})
    out: dict[str, Any] = {}
    throttled: list[str] = []
    for kernel, provider, dtype, shape in spec["cases"]:
        case = Case(REGISTRY[kernel], provider, dtype, parse_shape(shape))
        row = run_case(case, cfg, _InputCache())
        if row.get("throttled") is True:
            throttled.append(case_id((kernel, provider, dtype, shape)))
        elif row["status"] == "ok" and row.get("samples_ms"):
            out[case_id((kernel, provider, dtype, shape))] = list(row["samples_ms"])
    if throttled:
        out["throttled"] = throttled
    return out


def main() -> int:
    print(json.dumps(retime(json.loads(sys.stdin.read()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
