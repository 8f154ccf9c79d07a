"""One compile-ahead worker (`python -m benches.sweep.compile_worker`), started by
benches/sweep/triton_cache.CompileAhead in a session of its own.

It reads one JSON line on stdin: the file holding the jobs (triton_cache.compile_jobs),
the fp8 mode, the claims folder, the compile function ("module:name") and the
environment variables the sweep set after it started the worker.  Started with
`--preload A,B`, it first imports each module A (and calls A's function where A is
"module:function"; triton_cache.preload loads torch, Triton and the kernels, about 4 s),
so a worker started at the sweep's start is ready when the sweep sends its jobs.
Each job is claimed by creating claims/<index> exclusively, so the workers share the
jobs in run order without a queue or a lock; a claimed job is compiled and its result
written as one JSON line on the worker's stdout ({"job": i, "compiled": n, "built": b}:
n kernels compiled into Triton's cache, b of them built rather than found there; or
{"job": i, "error": "..."}).  Anything else the compile prints goes to stderr, a log
file the sweep reads when it stops the workers (triton_cache.CompileAhead.stop: the
run's `compiled_ahead.worker_errors`); so do a failed preload (`preload NAME: ...`) and
a compile function that cannot be imported (`compile function NAME: ...`, exit code 1).
The worker exits when no job is left.

Stdin stays open while the parent lives: at its end (the parent exited or was killed,
even by SIGKILL) the worker kills its own process group, itself and the ptxas children
of its compile, so no worker outlives the sweep that started it.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from benches.sweep.phases import TimeSplit, compiles_booked


def _compile_fn(name: str) -> Callable[..., int]:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def _die_with_parent(fd: int) -> None:
    """Block until `fd` (stdin) ends (the parent is gone), then kill this process group.
    The raw descriptor: a daemon thread blocked in a buffered read would hold the
    buffer's lock while the interpreter shuts down, which aborts the process."""
    try:
        while os.read(fd, 65536):
            pass
    finally:
        os.killpg(os.getpgrp(), signal.SIGKILL)


def run(order: dict[str, Any], results: IO[str]) -> int:
    """Claim and compile the jobs of `order`, one result line each; how many were done."""
    os.environ.update(order.get("env") or {})
    try:
        compile_fn = _compile_fn(order["compile"])
    except Exception as e:  # every job would fail alike: one line says why, then exit 1
        print(f"compile function {order['compile']}: {type(e).__name__}: {e}",
              file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    claims = Path(order["claims"])
    # The GPU present, when the sweep passed it: compile_case then compiles a launch's
    # shipped config alone (other compile functions are called as before).
    extra = {"device": order["device"]} if order.get("device") else {}
    done = 0
    jobs = json.loads(Path(order["jobs_file"]).read_text())
    # Triton's compilation listener counts what is built, not found in its cache, as
    # the sweep's own process counts it: how a run tells a cold cache from a warm one.
    split = TimeSplit()
    with compiles_booked(split):
        for i, (kernel, dtype, shape, sms, capability) in enumerate(jobs):
            try:
                os.close(os.open(claims / str(i), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue  # another worker has it
            cc = tuple(capability) if capability is not None else None
            before = split.compiles["compiled"]
            try:
                n = int(compile_fn(kernel, dtype, shape, sms, cc, order["fp8_mode"], **extra))
                line = {"job": i, "compiled": n,
                        "built": split.compiles["compiled"] - before}
            except Exception as e:  # counted: the sweep's own compile says what is wrong
                line = {"job": i, "error": f"{type(e).__name__}: {e}"[:200]}
            results.write(json.dumps(line) + "\n")
            results.flush()
            done += 1
    return done


def main() -> int:
    # The results go to the original stdout; what the compile prints (Triton writes the
    # PTX there when ptxas fails) goes to stderr instead.
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    args = sys.argv[1:]
    if args[:1] == ["--preload"] and len(args) > 1:
        for name in filter(None, args[1].split(",")):
            try:
                if ":" in name:
                    _compile_fn(name)()
                else:
                    importlib.import_module(name)
            except Exception as e:  # the job that needs it fails and is counted
                print(f"preload {name}: {type(e).__name__}: {e}", file=sys.stderr)
    line = b""
    while not line.endswith(b"\n"):  # the order: one line, read unbuffered (see above)
        chunk = os.read(0, 65536)
        if not chunk:
            return 0  # the parent is gone already
        line += chunk
    order = json.loads(line)
    threading.Thread(target=_die_with_parent, args=(0,), daemon=True).start()
    run(order, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
