"""What an exception from a kernel is: out of memory, a compile error, a sticky CUDA
fault that leaves the context unusable (also as a CUDA library reports it) and aborts
the sweep (SweepAborted), and its one-line message.  The runner turns it into a row."""

from __future__ import annotations

import torch

from contract.record import RunRow


class SweepAborted(Exception):
    """A kernel error left the CUDA context unusable (illegal address, launch failure):
    `row` is that case's failed row, `reason` the error; the sweep cannot go on."""

    def __init__(self, row: RunRow, reason: str) -> None:
        super().__init__(reason)
        self.row = row
        self.reason = reason


def _first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300]}" if msg else type(e).__name__


def error_message(e: BaseException) -> str:
    """Type and the telling part of an exception's message: its first line, plus its
    last line when they differ (a Triton CompilationError starts with the source
    location and ends with the error)."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    text = lines[0] if lines[-1] == lines[0] else f"{lines[0]} ... {lines[-1]}"
    return f"{type(e).__name__}: {text[:400]}"


# Out of memory on either device: torch.OutOfMemoryError on a GPU; on a CPU the default
# allocator raises RuntimeError "DefaultCPUAllocator: can't allocate memory: you tried to
# allocate N bytes. Error code 12 (Cannot allocate memory)".
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(e: BaseException) -> bool:
    msg = str(e).lower()
    return isinstance(e, torch.OutOfMemoryError) or any(m in msg for m in _OOM_MESSAGES)


# CUDA errors that are sticky: after one, the context is unusable and every later CUDA
# call fails with the same error (CUDA runtime docs).  Matched on the message, with "_"
# read as " " so the driver API's names (CUDA_ERROR_ILLEGAL_ADDRESS) match too, since
# torch raises them as RuntimeError / torch.AcceleratorError and Triton as RuntimeError.
_STICKY_CUDA_ERRORS = (
    "illegal memory access", "illegal address", "launch failure", "launch failed",
    "misaligned address", "illegal instruction", "invalid program counter", "invalid pc",
    "hardware stack error", "device-side assert", "device side assert", "error assert",
    "launch timed out", "launch timeout", "uncorrectable ecc", "ecc uncorrectable",
    "invalid address space", "not supported on global/shared address space",
    # CUDA libraries' own names for a kernel of theirs that faulted on the device
    # (CUBLAS_STATUS_EXECUTION_FAILED: "GPU program failed to execute"; the same status
    # in cuDNN, cuSOLVER and cuSPARSE; CUFFT_EXEC_FAILED): the fault poisons the context
    # like any other, and the next case's first call would take the blame.
    "status execution failed", "cufft exec failed",
)

# Words that mark a message as coming from CUDA or one of its libraries.
_CUDA_WORDS = ("cuda", "cublas", "cudnn", "cufft", "cusolver", "cusparse")


def is_sticky_cuda_error(e: BaseException) -> bool:
    """Whether `e` is a CUDA error that leaves the context unusable."""
    msg = str(e).lower().replace("_", " ")
    is_cuda = any(w in msg for w in _CUDA_WORDS) or type(e).__name__ == "AcceleratorError"
    return is_cuda and any(p in msg for p in _STICKY_CUDA_ERRORS)


def compile_error_types() -> tuple[type[BaseException], ...]:
    """Triton's compile-time failures: the kernel did not build (or does not fit)."""
    try:
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources, PTXASError
    except ImportError:  # pragma: no cover - triton is a dependency
        return ()
    return (CompilationError, OutOfResources, PTXASError)
