"""The rehearsal: every Triton launch the sweep makes on a GPU, made on a stand-in one.

Cases: every kernel of kernels.REGISTRY with Triton launches, every dtype the sweep runs
for the architecture (KernelSpec.skip_reason), the GPU shapes of a preset (quick by
default), their launches declared once per kernel module (KernelSpec.launches for the
arch's Target, on meta tensors: what compile-ahead and --inspect build).  A case whose
every (launch, config) has the specialization of one rehearsed already (Triton's binder
on the same arguments, as --inspect dedupes) is counted, not rehearsed again.

Each case goes three ways, each on a device index of its own so that each compiles
afresh in memory (Triton's JIT keeps compiled kernels per device; the on-disk cache,
one temporary TRITON_CACHE_DIR, is shared, as the sweep shares it with compile-ahead):
- "sweep": kernels.triton_utils.run_launch(launch), the sweep's own call, with the
  sweep's hooks (interrupt.restore_handlers_after_compiles, kernels.tuning.keep_tuning):
  autotuned over every candidate when there are several (Triton's Autotuner, its
  on-disk cache, the stand-in's timings), compiled for the target, launched on the
  stand-in;
- "config": run_launch(launch, config) for each candidate of a tuned launch (re-timing's
  call): every config compiled and launched, not only the one the tuning chose;
- "compile-ahead": triton_cache.compile_case, what a compile-ahead worker runs
  (JITFunction.warmup of every launch x config), with no post-compile hook, as in a
  freshly spawned worker.
After the sweep and config ways of a case, Python's C-level SIGINT/SIGTERM handlers
must still be there (a compile runs LLVM, which replaces them; the hook puts them back).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from benches.rehearse.driver import STANDIN_DEVICE, GpuModel, StandInDriver, standin_driver
from benches.rehearse.tensors import DeviceMemory
from benches.rehearse.tuning_record import Dropped, Recorder, TuneKey, recording
from kernels.spec import TritonLaunch

PATHS = ("sweep", "config", "compile-ahead")
# The device index each way runs on (see the module's docstring).
PATH_DEVICE = {p: STANDIN_DEVICE + i for i, p in enumerate(PATHS)}


@dataclass(frozen=True)
class Case:
    """One (kernel, dtype, shape) to rehearse: its launches, in order, on meta tensors,
    and what a compile-ahead worker runs for it (None: nothing)."""

    kernel: str
    dtype: str
    shape: str
    launches: list[TritonLaunch]
    compile_ahead: Callable[[], int] | None = None


@dataclass(frozen=True)
class Failure:
    kernel: str
    dtype: str
    shape: str
    path: str  # one of PATHS, "signals", "tuning" or "build"
    launch: str  # the Triton function
    config: str  # kernels.triton_utils.config_str, or what is known of it
    error: str  # the exception's type and first line

    def line(self) -> str:
        return (f"{self.kernel} {self.dtype} {self.shape} {self.launch}[{self.config}] "
                f"({self.path}): {self.error}")


@dataclass
class KernelCount:
    """One kernel's row of the summary table."""

    kernel: str
    dtypes: list[str] = field(default_factory=list)
    cases: int = 0  # rehearsed
    covered: int = 0  # same specializations as a rehearsed case
    launches: int = 0  # launches the stand-in received
    tunings: int = 0
    failures: int = 0
    seconds: float = 0.0


@dataclass
class ArchReport:
    arch: str
    device: str
    capability: list[int]
    triton: str
    cache_dir: str
    identity: str | None = None  # the device identity its tunings are keyed with
    kernels: dict[str, KernelCount] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    tunings: list[TuneKey] = field(default_factory=list)
    wall_s: float = 0.0

    def count(self, kernel: str) -> KernelCount:
        return self.kernels.setdefault(kernel, KernelCount(kernel))


def one_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


# ---- C-level signal handlers ---------------------------------------------------------

