"""Fleet acceptance verdicts: the rule of every check (RULES, the one table the report,
the README and the judging share) and the functions that apply them to what the ranks
read and measured (benches/fleet/acceptance.py gathers it).

Verdicts are GCM's (Meta's cluster health checks): OK, WARN, CRITICAL and UNKNOWN, with
its exit codes 0, 1, 2 and 3.  A reading NVML cannot give (no NVML, a call the GPU or
driver does not support, a CPU rank) is UNKNOWN, never OK; the worst verdict wins, and
UNKNOWN ranks below WARN, so a fleet is UNKNOWN only when nothing is WARN or CRITICAL
and something could not be read.  A check that does not apply to the hardware (NVLink on
a GPU that NVML says has none, busbw on a node of one GPU) is N/A: shown, never judged,
so a healthy one-GPU node or a PCIe fleet can still be OK.  A GPU with no NVLink up has
no NVLink in use: no link reported is what a PCIe card says, and also an NVLink (SXM)
part whose links this machine cannot see (the H200 passed alone into a VM answered
NotSupported), while a bare-metal SXM part alone on its node may report every link with
state 0 (down).  Alone on its node (nothing to link to) or on a model without NVLink
that is N/A; on an NVLink model beside other GPUs of its node it is WARN (fewer links up
than the model has).  Some links up and others down is WARN wherever it is.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from benches.fleet.acceptance_records import (
    Check,
    GpuVerdict,
    Judged,
    Node,
    NodeVerdict,
    NvmlReading,
    RankRecord,
    Stress,
    StressNvml,
)

OK, WARN, CRITICAL, UNKNOWN = "OK", "WARN", "CRITICAL", "UNKNOWN"
NA = "N/A"  # the check does not apply to this hardware; left out of every verdict
VERDICTS = (OK, WARN, CRITICAL, UNKNOWN, NA)  # every verdict a check can get
SEVERITY = {OK: 0, UNKNOWN: 1, WARN: 2, CRITICAL: 3}
EXIT_CODE = {OK: 0, WARN: 1, CRITICAL: 2, UNKNOWN: 3}  # GCM's (Nagios') codes

# ---- fixed limits (each rule below quotes them) ----------------------------------------
# GCM's gpu_retired_pages check fails above 10 retired pages (its default threshold).
RETIRED_PAGES_MAX = 10
# Clock-event reasons that mean the GPU slowed itself for heat or a hardware signal
# (nvml.h bits, benches/gpu_monitor.SLOWDOWN_REASONS): gpu-fryer flags "Throttling HW,
# Thermal SW, Thermal HW"; the power brake is an external hardware slowdown.  The SW
# power cap is left out: a sustained GEMM at TDP holds it as its normal state.
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
# Share of the stress's busy NVML readings carrying one of them for WARN: NVML also sets
# hw_slowdown briefly "during PState or clock change", which one reading may catch.
THROTTLE_WARN_FRACTION = 0.10
# Without NVML's "max GPU temperature for normal operation" threshold, WARN this many
# degrees below the slowdown threshold.
TEMP_WARN_MARGIN_C = 5.0
# An enforced power limit this far under the default is a cap someone set.
POWER_CAP_TOLERANCE = 0.01
# NVLink links per GPU of the NVLink (SXM) models, by device key: what a GPU beside
# others on its node should have up.  NVIDIA's datasheets: A100 SXM4 12 third-generation
# links (600 GB/s); H100 and H200 SXM 18 fourth-generation (900 GB/s); B200 and GB200 18
# fifth-generation (1.8 TB/s).
NVLINK_LINKS = {"a100": 12, "h100": 18, "h200": 18, "b200": 18, "gb200": 18}


@dataclass(frozen=True)
class Thresholds:
    """The options (run_bench.py --median-warn, ...): a GPU's figure this many percent
    below the node's or the fleet's median is WARN / CRITICAL; the node's busbw under
    these percentages of the expected link figure is WARN / CRITICAL."""

    median_warn_pct: float = 7.0
    median_critical_pct: float = 15.0
    busbw_warn_pct: float = 80.0
    busbw_critical_pct: float = 50.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Rule:
    check: str
    reads: str
    warn: str
    critical: str
    source: str
    gpu_only: bool = True


def rules(t: Thresholds) -> tuple[Rule, ...]:
    """Every check's rule with the thresholds in force (OK: neither WARN nor CRITICAL
    and the reading present; UNKNOWN: a reading missing): the passive ones (one GPU's
    NVML readings), then the active ones (what every rank measured)."""
    return (*_passive_rules(), *_active_rules(t))


def _passive_rules() -> tuple[Rule, ...]:
    return (
        Rule("ecc_mode", "nvmlDeviceGetEccMode (current, pending)", "on, but off after "
             "the next reboot (pending off)", "ECC off", "Imbue (ECC on)"),
        Rule("ecc_errors", "nvmlDeviceGetTotalEccErrors, uncorrected, volatile and "
             "aggregate", "aggregate > 0 (an earlier boot)", "volatile > 0 (this boot)",
             "GCM ecc_uncorrected_volatile_total (limit 0), Imbue (0 uncorrected)"),
        Rule("memory_retire", "nvmlDeviceGetRemappedRows (A100 and later), else "
             "nvmlDeviceGetRetiredPages and ...PendingStatus", "a row remap or page "
             "retirement pending (reset the GPU)", "a row remap failed, or more than "
             f"{RETIRED_PAGES_MAX} retired pages", "GCM row_remap and gpu_retired_pages "
             f"(limit {RETIRED_PAGES_MAX}), NVIDIA's memory error management guide"),
        Rule("pcie_link", "nvmlDeviceGetCurr/MaxPcieLinkGeneration and ...Width, read "
             "under the stress (an idle GPU lowers its link speed)", "generation below "
             "the maximum of GPU and host", "width below the maximum", "Imbue (PCIe link "
             "width and speed)"),
        Rule("nvlink", "nvmlDeviceGetNvLinkState of every link the GPU reports; none up "
             "is no NVLink in use (N/A) on a GPU alone on its node or of a model without "
             "NVLink", "some reported links up and others down; or, beside other GPUs of "
             "its node, fewer links up than its NVLink model has (" + ", ".join(
                 f"{k} {v}" for k, v in NVLINK_LINKS.items()) + ")", "fewer links up than "
             "another GPU of the same model beside others on its node", "Imbue (NVLink "
             "up)"),
        Rule("throttle", "clock-event reasons sampled every 0.1 s during the stress "
             f"({', '.join(THROTTLE_REASONS)}; sw_power_cap reported only)",
             f"one of them in >= {THROTTLE_WARN_FRACTION:.0%} of the busy readings", "-",
             "gpu-fryer (flags HW throttling, SW and HW thermal)"),
        Rule("power_limit", "nvmlDeviceGetEnforcedPowerLimit vs "
             "nvmlDeviceGetPowerManagementDefaultLimit", "enforced limit more than "
             f"{POWER_CAP_TOLERANCE:.0%} under the default", "-", "this suite: a cap (nvidia-smi "
             "-pl) slows every sustained GEMM"),
        Rule("temperature", "the hottest nvmlDeviceGetTemperature reading during the "
             "stress vs nvmlDeviceGetTemperatureThreshold", "at or above the GPU's max "
             f"operating temperature (else {TEMP_WARN_MARGIN_C:g} C under slowdown)",
             "at or above its slowdown temperature", "GCM gpu_temperature (one fixed "
             "limit; here the GPU's own NVML thresholds)"),
        Rule("driver", "nvmlSystemGetDriverVersion", "-", "differs from the fleet's most "
             "common version", "Imbue (pinned driver versions)"),
        Rule("vbios", "nvmlDeviceGetVbiosVersion", "differs from the most common VBIOS "
             "of the same GPU model in the fleet", "-",
             "agreement across the fleet, as Imbue's pinned versions"),
    )


def _active_rules(t: Thresholds) -> tuple[Rule, ...]:
    w, c = t.median_warn_pct, t.median_critical_pct
    median = (f"> {w:g}% below the node or fleet median (same GPU model)",
              f"> {c:g}% below it")
    return (
        Rule("matmul_<dtype>", "median TFLOP/s of the stress's batches (bf16 and, on "
             "sm_89+, fp8 on GPUs; fp32 on CPUs), every rank at once", *median,
             "gpu-fryer (within 10% of the best GPU), DCGM diagnostics (GFLOPS against "
             "the mean, off by default); 5% between GPUs of a node is normal",
             gpu_only=False),
        Rule("sdc_<dtype>", "every stress product compared bit for bit with the first; "
             "the first against a float64 reference and, by digest, with every rank of "
             "the same model fed the same inputs", "ranks disagree with no majority to "
             "tell which is wrong", "a product differs from the first, fails the "
             "reference, or differs from the majority of ranks", "Imbue (exact-equality "
             "checks), SemiAnalysis ClusterMAX (silent data corruption)", gpu_only=False),
        Rule("copy_bw", "median GB/s of a device-to-device copy (1 GiB on GPUs, 64 MiB "
             "on CPUs; read + write counted)", *median, "DCGM diagnostics (memory "
             "bandwidth)", gpu_only=False),
        Rule("busbw", "nccl-tests busbw of an all_reduce among the node's ranks (1 GiB "
             "bf16 on GPUs, 4 MiB fp32 through gloo on CPUs)",
             f"< {t.busbw_warn_pct:g}% of the expected link figure",
             f"< {t.busbw_critical_pct:g}% of it", "GCM check-nccl (warn and critical "
             "busbw limits), nccl-tests", gpu_only=False),
    )


def worst(verdicts: Iterable[str]) -> str:
    """The worst verdict; N/A checks are left out, and nothing judged is UNKNOWN (never
    OK)."""
    vs = [v for v in verdicts if v != NA]
    return max(vs, key=SEVERITY.__getitem__) if vs else UNKNOWN


def _unknown(check: str, why: str) -> Check:
    return Check(check, "-", UNKNOWN, why)


# ---- passive checks: one GPU's NVML readings (benches/fleet/acceptance_nvml.py) --------

def ecc_mode(r: NvmlReading) -> Check:
    mode = r.ecc_mode
    if not mode:
        return _unknown("ecc_mode", "ECC mode unreadable")
    current, pending = mode[0], mode[1] if len(mode) > 1 else mode[0]
    value = f"{'on' if current else 'off'} (pending {'on' if pending else 'off'})"
    if not current:
        return Check("ecc_mode", value, CRITICAL, "ECC is off")
    if not pending:
        return Check("ecc_mode", value, WARN, "ECC goes off at the next reboot")
    return Check("ecc_mode", value, OK)


def ecc_errors(r: NvmlReading) -> Check:
    vol, agg = r.ecc_uncorrected_volatile, r.ecc_uncorrected_aggregate
    if vol is None and agg is None:
        return _unknown("ecc_errors", "uncorrected ECC counts unreadable")
    value = f"uncorrected {vol if vol is not None else '?'} volatile, " \
            f"{agg if agg is not None else '?'} aggregate"
    if vol:
        return Check("ecc_errors", value, CRITICAL, f"{vol} uncorrected ECC errors since boot")
    if agg:
        return Check("ecc_errors", value, WARN, f"{agg} uncorrected ECC errors in its life")
    if vol is None:
        return Check("ecc_errors", value, UNKNOWN, "the volatile count is unreadable")
    return Check("ecc_errors", value, OK)


def memory_retire(r: NvmlReading) -> Check:
    rows = r.remapped_rows
    if rows is not None:  # (correctable, uncorrectable, pending, failure)
        _, unc, pending, failure = rows
        value = f"rows remapped {rows[0]} + {unc}, pending {pending}, failed {failure}"
        if failure:
            return Check("memory_retire", value, CRITICAL, "a row remap failed")
        if pending:
            return Check("memory_retire", value, WARN, "a row remap is pending (reset)")
        return Check("memory_retire", value, OK)
    pages, pend = r.retired_pages, r.retired_pages_pending
    if pages is None and pend is None:
        return _unknown("memory_retire", "neither remapped rows nor retired pages readable")
    value = f"retired pages {pages if pages is not None else '?'}, pending " \
            f"{'?' if pend is None else ('yes' if pend else 'no')}"
    if pages is not None and pages > RETIRED_PAGES_MAX:
        return Check("memory_retire", value, CRITICAL,
                     f"{pages} retired pages, over {RETIRED_PAGES_MAX}")
    if pend:
        return Check("memory_retire", value, WARN, "a page retirement is pending (reset)")
    if pages is None or pend is None:
        return Check("memory_retire", value, UNKNOWN, "part of it unreadable")
    return Check("memory_retire", value, OK)


def pcie_link(r: NvmlReading) -> Check:
    gen, gmax = r.pcie_gen, r.pcie_gen_max
    width, wmax = r.pcie_width, r.pcie_width_max
    if None in (gen, gmax, width, wmax):
        return _unknown("pcie_link", "PCIe link generation or width unreadable")
    value = f"gen {gen}/{gmax} x{width}/x{wmax}"
    if width < wmax:
        return Check("pcie_link", value, CRITICAL, f"link width x{width}, below x{wmax}")
    if gen < gmax:
        return Check("pcie_link", value, WARN, f"link generation {gen}, below {gmax}")
    return Check("pcie_link", value, OK)


def nvlink(r: NvmlReading, most_up: int | None, model: str | None = None,
           neighbours: int = 0, expected: int | None = None) -> Check:
    """`most_up`: the most links up on any GPU of the same model beside others on its
    node; `model`: the device model's name when it is an NVLink (SXM) part, else None;
    `neighbours`: the other GPUs of its node; `expected`: the links the model has."""
    links, up = r.nvlink_links, r.nvlink_up
    if links is None or up is None:
        return _unknown("nvlink", "no NVLink state readable")
    value = f"{up}/{links} up" if links else "none"
    seen = (f"{links} links reported, none up" if links
            else "NVML reports no NVLink")
    if neighbours and most_up and up < most_up:
        return Check("nvlink", value, CRITICAL, f"{up} links up, another GPU of this "
                                                 f"model has {most_up}")
    if up == 0:
        if model is not None and neighbours:
            return Check("nvlink", value, WARN, f"{seen} beside {neighbours} other GPU(s) "
                         f"of its node, though the {model} has "
                         f"{expected or 'NVLink'} links: not visible (a VM) or not set up")
        if model is None:
            return Check("nvlink", value, NA, f"no NVLink in use: {seen} (a PCIe card, or "
                         "links not visible, as for one GPU in a VM)")
        return Check("nvlink", value, NA, f"no NVLink in use: {seen}, though the {model} "
                     "has it: links not visible or down, as for one GPU in a VM (alone on "
                     "its node, nothing to link to)")
    if up < links:
        return Check("nvlink", value, WARN, f"{links - up} of {links} reported links down "
                                              f"while {up} are up")
    if model is not None and neighbours and expected and up < expected:
        return Check("nvlink", value, WARN, f"{up} links up beside {neighbours} other "
                     f"GPU(s) of its node; the {model} has {expected}")
    return Check("nvlink", value, OK)


def throttle(s: StressNvml | None) -> Check:
    """`s`: the stress's NVML summary (acceptance_nvml.stress_summary)."""
    if s is None or not s.readings:
        return _unknown("throttle", "no busy NVML reading during the stress")
    fractions = s.reason_fractions
    bad = {k: v for k, v in fractions.items()
           if k in THROTTLE_REASONS and v >= THROTTLE_WARN_FRACTION}
    seen = ", ".join(f"{k} {v:.0%}" for k, v in fractions.items() if v) or "none"
    value = f"{seen} of {s.readings} readings"
    if bad:
        return Check("throttle", value, WARN, "slowed for heat or a hardware signal: "
                     + ", ".join(sorted(bad)))
    return Check("throttle", value, OK)


