"""The TypedDicts that name the JSON objects the records write hold the records' own
fields, in order: a field added to a record without its JSON shape fails here."""

from __future__ import annotations

from dataclasses import fields

import pytest

from benches.fleet import acceptance_json as aj
from benches.fleet import acceptance_records as ar
from benches.inspect import inspected as ins
from benches.rehearse import rehearsal, rehearsal_report, tuning_record
from benches.sweep import energy_counter, gpu_monitor
from contract import meta_parts
from contract.request import AcceptanceOptions


@pytest.mark.parametrize("record, shape", [
    (ar.Stress, aj.StressJson), (ar.StressNvml, aj.StressNvmlJson), (ar.Check, aj.CheckJson),
    (ar.GpuVerdict, aj.GpuVerdictJson), (ar.RankRecord, aj.RankRecordJson),
    (AcceptanceOptions, aj.AcceptanceOptionsJson), (ins.Compiled, ins.CompiledJson),
    (ins.InspectMeta, ins.InspectMetaJson),
    (rehearsal.KernelCount, rehearsal_report.KernelCountJson),
    (rehearsal.Failure, rehearsal_report.FailureJson),
    (rehearsal.ArchReport, rehearsal_report.ArchReportJson),
    (tuning_record.Dropped, rehearsal_report.DroppedJson),
    (tuning_record.TuneKey, rehearsal_report.TuneKeyJson),
    (gpu_monitor.MonitorSummary, meta_parts.DuringRun)])
def test_a_records_json_shape_is_its_fields(record, shape) -> None:
    assert list(shape.__annotations__) == [f.name for f in fields(record)]


def test_an_nvml_reading_adds_the_pcie_link_read_under_load() -> None:
    names = [f.name for f in fields(ar.NvmlReading) if f.name != "pcie"]
    assert list(aj.NvmlReadingJson.__annotations__) == [*names, "pcie_gen", "pcie_width"]
    assert set(aj.NvmlReadingJson.__optional_keys__) == {"pcie_gen", "pcie_width"}


def test_the_counter_probe_adds_how_it_was_read() -> None:
    names = [f.name for f in fields(energy_counter.CounterProbe)]
    assert list(meta_parts.CounterProbe.__annotations__) == [*names, "how"]


def test_the_monitors_summary_is_written_as_during_run_holds_it() -> None:
    m = gpu_monitor.MonitorSummary(3, 1, 4, 0.01, 1005.0, 1980.0, 1980.0, 512.5, 0.25,
                                   ("SW_POWER_CAP",))
    assert m.to_json() == {
        "readings": 3, "readings_idle": 1, "readings_all": 4, "interval_s": 0.01,
        "sm_clock_mhz_min": 1005.0, "sm_clock_mhz_median": 1980.0,
        "sm_clock_mhz_max": 1980.0, "power_w_max": 512.5, "throttled_fraction": 0.25,
        "throttle_reasons_seen": ["SW_POWER_CAP"]}
    assert list(m.to_json()) == list(meta_parts.DuringRun.__annotations__)
