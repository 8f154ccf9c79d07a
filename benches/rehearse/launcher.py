"""The C launcher Triton 3.6 builds for each kernel signature, built for real without a GPU.

Triton 3.6's CudaLauncher (backends/nvidia/driver.py) writes a C source for each kernel's
signature (`make_launcher`) and builds it with the host compiler into Triton's cache
(runtime/build.py `compile_module_from_src`, keyed by the source: kernels of one
signature share it) the first time a compiled kernel is loaded, at its first launch.
The stand-in's launcher (benches/rehearse/driver.py) does the same, so the rehearsal
pays, counts and caches the host compiler's builds as a GPU run does.  Triton 3.9 has
one launcher for every kernel (CudaUtils.launch) and builds none: nothing to do there.

The launcher calls a few CUDA driver functions directly and links against libcuda.so.1;
a CPU has none, so a stub of that name, defining those functions (each returning
CUDA_ERROR_NOT_SUPPORTED), is built once per process and loaded before any launcher.
Nothing calls them: the stand-in launches nothing.  Run the rehearsal in a process of
its own (the command does): the stub answers to libcuda.so.1's name there.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

# CUDA_ERROR_NOT_SUPPORTED: what every stub function returns.
NOT_SUPPORTED = 801
_stub_dir: str | None = None


def per_kernel_launchers() -> bool:
    """Whether this Triton builds a C launcher per kernel signature (3.6: make_launcher)."""
    try:
        from triton.backends.nvidia import driver
    except ImportError:
        return False
    return hasattr(driver, "make_launcher")


def stub_libcuda() -> str:
    """The folder of a libcuda.so.1 defining every cu* function Triton's CUDA backend
    calls (its driver.c, and the launcher template in driver.py), built with the host
    compiler and loaded into this process, once."""
    global _stub_dir
    if _stub_dir is not None:
        return _stub_dir
    from triton.backends.nvidia import driver

    files = [Path(driver.dirname) / f for f in ("driver.c", "driver.py")]
    source = "".join(f.read_text() for f in files if f.exists())
    names = sorted(set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", source)))
    folder = tempfile.mkdtemp(prefix="rehearse-libcuda-")
    c = os.path.join(folder, "stub.c")
    with open(c, "w") as f:
        f.writelines(f"int {n}(void) {{ return {NOT_SUPPORTED}; }}\n" for n in names)
    so = os.path.join(folder, "libcuda.so.1")
    cc = os.environ.get("CC") or "cc"
    subprocess.check_call([cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", so, c])
    ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL)  # a launcher's libcuda.so.1, by its name
    _stub_dir = folder
    return folder


def build_launcher(src: Any, metadata: Any) -> Any:
    """What CudaLauncher.__init__ builds for a compiled kernel (Triton 3.6): the C
    launcher's module, from Triton's cache or built by the host compiler into it."""
    from triton.backends.nvidia import driver
    from triton.runtime.build import compile_module_from_src

    constants = getattr(src, "constants", None) or {}
    fn = getattr(src, "fn", None)
    constants = {(fn.arg_names.index(k),) if isinstance(k, str) else k: v
                 for k, v in constants.items()}
    signature = dict(getattr(src, "signature", {}) or {})
    source = driver.make_launcher(constants, signature,
                                  getattr(metadata, "tensordesc_meta", None))
    return compile_module_from_src(src=source, name="__triton_launcher",
                                   library_dirs=[stub_libcuda()],
                                   include_dirs=driver.include_dirs,
                                   libraries=driver.libraries)
