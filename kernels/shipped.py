"""Tuned configs shipped in the repository, one file per GPU model
(kernels/configs/<device>.json), so that a sweep on a fresh machine (a CI runner) runs
each tuned launch's known winner instead of autotuning it on its first call.

A file holds the device it was measured on, as a run's metadata records it
(device_name, sms, gpu_memory_gb, and the tuning identity where the run recorded one),
and one entry per (kernel, launch name, dtype, bucket): the config that won there.  The
bucket is the autotuner's own key for the launch (kernels/tuning.py tuning_key: the
declared tune_key values, then every constexpr) written as text, "M=4096,N=4096,K=4096,
PRECISION=tf32,SCALED=False,FP8_FAST=True,MBITS=0": `name=value` in tuning_key's order,
values as kernels.tuning.plain writes them, "," between.  The constexprs are those of a
compiled GPU launch (the CPU interpreter sets MBITS; its buckets never match a GPU's).

The file is chosen here, from plain values (the sweep passes what it read of the device
present), because which configs suit a GPU model is a fact about the kernels; the sweep
(benches/sweep/runner.py) passes the chosen config down to run_launch_with.  A file of
another device is never used: shipped_for says which file was used or why none was.
Written by `python -m roofline configs RUN ... --out kernels/configs/<device>.json`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from kernels.shipped_json import (
    ShippedDeviceJson,
    ShippedEntryJson,
    ShippedFileJson,
    ShippedUseJson,
)
from kernels.spec import TritonLaunch
from kernels.triton_utils import find_config
from kernels.tuning import plain, tuning_values

CONFIG_DIR = Path(__file__).parent / "configs"
FORMAT = 1
# Memory as torch reports it moves a little with the driver and ECC reservations; a
# model's SM count and name are exact.  Within 2 % it is the same model.
MEMORY_TOLERANCE = 0.02
# The one place the retune request is read (run_bench.py's --retune sets it).
RETUNE_ENV = "GPUBENCH_RETUNE"

EntryKey = tuple[str, str, str, str]  # (kernel, launch name, dtype, bucket)


def retune_requested() -> bool:
    """Whether this run tunes even where a shipped config applies (GPUBENCH_RETUNE=1):
    the row then says how much slower the shipped config was than the tuned one."""
    return os.environ.get(RETUNE_ENV, "") == "1"


def bucket_text(launch: TritonLaunch) -> str:
    """The launch's tuning bucket as text (module docstring)."""
    return ",".join(f"{k}={plain(v)}" for k, v in tuning_values(launch).items())


@dataclass(frozen=True)
class ShippedDevice:
    """The GPU a file's configs were measured on (a run's metadata's names)."""

    device_name: str
    sms: int
    gpu_memory_gb: float
    tuning_identity: str | None = None

    def mismatch(self, name: str, sms: int | None, memory_gb: float | None) -> str | None:
        """Why the device present is not this one (None: it is)."""
        if name != self.device_name:
            return f"name {name!r}, not {self.device_name!r}"
        if sms != self.sms:
            return f"{sms} SMs, not {self.sms}"
        if memory_gb is None or abs(memory_gb - self.gpu_memory_gb) > \
                MEMORY_TOLERANCE * self.gpu_memory_gb:
            return f"{memory_gb} GB of memory, not {self.gpu_memory_gb:.1f}"
        return None

    def to_json(self) -> ShippedDeviceJson:
        return {"device_name": self.device_name, "sms": self.sms,
                "gpu_memory_gb": self.gpu_memory_gb, "tuning_identity": self.tuning_identity}


@dataclass(frozen=True)
class ShippedEntry:
    """One winning config: where it applies, its text (config_str), and the row it
    came from (run id and that row's median time, for reference)."""

    kernel: str
    launch: str
    dtype: str
    bucket: str
    config: str
    run: str = ""
    ms: float | None = None

    @property
    def key(self) -> EntryKey:
        return (self.kernel, self.launch, self.dtype, self.bucket)

    def to_json(self) -> ShippedEntryJson:
        return {"kernel": self.kernel, "launch": self.launch, "dtype": self.dtype,
                "bucket": self.bucket, "config": self.config, "run": self.run,
                "ms": self.ms}


