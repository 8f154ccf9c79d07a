"""Ceilings: datasheet peaks beside measured ones.

Metadata format (results.json's metadata.ceilings, RunMeta.ceilings):

    {
      "datasheet": {"tflops": {"fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4,
                               "fp8": 1978.9},
                    "hbm_gbps": 3350.0, "l2_gbps": null}        # or null (CPU, unlisted GPU)
      "measured":  {"tflops": {"fp32": ..., "bf16": ...},     # classes that were measured
                    "hbm_gbps": ..., "l2_gbps": ..., "method": {...}, "measured_at": "...",
                    "left_out": {"hbm": "the copy of 256 MiB failed: ...", ...}}
                                                               # or null when not measured
    }

`left_out` names each ceiling whose measurement failed or was not believable (a cache
copy below the DRAM copy on a busy host), with why ("all": the whole measurement); its
value is then null or absent, `method[name]` says "left out: <why>" (summary.md prints
it), and the measurement is not cached.  Written since the ceilings phase stopped
aborting runs; older runs have no `left_out`.

Rows use the datasheet value where there is one (peak_tflops, peak_gbps) and the
measured one beside it (meas_peak_tflops, meas_peak_gbps); a device without a datasheet
uses the measured values for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.devices import DeviceModel
from contract.meta_parts import CeilingsJson, Datasheet, Measured


@dataclass
class Ceilings:
    datasheet: Datasheet | None
    measured: Measured | None

    def to_json(self) -> CeilingsJson:
        return {"datasheet": self.datasheet, "measured": self.measured}

    @classmethod
    def from_json(cls, doc: Any) -> Ceilings:
        """A run's RunMeta.ceilings (results.json's metadata.ceilings) back; a source it
        lacks (or holds as anything but an object) is None."""
        doc = doc if isinstance(doc, dict) else {}
        return cls(*(d if isinstance(d := doc.get(s), dict) else None
                     for s in ("datasheet", "measured")))

    @property
    def measured_s(self) -> float:
        """Seconds the measurement took (0 where it did not say, or none was made)."""
        return float((self.measured or {}).get("seconds") or 0.0)

    @property
    def measured_at(self) -> str:
        """When the measurement was made, ISO 8601 ("" where it did not say)."""
        return str((self.measured or {}).get("measured_at") or "")

    def _pick(self, section: Datasheet | Measured | None, roof_class: str) -> float | None:
        tflops = (section or {}).get("tflops", {})
        if section is self.measured and roof_class in no_roofs(tflops):
            return None
        return tflops.get(roof_class)

    def no_roofs(self) -> dict[str, str]:
        """The measured classes that are no roof (see no_roofs), with why."""
        return no_roofs((self.measured or {}).get("tflops") or {})

    def peak_tflops(self, roof_class: str) -> float | None:
        """The peak a row is held against: datasheet where there is one, else measured."""
        ds = self._pick(self.datasheet, roof_class)
        return ds if ds is not None else self._pick(self.measured, roof_class)

    def peak_gbps(self) -> float | None:
        ds = (self.datasheet or {}).get("hbm_gbps")
        return ds if ds is not None else (self.measured or {}).get("hbm_gbps")

    def meas_tflops(self, roof_class: str) -> float | None:
        return self._pick(self.measured, roof_class)

    def meas_gbps(self) -> float | None:
        return (self.measured or {}).get("hbm_gbps")


def datasheet_of(model: DeviceModel) -> Datasheet | None:
    if not model.peaks_tflops and model.hbm_tbps is None:
        return None
    return {"tflops": dict(model.peaks_tflops), "hbm_gbps": model.hbm_gbps, "l2_gbps": None}


# A reduced-precision class measured below this fraction of fp32's rate is no roof.
# 10x leaves room for a loaded host's noise (2-3x between two measurements) and for
# converting paths that still run near fp32 (fp8 torch._scaled_mm on a CPU: half fp32's
# rate), while a software path is far below it (fp16 matmul on a CPU: 66x slower than
# fp32; a CPU without fp8 support: 7,000x).  Where: docs/measurement.md.
NO_ROOF_BELOW_FP32 = 0.1


def no_roofs(tflops: dict[str, float]) -> dict[str, str]:
    """Measured compute ceilings that are no roof, each with why: a reduced-precision
    class (tf32, fp16, bf16, fp8) measured more than 10x slower than fp32 has no unit of
    its own on this device (the library emulates it in software), so its rate says how
    slow that path is, not what the hardware can do; MFU against it would call a
    crawling kernel efficient (fp8 matmul at 40% "MFU" of a 3.8e-5 TFLOP/s ceiling).
    Rows of such a class get no compute roof (no MFU), and it is not plotted."""
    fp32 = tflops.get("fp32")
    if not fp32:
        return {}
    return {rc: (f"measured {v:.3g} TFLOP/s, under {NO_ROOF_BELOW_FP32:g}x fp32's "
                 f"{fp32:.3g}: no {rc} unit on this device (an emulated path), so no MFU "
                 "against it")
            for rc, v in tflops.items() if rc != "fp32" and v < NO_ROOF_BELOW_FP32 * fp32}