def power_limit(r: NvmlReading) -> Check:
    limit, default = r.power_limit_w, r.power_default_w
    if limit is None or default is None:
        return _unknown("power_limit", "power limits unreadable")
    value = f"{limit:.0f} W of default {default:.0f} W"
    if limit < default * (1 - POWER_CAP_TOLERANCE):
        return Check("power_limit", value, WARN, "capped below the default limit")
    return Check("power_limit", value, OK)


def temperature(r: NvmlReading, s: StressNvml | None) -> Check:
    hottest = s.temperature_c_max if s is not None else None
    if hottest is None:
        hottest = r.temperature_c
    slowdown, gpu_max = r.temp_slowdown_c, r.temp_gpu_max_c
    if hottest is None or slowdown is None:
        return _unknown("temperature", "temperature or its slowdown threshold unreadable")
    warn_at = gpu_max if gpu_max is not None else slowdown - TEMP_WARN_MARGIN_C
    value = f"{hottest:.0f} C (warn {warn_at:.0f}, slowdown {slowdown:.0f})"
    if hottest >= slowdown:
        return Check("temperature", value, CRITICAL, "at its slowdown temperature")
    if hottest >= warn_at:
        return Check("temperature", value, WARN, "above its normal operating temperature")
    return Check("temperature", value, OK)


