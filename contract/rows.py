"""A run's rows and ceilings as the figures and summary.md read them: clean numeric
rows, the ok rows, each row's roof class, and the datasheet and measured ceilings
(Ceiling) the run was held against; a typed row's cache-mode tag and name.

The metadata is read typed (contract/run_meta.py RunMeta); run_ceilings, which the plan's
figures still hand a ceilings document, takes either and reads the JSON through the one
loader (parse_meta).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from contract.ceilings import no_roofs
from contract.devices import DEVICES, ROOF_CLASS, ROOF_CLASSES
from contract.meta_parts import CompiledAhead
from contract.run_meta import RunMeta, parse_meta
from kernels import PROVIDERS
from kernels.spec import DTYPE_NAMES

DTYPE_ORDER: tuple[str, ...] = DTYPE_NAMES  # kernels.spec's order: plain, then block-scaled

PROVIDER_ORDER: tuple[str, ...] = PROVIDERS  # kernels.PROVIDERS' order


# The kernel facts below come from the registry, on call and never at import: loading it
# decorates the Triton kernels, which fixes for the whole process whether they are
# interpreted (kernels/__init__.py), and a reader of saved runs must not decide that for
# the command that imported it.  Not cached: a test's registry entry counts at once.
def kernel_order() -> tuple[str, ...]:
    """The canonical kernel order: the registry's.  A saved run's kernels that the
    registry no longer has (an older run's) go after these (canonical_order)."""
    from kernels import REGISTRY

    return tuple(REGISTRY)


def compute_kernels() -> frozenset[str]:
    """The kernels held against compute roofs, on the tensor cores (KernelSpec.matrix_unit):
    the GEMMs; every other kernel is memory-bound by design."""
    from kernels import REGISTRY

    return frozenset(name for name, spec in REGISTRY.items() if spec.matrix_unit)

_NUMERIC = (
    "flops", "bytes", "intensity", "ms_median", "ms_p20", "ms_p80", "n_samples", "tflops",
    "gbps", "peak_tflops", "peak_gbps", "roof_tflops", "mfu", "pct_roof", "rel_err",
    "meas_peak_tflops", "meas_peak_gbps", "meas_roof_tflops", "pct_meas_roof", "tolerance",
)


def clean_rows(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with numeric columns coerced (JSON nulls and stray strings become NaN),
    intensity filled from flops/bytes where missing, and roof_class filled in for rows
    written before that column existed."""
    out = df.copy()
    for col in _NUMERIC:
        if col in out.columns:
            out[col] = pd.to_numeric(out[col], errors="coerce")
    for col in ("kernel", "provider", "dtype", "shape", "status", "reason"):
        if col not in out.columns:
            out[col] = None
    if "flops" in out.columns and "bytes" in out.columns:
        with np.errstate(divide="ignore", invalid="ignore"):
            derived = out["flops"] / out["bytes"].where(out["bytes"] > 0)
        out["intensity"] = out["intensity"].fillna(derived) if "intensity" in out else derived
    if "roof_class" not in out.columns:
        out["roof_class"] = None
    missing = out["roof_class"].isna()
    if missing.any():
        out.loc[missing, "roof_class"] = [
            row_roof_class(k, d) for k, d in zip(out.loc[missing, "kernel"],
                                                  out.loc[missing, "dtype"], strict=True)
        ]
    return out


def row_roof_class(kernel: str, dtype: str) -> str:
    """The roof a row is held against when the row does not say: GEMMs run on the
    dtype's tensor cores, every other kernel on the fp32 vector units."""
    if kernel in compute_kernels():
        return ROOF_CLASS.get(dtype, dtype)
    return "fp32"


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that can be plotted: status ok with a positive, finite intensity and TFLOP/s.

    Failed rows are excluded on purpose: a wrong kernel must never look fast."""
    if df.empty or "status" not in df.columns:
        return df.iloc[0:0]
    d = df[df["status"] == "ok"]
    for col in ("intensity", "tflops"):
        if col not in d.columns:
            return d.iloc[0:0]
        d = d[np.isfinite(d[col].astype(float)) & (d[col].astype(float) > 0)]
    return d


def canonical_order(values: Iterable[Any], order: Iterable[str]) -> list[str]:
    """Known values in canonical order, then unknown ones sorted (new kernels/dtypes)."""
    present = {str(v) for v in values if isinstance(v, str) and v}
    known = [v for v in order if v in present]
    return known + sorted(present - set(known))


def is_throttled(v: Any) -> bool:
    """A row's `throttled` cell as a bool: True (Python's or numpy's, as pandas gives a
    bool column's cells) or the text "true" (a CSV round trip); anything else, None and
    NaN included, is not throttled."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    return isinstance(v, str) and v.strip().lower() == "true"


def positive_float(x: Any) -> float | None:
    """x as a positive finite float, else None (nulls, NaN, zero, junk); strings of
    numbers count, as a CSV or JSON reader may hand them over."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


@dataclass(frozen=True)
class TritonBuilds:
    """The Triton kernels a run built or loaded: by its own process (metadata.
    triton_compiles: `compiled`, built; `from_cache`, loaded from Triton's cache) and by
    its compile-ahead workers (compiled_ahead.kernels_built), and the seconds its sweep
    waited for those workers (compiled_ahead.waited_s); 0 where not recorded."""

    built: int
    from_cache: int
    built_ahead: int
    waited_s: float = 0.0

    @property
    def cold(self) -> bool:
        """Triton's cache was cold: the run or its workers built a kernel (loading one
        from the cache is not building it)."""
        return bool(self.built or self.built_ahead)

    @classmethod
    def of(cls, meta: RunMeta) -> TritonBuilds:
        def count(doc: Any, key: str) -> int:
            return int(positive_float(doc.get(key)) or 0) if isinstance(doc, dict) else 0

        compiles = meta.compiles
        own, ahead = compiles.triton_compiles, compiles.compiled_ahead
        waited = positive_float(ahead.get("waited_s")) if isinstance(ahead, dict) else None
        return cls(count(own, "compiled"), count(own, "from_cache"),
                   count(ahead, "kernels_built"), waited or 0.0)


def compiled_ahead_text(ahead: CompiledAhead) -> str:
    """What the compile-ahead workers did (metadata.compiled_ahead, triton_cache.
    CompileAhead.record): "183 of 183 cases (178 kernels, 178 built) by 8 workers, 9.4 s
    after the ceilings", with the cases that failed and why the wait ended early."""
    def n(key: str, word: str) -> str:
        count = ahead.get(key) or 0
        return f"{count} {word}" + ("" if count == 1 else "s")

    why, waited = ahead.get("wait_ended"), ahead.get("waited_s")
    failed = f", {n('cases_failed', 'case')} failed" if ahead.get("cases_failed") else ""
    return (f"{ahead.get('cases_done', 0)} of {n('cases', 'case')} "
            f"({n('kernels_compiled', 'kernel')}, {ahead.get('kernels_built', 0)} built"
            f"{failed}) by {n('workers', 'worker')}"
            + (f", {waited:.1f} s after the ceilings" if isinstance(waited, int | float)
               else "") + ("" if why in (None, "done") else f" (ended: {why})"))


@dataclass(frozen=True)
class Ceiling:
    """One set of ceilings (datasheet or measured) of a run."""

    source: str  # "datasheet" or "measured"
    tflops: dict[str, float] = field(default_factory=dict)  # roof class -> TFLOP/s
    hbm_gbps: float | None = None
    l2_gbps: float | None = None
    # Measured classes that are no roof (ceilings.no_roofs), with the TFLOP/s measured:
    # left out of `tflops`, kept so readers can say why those rows have none.
    no_roof: dict[str, float] = field(default_factory=dict)

    def ridge(self, roof_class: str) -> float | None:
        """FLOP/byte where the HBM slope meets this roof (TFLOP/s / GB/s x 1e3)."""
        peak = self.tflops.get(roof_class)
        if peak is None or not self.hbm_gbps:
            return None
        return peak * 1e3 / self.hbm_gbps


def _ceiling_from(source: str, doc: Any) -> Ceiling | None:
    if not isinstance(doc, dict):
        return None
    raw = doc.get("tflops") or {}
    tflops = {str(k): v for k, v in ((k, positive_float(v)) for k, v in raw.items())
              if v is not None} if isinstance(raw, dict) else {}
    # A measured class under 0.1x fp32's rate is no roof (ceilings.no_roofs).
    no_roof = {rc: tflops.pop(rc) for rc in no_roofs(tflops)} if source == "measured" else {}
    c = Ceiling(source, tflops, positive_float(doc.get("hbm_gbps")),
                positive_float(doc.get("l2_gbps")), no_roof)
    return c if (c.tflops or c.hbm_gbps or c.l2_gbps) else None


def run_ceilings(meta: RunMeta | Mapping[str, Any],
                 df: pd.DataFrame | None = None) -> dict[str, Ceiling]:
    """{"datasheet": Ceiling, "measured": Ceiling}, each present only when known.

    Reads the metadata's ceilings (format in benches/measured_ceilings.py) as written once the run
    measured them (`ceilings_ready`, or any value in it: a source left empty then was
    none).  A run without them there (written before that key, or cut short before its
    ceilings reached results.json: its rows, read from the journal, carry them) falls
    back on the device table for the datasheet and on the rows' meas_peak_* columns for
    the measured values."""
    out: dict[str, Ceiling] = {}
    m = typed_meta(meta)
    ceil = m.ceilings
    if m.ceilings_ready or any(ceil.get(s) for s in ("datasheet", "measured")):
        for source in ("datasheet", "measured"):
            c = _ceiling_from(source, ceil.get(source))
            if c is not None:
                out[source] = c
        return out
    dev = DEVICES.get(str(m.device.device_key or ""))
    if dev is not None and dev.peaks_tflops:
        out["datasheet"] = Ceiling("datasheet", dict(dev.peaks_tflops), dev.hbm_gbps)
    if df is not None and not df.empty and "meas_peak_tflops" in df.columns:
        d = clean_rows(df)
        peaks = d.dropna(subset=["meas_peak_tflops"]).groupby("roof_class")["meas_peak_tflops"]
        tflops = {str(k): float(v) for k, v in peaks.max().items() if positive_float(v)}
        gbps = positive_float(d["meas_peak_gbps"].max()) if "meas_peak_gbps" in d.columns else None
        if tflops or gbps:
            out["measured"] = Ceiling("measured", tflops, gbps)
    return out


def l2_bytes(meta: RunMeta) -> float | None:
    """L2 size in bytes from the metadata's l2_mb, else the device table (MiB, as CUDA
    reports)."""
    mb = positive_float(meta.device.l2_mb)
    if mb is None:
        dev = DEVICES.get(str(meta.device.device_key or ""))
        mb = positive_float(dev.l2_mb) if dev is not None else None
    return None if mb is None else mb * 2**20


def panel_classes(rows: pd.DataFrame) -> list[str]:
    return canonical_order(rows["roof_class"].dropna().unique(), ROOF_CLASSES)


def typed_meta(meta: RunMeta | Mapping[str, Any]) -> RunMeta:
    """The metadata as a record: a RunMeta as it is, the JSON form (results.json's
    "metadata", as callers that have not moved to RunMeta hand it) through parse_meta."""
    return meta if isinstance(meta, RunMeta) else parse_meta(meta)
