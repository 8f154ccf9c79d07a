"""The inspection's records: a distinct compile case (Case), what one compiled case says
(Compiled, read by read.py from its PTX, TTGIR, SASS and ptxas's report), one case's
compile (Outcome: its readings or its error), a row of the table (Inspected: the case,
its outcome, what is wrong with it) and the inspection's metadata (InspectMeta).
inspect.json holds the rows and the metadata as JSON objects (`to_json`), their keys in
the order of the fields here."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TypedDict, cast


@dataclass
class Case:
    """A distinct compile case: kernel, dtype(s), function, config, warps, stages, the
    shapes whose launches it serves, and how a worker process rebuilds its launch
    (`where`: dtype, shape, launch index, config index)."""

    kernel: str
    dtype: str
    fn: str
    config: str
    warps: int
    stages: int
    shapes: list[str] = field(default_factory=list)
    where: tuple[str, dict[str, int], int, int] = ("", {}, 0, 0)


@dataclass(frozen=True)
class Compiled:
    """One compiled case: registers and spills (ptxas -v), shared memory (bytes), the MMA
    family with its element types and instruction shape, the narrowest global load of a
    tensor operand (bits per thread: among the loads whose tile allows 128, `load_bits`;
    of all, `load_bits_all`) and the load kinds, whether the operands allow wide loads and
    the narrowest of those, the fp8 accumulation mode, ptxas's advisories and version,
    whether the launch runs on the matrix unit, tensor memory (columns, -1 not constant;
    the ops moving it), TMA use, and the SASS MMA opcode with the SASS op counts."""

    registers: int
    spill_stores: int
    spill_loads: int
    shared: int
    mma: str
    mma_types: str
    mma_shape: str
    load_bits: int
    load_bits_all: int
    load_kinds: str
    wide_allowed: bool
    wide_allowed_min_bits: int
    fp8_acc: str
    ptxas_warnings: tuple[str, ...]
    ptxas: str
    matrix_unit: bool
    tmem_cols: int
    tmem_ops: str
    tma: str
    sass_mma: str
    sass_ops: dict[str, int]

    @property
    def spills(self) -> bool:
        return bool(self.spill_stores or self.spill_loads)


class CompiledJson(TypedDict, total=False):
    """A compiled case's readings in an inspect.json row (Compiled's fields, asdict's):
    all of them where the case compiled, none where it failed."""

    registers: int
    spill_stores: int
    spill_loads: int
    shared: int
    mma: str
    mma_types: str
    mma_shape: str
    load_bits: int
    load_bits_all: int
    load_kinds: str
    wide_allowed: bool
    wide_allowed_min_bits: int
    fp8_acc: str
    ptxas_warnings: tuple[str, ...]
    ptxas: str
    matrix_unit: bool
    tmem_cols: int
    tmem_ops: str
    tma: str
    sass_mma: str
    sass_ops: dict[str, int]


class CaseJson(TypedDict):
    """An inspect.json row's case: its shapes (how many, which) and its error ("" when
    it compiled)."""

    kernel: str
    dtype: str
    fn: str
    config: str
    warps: int
    stages: int
    shapes: int
    shape_list: list[str]
    error: str


class InspectedJson(CaseJson, CompiledJson):
    """An inspect.json row: the case, a compiled case's readings, the flags, the status."""

    flags: list[str]
    status: str


@dataclass(frozen=True)
class Outcome:
    """One case's compile: its readings, or the error it failed with (one line)."""

    compiled: Compiled | None = None
    error: str = ""
    # Its binary, from the worker that compiled it until its SASS is read (in one batch
    # with the others': compile._compiled_rows), then dropped.
    cubin: bytes = field(default=b"", repr=False)


@dataclass(frozen=True)
class Inspected:
    """A row of the table: the case (kernel, its dtypes comma-joined where one compile
    serves several, function, config, warps, stages, the shapes that launch it), its
    compile, and what is wrong with it (`flags`: compile.flags_of; none: ok)."""

    kernel: str
    dtype: str
    fn: str
    config: str
    warps: int
    stages: int
    shapes: tuple[str, ...]
    outcome: Outcome
    flags: tuple[str, ...] = ()

    @property
    def compiled(self) -> Compiled | None:
        return self.outcome.compiled

    @property
    def error(self) -> str:
        return self.outcome.error

    @property
    def dtypes(self) -> list[str]:
        return self.dtype.split(",")

    @property
    def status(self) -> str:
        return "flagged" if self.flags else "ok"

    @property
    def name(self) -> str:
        """kernel, dtype, function, config, warps and stages, as the flagged list says."""
        return f"{self.kernel} {self.dtype} {self.fn} {self.config} w{self.warps} " \
               f"s{self.stages}"

    def to_json(self) -> InspectedJson:
        """inspect.json's row: the case, its shapes (how many, which), the error ("" when
        it compiled), the readings of a compiled case, the flags and the status."""
        case = CaseJson(
            kernel=self.kernel, dtype=self.dtype, fn=self.fn, config=self.config,
            warps=self.warps, stages=self.stages, shapes=len(self.shapes),
            shape_list=list(self.shapes), error=self.error)
        readings = CompiledJson() if self.compiled is None else \
            cast(CompiledJson, asdict(self.compiled))
        return InspectedJson(**case, **readings, flags=list(self.flags), status=self.status)


@dataclass(frozen=True)
class InspectMeta:
    """inspect.json's metadata: the arch and its limits (shared memory per block; tensor
    memory columns from sm_100 on), the toolchain, the fp8 mode asked for, when and by
    which command, the cases, the selection's cases left out (why), the flagged cases,
    and the summary's figures (registers' range, the most shared memory, the MMA each
    tensor-core dtype got)."""

    arch: str
    capability: int
    smem_limit: int
    tmem_columns: int | None
    triton: str
    ptxas: str
    fp8_accum: str
    python: str
    created: str
    command: str
    cases: int
    left_out: tuple[str, ...]
    flagged: tuple[str, ...]
    registers_range: tuple[int | None, int | None]
    max_shared: int | None
    mma_per_dtype: dict[str, list[str]]

    def to_json(self) -> InspectMetaJson:
        return cast(InspectMetaJson, asdict(self))


class InspectMetaJson(TypedDict):
    """inspect.json's `metadata` (InspectMeta's fields, asdict's)."""

    arch: str
    capability: int
    smem_limit: int
    tmem_columns: int | None
    triton: str
    ptxas: str
    fp8_accum: str
    python: str
    created: str
    command: str
    cases: int
    left_out: tuple[str, ...]
    flagged: tuple[str, ...]
    registers_range: tuple[int | None, int | None]
    max_shared: int | None
    mma_per_dtype: dict[str, list[str]]
