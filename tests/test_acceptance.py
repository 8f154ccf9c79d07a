"""Fleet acceptance's verdict rules (benches/fleet/acceptance_rules.py), fed through the
real NVML reading code (benches/fleet/acceptance_nvml.py, benches/sweep/gpu_monitor.py) from a
fake pynvml whose calls return NVML's raw values (mW, counts, C, bit masks) for an H100
SXM as nvidia-smi shows one: the fakes stand at the NVML call, never at the verdict.
The figures of the active checks are given as a rank measures them."""

from __future__ import annotations

from dataclasses import replace

import pynvml
import pytest

import run_bench
from benches.fleet import acceptance_nvml as anvml
from benches.fleet import acceptance_rules as ar
from benches.fleet.acceptance_records import Node, RankRecord
from benches.fleet.acceptance_rules import CRITICAL, NA, OK, UNKNOWN, WARN, Thresholds
from benches.fleet.acceptance_stress import matmul_stress
from benches.sweep.gpu_monitor import GpuMonitor


class NotSupported(pynvml.NVMLError):
    def __init__(self) -> None:
        super().__init__(pynvml.NVML_ERROR_NOT_SUPPORTED)


class Unreadable(pynvml.NVMLError):
    def __init__(self) -> None:
        super().__init__(pynvml.NVML_ERROR_UNKNOWN)


# An H100 SXM's answers (nvidia-smi -q's fields), as NVML returns them.
H100 = {
    "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0", "ecc_mode": [1, 1],
    "ecc_volatile": 0, "ecc_aggregate": 0, "remapped_rows": (0, 0, 0, 0),
    "retired_pages": NotSupported, "retired_pending": NotSupported,  # rows are remapped
    "pcie_gen": 5, "pcie_width": 16, "pcie_gen_max": 5, "pcie_width_max": 16,
    "nvlinks": [1] * 18, "power_limit_mw": 700_000, "power_default_mw": 700_000,
    "temperature": 41, "temp_slowdown": 89, "temp_gpu_max": 87,
    "driver": "550.54.15", "vbios": "96.00.89.00.01",
    "sm_clock": 1755, "max_sm_clock": 1980, "power_mw": 690_000, "util": 100,
    "clock_reasons": 0x4,  # sw_power_cap: a GEMM at TDP
}


class FakeNVML:
    """pynvml's query calls answering from `values`; an exception class as a value
    is raised, as NVML raises NVMLError_NotSupported.  Constants are pynvml's own."""

    def __init__(self, **values):
        self.v = {**H100, **values}

    def __getattr__(self, name):
        if name.startswith("NVML_") or name.startswith("NVMLError"):
            return getattr(pynvml, name)
        raise AttributeError(name)

    def _get(self, key):
        v = self.v[key]
        if isinstance(v, type) and issubclass(v, Exception):
            raise v()
        return v

    def nvmlDeviceGetName(self, h): return self._get("name")
    def nvmlDeviceGetUUID(self, h): return self._get("uuid")
    def nvmlDeviceGetEccMode(self, h): return self._get("ecc_mode")
    def nvmlDeviceGetRemappedRows(self, h): return self._get("remapped_rows")
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h): return self._get("retired_pending")
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return self._get("pcie_gen")
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return self._get("pcie_width")
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return self._get("pcie_gen_max")
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): return self._get("pcie_width_max")
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return self._get("power_limit_mw")
    def nvmlDeviceGetPowerManagementDefaultLimit(self, h): return self._get("power_default_mw")
    def nvmlSystemGetDriverVersion(self): return self._get("driver")
    def nvmlDeviceGetVbiosVersion(self, h): return self._get("vbios")
    def nvmlDeviceGetPowerUsage(self, h): return self._get("power_mw")
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return self._get("clock_reasons")
    def nvmlDeviceGetMaxClockInfo(self, h, clock): return self._get("max_sm_clock")
    def nvmlDeviceGetClockInfo(self, h, clock): return self._get("sm_clock")

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("Util", (), {"gpu": self._get("util")})()

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter):
        assert error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return self._get("ecc_volatile" if counter == pynvml.NVML_VOLATILE_ECC
                         else "ecc_aggregate")

    def nvmlDeviceGetRetiredPages(self, h, cause):
        pages = self._get("retired_pages")
        return pages[cause]  # {cause: [addresses]}

    def nvmlDeviceGetNvLinkState(self, h, link):
        links = self._get("nvlinks")
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._get("temperature")

    def nvmlDeviceGetTemperatureThreshold(self, h, which):
        return self._get({pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: "temp_slowdown",
                          pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: "temp_gpu_max"}[which])


