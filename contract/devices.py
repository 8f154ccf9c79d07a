"""Device models: dense datasheet peaks by exact SKU, and detection of the device present.

This table is the single source of truth for datasheet ceilings (docs/design.md, Device peaks).
All tensor-core numbers are *dense*: NVIDIA datasheets often quote 2:4-sparse numbers,
which are twice these.  A device with no datasheet (a CPU, an unknown GPU) gets its
ceilings measured instead (benches/measured_ceilings.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

# Which roof each benchmark dtype is measured against: a fact about dtypes, defined with
# them in kernels/spec.py and re-exported here for the analysis side.
from kernels.spec import ROOF_CLASS, ROOF_CLASSES  # noqa: E402,F401


class DeviceError(ValueError):
    """A device key or device combination that cannot be used (one-line message)."""


@dataclass(frozen=True)
class DeviceModel:
    key: str
    name: str
    kind: str  # "cuda" or "cpu"
    # Dense peak TFLOP/s per roof class; absent = no such unit (e.g. no fp8 on A100).
    peaks_tflops: dict[str, float] = field(default_factory=dict)
    hbm_tbps: float | None = None  # datasheet memory bandwidth, TB/s
    l2_mb: float | None = None
    sms: int | None = None
    # Substrings that identify the SKU in torch.cuda.get_device_name().
    match: tuple[str, ...] = ()
    notes: str = ""
    # NVLink bandwidth per direction per GPU, GB/s; None where GPUs are not joined by an
    # NVLink switch (PCIe cards, NVL bridges: measure) or have no NVLink at all.
    nvlink_gbps: float | None = None

    @property
    def hbm_gbps(self) -> float | None:
        return None if self.hbm_tbps is None else self.hbm_tbps * 1000.0

    def peak(self, dtype: str) -> float | None:
        """Dense peak TFLOP/s for a benchmark dtype (fp8e5 -> fp8 roof), or None."""
        return self.peaks_tflops.get(ROOF_CLASS.get(dtype, dtype))

    def ridge(self, dtype: str) -> float | None:
        """Ridge point in FLOP/byte: peak FLOP/s over bandwidth byte/s (TFLOP/s / TB/s)."""
        peak = self.peak(dtype)
        if peak is None or not self.hbm_tbps:
            return None
        return peak / self.hbm_tbps


def _gpu(key: str, name: str, fp32: float, tf32: float, bf16: float, fp8: float | None,
         hbm_tbps: float, l2_mb: float, sms: int, match: tuple[str, ...],
         notes: str = "", fp4: float | None = None,
         nvlink_gbps: float | None = None) -> DeviceModel:
    peaks = {"fp32": fp32, "tf32": tf32, "fp16": bf16, "bf16": bf16}
    if fp8 is not None:
        peaks["fp8"] = fp8
    if fp4 is not None:  # FP4 tensor cores: Blackwell (sm_100) onwards
        peaks["fp4"] = fp4
    return DeviceModel(key, name, "cuda", peaks, hbm_tbps, l2_mb, sms, match, notes,
                       nvlink_gbps)


# Dense peaks (TFLOP/s), HBM TB/s, L2 MB, SMs, NVLink GB/s per direction.  Sources: NVIDIA
# H100/H200/A100/L40S/L4 datasheets, sparse tensor-core figures halved.
#
# Blackwell (b200, gb200), dense = NVIDIA's sparse figures halved:
# - gb200: NVIDIA's GB200 NVL72 datasheet, "individual Blackwell GPU" column (1,200 W):
#   FP4 20, FP8/FP6 10, FP16/BF16 5, TF32 2.5 PFLOPS sparse, FP32 80 TFLOPS, 8 TB/s
#   HBM3e (rack totals /72 agree: 1,440 PF FP4, 5,760 TF FP32, 576 TB/s).  NVIDIA's
#   Blackwell architecture technical brief gives 90 TFLOPS FP32 for this part: 80 is kept.
# - b200: NVIDIA's HGX B200 datasheet (1,000 W): 8-GPU totals FP4 144, FP8/FP6 72,
#   FP16/BF16 36, TF32 18 PFLOPS sparse, i.e. per GPU dense 9,000 / 4,500 / 2,250 / 1,125
#   (its per-GPU column rounds TF32 to 2.2 PF sparse, the technical brief gives 1,100
#   dense: 1,125 keeps tf32 at half of bf16, as on every other NVIDIA tensor core).  FP32
#   80 TFLOPS per the technical brief; the HGX page's 600 TF for 8 GPUs is 75 per GPU.
#   HBM3e 8 TB/s as launched; NVIDIA's current HGX B200 page says 7.7 TB/s (180 GB), and
#   a B200 reports a 7680-bit bus at 3996 MHz, 7.67 TB/s: rows are also held against the
#   measured copy ceiling, which shows what the part does.
# - Both: 126 MB L2 (NVIDIA's Blackwell tuning guide; a B200 reports 126.5 MiB), 148 SMs
#   (what a B200 reports: 2 dies x 74 enabled; assumed for GB200's GPU, which NVIDIA's
#   datasheets do not list), NVLink 5 at 1.8 TB/s per GPU = 900 GB/s per direction.
# mxfp8 has no roof class of its own: NVIDIA quotes one FP8/FP6 figure for Blackwell's
# tensor cores, with or without e8m0 block scales (applied inside the MMA), so
# block-scaled fp8 is held against the fp8 roof; mxfp4 and nvfp4 against the fp4 roof,
# which only Blackwell has (kernels/spec.py maps dtypes to roofs).  A device without an
# fp4 peak has no fp4 roof: peak("fp4") is None, never a borrowed number.
DEVICES: dict[str, DeviceModel] = {
    d.key: d
    for d in [
        _gpu("h100", "NVIDIA H100 SXM5 80GB", 66.9, 494.7, 989.4, 1978.9, 3.35, 50, 132,
             ("H100 80GB HBM3", "H100 SXM"), nvlink_gbps=450.0),
        _gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", 51.2, 378.0, 756.0, 1513.0, 2.0, 50, 114,
             ("H100 PCIe",)),
        _gpu("h100-nvl", "NVIDIA H100 NVL 94GB", 60.0, 417.5, 835.5, 1670.5, 3.9, 50, 132,
             ("H100 NVL",)),
        _gpu("h200", "NVIDIA H200 SXM 141GB", 66.9, 494.7, 989.4, 1978.9, 4.8, 50, 132,
             ("H200",), nvlink_gbps=450.0),
        # Same GH100 die and HBM3e as the SXM part, at a 600 W (not 700 W) limit: lower
        # sustained clocks, hence the NVL-class tensor-core peaks.
        _gpu("h200-nvl", "NVIDIA H200 NVL 141GB", 60.0, 417.5, 835.5, 1670.5, 4.8, 50, 132,
             ("H200 NVL",)),
        _gpu("a100", "NVIDIA A100 SXM4 80GB", 19.5, 156.0, 312.0, None, 2.039, 40, 108,
             ("A100",), notes="A100 40GB/PCIe variants have less bandwidth (1.555-1.935 TB/s)",
             nvlink_gbps=300.0),
        _gpu("l40s", "NVIDIA L40S", 91.6, 183.0, 362.05, 733.0, 0.864, 96, 142, ("L40S",)),
        _gpu("l4", "NVIDIA L4", 30.3, 60.0, 121.0, 242.5, 0.3, 48, 58, ("L4",)),
        _gpu("b200", "NVIDIA B200 (HGX, 1000 W)", 80.0, 1125.0, 2250.0, 4500.0, 8.0, 126, 148,
             ("B200",), fp4=9000.0, nvlink_gbps=900.0),
        _gpu("gb200", "NVIDIA GB200 (per GPU, 1200 W)", 80.0, 1250.0, 2500.0, 5000.0, 8.0,
             126, 148, ("GB200",), fp4=10000.0, nvlink_gbps=900.0,
             notes="one of a GB200 superchip's two GPUs"),
        DeviceModel("cpu", "host CPU", "cpu", notes="no datasheet: ceilings are measured"),
        DeviceModel("gpu", "unlisted CUDA GPU", "cuda",
                    notes="no datasheet: ceilings are measured"),
    ]
}


def get_device_model(key: str) -> DeviceModel:
    try:
        return DEVICES[key]
    except KeyError:
        raise DeviceError(
            f"unknown device '{key}' (choose from auto, {', '.join(DEVICES)})"
        ) from None


def match_sku(name: str, sms: int | None = None) -> str:
    """Exact SKU key for a CUDA device name (and SM count), or 'gpu' when unlisted."""
    upper = name.upper()
    if "H100" in upper:
        if "NVL" in upper:
            return "h100-nvl"
        if "PCIE" in upper:
            return "h100-pcie"
        if "HBM3" in upper or "SXM" in upper:
            return "h100"
        # Fall back on the SM count: SXM and NVL have 132 SMs, PCIe 114.
        return "h100-pcie" if sms == 114 else "h100"
    if "GH200" in upper:
        return "gpu"  # Grace-Hopper variants differ in memory; measure instead of guessing
    if "H200" in upper:
        return "h200-nvl" if "NVL" in upper else "h200"
    # "NVIDIA GB200" contains "B200": the superchip's GPU (higher clocks) is tested first.
    # B100, B300 and GB300 are other parts with other peaks: unlisted, measured.
    if "GB200" in upper:
        return "gb200"
    if "B200" in upper:
        return "b200"
    for dev in DEVICES.values():
        if any(m.upper() in upper for m in dev.match):
            return dev.key
    return "gpu"


@dataclass(frozen=True)
class Present:
    """The device actually present on this machine."""

    key: str  # SKU key from DEVICES ("cpu" without CUDA)
    name: str  # e.g. "NVIDIA H100 80GB HBM3" or the CPU model
    kind: str  # "cuda" or "cpu"
    capability: tuple[int, int] | None = None
    sms: int | None = None
    l2_mb: float | None = None
    memory_gb: float | None = None
    cores: int | None = None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def host_cpu() -> Present:
    """The host CPU as a Present (also used for `--device cpu` on a GPU machine)."""
    return Present(key="cpu", name=cpu_name(), kind="cpu", cores=os.cpu_count())


def detect() -> Present:
    """Detect the device present: the CUDA GPU in use's exact SKU (cuda:0, or a fleet
    rank's cuda:LOCAL_RANK), else the CPU."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 0) or 0
        return Present(
            key=match_sku(props.name, props.multi_processor_count),
            name=props.name,
            kind="cuda",
            capability=(props.major, props.minor),
            sms=props.multi_processor_count,
            l2_mb=l2 / 2**20 if l2 else None,
            memory_gb=props.total_memory / 1e9,
        )
    return host_cpu()


