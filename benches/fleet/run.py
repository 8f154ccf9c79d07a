"""Fleet runs: `torchrun --nproc-per-node=G run_bench.py [the usual flags]`.

Every rank runs the usual sweep (benches/sweep/job.py `run`) on its own device (cuda:LOCAL_RANK,
or a CPU process with its share of the cores), with ceilings measured on that device and
cached per host and local rank, into its own run folder
(<out>/fleet/<run-id>/ranks/rank-<r>/<device>/<run-id>/).  Before measuring, the ranks
agree on the suite's version, torch, triton and the request, then on the case list each
built (a fingerprint of it, so ranks that would select different cases are refused, not
compared).  After its sweep every rank posts its rows in the rendezvous store, and rank 0
gathers them into <out>/fleet/<run-id>/: results.csv/json with `rank`, `host` and
`gpu_uuid` on every row; they then time the collectives together
(benches/fleet/collectives.py; a fleet of one rank too: its rows have no busbw) and rank 0
adds those rows, summary.md, fleet.md and fleet.png.  A device more than --fleet-tolerance
below the fleet median on a key figure is an outlier, and the exit code is then 1.
Rank 0 speaks; every other rank's console goes to console.log in its rank folder
(benches/fleet/rank_io.py), with one line on stderr if it fails.

Stops.  A rank whose heartbeat stops for --dist-timeout seconds (killed, frozen, its
host gone) is lost (benches/fleet/liveness.py); a rank interrupted by SIGINT or SIGTERM (torchrun
forwards Ctrl-C to every rank of its node) stops measuring and asks every rank to stop.
Either way the fleet stops at once, also mid-sweep (the sweep unwinds as an interrupt
does: its finished rows are kept, marked interrupted), without the collectives; rank 0
gathers the rows every rank still posts within min(--dist-timeout, STOP_GRACE_S), writes
the fleet folder marked incomplete, and says so in one line.  Rank 0 exits 130 or 143
when the fleet was interrupted, 1 when a rank was lost.  A rank whose process lives but
whose sweep never ends (a hung kernel) is given up after the waiting rank's own sweep
time plus --dist-timeout.  The collectives stop too: before each row the ranks agree
on whether one of them was interrupted (benches/fleet/collectives.py), so none is left
waiting in a collective for a rank that left.

Test-only hooks (environment variables, read nowhere else; they exist so the outlier and
failure paths can be tested on one machine, and must not be set otherwise):
GPUBENCH_TEST_SLOW_RANK=r makes rank r's measured times (rows and copy ceiling) 10x
longer; GPUBENCH_TEST_EXIT_RANK=r makes rank r leave after its sweep, before posting its
rows; GPUBENCH_TEST_HANG_RANK=r freezes rank r (its heartbeat stops, as a stopped
process's would) as its sweep starts; GPUBENCH_TEST_KILL_RANK=r makes rank r SIGKILL
itself once every rank's run folder exists (all ranks sweeping: the tests run on one
machine); GPUBENCH_TEST_CASES_RANK=r drops the first case from rank r's case list.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from benches.fleet import dist as fdist
from benches.fleet.dist import FleetRefused, Rank
from benches.fleet.folder import RankInfo, own_rows, versions, write_folder, write_rank_file
from benches.fleet.liveness import FleetError, Liveness
from benches.fleet.rank_io import CONSOLE_LOG, Noted, RankOutput, deferred_signals, say_line
from benches.sweep.interrupt import EXIT_SIGINT, EXIT_SIGTERM, PeerStopped, Terminated
from contract.record import RunRow
from contract.request import RunRequest
from contract.run_meta import RunMeta
from roofline.report.run_time import time_split_line

TEST_SLOW = "GPUBENCH_TEST_SLOW_RANK"
TEST_EXIT = "GPUBENCH_TEST_EXIT_RANK"
TEST_HANG = "GPUBENCH_TEST_HANG_RANK"
TEST_KILL = "GPUBENCH_TEST_KILL_RANK"
TEST_CASES = "GPUBENCH_TEST_CASES_RANK"
POLL_S = 0.1  # how often a waiting rank looks at the store
# After a stop, how long rank 0 waits for the rows of ranks still alive (they were
# stopped too and only need to post what they have); well within torchrun's 30 s
# between forwarding a signal and killing its workers.
STOP_GRACE_S = 10.0
SIGNAL_CODES = {"SIGINT": EXIT_SIGINT, "SIGTERM": EXIT_SIGTERM}


def run_fleet(req: RunRequest, argv: list[str], started: float | None = None) -> int:
    """One rank's fleet run; `started`: the process's start (its sweep's time split
    counts from there, as a single-process run's)."""
    from benches.sweep.job import USER_ERRORS

    try:
        me = fdist.start(req.fleet.dist_timeout, req.device.key)
    except FleetError as e:
        fdist.stop()
        say_line(f"error: {e}")  # every rank: nothing else has been said
        return e.code
    out = RankOutput(me.rank)
    fleet: _Fleet | None = None
    try:
        fleet = _Fleet(me, req, argv, out, started)
        return fleet.main()
    except FleetError as e:
        if fleet is not None:
            fleet.retire(f"rank {me.rank} on {me.host}: {e}")
        out.say(f"error: rank {me.rank} on {me.host}: {e}"
                f"{fleet.where() if fleet is not None else ''}")
        return e.code
    except BaseException as e:
        if fleet is not None:
            fleet.retire(f"rank {me.rank} on {me.host} "
                         + ("was interrupted before measuring"
                            if isinstance(e, (KeyboardInterrupt, Terminated))
                            else f"failed: {type(e).__name__}: {e}"))
        # A request error is said by run_bench (on the terminal: the console is restored
        # by then), an interrupt too; anything else is a bug: its traceback goes to the
        # terminal from rank 0, to console.log from the others (with one line).
        if me.rank and not isinstance(e, (KeyboardInterrupt, Terminated, *USER_ERRORS)):
            traceback.print_exc()
            out.say(f"error: rank {me.rank} on {me.host}: {type(e).__name__}: {e}"
                    f"{fleet.where() if fleet is not None else ''}")
            return 1
        raise
    finally:
        fdist.stop()
        out.close()


def _test_rank(var: str, me: Rank) -> bool:
    return os.environ.get(var) == str(me.rank)


class _Fleet:
    """One rank's part of a fleet run, from the agreement to its exit code."""

    def __init__(self, me: Rank, req: RunRequest, argv: list[str],
                 out: RankOutput, started: float | None = None) -> None:
        self.me, self.req, self.argv, self.out = me, req, argv, out
        self.started = started
        live = fdist.liveness()
        if live is None:
            raise FleetError("torch does not expose the rendezvous store the fleet needs")
        self.live: Liveness = live
        self.run_id = ""
        self.fleet_dir = self.rank_dir = Path(req.output.out)

    def where(self) -> str:
        """Where a rank other than 0 left its console (for its one line on stderr)."""
        return f" (log: {self.out.log})" if self.me.rank and self.out.log else ""

    def retire(self, word: str) -> None:
        self.live.retire(word)

    def key(self, what: str) -> str:
        return f"{self.run_id}/{what}"

    # ---- agreement and the sweep ----------------------------------------------------

    def main(self) -> int:
        from benches.sweep import job

        me, req = self.me, self.req
        fdist.agree("versions and request", versions(req))
        self.run_id = fdist.broadcast_object("sharing the run id", req.output.run_id
                                             or datetime.now().strftime("%Y%m%d-%H%M%S"))
        self.fleet_dir = Path(req.output.out) / "fleet" / self.run_id
        self.rank_dir = self.fleet_dir / "ranks" / f"rank-{me.rank}"
        # This rank's own sweep: its folder and ceiling cache, no gate, no figures.
        mine = replace(
            req, output=replace(req.output, out=str(self.rank_dir), run_id=self.run_id,
                                plots=False),
            gate=replace(req.gate, compare=None),
            ceilings=replace(req.ceilings, cache_dir=str(
                Path(req.output.out) / ".ceilings" / f"{me.host}-rank{me.local_rank}")))
        t0 = time.monotonic()
        try:
            with self.live.armed():
                code = job.run(mine, self.argv, on_cases=self._agree_on_cases,
                               started=self.started)
        except PeerStopped as e:  # before the sweep's own handling: nothing measured
            raise FleetError(f"stopped before measuring: {e.why}",
                             self.live.problem_code) from None
        sweep_s = time.monotonic() - t0
        with deferred_signals() as noted:
            rows, meta, info = own_rows(me, self.rank_dir, self.run_id, code,
                                        slow=_test_rank(TEST_SLOW, me))
            if _test_rank(TEST_EXIT, me):
                os._exit(0)  # test-only: a rank that leaves without a word
            return self._after_sweep(code, sweep_s, rows, meta, info, noted)

    def _agree_on_cases(self, cases: list[Any]) -> None:

        me = self.me
        keys = [list(c.key) for c in cases]
        if _test_rank(TEST_CASES, me):
            keys = keys[1:]
        fdist.agree("case list", {"cases": keys, "number of cases": len(keys)})
        problem = None
        if me.rank == 0:
            try:
                self.fleet_dir.mkdir(parents=True)
            except FileExistsError:
                problem = (f"fleet folder {self.fleet_dir} exists already (runs are never "
                           "overwritten)")
            except OSError as e:
                problem = f"cannot create {self.fleet_dir}: {e.strerror or e}"
        problem = fdist.broadcast_object("making the fleet folder", problem)
        if problem:
            raise FleetRefused(problem)
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        write_rank_file(self.rank_dir, me)
        self.out.settle(self.rank_dir / CONSOLE_LOG)
        if _test_rank(TEST_KILL, me):
            self._kill_when_sweeping()
        if _test_rank(TEST_HANG, me):
            self.live.freeze()  # test-only: a frozen rank (torchrun ends it)
            while True:
                time.sleep(3600)

    def _kill_when_sweeping(self) -> None:
        """Test-only: SIGKILL this rank once every rank's run folder exists (the tests run
        on one machine), so that the others are inside their sweep when it dies."""

        def kill() -> None:
            deadline = time.monotonic() + 120  # a guard: the tests wait for the state
            while time.monotonic() < deadline:
                if all(any((self.fleet_dir / "ranks" / f"rank-{r}").glob(
                        f"*/{self.run_id}/results.json")) for r in range(self.me.world)):
                    break
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()

    # ---- after the sweep: rows to rank 0, the collectives, the fleet folder --------

    def _interrupt(self, meta: RunMeta, noted: Noted) -> str | None:
        """SIGINT or SIGTERM if this rank was signalled (in its sweep, or since)."""
        if meta.state.interrupted and meta.state.signal in SIGNAL_CODES:
            return str(meta.state.signal)
        return noted()

    def _stop_reason(self, meta: RunMeta, noted: Noted) -> tuple[str, int] | None:
        """(why, exit code) once the fleet stops: this rank's own signal (posted for
        the others), else the stop another rank posted or a lost rank."""
        mine = self._interrupt(meta, noted)
        if mine is not None and self.live.problem is None:
            self.live.post_stop(f"rank {self.me.rank} on {self.me.host} was interrupted "
                                f"({mine})", SIGNAL_CODES[mine])
        if self.live.problem is not None:
            return self.live.problem, self.live.problem_code
        return None

    def _after_sweep(self, code: int, sweep_s: float, rows: list[RunRow],
                     meta: RunMeta, info: RankInfo, noted: Noted) -> int:
        me = self.me
        stopped = self._stop_reason(meta, noted)
        if me.rank != 0:
            fdist.post(self.key(f"rows/{me.rank}"), (info, rows))
            step = (fdist.decide(self.key("next"), "done") if stopped
                    else self._wait_for_rank0(sweep_s + me.timeout_s, meta, noted))
            if step == "collectives":
                self._collectives(noted)
            stopped = self._stop_reason(meta, noted)
            self.retire("done")
            own = self._interrupt(meta, noted)
            if own is not None:
                return SIGNAL_CODES[own]  # rank 0 says that the fleet was interrupted
            if stopped and 0 in self.live.lost:  # nobody else can say it
                raise FleetError(self.live.lost[0])
            return stopped[1] if stopped else code
        return self._rank0(code, sweep_s, rows, meta, info, noted)

    def _wait_for_rank0(self, limit_s: float, meta: RunMeta, noted: Noted) -> str:
        """What rank 0 decided after gathering: "collectives" or "done".  A rank that
        stops first decides "done" itself, unless rank 0 decided before: then it joins
        the collectives, which its stop ends at once on every rank."""
        t0 = time.monotonic()
        while (step := fdist.decided(self.key("next"))) is None:
            if 0 in self.live.lost:
                raise FleetError(self.live.lost[0])
            if self._stop_reason(meta, noted) is not None:
                return fdist.decide(self.key("next"), "done")
            if time.monotonic() - t0 >= limit_s and not self._silent(0):
                raise FleetError(f"rank 0 did not gather the rows within {limit_s:.0f} s "
                                 "(this rank's sweep plus --dist-timeout) though its "
                                 "heartbeat goes on: hung?")
            time.sleep(POLL_S)
        return step

    def _gather(self, limit_s: float, meta: RunMeta, noted: Noted
                ) -> tuple[dict[int, Any], dict[int, str]]:
        """Rank 0: the rows every other rank posts, {rank: (info, rows)}, and the ranks
        that posted none, with why.  Waits while they are alive, up to `limit_s`; once
        the fleet stops, up to the grace."""
        live, grace = self.live, min(self.me.timeout_s, STOP_GRACE_S)
        want, got, missing = set(range(1, self.me.world)), {}, {}
        t0, stop_t = time.monotonic(), None
        while want:
            for r in sorted(want):
                key = self.key(f"rows/{r}")
                lost = r in live.lost  # read first: a rank posts its rows, then leaves
                if fdist.posted(key):
                    got[r] = fdist.take(key)
                elif lost:
                    missing[r] = live.lost[r]
                else:
                    continue
                want.discard(r)
            now = time.monotonic()
            if want and self._stop_reason(meta, noted) is not None:
                stop_t = stop_t or now
                if now - stop_t >= grace:
                    for r in want:
                        missing[r] = (f"rank {r} sent no heartbeat for "
                                      f"{live.silent_s(r):.0f} s (died or hung)"
                                      if self._silent(r) else f"rank {r} posted no rows "
                                      f"within {grace:.0f} s of the stop")
                    break
            # A rank whose heartbeat goes on but whose sweep does not end is given up
            # after the limit; one whose heartbeat stopped is judged by it (lost after
            # --dist-timeout of silence).
            hung = [r for r in want if now - t0 >= limit_s and not self._silent(r)]
            for r in hung:
                missing[r] = (f"rank {r} did not finish its sweep within {limit_s:.0f} s "
                              "(rank 0's sweep plus --dist-timeout) though its heartbeat goes "
                              "on: hung?")
                want.discard(r)
            if want:
                time.sleep(POLL_S)
        return got, missing

    def _silent(self, r: int) -> bool:
        """Whether rank r's heartbeat has stopped (no beat for three periods)."""
        silent = self.live.silent_s(r)
        return silent is not None and silent >= 3 * self.live.period_s

    def _collectives(self, noted: Noted, rows: list[RunRow] | None = None) -> int:
        """The collectives, every rank together, into `rows` (kept up to a failure);
        returns the stop code the ranks agreed on (0: the sweep ran to its end)."""
        from benches.fleet import collectives

        def stop() -> int:
            own = noted()
            if own is not None:
                return SIGNAL_CODES[own]
            return self.live.problem_code if self.live.problem is not None else 0

        return fdist.collective("timing the collectives", collectives.sweep, self.me.device,
                                stop=stop, rows=[] if rows is None else rows)

    def _rank0(self, code: int, sweep_s: float, rows: list[RunRow],
               meta: RunMeta, info: RankInfo, noted: Noted) -> int:
        me, req = self.me, self.req
        got, missing = self._gather(sweep_s + me.timeout_s, meta, noted)
        gathered = [(info, rows)] + [got[r] for r in sorted(got)]
        write_folder(self.fleet_dir, me, req, self.argv, meta, gathered, [], final=False)
        stopped = self._stop_reason(meta, noted)
        # (why the fleet stopped, its exit code): a rank's interrupt (130, 143), a lost
        # rank or one that never posted its rows (1)
        stop: tuple[str, int] | None = stopped
        lost = "; ".join(m for _, m in sorted(missing.items())
                         if stopped is None or m != stopped[0])  # said once
        if lost:
            stop = (f"{stopped[0]}; {lost}", stopped[1]) if stopped else (lost, 1)
        coll_rows: list[RunRow] = []
        # One rank too: NCCL and gloo take a world of one, so every op is run and
        # checked on the node's own backend (its rows then carry no busbw).
        step = fdist.decide(self.key("next"), "collectives" if req.fleet.collectives
                            and not req.selection.check_only and stop is None else "done")
        if step == "collectives":
            try:
                agreed = self._collectives(noted, coll_rows)
            except FleetError as e:
                agreed, stop = 0, (str(e), 1)
            if agreed:
                stopped = self._stop_reason(meta, noted)
                stop = (f"{stopped[0] if stopped else 'a rank was interrupted'} during the "
                        "collectives", agreed)
            # the fleet's rows, not one rank's
            coll_rows = [replace(r, fleet=replace(r.fleet, rank=None, host="fleet"),
                                 accounting=replace(r.accounting, device=info.device_key,
                                                    gpu_name=info.device_name))
                         for r in coll_rows]
        signal_name = next((n for n, c in SIGNAL_CODES.items() if stop and c == stop[1]),
                           None)
        outliers = write_folder(self.fleet_dir, me, req, self.argv, meta, gathered,
                                coll_rows, final=True, problem=stop[0] if stop else None,
                                signal_name=signal_name)
        self.retire("done")
        n_rows = sum(len(g[1]) for g in gathered) + len(coll_rows)
        print(f"fleet of {me.world}: {n_rows} rows in {self.fleet_dir} "
              f"({len(coll_rows)} collective rows); outliers: {len(outliers)}")
        for info in (g[0] for g in gathered):
            line = time_split_line(info.time_split_s, info.wall_s)
            if line:
                print(f"rank {info.rank} on {info.host}: {line}")
        for o in outliers:
            print(f"OUTLIER rank {o.device.rank} on {o.device.host}: {o.why}")
        if stop is not None:
            ranks = [g[0].rank for g in gathered]
            lead = ("interrupted" if signal_name and not missing
                    else f"error: rank 0 on {me.host}")
            self.out.say(f"{lead}: the fleet stopped: {stop[0]}; {n_rows} rows of rank(s) "
                         f"{ranks} kept in {self.fleet_dir} (incomplete"
                         + (")" if coll_rows else ", no collectives)"))
            return stop[1]
        worst = max([i.exit_code or 0 for i in (g[0] for g in gathered)] + [code])
        return max(worst, 1 if outliers else 0)