class AllFail(FakeNVML):
    """A GPU or driver that answers nothing."""

    def _get(self, key):
        raise NotSupported()


def stressed(nv: FakeNVML, samples: int = 20, reasons: list[int] | None = None,
             temps: list[int] | None = None) -> dict:
    """One rank's record as acceptance.py builds it: a GpuMonitor sampling the fake
    NVML during the stress (clock-event reasons and temperature per sample), then the
    passive reading and the PCIe link read under load."""
    mon = GpuMonitor(nv, "h")
    for i in range(samples):
        if reasons is not None:
            nv.v["clock_reasons"] = reasons[i]
        if temps is not None:
            nv.v["temperature"] = temps[i]
        mon.sample()
    summary = anvml.stress_summary(list(mon.readings), mon.max_sm_clock_mhz).to_json()
    reading = replace(anvml.read_passive(nv, "h"), pcie=anvml.read_pcie(nv, "h")).to_json()
    return {"rank": 0, "host": "node-a", "local_rank": 0, "device": "cuda",
            "device_name": "NVIDIA H100 80GB HBM3", "nvml": reading, "stress_nvml": summary,
            "stress": {}, "copy_gbps": None}


def judge(records: list[dict], nodes: list[dict], t: Thresholds) -> dict:
    """judge_fleet on records and nodes as acceptance.json holds them; its verdicts so."""
    return ar.judge_fleet([RankRecord.from_json(r) for r in records],
                          [Node.from_json(n) for n in nodes], t).to_json()


def verdicts(records: list[dict], rank: int = 0, t: Thresholds | None = None) -> dict:
    hosts = sorted({r["host"] for r in records})
    nodes = [{"host": h, "ranks": [r["rank"] for r in records if r["host"] == h],
              "busbw_gbps": None, "expected_gbps": None} for h in hosts]
    doc = judge(records, nodes, t or Thresholds())
    gpu = next(g for g in doc["gpus"] if g["rank"] == rank)
    return {c["check"]: c["verdict"] for c in gpu["checks"]}


def test_a_healthy_h100_is_ok_on_every_passive_check():
    v = verdicts([stressed(FakeNVML())])
    assert {k: v[k] for k in ar.PASSIVE} == dict.fromkeys(ar.PASSIVE, OK)


def test_unreadable_nvml_is_unknown_never_ok():
    v = verdicts([stressed(AllFail())])
    assert {k: v[k] for k in ar.PASSIVE} == dict.fromkeys(ar.PASSIVE, UNKNOWN)


@pytest.mark.parametrize("values, check, verdict", [
    ({"ecc_mode": [0, 0]}, "ecc_mode", CRITICAL),
    ({"ecc_mode": [1, 0]}, "ecc_mode", WARN),  # off after the next reboot
    ({"ecc_volatile": 1, "ecc_aggregate": 1}, "ecc_errors", CRITICAL),
    ({"ecc_aggregate": 3}, "ecc_errors", WARN),  # an earlier boot's
    ({"ecc_volatile": NotSupported, "ecc_aggregate": NotSupported}, "ecc_errors", UNKNOWN),
    ({"remapped_rows": (4, 1, 0, 1)}, "memory_retire", CRITICAL),  # a remap failed
    ({"remapped_rows": (4, 1, 1, 0)}, "memory_retire", WARN),  # pending: reset
    ({"remapped_rows": (4, 1, 0, 0)}, "memory_retire", OK),  # remapped is fine
    # A pre-Ampere GPU: pages retired rather than rows remapped; GCM's limit is 10.
    ({"remapped_rows": NotSupported, "retired_pending": 0,
      "retired_pages": {0: [1] * 6, 1: [2] * 5}}, "memory_retire", CRITICAL),
    ({"remapped_rows": NotSupported, "retired_pending": 0,
      "retired_pages": {0: [1] * 5, 1: [2] * 5}}, "memory_retire", OK),
    ({"remapped_rows": NotSupported, "retired_pending": 1,
      "retired_pages": {0: [], 1: [2]}}, "memory_retire", WARN),
    ({"remapped_rows": NotSupported}, "memory_retire", UNKNOWN),
    ({"pcie_width": 8}, "pcie_link", CRITICAL),
    ({"pcie_gen": 4}, "pcie_link", WARN),
    ({"pcie_gen": 4, "pcie_gen_max": 4}, "pcie_link", OK),  # a Gen4 host
    ({"pcie_gen": NotSupported}, "pcie_link", UNKNOWN),
    ({"nvlinks": [1] * 17 + [0]}, "nvlink", WARN),  # down on the only GPU of its model
    ({"nvlinks": []}, "nvlink", NA),  # a PCIe card: every link NOT_SUPPORTED/INVALID
    ({"nvlinks": Unreadable}, "nvlink", UNKNOWN),  # NVML failing otherwise
    ({"power_limit_mw": 500_000}, "power_limit", WARN),
    ({"power_limit_mw": 695_000}, "power_limit", OK),  # within 1%
    ({"power_default_mw": NotSupported}, "power_limit", UNKNOWN),
    ({"temp_slowdown": NotSupported}, "temperature", UNKNOWN),
])
def test_each_passive_rule(values, check, verdict):
    assert verdicts([stressed(FakeNVML(**values))])[check] == verdict


