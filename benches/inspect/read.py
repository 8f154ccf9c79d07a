"""Reading what Triton's compiler produced for one kernel: the TTGIR's tensor loads and
their source lines, the PTX's global loads and their widths, the MMA instructions and
their element types (wgmma, mma.sync, and Blackwell's tcgen05 from its instruction
descriptor), tensor memory and TMA use, the fp8 accumulation mode, ptxas's register and
spill report, the SASS instructions nvdisasm lists, and what MLIR wrote to fd 2 when a
compile failed.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import struct
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any

WIDE_LOAD_BITS = 128  # the widest global load / cp.async per thread

_LOC_DEF = re.compile(r"^(#loc\d*) = loc\((.*)\)\s*$", re.M)

_FILE_LINE = re.compile(r'"([^"]+)":(\d+):\d+')

_LOC_REF = re.compile(r"#loc\d*")

_PTR_TENSOR = re.compile(r"tensor<([\dx]+)x!tt\.ptr<(\w+)>")

_BITS = {"f32": 32, "i32": 32, "f16": 16, "bf16": 16, "f64": 64, "i64": 64, "i8": 8,
         "f8E4M3FN": 8, "f8E5M2": 8, "f8E4M3FNUZ": 8, "f8E5M2FNUZ": 8, "f8E4M3B11FNUZ": 8}


def _resolve_locs(ir: str) -> dict[str, tuple[str, int] | None]:
    """#locN alias -> (file, line).  Names, call sites and fusions wrap a file location;
    the first one reached is the innermost (for an inlined helper: the callee's line,
    which is also the line PTX's .loc gives)."""
    defs = dict(_LOC_DEF.findall(ir))
    out: dict[str, tuple[str, int] | None] = {}

    def resolve(name: str, depth: int = 0) -> tuple[str, int] | None:
        if name in out:
            return out[name]
        body = defs.get(name, "")
        m = _FILE_LINE.search(body)
        ref = _LOC_REF.search(body)
        if m and (not ref or m.start() < ref.start()):
            res: tuple[str, int] | None = (m.group(1), int(m.group(2)))
        elif ref and depth < 50:
            res = resolve(ref.group(0), depth + 1)
        else:
            res = None
        out[name] = res
        return res

    for name in defs:
        resolve(name)
    return out


def tensor_load_lines(ttgir: str, num_warps: int) -> dict[tuple[str, int], bool]:
    """Source lines of the loads of tensors (not scalars) -> whether that load's tile
    gives each thread at least 128 bits (else narrower loads are all it can do)."""
    locs = _resolve_locs(ttgir)
    lines: dict[tuple[str, int], bool] = {}
    for line in ttgir.splitlines():
        s = line.strip()
        if not re.search(r"= (tt\.load|ttg\.async_copy_global_to_local) ", s):
            continue
        m = _PTR_TENSOR.search(s)
        ref = re.search(r"loc\((#loc\d*)\)\s*$", s)
        direct = re.search(r'loc\(("[^"]+":\d+:\d+)\)\s*$', s)
        where = None
        if ref:
            where = locs.get(ref.group(1))
        elif direct:
            fm = _FILE_LINE.search(direct.group(1))
            where = (fm.group(1), int(fm.group(2))) if fm else None
        if not m or where is None:
            continue
        numel = 1
        for d in m.group(1).split("x"):
            numel *= int(d)
        per_thread_bits = numel * _BITS.get(m.group(2), 32) // (32 * num_warps)
        lines[where] = lines.get(where, False) or per_thread_bits >= WIDE_LOAD_BITS
    return lines


_PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', re.M)

_PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")

_PTX_LD = re.compile(r"\bld\.global\.(?:[\w:]+\.)*?(?:v(\d)\.)?[bfsu](\d+)\b")

_PTX_CP = re.compile(r"\bcp\.async\.c[ag]\.shared\.global(?:\.[\w:]+)*\s+\[[^\]]*\],\s*"
                     r"\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)")


def global_loads(ptx: str) -> list[tuple[tuple[str, int] | None, str, int]]:
    """Every global load and global-to-shared copy in the PTX: (source file and line from
    the preceding .loc, kind, bits moved per thread)."""
    files = {int(i): path for i, path in _PTX_FILE.findall(ptx)}
    where: tuple[str, int] | None = None
    in_asm = False
    out = []
    for line in ptx.splitlines():
        if "// begin inline asm" in line or "// end inline asm" in line:
            in_asm = "begin" in line
            continue
        m = _PTX_LOC.match(line)
        if m:
            # Inside Triton's inline-asm blocks the .loc lines count asm lines, not
            # source lines: the location is the one in force where the block began.
            if not in_asm:
                where = (files.get(int(m.group(1)), "?"), int(m.group(2)))
            continue
        m = _PTX_LD.search(line)
        if m:
            out.append((where, "ld.global", int(m.group(1) or 1) * int(m.group(2))))
            continue
        m = _PTX_CP.search(line)
        if m:
            out.append((where, "cp.async", 8 * int(m.group(1), 0)))
    return out


_WGMMA = re.compile(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.(\w+)\.(\w+)\.(\w+)")

_MMA = re.compile(r"\bmma\.sync\.aligned\.(m\d+n\d+k\d+)\.row\.col\.(\w+)\.(\w+)\.(\w+)\.\w+")


def mma_of(ptx: str) -> tuple[str, str, str]:
    """(family, element types 'a->d' or 'a*b->d', instruction shape) of the matrix
    instructions in the PTX; tcgen05's shape is prefixed with its kind."""
    tc = tcgen05_mma(ptx)
    if tc:
        return "tcgen05", tc[0], tc[1]
    for family, found in (("wgmma", _WGMMA.findall(ptx)), ("mma.sync", _MMA.findall(ptx))):
        if found:
            shape, d, a, b = found[0]
            return family, (a if a == b else f"{a}*{b}") + f"->{d}", shape
    return "", "", ""


# ---- Blackwell (sm_100a): tcgen05 MMA, tensor memory, TMA -------------------------------

_TCGEN05_MMA = re.compile(r"\btcgen05\.mma(?:\.sp)?(?:\.ws)?\.cta_group::(\d)\.kind::(\w+)"
                          r"((?:\.[\w:]+)*)\s+([^;]*);")

_MOV_IMM = re.compile(r"\bmov\.[bsu]32\s+(%r\d+),\s*(-?(?:0x[0-9a-fA-F]+|\d+))\s*;")

# tcgen05.mma takes its element types and M x N from a 32-bit instruction descriptor
# operand (PTX ISA, "Instruction descriptor"; Triton's MMAv5 lowering builds it as a
# constant): A type bits 7-9, B type 10-12, D type 4-5 (not in the block-scaled kinds,
# whose D is f32 and whose bit 23 is the scale type), N >> 3 in bits 17-22, M >> 4 in
# bits 24-28.  The type codes depend on the kind.
_F8F6F4 = {0: "e4m3", 1: "e5m2", 3: "e2m3", 4: "e3m2", 5: "e2m1"}
_IDESC_TYPES: dict[str, dict[int, str]] = {
    "f16": {0: "f16", 1: "bf16"}, "tf32": {2: "tf32"}, "f8f6f4": _F8F6F4,
    "i8": {0: "u8", 1: "s8"}, "mxf8f6f4": _F8F6F4, "mxf4": {1: "e2m1"},
    "mxf4nvf4": {1: "e2m1"}}
_IDESC_D = {0: "f16", 1: "f32", 2: "s32"}
# K of one dense instruction per kind: 32 bytes of A's row (fp4: 64 elements).
_KIND_K = {"f16": 16, "tf32": 8, "f8f6f4": 32, "i8": 32, "mxf8f6f4": 32, "mxf4": 64,
           "mxf4nvf4": 64}


def _operands(text: str) -> list[str]:
    """Comma-separated operands, commas inside [] and {} kept."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [*out, cur.strip()] if cur.strip() else out


def _imm(text: str) -> int:
    return int(text, 0) & 0xFFFFFFFF


def decode_idesc(kind: str, mods: str, idesc: int) -> tuple[str, str]:
    """(element types, shape) of a tcgen05.mma from its kind, its modifiers
    ('.block_scale.block16', '.block_scale.scale_vec::4X') and its instruction
    descriptor: ('bf16->f32', 'm128n256k16'), ('e2m1->f32 ue4m3/16', 'm128n128k64')."""
    table = _IDESC_TYPES.get(kind, {})
    a, b = table.get((idesc >> 7) & 7, "?"), table.get((idesc >> 10) & 7, "?")
    m, n = ((idesc >> 24) & 0x1F) << 4, ((idesc >> 17) & 0x3F) << 3
    k = _KIND_K.get(kind, 0)
    types = a if a == b else f"{a}*{b}"
    if kind.startswith("mx"):
        types += "->f32 " + ("ue8m0" if (idesc >> 23) & 1 else "ue4m3")
        block = re.search(r"\.block(\d+)", mods)
        vec = re.search(r"\.scale_vec::(\d)X", mods)
        if block:
            types += f"/{block.group(1)}"
        elif vec and k:
            types += f"/{k // int(vec.group(1))}"
    else:
        types += "->" + _IDESC_D.get((idesc >> 4) & 3, "?")
    return types, f"m{m}n{n}k{k}"


def tcgen05_mma(ptx: str) -> tuple[str, str] | None:
    """(element types, 'kind::K mMnNkK') of the first tcgen05.mma in the PTX whose
    instruction descriptor is a constant (None without tcgen05.mma).  Two-CTA MMAs
    (cta_group::2) say so after the shape."""
    consts: dict[str, int] = {}
    first: tuple[str, str] | None = None
    for line in ptx.splitlines():
        m = _MOV_IMM.search(line)
        if m:
            consts[m.group(1)] = _imm(m.group(2))
            continue
        m = _TCGEN05_MMA.search(line)
        if not m:
            continue
        group, kind, mods, ops = m.groups()
        args = _operands(ops)
        desc = args[3] if len(args) > 3 else ""
        value = consts.get(desc) if desc.startswith("%") else \
            (_imm(desc) if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", desc) else None)
        two = ", 2 CTAs" if group == "2" else ""
        if value is None:
            first = first or ("?", f"kind::{kind}{two}")
            continue
        types, shape = decode_idesc(kind, mods, value)
        return types, f"kind::{kind} {shape}{two}"
    return first


_TMEM_ALLOC = re.compile(r"\btcgen05\.alloc\.[\w:.]*\s+\[[^\]]*\],\s*(%r\d+|\d+)\s*;")

_TMEM_OPS = re.compile(r"\btcgen05\.(ld|st|cp|shift)\.")


def tensor_memory(ptx: str) -> tuple[int, str]:
    """(tensor-memory columns allocated, -1 if not constant; 'cp,ld,st': how the kernel
    moves data to and from it) from tcgen05.alloc / ld / st / cp.  An SM has 512
    columns of 128 lanes x 32 bits."""
    consts = {r: _imm(v) for r, v in _MOV_IMM.findall(ptx)}
    cols = 0
    for n in _TMEM_ALLOC.findall(ptx):
        if n.startswith("%") and n not in consts:
            return -1, ",".join(sorted(set(_TMEM_OPS.findall(ptx))))
        cols += consts[n] if n.startswith("%") else int(n)
    return cols, ",".join(sorted(set(_TMEM_OPS.findall(ptx))))


_TMA = re.compile(r"\bcp(\.reduce)?\.async\.bulk(\.prefetch)?\.tensor\.\d+d\.([\w:]+)")


def tma_of(ptx: str) -> str:
    """How the kernel uses the Tensor Memory Accelerator (cp.async.bulk.tensor):
    'load', 'store', 'reduce', 'prefetch', comma-separated; '' when not at all."""
    kinds = set()
    for reduce, prefetch, dst in _TMA.findall(ptx):
        kinds.add("reduce" if reduce else "prefetch" if prefetch else
                  "store" if dst == "global" else "load")
    return ",".join(sorted(kinds))


_WG_DOT = re.compile(r"ttng\.warp_group_dot .*?:\s*!ttg\.memdesc<(\d+)x(\d+)x(\w+)")

_TC5_DOT = re.compile(r"ttng\.tc_gen5_mma(?:_scaled)? .*?:\s*!ttg\.memdesc<\d+x\d+x(\w+)")


def fp8_accumulation(ttgir: str) -> str:
    """How the fp8 dots of the kernel accumulate on sm_90 wgmma, read from the IR:
    maxNumImpreciseAcc > the dot's K: in the tensor core's accumulator over all of K
    ("fast"); otherwise promoted to fp32 every max(limit, 32) elements of K
    ("precise/N"); "" when no fp8 wgmma.  An fp8 tcgen05 MMA (sm_100) is "tcgen05":
    Triton's MMAv5 path has no promotion (the limit is ignored, fast and precise
    compile to the same code), the whole K accumulates in tensor memory."""
    modes = []
    for line in ttgir.splitlines():
        m = _TC5_DOT.search(line)
        if m and m.group(1).startswith("f8"):
            modes.append("tcgen05")
            continue
        m = _WG_DOT.search(line)
        if not m or not m.group(3).startswith("f8"):
            continue
        k = int(m.group(2))
        lim = re.search(r"maxNumImpreciseAcc = (\d+)", line)
        limit = int(lim.group(1)) if lim else 0
        modes.append("fast" if limit > k else f"precise/{max(limit, 32)}")
    return ",".join(sorted(set(modes)))


def operands_allow_wide(launch: Any, src: Any) -> bool:
    """Whether the memory layout of every tensor operand allows 128-bit loads, from the
    binding: 16-byte aligned base and a unit stride (declared as the literal 1, or a
    stride argument that Triton specialized to the constant 1) with the other strides
    divisible by 16."""
    names = launch.fn.arg_names

    def div16(name: str) -> bool:
        i = (names.index(name),)
        return src.constants.get(i) == 1 or ["tt.divisibility", 16] in src.attrs.get(i, [])

    for ptr, strides in launch.operands.items():
        i = (names.index(ptr),)
        if ["tt.divisibility", 16] not in src.attrs.get(i, []):
            return False
        args = [s for s in strides if s != 1]  # 1: a dimension walked with unit stride
        unit = 1 in strides or any(src.constants.get((names.index(s),)) == 1 for s in args)
        if not unit or not all(div16(s) for s in args):
            return False
    return True


def ptxas_report(ptx: str, cc: int, options: Any) -> tuple[int, int, int, list[str], str]:
    """(registers, spill store bytes, spill load bytes, warnings, ptxas version): ptxas
    run again exactly as Triton runs it (make_cubin), whose -v log it throws away."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(cc).path
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout
    vm = re.search(r"V(\d+\.\d+\.\d+)", version)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        fmad = [] if options.enable_fp_fusion else ["--fmad=false"]
        extra = options.ptx_options.split(" ") if options.ptx_options else []
        r = subprocess.run([ptxas, "-lineinfo", *fmad, "-v", *extra,
                            f"--gpu-name={sm_arch_from_capability(cc)}", str(src),
                            "-o", str(Path(tmp) / "k.o")], capture_output=True, text=True)
    log = r.stdout + r.stderr
    regs = re.search(r"Used (\d+) registers", log)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    # Warnings, and the coded performance advisories ptxas prints as "info", e.g.
    # "(C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized".
    warnings = [re.sub(r"^ptxas[\w-]*\s+\w+\s*:\s*", "", ln.strip()) for ln in log.splitlines()
                if "warning" in ln or re.search(r"\(C\d{4}\)", ln)]
    return (int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else 0,
            int(spill.group(2)) if spill else 0, warnings, vm.group(1) if vm else "?")


# ---- SASS, as nvdisasm lists it ---------------------------------------------------------

# An instruction's offset and opcode (after its predicate, if any).
_SASS_AT = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_]*)",
                      re.M)

