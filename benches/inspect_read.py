"""Reading what Triton's compiler produced for one kernel: the TTGIR's tensor loads and
their source lines, the PTX's global loads and their widths, the MMA instructions and
their element types, the fp8 accumulation mode, and ptxas's register and spill report.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
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
    instructions in the PTX."""
    for family, found in (("wgmma", _WGMMA.findall(ptx)), ("mma.sync", _MMA.findall(ptx))):
        if found:
            shape, d, a, b = found[0]
            return family, (a if a == b else f"{a}*{b}") + f"->{d}", shape
    return "", "", ""


_WG_DOT = re.compile(r"ttng\.warp_group_dot .*?:\s*!ttg\.memdesc<(\d+)x(\d+)x(\w+)")


def fp8_accumulation(ttgir: str) -> str:
    """How the fp8 dots of the kernel accumulate on sm_90 wgmma, read from the IR:
    maxNumImpreciseAcc > the dot's K: in the tensor core's accumulator over all of K
    ("fast"); otherwise promoted to fp32 every max(limit, 32) elements of K
    ("precise/N"); "" when no fp8 wgmma."""
    modes = []
    for line in ttgir.splitlines():
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


def _ptxas_report(ptx: str, cc: int, options: Any) -> tuple[int, int, int, list[str], str]:
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