@pytest.mark.parametrize("temps, gpu_max, verdict", [
    ([60] * 19 + [89], 87, CRITICAL),  # the hottest sample reaches slowdown (89)
    ([60] * 19 + [87], 87, WARN),  # max operating temperature
    ([86] * 20, 87, OK),
    ([84] * 20, NotSupported, WARN),  # 5 C under slowdown without the GPU's own figure
    ([83] * 20, NotSupported, OK),
])
def test_temperature_is_the_hottest_reading_of_the_stress(temps, gpu_max, verdict):
    nv = FakeNVML(temp_gpu_max=gpu_max)
    assert verdicts([stressed(nv, temps=temps)])["temperature"] == verdict


HW_THERMAL, SW_POWER_CAP, HW_SLOWDOWN, IDLE = 0x40, 0x4, 0x8, 0x1


@pytest.mark.parametrize("reasons, verdict", [
    ([HW_THERMAL] * 2 + [0] * 18, WARN),  # 10% of the busy readings
    ([HW_THERMAL] * 1 + [0] * 19, OK),  # 5%: a clock change's blip
    ([SW_POWER_CAP] * 20, OK),  # holding TDP: reported, not flagged
    ([HW_SLOWDOWN | SW_POWER_CAP] * 20, WARN),
    ([IDLE] * 20, UNKNOWN),  # no busy reading: nothing to judge
])
def test_throttle_reasons_sampled_during_the_stress(reasons, verdict):
    assert verdicts([stressed(FakeNVML(), reasons=reasons)])["throttle"] == verdict


def test_versions_and_links_are_judged_against_the_fleet():
    recs = [stressed(FakeNVML()) for _ in range(3)]
    recs[1] = stressed(FakeNVML(driver="535.129.03", vbios="96.00.74.00.01",
                                nvlinks=[1] * 17 + [0]))
    for i, r in enumerate(recs):
        r["rank"] = r["local_rank"] = i
    odd, peer = verdicts(recs, rank=1), verdicts(recs, rank=0)
    assert (odd["driver"], odd["vbios"], odd["nvlink"]) == (CRITICAL, WARN, CRITICAL)
    assert (peer["driver"], peer["vbios"], peer["nvlink"]) == (OK, OK, OK)


SXM, A100, PCIE = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe"


def fleet_of(gpus: list[tuple[str, list[int], str]]) -> list[dict]:
    """One record per (host, link states, device name), ranks in order."""
    recs = []
    for i, (host, links, name) in enumerate(gpus):
        r = stressed(FakeNVML(nvlinks=links))
        r.update(rank=i, local_rank=i, host=host, device_name=name)
        recs.append(r)
    return recs


def nvlink_check(recs: list[dict], rank: int) -> dict:
    hosts = sorted({r["host"] for r in recs})
    nodes = [{"host": h, "ranks": [r["rank"] for r in recs if r["host"] == h],
              "busbw_gbps": None, "expected_gbps": None} for h in hosts]
    gpu = next(g for g in judge(recs, nodes, Thresholds())["gpus"]
               if g["rank"] == rank)
    return next(c for c in gpu["checks"] if c["check"] == "nvlink")


UP, DOWN = [1] * 18, [0] * 18


