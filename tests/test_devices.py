"""Device models for Blackwell (B200, GB200): peaks, ridges, the fp4 roof, detection by
name, and the --list-devices table (docs/design.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benches.sweep import console
from contract import devices
from contract.devices import DEVICES, ROOF_CLASS, ROOF_CLASSES, detect, match_sku

# Dense TFLOP/s per roof class, HBM TB/s, L2 MB, SMs, NVLink GB/s per direction.
BLACKWELL = {
    "b200": ({"fp32": 80, "tf32": 1125, "fp16": 2250, "bf16": 2250, "fp8": 4500, "fp4": 9000},
             8.0, 126, 148, 900),
    "gb200": ({"fp32": 80, "tf32": 1250, "fp16": 2500, "bf16": 2500, "fp8": 5000,
               "fp4": 10000}, 8.0, 126, 148, 900),
}


@pytest.mark.parametrize("key", sorted(BLACKWELL))
def test_blackwell_datasheet_figures(key):
    peaks, hbm, l2, sms, link = BLACKWELL[key]
    d = DEVICES[key]
    assert d.kind == "cuda"
    assert d.peaks_tflops == peaks  # exact: a 2x (sparse vs dense) error fails
    assert (d.hbm_tbps, d.l2_mb, d.sms, d.nvlink_gbps) == (hbm, l2, sms, link)
    assert d.hbm_gbps == 8000.0


def test_blackwell_ridge_points():
    b200, gb200 = DEVICES["b200"], DEVICES["gb200"]
    assert b200.ridge("bf16") == pytest.approx(2250e3 / 8000)  # 281 FLOP/B
    assert b200.ridge("fp16") == b200.ridge("bf16")
    assert b200.ridge("fp32") == pytest.approx(10.0)
    assert b200.ridge("tf32") == pytest.approx(140.625)
    assert b200.ridge("fp8") == pytest.approx(562.5)
    assert b200.ridge("fp4") == pytest.approx(1125.0)
    assert gb200.ridge("bf16") == pytest.approx(312.5)
    assert gb200.ridge("fp4") == pytest.approx(1250.0)
    # Every benchmark dtype's roof exists on Blackwell: fp8e5 (and block-scaled fp8,
    # wherever kernels/spec.py maps it) on the fp8 roof.
    assert b200.peak("fp8e5") == 4500
    for dtype in ROOF_CLASS:
        assert b200.peak(dtype) is not None, dtype


def test_fp4_roof_is_blackwells_only():
    assert "fp4" in ROOF_CLASSES
    assert set(ROOF_CLASS.values()) <= set(ROOF_CLASSES)
    with_fp4 = {k for k, d in DEVICES.items() if d.peak("fp4") is not None}
    assert with_fp4 == {"b200", "gb200"}
    # No borrowed number: an H100 has no fp4 roof and no fp4 ridge.
    assert DEVICES["h100"].peak("fp4") is None and DEVICES["h100"].ridge("fp4") is None


@pytest.mark.parametrize("name, key", [
    ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", "gb200"),  # contains "B200": the superchip's GPU is its own row
    ("NVIDIA B300 SXM6 AC", "gpu"),  # other parts, other peaks: measured
    ("NVIDIA GB300", "gpu"),
    ("NVIDIA B100", "gpu"),
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
])
def test_match_sku_names(name, key):
    assert match_sku(name) == key


def test_detect_a_b200_from_torchs_device_properties(monkeypatch):
    """The CUDA device properties a B200 reports (name, 148 SMs, 126.5 MiB of L2), faked at
    torch.cuda, are detected as the b200 model."""
    props = SimpleNamespace(name="NVIDIA B200", multi_processor_count=148,
                            L2_cache_size=int(126.5 * 2**20), major=10, minor=0,
                            total_memory=int(178.35e9))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    p = detect()
    assert (p.key, p.kind, p.capability, p.sms) == ("b200", "cuda", (10, 0), 148)
    assert p.l2_mb == pytest.approx(126.5)
    model, warnings = devices.resolve("auto", p)
    assert model is DEVICES["b200"] and not warnings


def _table(out: str, title_start: str) -> dict[str, dict[str, str]]:
    """Rows of one rich table of `out` (the one whose title starts with title_start), as
    {key: {column: cell}}; a cell folded over several lines is joined with spaces."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip().startswith(title_start))
    head = next(i for i in range(start, len(lines)) if lines[i].lstrip().startswith("┃"))
    cols = [c.strip() for c in lines[head].split("┃")[1:-1]]
    rows: dict[str, dict[str, str]] = {}
    key = None
    for ln in lines[head + 2:]:
        if not ln.lstrip().startswith("│"):
            break
        cells = [c.strip() for c in ln.split("│")[1:-1]]
        if cells[0]:
            key = cells[0]
            rows[key] = dict(zip(cols, cells, strict=True))
        else:  # a folded continuation line
            for c, v in zip(cols, cells, strict=True):
                if v:
                    rows[key][c] = f"{rows[key][c]} {v}".strip()
    return rows


def test_list_devices_shows_blackwell_peaks_and_ridges(capsys):
    console.print_devices()
    out = capsys.readouterr().out
    peaks = _table(out, "Device models")
    for key, (want, hbm, l2, sms, link) in BLACKWELL.items():
        row = peaks[key]
        assert {c: float(row[c]) for c in want} == want
        assert (float(row["HBM TB/s"]), float(row["L2 MB"]), int(row["SMs"])) == (hbm, l2, sms)
        assert row["NVLink GB/s"] == f"{link} per direction"
    assert peaks["h100"]["fp4"] == "-" and peaks["h100"]["fp8"] == "1978.9"
    assert peaks["a100"]["fp8"] == "-"
    ridges = _table(out, "Ridge points")
    assert ridges["b200"]["ridge FLOP/B"] == \
        "fp32 10, tf32 141, fp16/bf16 281, fp8 562, fp4 1125"
    assert ridges["gb200"]["ridge FLOP/B"] == \
        "fp32 10, tf32 156, fp16/bf16 312, fp8 625, fp4 1250"
    assert ridges["h100"]["ridge FLOP/B"] == "fp32 20, tf32 148, fp16/bf16 295, fp8 591"
    assert "measured" in ridges["cpu"]["ridge FLOP/B"]
    # The caption says which dtypes share a roof, from kernels/spec.py's mapping.
    assert "fp8: fp8, fp8e5" in " ".join(out.split())
