"""summary.md's run facts: the run's status (aborted, interrupted, incomplete, check
only), device, versions, command, what it was asked (the stored request's seed and
sizes), its time and compiles, its fp8 mode, the device's and host's figures, and the
clocks, power and throttle facts, each read from the metadata's typed parts
(contract/run_meta.py)."""

from __future__ import annotations

import json
from typing import Any

from contract.meta_parts import ClocksFacts, PowerFacts, ThrottleFacts
from contract.request import stored_selection
from contract.run_meta import RunMeta
from roofline.report.cells import cell, mhz
from roofline.report.run_time import compile_facts, time_split_line

# What each fp8 accumulation mode means for the fp8 matmul rows and the fp8 ceiling.
_FP8_ACCUM = {
    "fast": "fast (tensor-core accumulator over the whole K: Triton max_num_imprecise_acc "
            "= 2^30, torch._scaled_mm use_fast_accum=True), for the Triton kernel, torch and "
            "the fp8 ceiling alike",
    "precise": "precise (partial sums promoted to fp32 every 128 of K: Triton "
               "max_num_imprecise_acc = BLOCK_K, torch._scaled_mm use_fast_accum=False), "
               "for the Triton kernel, torch and the fp8 ceiling alike",
}


def _status(meta: RunMeta, check_only: bool) -> str | None:
    """What a partial run says before anyone reads its numbers, and a check-only run."""
    state = meta.state
    if state.aborted:
        why = state.abort_reason or "no reason recorded"
        status = (f"**aborted**: a CUDA error left the context unusable ({cell(why)}); "
                  "partial results, the rows after it were not run")
    elif state.interrupted:
        status = "**interrupted**: partial results, the sweep did not finish"
    elif state.complete is False:
        status = "**incomplete**: the sweep had not finished when this was written"
    else:
        status = None
    if check_only:
        status = (status + "; " if status else "") + "correctness check only, no timing"
    return status


def _given(v: Any) -> Any:
    """A recorded fact, or None where it is empty."""
    return None if v in (None, "") else v


def _run_identity(meta: RunMeta) -> list[tuple[str, Any]]:
    """Status, device, run, versions, command, the request's seed and sizes, timing,
    time and compiles, the fp8 mode."""
    sw, dev, prov = meta.software, meta.device, meta.provenance
    asked = stored_selection(meta)
    versions = ", ".join(f"{k} {v}" for k, v in (
        ("python", sw.python), ("torch", sw.torch), ("triton", sw.triton),
        ("cuda", sw.cuda), ("driver", sw.driver)) if v)
    # Settings recorded as a mapping get a table of their own (_timing_section).
    timing = None if isinstance(meta.settings.timing, dict) else meta.settings.timing
    command, name, model = _given(prov.command), _given(dev.device_name), dev.device_model
    fp8 = meta.settings.fp8_accum
    return [
        ("status", _status(meta, bool(asked and asked.check_only))),
        ("device", f"{name or '?'} (`{_given(dev.device_key) or '?'}`)"),
        # The model whose peaks the rows use, when it is not the device itself (e.g. an
        # H200 run as --device h100, or "host CPU").
        ("device model", model if model and model != name else None),
        ("run", _given(prov.run_id)),
        ("date", _given(prov.created)),
        ("versions", versions or None),
        # Outside the declared bounds (contract/versions.py): the numbers may not hold.
        ("version warnings", "; ".join(map(str, sw.version_warnings)) or None),
        ("git commit", _given(prov.git_commit)),
        ("command", f"`{command}`" if command else None),
        ("seed", asked.seed if asked else None),
        ("sizes", _given(asked.sizes) if asked else None),
        ("timing", timing),
        ("time", time_split_line(meta.time.time_split_s, meta.time.wall_s)),
        *compile_facts(meta),
        ("fp8 accumulation", _FP8_ACCUM.get(str(fp8), fp8)),
    ]


def _machine_facts(meta: RunMeta) -> list[tuple[str, Any]]:
    """The device's and host's figures the run recorded, then its clocks, power and
    throttle facts."""
    dev = meta.device
    facts: list[tuple[str, Any]] = []
    for label, val in (("compute capability", dev.capability), ("SMs", dev.sms),
                       ("L2 MiB", dev.l2_mb), ("GPU memory GB", dev.gpu_memory_gb),
                       ("CPU cores", dev.cpu_cores), ("threads", dev.threads),
                       ("platform", meta.software.platform)):
        if val not in (None, "", [], ()):
            facts.append((label, ".".join(map(str, val)) if isinstance(val, list | tuple)
                          else val))
    tele = meta.telemetry
    for key, val in (("clocks", tele.clocks), ("power", tele.power),
                     ("throttle", tele.throttle)):
        if val:
            nice = _CLOCK_FACTS[key](val) if isinstance(val, dict) else None
            facts.append((key, nice or (json.dumps(val) if isinstance(val, dict | list)
                                        else val)))
    return facts


def run_facts(meta: RunMeta) -> str:
    """summary.md's list of the run's facts, by the metadata's typed parts."""
    facts = _run_identity(meta) + _machine_facts(meta)
    return "\n".join(f"- **{k}**: {val if k == 'status' else cell(val)}"
                     for k, val in facts if val is not None)


def _clocks_fact(c: ClocksFacts) -> str | None:
    med, lo, hi = (mhz(c.get(k)) for k in ("sm_mhz_median", "sm_mhz_min", "sm_mhz_max"))
    if not med:
        return None
    text = f"SM {med} median while timing ({lo} to {hi})"
    if mhz(c.get("sm_mhz_max_possible")):
        text += f", of a {mhz(c['sm_mhz_max_possible'])} maximum"
    if mhz(c.get("mem_mhz")):
        text += f"; memory {mhz(c['mem_mhz'])}"
    return text


def _power_fact(p: PowerFacts) -> str | None:
    top, limit = p.get("max_w"), p.get("limit_w")
    if not isinstance(top, int | float):
        return None
    return f"{top:.0f} W peak" + (f" of a {limit:.0f} W limit"
                                 if isinstance(limit, int | float) else "")


def _throttle_fact(t: ThrottleFacts) -> str | None:
    n = t.get("throttled_rows")
    if n is None:
        return None
    frac = t.get("throttled_fraction_of_readings")
    seen = ", ".join(t.get("reasons_seen") or []) or "none"
    text = (f"{n} row(s) throttled after re-timing; throttle reasons seen: {seen}")
    if isinstance(frac, int | float):
        text += f" ({frac:.0%} of readings)"
    return text + (f"; threshold {t.get('threshold_pct'):g}% of the maximum SM clock, "
                   f"re-timed after {t.get('recovery_delay_s'):g} s"
                   if isinstance(t.get("threshold_pct"), int | float)
                   and isinstance(t.get("recovery_delay_s"), int | float) else "")


_CLOCK_FACTS = {"clocks": _clocks_fact, "power": _power_fact, "throttle": _throttle_fact}