@pytest.mark.parametrize("gpus, rank, verdict, says", [
    # An H100 SXM alone on a bare-metal node, its 18 links reported with state 0: no
    # NVLink in use, not "links down" (the H200 VM answered NotSupported instead).
    ([("a", DOWN, SXM)], 0, NA, "no NVLink in use: 18 links reported, none up"),
    # The same GPU beside another on its node: links that should join them are down.
    ([("a", DOWN, SXM), ("a", DOWN, SXM)], 0, WARN, "none up beside 1 other GPU(s)"),
    # Alone on its node while an 8-GPU node of the fleet has its 18 links up: nothing
    # to link to, not CRITICAL.
    ([("vm", DOWN, SXM)] + [("hgx", UP, SXM)] * 8, 0, NA, "no NVLink in use"),
    ([("vm", [], SXM)] + [("hgx", UP, SXM)] * 8, 0, NA, "no NVLink in use"),
    # Some links up and others down: WARN, alone or not.
    ([("a", [1] * 17 + [0], SXM)], 0, WARN, "1 of 18 reported links down while 17 are up"),
    # Fewer links than the model has, all of them up, beside other GPUs: WARN.
    ([("a", [1] * 12, SXM), ("a", [1] * 12, SXM)], 0, WARN, "the NVIDIA H100 SXM5 80GB "
                                                             "has 18"),
    # ...but an A100's 12 are its model's count.
    ([("a", [1] * 12, A100), ("a", [1] * 12, A100)], 0, OK, ""),
    # A PCIe card whose bridge links are all down beside another card: no NVLink in use.
    ([("a", DOWN, PCIE), ("a", DOWN, PCIE)], 0, NA, "no NVLink in use: 18 links reported"),
    # A GPU of an 8-GPU node with fewer links up than its neighbours: CRITICAL.
    ([("a", [1] * 16 + [0] * 2, SXM)] + [("a", UP, SXM)] * 7, 0, CRITICAL,
     "16 links up, another GPU of this model has 18"),
])
def test_nvlink_is_judged_where_links_are_in_use(gpus, rank, verdict, says):
    c = nvlink_check(fleet_of(gpus), rank)
    assert c["verdict"] == verdict and says in c["why"], c


# ---- active checks: figures against the medians, equality, busbw -------------------------

def measured(rank: int, host: str, tflops: float, gbps: float = 100.0, digest: str = "d",
             mismatches: int = 0, reference_ok: bool = True) -> dict:
    return {"rank": rank, "host": host, "local_rank": rank, "device": "cpu",
            "device_name": "cpu", "nvml": None, "nvml_why": "a CPU rank",
            "stress": {"fp32": {"tflops": tflops, "iterations": 100, "mismatches": mismatches,
                                "digest": digest, "reference_ok": reference_ok,
                                "rel_err": 1e-7, "tol": 2e-5}},
            "copy_gbps": gbps}


@pytest.mark.parametrize("slow, t, verdict", [
    (0.94, Thresholds(), OK),  # 6% under the median of (1, 1, 0.94)
    (0.92, Thresholds(), WARN),  # 8%, over the 7% default
    (0.86, Thresholds(), WARN),  # 14%
    (0.84, Thresholds(), CRITICAL),  # 16%, over 15%
    (0.84, Thresholds(median_critical_pct=20), WARN),  # the thresholds are options
    (0.97, Thresholds(median_warn_pct=2), WARN),
])
def test_matmul_and_copy_against_the_median(slow, t, verdict):
    recs = [measured(0, "a", 1.0), measured(1, "a", 1.0), measured(2, "a", slow, 100 * slow)]
    v = verdicts(recs, rank=2, t=t)
    assert v["matmul_fp32"] == v["copy_bw"] == verdict
    assert verdicts(recs, rank=0, t=t)["matmul_fp32"] == OK


def test_the_node_median_catches_a_gpu_the_fleet_median_hides():
    # Node a's GPUs run 10% faster than the fleet's, but for one at the fleet's median:
    # 0% under the fleet's median (1.0), 9% under its node's (1.1).
    recs = [measured(i, "a", 1.1) for i in range(3)] + [measured(3, "a", 1.0)] + \
           [measured(4 + i, "b", 1.0) for i in range(8)]
    assert verdicts(recs, rank=3)["matmul_fp32"] == WARN
    assert verdicts(recs, rank=4)["matmul_fp32"] == OK


@pytest.mark.parametrize("digests, mismatches, ref_ok, verdict", [
    (["x", "x", "x"], 0, True, OK),
    (["y", "x", "x"], 0, True, CRITICAL),  # differs from the majority
    (["x", "x", "x"], 1, True, CRITICAL),  # one product differs from the first
    (["x", "x", "x"], 0, False, CRITICAL),  # fails the float64 reference
    (["y", "x"], 0, True, WARN),  # two ranks disagree: no telling which
])
def test_silent_data_corruption_rules(digests, mismatches, ref_ok, verdict):
    recs = [measured(i, "a", 1.0, digest=d) for i, d in enumerate(digests)]
    recs[0]["stress"]["fp32"].update(mismatches=mismatches, reference_ok=ref_ok)
    assert verdicts(recs, rank=0)["sdc_fp32"] == verdict