def agreement(check: str, mine: str | None, everyone: list[str | None], differ: str
              ) -> Check:
    """`mine` against the most common value of `everyone` (its peers, itself included):
    `differ` (WARN or CRITICAL) when it is not that value."""
    if mine is None:
        return _unknown(check, f"{check} unreadable")
    known = Counter(v for v in everyone if v is not None)
    common, n = known.most_common(1)[0]
    if mine != common:
        return Check(check, mine, differ, f"differs from {common} ({n} of {sum(known.values())})")
    return Check(check, mine, OK)


# ---- active checks: figures against the node's and the fleet's medians ------------------

def against_medians(check: str, value: float | None, node: list[float],
                    fleet: list[float], t: Thresholds, unit: str) -> Check:
    """`value` against the median of `node` (its node's ranks, itself included) and of
    `fleet` (every rank of the same model): the larger shortfall decides."""
    if value is None:
        return _unknown(check, "not measured")
    shortfall = max(1 - value / statistics.median(xs) for xs in (node, fleet) if xs)
    value_s = f"{value:.4g} {unit} ({-shortfall:+.1%} vs median)"
    if shortfall * 100 > t.median_critical_pct:
        return Check(check, value_s, CRITICAL, f"{shortfall:.1%} below the median, over "
                                                f"{t.median_critical_pct:g}%")
    if shortfall * 100 > t.median_warn_pct:
        return Check(check, value_s, WARN, f"{shortfall:.1%} below the median, over "
                                            f"{t.median_warn_pct:g}%")
    return Check(check, value_s, OK)