# Tensor-core MMAs: HMMA / IMMA (mma.sync), HGMMA / QGMMA (Hopper's wgmma), UTCHMMA /
# UTCQMMA / UTCOMMA (what tcgen05.mma issues on Blackwell).
_SASS_MMA = re.compile(r"UTC\w*MMA|[A-Z]?GMMA|[HIQO]MMA|DMMA")

# Beside them: tensor memory (LDTM / STTM to and from registers, UTCCP from shared
# memory), TMA (UTMALDG / UTMASTG / UTMAREDG / UTMAPF) and cp.async (LDGSTS).
_SASS_OTHER = frozenset({"LDTM", "STTM", "UTCCP", "UTMALDG", "UTMASTG", "UTMAREDG", "UTMAPF",
                         "LDGSTS"})

# The cubins one disassembler call reads: its start-up (about 0.7 s of CPU, more than
# most kernels' compile) is paid once for them, and a call that fails loses only them.
SASS_BATCH = 64


def sass_ops(listing: str) -> list[tuple[int, str]]:
    """Each instruction of a disassembler's listing: its offset and opcode."""
    return [(int(at, 16), op) for at, op in _SASS_AT.findall(listing)]


def sass_counts(ops: Iterable[str]) -> dict[str, int]:
    """Opcode -> count of the SASS instructions above among `ops`."""
    return dict(sorted(Counter(op for op in ops
                               if op in _SASS_OTHER or _SASS_MMA.fullmatch(op)).items()))


