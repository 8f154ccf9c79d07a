"""What the CUDA driver reads from a cubin, read without it: a kernel's registers, its
local frame and its thread bound (cuFuncGetAttribute's NUM_REGS, LOCAL_SIZE_BYTES and
MAX_THREADS_PER_BLOCK inputs), from the ELF's .nv.info sections."""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterator
from dataclasses import dataclass

_EIATTR_REGCOUNT = 0x2F  # .nv.info: (symbol index, registers)
_EIATTR_FRAME_SIZE = 0x11  # .nv.info: (symbol index, bytes of local frame)
_EIATTR_REQNTID = 0x10  # .nv.info.<kernel>: required threads (x, y, z)
_EIATTR_MAX_THREADS = 0x05  # .nv.info.<kernel>: maximum threads (x, y, z)


@dataclass(frozen=True)
class CubinUsage:
    registers: int = 0
    frame_bytes: int = 0
    threads: int = 0  # .reqntid / .maxntid product; 0 when absent


def _nv_info(data: bytes, off: int, size: int) -> Iterator[tuple[int, bytes]]:
    """The (attribute, value) entries of an .nv.info section."""
    i, end = off, off + size
    while i + 2 <= end:
        fmt, attr = data[i], data[i + 1]
        i += 2
        if fmt == 1:  # EIFMT_NVAL
            val = b""
        elif fmt == 2:  # EIFMT_BVAL
            val, i = data[i:i + 1], i + 1
        elif fmt == 3:  # EIFMT_HVAL
            val, i = data[i:i + 2], i + 2
        elif fmt == 4:  # EIFMT_SVAL: a 16-bit size, then the bytes
            (n,) = struct.unpack_from("<H", data, i)
            val, i = data[i + 2:i + 2 + n], i + 2 + n
        else:
            return
        yield attr, val


@functools.lru_cache(maxsize=512)
def cubin_usage(cubin: bytes, name: str) -> CubinUsage:
    """Registers, local frame and thread bounds of kernel `name` in an ELF cubin (what
    the CUDA driver's cuFuncGetAttribute would report); zeros where it cannot be read."""
    try:
        shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
        entsize, count, names_at = struct.unpack_from("<HHH", cubin, 0x3A)
        heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize)
                 for i in range(count)]

        def text(at: int) -> str:
            return cubin[at:cubin.index(b"\0", at)].decode()

        by_name = {text(heads[names_at][4] + h[0]): h for h in heads}
        symtab = by_name[".symtab"]
        strtab = heads[symtab[6]]
        sym_index = next(
            i for i in range(symtab[5] // 24)
            if text(strtab[4] + struct.unpack_from("<I", cubin, symtab[4] + 24 * i)[0])
            == name)
        regs = frame = threads = 0
        info = by_name.get(".nv.info")
        if info is not None:
            for attr, val in _nv_info(cubin, info[4], info[5]):
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and len(val) == 8:
                    sym, v = struct.unpack("<II", val)
                    if sym == sym_index:
                        regs = v if attr == _EIATTR_REGCOUNT else regs
                        frame = v if attr == _EIATTR_FRAME_SIZE else frame
        own = by_name.get(f".nv.info.{name}")
        if own is not None:
            for attr, val in _nv_info(cubin, own[4], own[5]):
                if attr in (_EIATTR_REQNTID, _EIATTR_MAX_THREADS) and len(val) == 12:
                    x, y, z = struct.unpack("<III", val)
                    threads = x * y * z
        return CubinUsage(regs, frame, threads)
    except (struct.error, KeyError, StopIteration, ValueError, IndexError):
        return CubinUsage()