def sdc(check: str, s: Stress | None, digests: list[str]) -> Check:
    """The equality check of one rank's stress `s` for one dtype; `digests`: the first
    product's digest on every rank of the same model (itself included)."""
    if s is None:
        return _unknown(check, "not measured")
    bad, n = s.mismatches, s.iterations
    value = f"{n} products, {bad} differ; ref err {s.rel_err:.2g}"
    if bad:
        return Check(check, value, CRITICAL, f"{bad} of {n} products differ from the first "
                                             "(same inputs)")
    if not s.reference_ok:
        return Check(check, value, CRITICAL, f"the product fails its float64 reference "
                                             f"(rel err {s.rel_err}, tol {s.tol})")
    counts = Counter(digests)
    top, n_top = counts.most_common(1)[0]
    if len(counts) > 1:
        if n_top * 2 > len(digests):  # a strict majority tells which is right
            if s.digest != top:
                return Check(check, value, CRITICAL, f"its product differs from "
                                                     f"{n_top} of {len(digests)} ranks'")
        else:
            return Check(check, value, WARN, f"{len(counts)} different products among "
                                             f"{len(digests)} ranks, no majority")
    return Check(check, value, OK)


def busbw(value: float | None, expected: float | None, t: Thresholds, ranks: int
          ) -> Check:
    if ranks < 2:
        return Check("busbw", "-", NA, "one GPU on this node: nothing to all-reduce")
    if value is None:
        return _unknown("busbw", "not measured")
    if not expected:
        return Check("busbw", f"{value:.4g} GB/s", UNKNOWN,
                     "no expected link figure (pass --expected-busbw)")
    pct = 100 * value / expected
    value_s = f"{value:.4g} GB/s ({pct:.0f}% of {expected:g})"
    if pct < t.busbw_critical_pct:
        return Check("busbw", value_s, CRITICAL, f"under {t.busbw_critical_pct:g}% of the "
                                                 "expected link figure")
    if pct < t.busbw_warn_pct:
        return Check("busbw", value_s, WARN, f"under {t.busbw_warn_pct:g}% of the expected "
                                             "link figure")
    return Check("busbw", value_s, OK)