@pytest.mark.parametrize("value, expected, verdict", [
    (362.0, 450.0, OK), (358.0, 450.0, WARN),  # 80.4% and 79.6% of 450
    (226.0, 450.0, WARN), (224.0, 450.0, CRITICAL),  # 50.2% and 49.8%
    (400.0, None, UNKNOWN), (None, 450.0, UNKNOWN),
])
def test_busbw_against_the_expected_link_figure(value, expected, verdict):
    recs = [measured(0, "a", 1.0), measured(1, "a", 1.0)]
    nodes = [{"host": "a", "ranks": [0, 1], "busbw_gbps": value, "expected_gbps": expected}]
    doc = judge(recs, nodes, Thresholds())
    assert doc["nodes"][0]["checks"][0]["verdict"] == verdict


def test_worst_verdict_first_and_gcm_exit_codes():
    recs = [measured(0, "a", 1.0), measured(1, "b", 1.0), measured(2, "b", 1.0, digest="z"),
            measured(3, "b", 1.0)]
    nodes = [{"host": h, "ranks": rs, "busbw_gbps": 300.0, "expected_gbps": 300.0}
             for h, rs in (("a", [0]), ("b", [1, 2, 3]))]
    doc = judge(recs, nodes, Thresholds())
    assert [g["rank"] for g in doc["gpus"]][0] == 2 and doc["nodes"][0]["host"] == "b"
    assert (doc["verdict"], doc["exit_code"]) == (CRITICAL, 2)
    assert [ar.EXIT_CODE[v] for v in (OK, WARN, CRITICAL, UNKNOWN)] == [0, 1, 2, 3]
    assert ar.worst([OK, UNKNOWN]) == UNKNOWN and ar.worst([UNKNOWN, WARN]) == WARN
    assert ar.worst([]) == UNKNOWN
    # N/A (the check does not apply) is never judged: alone it is nothing judged.
    assert ar.worst([OK, NA]) == OK and ar.worst([NA]) == UNKNOWN


def test_a_healthy_one_gpu_pcie_node_is_ok():
    """busbw on a node of one GPU and NVLink on a card with none do not apply: N/A, so
    the node is OK (exit 0), not UNKNOWN (exit 3)."""
    measured_ = measured(0, "node-a", 800.0, gbps=3000.0)
    rec = {**stressed(FakeNVML(nvlinks=[])), "stress": measured_["stress"],
           "copy_gbps": measured_["copy_gbps"]}
    doc = judge([rec], [{"host": rec["host"], "ranks": [0], "busbw_gbps": None,
                         "expected_gbps": 450.0}], Thresholds())
    (node,), (gpu,) = doc["nodes"], doc["gpus"]
    assert node["checks"][0]["verdict"] == NA
    assert {c["check"]: c["verdict"] for c in gpu["checks"]}["nvlink"] == NA
    assert (doc["verdict"], doc["exit_code"]) == (OK, 0)


# ---- the stress itself, on this CPU ------------------------------------------------------

def test_the_stress_catches_one_wrong_element_of_one_product():
    good = matmul_stress("fp32", 0.05, "cpu", n=64)
    bad = matmul_stress("fp32", 0.05, "cpu", n=64, wrong=True)
    assert good.mismatches == 0 and good.reference_ok and good.iterations >= 2
    assert bad.mismatches == 1 and bad.digest == good.digest
    assert good.tflops == pytest.approx(2 * 64**3 / (good.ms_per_call * 1e-3) / 1e12)


# ---- the command line ---------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["--minutes", "1"], "--minutes needs --acceptance"),
    (["--acceptance"], "under torchrun"),
    (["--acceptance", "--minutes", "0"], "--minutes must be a positive number"),
    (["--acceptance", "--median-warn", "20"], "0 <= warn < critical < 100"),
    (["--acceptance", "--busbw-critical", "90"], "0 < critical < warn <= 100"),
    (["--acceptance", "--expected-busbw", "nan"], "--expected-busbw must be"),
])
def test_usage_errors_are_one_line_and_exit_2(argv, says, capsys, monkeypatch):
    for k in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert run_bench.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0]