def resolve(requested: str, present: Present) -> tuple[DeviceModel, list[str]]:
    """The device model to use for `--device requested`, plus warnings.

    Raises DeviceError (one line) when the request cannot be honoured, e.g. a GPU model
    asked for on a machine without CUDA.
    """
    warnings: list[str] = []
    if requested == "auto":
        return DEVICES[present.key], warnings
    model = get_device_model(requested)
    if model.kind == "cuda" and present.kind != "cuda":
        raise DeviceError(f"--device {requested} needs a CUDA GPU, but none is present "
                          "(use --device cpu or auto)")
    if model.kind == "cpu" and present.kind == "cuda":
        warnings.append("--device cpu on a machine with a GPU: benchmarking the host CPU")
        return model, warnings
    if model.kind == "cuda" and model.key != present.key:
        warnings.append(
            f"--device {requested} ({model.name}) does not match the GPU present "
            f"({present.name}, detected as '{present.key}'): rows use {requested}'s peaks"
        )
    return model, warnings


@dataclass(frozen=True)
class ResolvedDevice:
    """`--device requested` interpreted once: the model the rows use, the device they are
    measured on, and what the user should be told about the pair."""

    requested: str
    model: DeviceModel
    present: Present
    warnings: tuple[str, ...] = ()


def resolve_device(requested: str) -> ResolvedDevice:
    """The one reading of `--device` for everything that measures (the sweep, its
    re-timing children, the planner's ceilings and timers, a fleet rank's GPU check,
    the estimate's device present): the device present detected (a fleet rank's
    cuda:LOCAL_RANK once it is bound), the model resolved against it (DeviceError, one
    line, when it cannot be honoured), and the host CPU measured when a CPU model is
    asked for on a GPU machine."""
    present = detect()
    model, warnings = resolve(requested, present)
    if model.kind == "cpu" and present.kind != "cpu":
        present = host_cpu()  # --device cpu on a GPU machine benchmarks the host
    return ResolvedDevice(requested, model, present, tuple(warnings))
