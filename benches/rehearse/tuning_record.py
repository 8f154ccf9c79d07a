"""What Triton's autotuner does during a rehearsal, recorded from inside it.

`recording()` wraps three of the autotuner's own steps for the block (the same in
Triton 3.6 and 3.9; put back after):
- `Autotuner._bench(config=...)`: which config is being tried (a failure names it), and
  the configs it gives an infinite time (OutOfResources, PTXASError, a compile-time
  assertion: dropped from the tuning, as on a GPU);
- `Autotuner.check_disk_cache(tuning_key, configs, bench)`: one `TuneKey` per tuning
  looked up on disk, with every input of its on-disk key;
- `get_cache_manager(key)`, as the autotuner module calls it: the key Triton computed,
  and the folder it names.

A TuneKey holds the inputs as Triton 3.6/3.9 hash them ([triton_key(), the target's
backend hash, the kernel's cache_key, the cache-invalidating environment, str(tuning
key)] + str(config) each, sha256 of their "-" join) and `inputs_match`: whether that
hash is the one Triton computed, so a Triton that changes its key shows up as a
mismatch, not as a wrong report.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TuneKey:
    """One tuning's on-disk cache entry: where it is, whether it was there, and what
    its key is made of."""

    kernel: str  # the registry kernel (or the rehearsed case's name)
    dtype: str
    shape: str
    launch: str  # the Triton function
    device: str  # the stand-in device's model key
    tuning_key: str  # str() of the autotuner's key: tune_key values, then arg dtypes
    configs: list[str]
    target: str
    backend_hash: str
    fn_cache_key: str
    env: str
    triton_key_sha: str  # sha256 of triton_key() (the Triton build)
    cache_key: str  # the sha256 Triton computed
    cache_dir: str  # the folder that key names under the cache dir
    hit: bool  # read from disk (no candidate timed)
    best: str  # config_str of the chosen config
    inputs_match: bool


@dataclass(frozen=True)
class Dropped:
    """A config the autotuner timed as infinite (it is left out of the tuning)."""

    kernel: str
    dtype: str
    shape: str
    launch: str
    config: str
    why: str


@dataclass
class Recorder:
    """What `recording` saw; `context` is the case the next calls belong to."""

    device: str
    context: tuple[str, str, str, str] = ("", "", "", "")
    trying: str = ""  # the config _bench is timing, "" outside a tuning
    failed_config: str = ""  # the config whose timing raised
    best: str = ""  # the last tuning's choice
    tunings: list[TuneKey] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    _key: tuple[str, str] = ("", "")  # (key, folder) of the last get_cache_manager

    def start(self, kernel: str, dtype: str, shape: str, launch: str) -> None:
        self.context = (kernel, dtype, shape, launch)
        self.trying = self.failed_config = self.best = ""


def _jit_fn(tuner: Any) -> Any:
    from triton.runtime.jit import JITFunction

    fn = tuner.fn
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    return fn


@dataclass(frozen=True)
class KeyInputs:
    """The inputs of a tuning's on-disk key as Triton hashes them (triton_key(), the
    target's backend hash, the kernel's cache_key, the cache-invalidating environment,
    str(tuning key)), the target and kernel name, and the sha256 of their "-" join with
    every config's str()."""

    triton: str
    backend: str
    fn: str
    env: str
    tuning: str
    target: str
    name: str
    sha: str


def _key_inputs(tuner: Any, tuning_key: Any, configs: list[Any]) -> KeyInputs:
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key
    from triton.runtime.driver import driver

    fn = _jit_fn(tuner)
    target = driver.active.get_current_target()
    parts = (triton_key(), make_backend(target).hash(), fn.cache_key,
             str(sorted(get_cache_invalidating_env_vars().items())), str(tuning_key))
    joined = "-".join([*parts, *(str(c) for c in configs)])
    return KeyInputs(*parts, target=str(target), name=fn.__name__,
                     sha=hashlib.sha256(joined.encode("utf-8")).hexdigest())


@contextlib.contextmanager
def recording(device: str) -> Iterator[Recorder]:
    """Within the block, the autotuner's steps are recorded into the Recorder."""
    from triton.runtime import autotuner as at

    from kernels.triton_utils import config_str

    rec = Recorder(device)
    bench, check, manager = at.Autotuner._bench, at.Autotuner.check_disk_cache, \
        at.get_cache_manager

    def recorded_bench(self: Any, *args: Any, config: Any, **meta: Any) -> Any:
        rec.trying = config_str(config)
        try:
            out = bench(self, *args, config=config, **meta)
        except BaseException:
            rec.failed_config = rec.trying
            raise
        if isinstance(out, (list, tuple)) and out and math.isinf(out[0]):
            from triton.runtime.driver import driver

            why = next((b.error for b in reversed(getattr(driver.active, "benchmarked", []))
                        if b.error), "timed as infinite")
            rec.dropped.append(Dropped(*rec.context, rec.trying, why))
        return out

    def recorded_manager(key: str) -> Any:
        m = manager(key)
        rec._key = (key, str(getattr(m, "cache_dir", "")))
        return m

    def recorded_check(self: Any, tuning_key: Any, configs: list[Any], bench_fn: Any
                       ) -> bool:
        rec._key = ("", "")
        hit = check(self, tuning_key, configs, bench_fn)
        # Both ways leave the candidates' times in configs_timings (read back, or timed).
        timings = getattr(self, "configs_timings", None) or {}
        rec.best = config_str(min(timings, key=timings.get)) if timings else ""
        inputs = _key_inputs(self, tuning_key, configs)
        kernel, dtype, shape, _ = rec.context
        rec.tunings.append(TuneKey(
            kernel, dtype, shape, inputs.name, rec.device, inputs.tuning,
            [str(c) for c in configs], inputs.target, inputs.backend, inputs.fn,
            inputs.env, hashlib.sha256(inputs.triton.encode()).hexdigest(),
            rec._key[0], rec._key[1], bool(hit), rec.best,
            inputs_match=inputs.sha == rec._key[0]))
        return hit

    at.Autotuner._bench = recorded_bench
    at.Autotuner.check_disk_cache = recorded_check
    at.get_cache_manager = recorded_manager
    try:
        yield rec
    finally:
        at.Autotuner._bench = bench
        at.Autotuner.check_disk_cache = check
        at.get_cache_manager = manager