@dataclass
class ShippedConfigs:
    """A shipped file as read; `dropped` counts its entries found at run time not to be
    a candidate of today's launch (never run)."""

    path: Path
    device: ShippedDevice
    entries: dict[EntryKey, ShippedEntry]
    runs: list[str] = field(default_factory=list)
    dropped: int = 0

    def pick(self, kernel: str, dtype: str, launch: TritonLaunch) -> tuple[Any, str]:
        """(the shipped config of `launch` in this row, None if none applies; why not)."""
        entry = self.entries.get((kernel, launch.name, dtype, bucket_text(launch)))
        if entry is None:
            return None, f"no shipped config for {launch.name} at this bucket ({self.path.name})"
        try:
            return find_candidate(launch, entry.config), ""
        except ValueError:
            self.dropped += 1
            return None, (f"shipped {launch.name}[{entry.config}] is not a candidate of "
                          f"today's launch: dropped ({self.path.name})")


def find_candidate(launch: TritonLaunch, text: str) -> Any:
    """The candidate of `launch` written as `text`; ValueError if it is not one (its
    interpreter config does not count: a GPU never autotunes over it)."""
    cfg = find_config(launch, text)
    if cfg not in launch.configs:
        raise ValueError(f"{launch.name} has no candidate {text}")
    return cfg


def document(device: ShippedDevice, entries: list[ShippedEntry], runs: list[str]
             ) -> ShippedFileJson:
    """A shipped file's JSON: entries sorted by their key, so that a file written twice
    from the same runs is the same."""
    return {"format": FORMAT, "device": device.to_json(), "runs": runs,
            "configs": [e.to_json() for e in sorted(entries, key=lambda e: e.key)]}


def read_shipped(path: Path) -> ShippedConfigs:
    """A shipped file; ValueError naming the file when it is not one."""
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, not {FORMAT}")
        d = doc["device"]
        device = ShippedDevice(str(d["device_name"]), int(d["sms"]),
                               float(d["gpu_memory_gb"]), d.get("tuning_identity"))
        entries = [ShippedEntry(e["kernel"], e["launch"], e["dtype"], e["bucket"],
                                e["config"], e.get("run", ""), e.get("ms"))
                   for e in doc["configs"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a shipped configs file ({e})") from e
    return ShippedConfigs(path, device, {e.key: e for e in entries}, list(doc.get("runs", [])))


@dataclass(frozen=True)
class ShippedChoice:
    """The shipped file a run uses (None: none) and, when none, why."""

    configs: ShippedConfigs | None
    reason: str

    def to_json(self) -> ShippedUseJson:
        """For a run's metadata: which file was used, or why none."""
        c = self.configs
        return {"file": f"kernels/configs/{c.path.name}" if c else None,
                "reason": self.reason, "entries": len(c.entries) if c else 0,
                "dropped": c.dropped if c else 0}


@cache
def shipped_for(name: str, sms: int | None, memory_gb: float | None,
                directory: Path = CONFIG_DIR) -> ShippedChoice:
    """The shipped file of the device present (name, SM count, memory), read once per
    process; a file of another device is never chosen, and the reason names each file
    looked at and why it did not match."""
    why: list[str] = []
    for path in sorted(directory.glob("*.json")):
        try:
            shipped = read_shipped(path)
        except ValueError as e:
            why.append(str(e))
            continue
        mismatch = shipped.device.mismatch(name, sms, memory_gb)
        if mismatch is None:
            return ShippedChoice(shipped, f"device matches {path.name}")
        why.append(f"{path.name}: {mismatch}")
    return ShippedChoice(None, "no shipped configs for this device" +
                         (f" ({'; '.join(why)})" if why else f" (none in {directory})"))