# ---- the fleet: every rank's readings and figures to verdicts ---------------------------

PASSIVE = ("ecc_mode", "ecc_errors", "memory_retire", "pcie_link", "nvlink", "throttle",
           "power_limit", "temperature", "driver", "vbios")


def _model(r: RankRecord) -> str:
    return str(r.device_name)


def _nvlink_model(r: RankRecord) -> tuple[str | None, int | None]:
    """(the device model's name, its NVLink links) where it is joined by NVLink (an SXM
    part: the device table gives it an NVLink figure), else (None, None); by the rank's
    device key, else its name."""
    from contract.devices import DEVICES, match_sku

    key = r.device_key or match_sku(_model(r))
    model = DEVICES.get(key)
    if model is None or not model.nvlink_gbps:
        return None, None
    return model.name, NVLINK_LINKS.get(model.key)


def _neighbours(r: RankRecord, fleet: list[RankRecord]) -> int:
    """The other ranks of r's node."""
    return sum(x.host == r.host for x in fleet) - 1


def _passive(r: RankRecord, fleet: list[RankRecord]) -> list[Check]:
    nv, s = r.nvml, r.stress_nvml
    if nv is None:
        why = r.nvml_why or "no NVML reading"
        return [_unknown(name, why) for name in PASSIVE]
    peers = [x for x in fleet if _model(x) == _model(r) and x.nvml is not None]
    # Links are compared among GPUs beside others on their node: one alone on its node
    # has nothing to link to, whatever its links say.
    ups = [x.nvml.nvlink_up for x in peers if x.nvml and _neighbours(x, fleet)]
    most_up = max((u for u in ups if u is not None), default=None)
    drivers = [x.nvml.driver if x.nvml is not None else None for x in fleet]
    model, expected = _nvlink_model(r)
    return [ecc_mode(nv), ecc_errors(nv), memory_retire(nv), pcie_link(nv),
            nvlink(nv, most_up, model, _neighbours(r, fleet), expected), throttle(s),
            power_limit(nv),
            temperature(nv, s),
            agreement("driver", nv.driver, drivers, CRITICAL),
            agreement("vbios", nv.vbios, [x.nvml.vbios for x in peers if x.nvml], WARN)]


