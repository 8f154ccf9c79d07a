"""Which library a GPU kernel comes from, by its name as the profiler records it: the
`library` column of a row (the library of the kernels its call ran).  Names follow each
library's own conventions (sample names in tests/test_providers.py):

- cuBLASLt: `nvjet_*` (its Hopper/Blackwell JIT kernels), `cublasLt::*`;
- cuBLAS: `sm90_xmma_gemm_*`, `ampere_sgemm_*`, `gemv2T_kernel`, `gemmSN_*`, `cublas*`;
- CUTLASS: `cutlass::*`, `cutlass_80_tensorop_*`, mem-efficient attention's `fmha_cutlass*`;
- cuDNN: `cudnn*` (`cudnn_generated_fort_native_sdpa_*`);
- flash: FlashAttention's `flash_fwd_kernel`, `pytorch_flash::*`, `flash::*`;
- triton: Inductor's `triton_poi_*`, `triton_red_*`, `triton_per_*`, `triton_tem_*`;
- aten: PyTorch's own CUDA kernels (`at::native::*`, `elementwise_kernel`, ...).
"""

from __future__ import annotations

from collections.abc import Iterable

# (library, substrings of a lower-cased kernel name), most specific first: cuBLAS ships
# CUTLASS-built kernels named cutlass, and an at::native kernel may name a cuBLAS type.
_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cudnn", ("cudnn",)),  # first: cuDNN's SDPA kernels name "flash" in theirs
    ("flash", ("flash_fwd", "flash_bwd", "pytorch_flash", "flash::")),
    ("cutlass", ("cutlass", "fmha_")),
    ("cublasLt", ("nvjet", "cublaslt")),
    ("cublas", ("cublas", "xmma_gemm", "sgemm", "hgemm", "gemv", "gemmsn", "gemmk1",
                "splitkreduce")),
    ("triton", ("triton_",)),
    ("aten", ("at::native", "at::", "elementwise_kernel", "reduce_kernel", "softmax",
              "layer_norm", "vectorized")),
)


def library_of_kernel(name: str) -> str | None:
    """The library one kernel name comes from (see the module docstring), or None."""
    low = name.lower()
    for lib, marks in _RULES:
        if any(m in low for m in marks):
            return lib
    return None


def library_of(names: Iterable[str]) -> str | None:
    """The library of a row's kernels: the libraries its kernels come from, in the order
    first seen, PyTorch's own (aten) left out when a library ran beside it (a cuBLAS
    GEMM and aten's fill of its output are a cuBLAS row); '+'-joined when several; None
    when no name is recognized (or none was recorded: a CPU row)."""
    libs = list(dict.fromkeys(lib for n in names if (lib := library_of_kernel(n))))
    if len(libs) > 1:
        libs = [lib for lib in libs if lib != "aten"]
    return "+".join(libs) or None