def sass_mma(counts: dict[str, int]) -> str:
    """The MMA opcodes among sass_counts ('UTCHMMA', 'HGMMA+HMMA'; '' when none)."""
    return "+".join(op for op in counts if _SASS_MMA.fullmatch(op))


def _code(cubin: bytes) -> bytes | None:
    """A cubin's executable sections (ELF64 section headers flagged SHF_EXECINSTR), in
    order: its instructions as raw bytes; None where it is no such ELF or its code is not
    whole 16-byte instructions."""
    try:
        shoff, = struct.unpack_from("<Q", cubin, 0x28)
        entsize, count = struct.unpack_from("<HH", cubin, 0x3A)
        # each header's sh_flags, sh_offset and sh_size
        heads = [struct.unpack_from("<8xQ8xQQ", cubin, shoff + i * entsize)
                 for i in range(count)]
    except struct.error:
        return None
    code = b"".join(cubin[off:off + n] for flags, off, n in heads if flags & 0x4)
    return code if cubin[:4] == b"\x7fELF" and code and len(code) % 16 == 0 else None


def sass_reports(cubins: list[bytes], cc: int) -> list[dict[str, int] | None]:
    """sass_counts of each cubin of compute capability `cc` (None where it cannot be
    read): their code disassembled by the nvdisasm bundled with Triton as one raw
    instruction stream per SASS_BATCH cubins, each instruction given back to its cubin
    by its offset in the stream."""
    from triton import knobs
    from triton.backends.nvidia.compiler import sm_arch_from_capability

    sm = "SM" + sm_arch_from_capability(cc).removeprefix("sm_")  # sm_90a: SM90a
    todo = [(i, code) for i, c in enumerate(cubins) if (code := _code(c))]
    got: list[dict[str, int] | None] = [None] * len(cubins)
    for at in range(0, len(todo), SASS_BATCH):
        batch = todo[at:at + SASS_BATCH]
        starts = list(accumulate((len(code) for _, code in batch), initial=0))
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "code.bin"
            path.write_bytes(b"".join(code for _, code in batch))
            try:
                r = subprocess.run([knobs.nvidia.nvdisasm.path, "-b", sm, "-ndf", str(path)],
                                   capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired):
                continue
        if r.returncode != 0:
            continue
        ops: list[list[str]] = [[] for _ in batch]
        for offset, op in sass_ops(r.stdout):
            ops[bisect.bisect_right(starts, offset) - 1].append(op)
        for (i, _), mine in zip(batch, ops, strict=True):
            got[i] = sass_counts(mine)
    return got


# ---- what a failed compile left on file descriptor 2 --------------------------------------

@contextlib.contextmanager
def fd2_captured() -> Iterator[list[str]]:
    """File descriptor 2 into a temporary file for the block (C++ writes there, past
    sys.stderr); the list it yields holds the text once the block is left."""
    text: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield text
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text.append(tmp.read().decode(errors="replace"))


def mlir_failure(text: str) -> str:
    """What MLIR's diagnostics say about a failed pass pipeline ("PassManager::run failed"
    alone names nothing): the pass that failed, and any specific error before it."""
    specific = [ln.split("error:", 1)[1].strip() for ln in text.splitlines()
                if "error:" in ln and "Failures have been detected" not in ln]
    failed = re.search(r"Pipeline failed while executing \[`(\w+)`", text)
    return "; ".join([*specific[:1], *([f"in {failed.group(1)}"] if failed else [])])