def _stress_of(x: RankRecord, dtype: str) -> Stress:
    return x.stress.get(dtype) or Stress()


def _active(r: RankRecord, fleet: list[RankRecord], t: Thresholds) -> list[Check]:
    same = [x for x in fleet if _model(x) == _model(r)]
    node = [x for x in same if x.host == r.host]
    out = []
    for dtype, s in r.stress.items():
        def figures(xs: list[RankRecord], d: str = dtype) -> list[float]:
            return [f for x in xs if (f := _stress_of(x, d).tflops)]
        out.append(against_medians(f"matmul_{dtype}", s.tflops, figures(node),
                                   figures(same), t, "TFLOP/s"))
        digests = [d for x in same if (d := _stress_of(x, dtype).digest)]
        out.append(sdc(f"sdc_{dtype}", s, digests))
    copies = [x.copy_gbps for x in same if x.copy_gbps]
    node_copies = [x.copy_gbps for x in node if x.copy_gbps]
    out.append(against_medians("copy_bw", r.copy_gbps, node_copies, copies, t, "GB/s"))
    return out


def judge_fleet(ranks: list[RankRecord], nodes: list[Node], t: Thresholds) -> Judged:
    """Verdicts per GPU (rank), per node and for the fleet, worst first, from what every
    rank read and measured (`ranks`) and each node's busbw (`nodes`)."""
    gpus = []
    for r in ranks:
        checks = _passive(r, ranks) + _active(r, ranks, t)
        gpus.append(GpuVerdict(r.rank, r.host, r.local_rank, r.device_name,
                               worst(c.verdict for c in checks), tuple(checks)))
    judged = []
    for n in nodes:
        checks = [busbw(n.busbw_gbps, n.expected_gbps, t, len(n.ranks))]
        mine = [g.verdict for g in gpus if g.host == n.host]
        judged.append(NodeVerdict(n.host, n.ranks, worst([c.verdict for c in checks] + mine),
                                  tuple(checks), n.busbw))
    gpus.sort(key=lambda g: (-SEVERITY[g.verdict], g.rank))
    judged.sort(key=lambda n: (-SEVERITY[n.verdict], n.ranks[0]))
    verdict = worst(n.verdict for n in judged)
    return Judged(verdict, EXIT_CODE[verdict], tuple(judged), tuple(gpus))
