"""The JSON shapes of kernels/shipped.py: a shipped configs file (kernels/configs/*.json)
and the run's record of which file it used (its metadata's `shipped_configs`), apart
from kernels/shipped.py so that the run's metadata types (contract/meta_parts.py) name
them without importing Triton."""

from __future__ import annotations

from typing import TypedDict


class ShippedDeviceJson(TypedDict):
    """The GPU a file's configs were measured on (ShippedDevice)."""

    device_name: str
    sms: int
    gpu_memory_gb: float
    tuning_identity: str | None


class ShippedEntryJson(TypedDict):
    """One winning config (ShippedEntry)."""

    kernel: str
    launch: str
    dtype: str
    bucket: str
    config: str
    run: str
    ms: float | None


class ShippedFileJson(TypedDict):
    """A shipped file (shipped.document writes it, shipped.read_shipped reads it)."""

    format: int
    device: ShippedDeviceJson
    runs: list[str]
    configs: list[ShippedEntryJson]


class ShippedUseJson(TypedDict):
    """A run's metadata `shipped_configs` (ShippedChoice.to_json): the file used (None:
    none), why, its entries and those dropped at run time."""

    file: str | None
    reason: str
    entries: int
    dropped: int
