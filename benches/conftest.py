"""pytest-benchmark suites over the kernel registry (`pytest benches/`).

The GPU's name, the device model and the software versions go into machine_info, so
saved runs say where they were measured and --benchmark-compare compares like with like.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_benchmark_update_machine_info(config, machine_info):
    import torch

    from contract.devices import detect

    present = detect()
    machine_info["gpu_name"] = present.name
    machine_info["device_key"] = present.key
    machine_info["device_kind"] = present.kind
    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda
    try:
        import triton

        machine_info["triton"] = triton.__version__
    except ImportError:
        machine_info["triton"] = None
    machine_info["threads"] = torch.get_num_threads()