def c_handlers() -> dict[int, int | None]:
    """The C-level handler address of SIGINT and SIGTERM (sigaction; sa_handler is the
    struct's first field on Linux); {} where it cannot be read."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        out: dict[int, int | None] = {}
        for s in (signal.SIGINT, signal.SIGTERM):
            buf = ctypes.create_string_buffer(512)
            if libc.sigaction(int(s), None, buf) != 0:
                return {}
            out[int(s)] = ctypes.c_void_p.from_buffer(buf).value
        return out
    except (OSError, AttributeError):
        return {}


# ---- the cases -----------------------------------------------------------------------

def registry_cases(arch: str, model: GpuModel, kernels: list[str], dtypes: list[str],
                   sizes: str, fp8_mode: str, report: ArchReport) -> list[Case]:
    """The distinct cases of the selection (module docstring); what was left out is
    noted in `report`, a case that cannot even be built is a failure there."""
    from benches.inspect.compile import bind
    from benches.sweep import triton_cache
    from benches.sweep.shapes import preset_shapes
    from contract.schema import format_shape
    from kernels import triton_selection
    from kernels.spec import Target

    target = Target("cuda", model.capability, False, arch)
    seen: set[str] = set()
    cases: list[Case] = []
    pairs, notes = triton_selection(kernels, dtypes, target)
    report.left_out.extend(notes)
    for spec, dtype in pairs:
        kernel = spec.name
        count = report.count(kernel)
        count.dtypes.append(dtype)
        for shape in preset_shapes(spec, sizes, on_gpu=True):
            text = format_shape(shape)
            try:
                inputs = spec.make_inputs(shape, dtype, 0, "meta")
                launches = spec.launches(inputs, spec.alloc_out(inputs, dtype),
                                         model.sms, target)
                keys = set()
                for launch in launches:
                    for cfg in launch.configs:
                        src, options = bind(launch, cfg, model.arch)
                        keys.add(src.hash() + json.dumps(options.__dict__,
                                                         sort_keys=True, default=str))
            except Exception as e:
                report.failures.append(Failure(kernel, dtype, text, "build", "-", "-",
                                               one_line(e)))
                count.failures += 1
                continue
            if keys <= seen:
                count.covered += 1
                continue
            seen |= keys
            ahead = functools.partial(triton_cache.compile_case, kernel, dtype,
                                      dict(shape), model.sms, model.capability,
                                      fp8_mode)
            cases.append(Case(kernel, dtype, text, launches, ahead))
    return cases


# ---- the three ways ------------------------------------------------------------------

@contextlib.contextmanager
def sweep_hooks(cache_dir: str) -> Iterator[None]:
    """The sweep's Triton settings for the block (kernels.tuning.keep_tuning, and
    interrupt.restore_handlers_after_compiles as the sweep's iterate installs it), with
    Triton's cache in `cache_dir`; Triton's knobs as they were after."""
    from triton import knobs

    from benches.sweep.interrupt import restore_handlers_after_compiles
    from kernels.tuning import keep_tuning

    with knobs.cache.scope(), knobs.autotuning.scope(), knobs.runtime.scope():
        knobs.cache.dir = cache_dir  # also TRITON_CACHE_DIR, for child processes
        keep_tuning()
        restore_handlers_after_compiles()
        yield


@contextlib.contextmanager
def no_post_compile_hook() -> Iterator[None]:
    """As in a freshly spawned compile-ahead worker: no post-compile hook."""
    from triton import knobs

    saved = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = None
    try:
        yield
    finally:
        knobs.runtime.jit_post_compile_hook = saved


def _dropped_by_autotuner(e: BaseException) -> bool:
    """The errors Autotuner._bench turns into an infinite time (the config is dropped)."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    return isinstance(e, (OutOfResources, CompileTimeAssertionFailure, PTXASError))


def _failed_in_compile_case(e: BaseException) -> tuple[str, str]:
    """(launch, config) compile_case was at when `e` was raised (its frame's locals)."""
    from benches.sweep.triton_cache import compile_case
    from kernels.triton_utils import config_str

    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is compile_case.__code__:
            launch, cfg = tb.tb_frame.f_locals.get("launch"), tb.tb_frame.f_locals.get("config")
            return (getattr(launch, "name", "?"), config_str(cfg) if cfg is not None else "?")
        tb = tb.tb_next
    return "?", "?"


