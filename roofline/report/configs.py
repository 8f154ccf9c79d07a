"""python -m roofline configs RUN [RUN ...] --out kernels/configs/<device>.json

The tuned configs a GPU model's runs found, written as the file a sweep on that model
runs without tuning (kernels/shipped.py: its format and how a run picks it).

Only ok Triton rows count, and only their launches that tune today (more than one
candidate); each row's `config` column is read launch by launch against the launches a
GPU of the run's architecture builds today (on meta tensors, at the run's SM count and
fp8 accumulation mode).  A part whose launch no longer exists, or whose config is no
longer one of its candidates, is dropped with a count, never written.  When rows of one
bucket disagree (another run, another cache mode), the cold row with the lowest median
wins.  Runs of different device models are refused.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from contract.record import RunRow
from contract.run_meta import RunMeta
from contract.schema import RunDoc, RunLoadError, load_doc, parse_shape
from kernels import REGISTRY
from kernels.shipped import ShippedDevice, ShippedEntry, bucket_text, document, find_candidate
from kernels.spec import Target, TritonLaunch, fp8_accum, interpreter_enabled, set_fp8_accum

USAGE = "python -m roofline configs RUN [RUN ...] --out kernels/configs/<device>.json"


class ConfigsError(ValueError):
    """Runs that cannot make one shipped file (one-line message)."""


@dataclass
class Collected:
    """The winners found, and what was left out and why (counts)."""

    device: ShippedDevice
    runs: list[str]
    entries: dict[tuple[str, str, str, str], tuple[tuple[bool, float], ShippedEntry]] = \
        field(default_factory=dict)
    dropped: Counter[str] = field(default_factory=Counter)

    def add(self, entry: ShippedEntry, rank: tuple[bool, float]) -> None:
        old = self.entries.get(entry.key)
        if old is None or rank < old[0]:
            self.entries[entry.key] = (rank, entry)


def _device_of(meta: RunMeta, where: str) -> ShippedDevice:
    dev = meta.device
    name, sms, mem = dev.device_name, dev.sms, dev.gpu_memory_gb
    if dev.device_kind != "cuda" or not name or not sms or not mem:
        raise ConfigsError(f"{where} is not a GPU run (its metadata lacks device_name, "
                           "sms or gpu_memory_gb)")
    return ShippedDevice(str(name), int(sms), float(mem), meta.compiles.tuning_identity)


def _launches(kernel: str, dtype: str, shape: str, sms: int,
              capability: tuple[int, int]) -> list[TritonLaunch]:
    spec = REGISTRY[kernel]
    inputs = spec.make_inputs(parse_shape(shape), dtype, 0, "meta")
    return spec.launches(inputs, spec.alloc_out(inputs, dtype), sms,
                         Target("cuda", capability))


def _parts(text: str) -> list[tuple[str, str]]:
    """A `config` cell as (launch name, config text) pairs."""
    out = []
    for part in (p.strip() for p in text.split("; ")):
        name, _, rest = part.partition("[")
        if part and rest.endswith("]"):
            out.append((name, rest[:-1]))
    return out


def collect(runs: list[str]) -> Collected:
    """The winning configs of `runs` (module docstring)."""
    loaded = [(run, load_doc(run)) for run in runs]
    devices = [_device_of(doc.meta, run) for run, doc in loaded]
    for (run, _), device in zip(loaded, devices, strict=True):
        why = devices[0].mismatch(device.device_name, device.sms, device.gpu_memory_gb)
        if why is not None:
            raise ConfigsError(f"{run} is another device model than {runs[0]} ({why})")
    if interpreter_enabled():
        # The interpreter sets constexprs a compiled GPU launch does not (MBITS): its
        # buckets would never match a GPU's.
        raise ConfigsError("TRITON_INTERPRET=1 is set: the buckets must be a compiled "
                           "GPU launch's (run without it)")
    # The tuning identity of the first run that recorded one.
    identity = next((d.tuning_identity for d in devices if d.tuning_identity), None)
    collected = Collected(replace(devices[0], tuning_identity=identity), [])
    mode = fp8_accum()
    try:
        for (run, doc), device in zip(loaded, devices, strict=True):
            run_id = str(doc.meta.provenance.run_id or Path(run).name)
            collected.runs.append(run_id)
            cap = doc.meta.device.capability or (9, 0)
            set_fp8_accum(str(doc.meta.settings.fp8_accum or "fast"))
            _collect_run(collected, doc, run_id, device.sms, (int(cap[0]), int(cap[1])))
    finally:
        set_fp8_accum(mode)
    return collected


def _triton_rows(doc: RunDoc) -> list[RunRow]:
    """The run's ok Triton rows that recorded their configs."""
    return [r for r in doc.rows if r.case.provider == "triton" and r.ok and r.build.config]


def _collect_run(collected: Collected, doc: RunDoc, run_id: str, sms: int,
                 capability: tuple[int, int]) -> None:
    for row in _triton_rows(doc):
        case = row.case
        if case.kernel not in REGISTRY:
            collected.dropped["kernel no longer registered"] += 1
            continue
        today = {ln.name: ln for ln in _launches(case.kernel, case.dtype, case.shape,
                                                 sms, capability)}
        ms = float(row.timing.ms_median) if row.timing.ms_median is not None else math.nan
        rank = (case.cache != "cold", ms)
        for name, cfg_text in _parts(row.build.config or ""):
            launch = today.get(name)
            if launch is None:
                collected.dropped["launch no longer made"] += 1
            elif len(launch.configs) == 1:
                collected.dropped["launch has one candidate today (nothing to tune)"] += 1
            else:
                try:
                    find_candidate(launch, cfg_text)
                except ValueError:
                    collected.dropped["config no longer a candidate"] += 1
                    continue
                collected.add(ShippedEntry(case.kernel, name, case.dtype,
                                           bucket_text(launch), cfg_text, run_id, ms), rank)


def write(collected: Collected, out: Path) -> int:
    """The file at `out`; the number of configs written."""
    entries = [e for _, e in collected.entries.values()]
    doc = document(collected.device, entries, collected.runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return len(entries)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {USAGE}\n{__doc__}")
        return 0 if argv else 2
    runs, out, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a == "--out" and i + 1 < len(argv):
            out, i = Path(argv[i + 1]), i + 2
            continue
        if a.startswith("-"):
            print(f"error: unknown option {a} (usage: {USAGE})", file=sys.stderr)
            return 2
        runs.append(a)
        i += 1
    if out is None or not runs:
        what = "--out is required" if out is None else "expected at least one RUN"
        print(f"error: {what} (usage: {USAGE})", file=sys.stderr)
        return 2
    try:
        collected = collect(runs)
        n = write(collected, out)
    except (ConfigsError, RunLoadError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dropped = ", ".join(f"{v} {k}" for k, v in sorted(collected.dropped.items()))
    print(f"{out}: {n} configs of {collected.device.device_name} from "
          f"{len(collected.runs)} runs" + (f"; dropped: {dropped}" if dropped else ""))
    return 0