class Rehearsal:
    """Runs cases on one stand-in driver, into one ArchReport."""

    def __init__(self, driver: StandInDriver, rec: Recorder, report: ArchReport) -> None:
        self.driver, self.rec, self.report = driver, rec, report

    def fail(self, case: Case, path: str, launch: str, config: str, error: str) -> None:
        self.report.failures.append(Failure(case.kernel, case.dtype, case.shape, path,
                                            launch, config, error))
        self.report.count(case.kernel).failures += 1

    def run(self, case: Case) -> None:
        from benches.sweep.interrupt import python_handlers_back

        t0, made = time.perf_counter(), len(self.driver.launches)
        tuned = len(self.rec.tunings)
        before = c_handlers()
        self.sweep(case)
        self.configs(case)
        after = c_handlers()
        if before != after:
            names = [signal.Signals(s).name for s in before if before[s] != after.get(s)]
            self.fail(case, "signals", "-", "-", f"{' and '.join(names)}: the C-level "
                      "handler is no longer Python's after a compile")
            python_handlers_back()
        self.compile_ahead(case)
        python_handlers_back()  # as the sweep does after every row
        count = self.report.count(case.kernel)
        count.cases += 1
        count.launches += len(self.driver.launches) - made
        count.tunings += len(self.rec.tunings) - tuned
        count.seconds += time.perf_counter() - t0

    def sweep(self, case: Case) -> None:
        from kernels.triton_utils import config_str, run_launch

        mem = self._on(PATH_DEVICE["sweep"])
        for launch in case.launches:
            self.rec.start(case.kernel, case.dtype, case.shape, launch.name)
            try:
                run_launch(mem.launch(launch))
            except Exception as e:
                config = (config_str(launch.configs[0]) if len(launch.configs) == 1 else
                          self.rec.failed_config or
                          (f"tuned: {self.rec.best}" if self.rec.best else "tuning"))
                self.fail(case, "sweep", launch.name, config, one_line(e))

    def configs(self, case: Case) -> None:
        from kernels.triton_utils import config_str, run_launch

        mem = self._on(PATH_DEVICE["config"])
        for launch in case.launches:
            if len(launch.configs) < 2:
                continue  # the sweep's way ran it already
            self.rec.start(case.kernel, case.dtype, case.shape, launch.name)
            for cfg in launch.configs:
                try:
                    run_launch(mem.launch(launch), cfg)
                except Exception as e:
                    if _dropped_by_autotuner(e):
                        self.report.dropped.append(Dropped(
                            case.kernel, case.dtype, case.shape, launch.name,
                            config_str(cfg), f"{one_line(e)} (run alone)"))
                    else:
                        self.fail(case, "config", launch.name, config_str(cfg),
                                  one_line(e))

    def compile_ahead(self, case: Case) -> None:
        if case.compile_ahead is None:
            return
        self._on(PATH_DEVICE["compile-ahead"])
        with no_post_compile_hook():
            try:
                case.compile_ahead()
            except Exception as e:
                launch, config = _failed_in_compile_case(e)
                if not _dropped_by_autotuner(e):
                    self.fail(case, "compile-ahead", launch, config, one_line(e))

    def _on(self, device: int) -> DeviceMemory:
        self.driver.set_current_device(device)
        return DeviceMemory(device)

    def shared_tunings(self) -> None:
        """A tuning on disk that two kernels read (one tuned it, the other got its
        result): the second is a failure of the `tuning` way."""
        first: dict[str, TuneKey] = {}
        for t in self.rec.tunings:
            owner = first.setdefault(t.cache_key, t)
            if owner.kernel != t.kernel and t.cache_key:
                self.report.failures.append(Failure(
                    t.kernel, t.dtype, t.shape, "tuning", t.launch, t.best,
                    f"shares its on-disk tuning with {owner.kernel} {owner.dtype} "
                    f"{owner.shape} (key {t.tuning_key})"))
                self.report.count(t.kernel).failures += 1


def rehearse(cases: list[Case], model: GpuModel, report: ArchReport,
             log: Callable[[str], None] = print) -> ArchReport:
    """Every case three ways (module docstring) on a stand-in `model`, with the sweep's
    hooks and Triton's cache in report.cache_dir; the report filled in."""
    import triton

    from benches.rehearse.sweep import tuning_identity

    report.triton = triton.__version__
    report.identity = tuning_identity(model)
    if report.identity is not None:
        from kernels.tuning import set_device_identity

        for device in PATH_DEVICE.values():  # as the sweep names its GPU (job.py)
            set_device_identity(report.identity, device)
    t0 = time.perf_counter()
    with sweep_hooks(report.cache_dir), standin_driver(model) as driver, \
            recording(model.key) as rec:
        rehearsal = Rehearsal(driver, rec, report)
        for i, case in enumerate(cases):
            log(f"[{i + 1}/{len(cases)}] {case.kernel} {case.dtype} {case.shape}")
            rehearsal.run(case)
        rehearsal.shared_tunings()
        report.tunings = list(rec.tunings)
        report.dropped += rec.dropped
    report.wall_s = round(time.perf_counter() - t0, 1)
    return report
