"""The local launcher: one process per rank on this machine, watched, and torn down when any rank dies."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from harness.launch import warm
from harness.launch.failures import describe_failure, error_time
from harness.launch.hang import StallJudge, hang_error
from harness.launch.progress import MetricsTail
from harness.launch.tether import Tether, Tie
from harness.net import emulation
from harness.net.listen import LOOPBACK, hosted_store, loopback_interface
from harness.net.namespaces import NetworkError, enter
from harness.run.checkpoint import STOP
from harness.run.heartbeat import Heartbeat, SharedSlots, beat_interval
from harness.run.records import write_status
from harness.run.worker import Rendezvous, run_rank
from harness.suite.spec import RunSpec

POLL_S = 0.1
TERM_GRACE_S = 3.0


@dataclass
class LaunchResult:
    state: str
    error: dict | None
    seconds: float


def _entry(spec: RunSpec, rank: int, rdzv: Rendezvous, run_dir: str, argv: list[str], resume: bool,
           netns: str | None = None, network_info: dict | None = None, launched_at: float | None = None,
           slots: SharedSlots | None = None, beat_s: float = 1.0, tie: Tie | None = None) -> None:
    if netns is not None:  # first thing: no socket or thread may exist before the rank is in its namespace
        enter(netns)
        os.environ["GLOO_SOCKET_IFNAME"] = emulation.IFNAME
    else:  # gloo's own connections between the ranks stay on this machine too
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback_interface())
    if tie is not None:  # the rank ends the moment its launcher does (harness/launch/tether.py)
        tie.hold()
    # tqdm (datasets' progress bars, in a cold tokenization) would make its default lock, a multiprocessing RLock: a
    # named semaphore that this rank's os._exit below never unlinks, so the resource tracker warned of a leak at the
    # end of `dtbench run`. A rank's bars are its own: a thread lock serves.
    tqdm.set_lock(threading.RLock())
    # The launcher's hang watch reads this rank's progress from shared memory (harness/run/heartbeat.py).
    heartbeat = Heartbeat(slots.writer(rank) if slots is not None else None, beat_s).start()
    # SIGUSR2 on any rank (from a batch system, or a person) stops the run after a checkpoint: state preempted,
    # and `dtbench run --resume` goes on from there.
    STOP.install(stop_on=(signal.SIGUSR2,))
    warm.release_stop_signals()  # one that came while the rank was starting is handled now
    code = run_rank(spec, rank, rdzv, run_dir, "local", True, argv, resume=resume, network=network_info,
                    launched_at=launched_at, heartbeat=heartbeat)
    # Leave without the interpreter's teardown: every file is written and closed and the process group destroyed,
    # and a C++ thread torn down late at exit has aborted a finished rank ("terminate called without an active
    # exception", seen once in a CI smoke run), which the launcher would then report as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _terminate(procs: list[multiprocessing.process.BaseProcess]) -> None:
    """SIGTERM every live rank, then SIGKILL whatever is left after a short grace period. A stopped rank (SIGSTOP)
    is continued after its SIGTERM, so that it ends at once instead of after the grace period. Processes that never
    started are skipped."""
    procs = [p for p in procs if p.pid is not None]
    for p in procs:
        if p.exitcode is None:
            p.terminate()
            try:
                os.kill(p.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + TERM_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join(5.0)


def launch(spec: RunSpec, run_dir: Path, progress: Callable[[MetricsTail], None] | None = None,
           argv: list[str] | None = None, resume: bool = False, lock_fd: int | None = None) -> LaunchResult:
    """Run `spec` with world_size local processes. Returns once every rank has ended.

    With `resume`, the ranks continue from the newest valid checkpoint in run_dir (see worker.run_rank).
    `lock_fd`: the suite folder's lock (harness/launch/lock.py), which every rank holds a duplicate of until it
    ends. Every rank ends as soon as this process does, however it ends (harness/launch/tether.py).

    The launcher hosts the rendezvous store (on a free port it picked itself), so ranks never race for a port. If a
    rank exits with an error or is killed, the remaining ranks are torn down at once and the run is marked failed,
    naming that rank. Ctrl-C tears everything down too. A run whose ranks make no progress for
    spec.hang_timeout_s (a stopped or stuck rank, harness/run/heartbeat.py) is torn down the same way and failed,
    naming the rank that stalled.

    With spec.network, every rank runs in its own network namespace on an emulated network (harness/net/emulation.py),
    built before the ranks start and removed after they have all ended, whatever happened.
    """
    start = time.monotonic()
    if spec.network is None:
        return _launch(spec, run_dir, progress, argv, None, start, resume, lock_fd)
    try:
        with emulation.emulated_network(spec.network, spec.world_size) as topology:
            return _launch(spec, run_dir, progress, argv, topology, start, resume, lock_fd)
    except NetworkError as exc:
        error = {"message": str(exc), "rank": None}
        write_status(run_dir, "failed", error=error)
        return LaunchResult("failed", error, time.monotonic() - start)


def _launch(spec: RunSpec, run_dir: Path, progress: Callable[[MetricsTail], None] | None, argv: list[str] | None,
            topology: emulation.Topology | None, start: float, resume: bool = False,
            lock_fd: int | None = None) -> LaunchResult:
    # The store listens on loopback only; on an emulated network, on the root's address on the ranks' network
    # (where the namespaces reach it), and nowhere else (harness/net/listen.py).
    host = LOOPBACK if topology is None else topology.store_addr
    store = hosted_store(host, spec.world_size)
    rdzv = Rendezvous(host, store.port, store_is_external=True)
    ctx = warm.context()
    argv = list(argv if argv is not None else sys.argv)
    info = topology.describe() if topology is not None else None
    launched_at = time.time()
    slots = SharedSlots(ctx, spec.world_size)
    tether = Tether(ctx, warm.server_pid(), lock_fd)
    # The spec itself goes to each rank (pickled, so not validated again): its params stay the method's Params.
    procs = [warm.process(ctx, _entry, (spec, r, rdzv, str(run_dir), argv, resume,
                                        topology and topology.ranks[r], info, launched_at, slots,
                                        beat_interval(spec.hang_timeout_s), tether.tie()), f"rank{r}")
             for r in range(spec.world_size)]
    tail = MetricsTail(run_dir / "metrics.jsonl")
    failure: dict | None = None
    try:
        with warm.held_stop_signals():  # a spawned rank inherits the mask (forked ones get the server's)
            for p in procs:
                p.start()  # one that fails to start: the ranks started before it are torn down below
        # Counted from here: with the warm forkserver a rank starts from imported modules, in milliseconds.
        judge = StallJudge(spec.world_size, spec.hang_timeout_s, time.monotonic())
        write_status(run_dir, "running", pids={str(r): p.pid for r, p in enumerate(procs)})
        while True:
            ended = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode is not None]
            bad = [(r, code) for r, code in ended if code != 0]
            if bad:
                # The first rank to fail is the cause; peers that fail afterwards do so because it died.
                failure = describe_failure(*min(bad, key=lambda rc: (error_time(run_dir, rc[0]), rc[0])), run_dir)
                _terminate(procs)
                break
            if len(ended) == len(procs):
                break
            now = time.monotonic()
            for r in range(len(procs)):
                if procs[r].exitcode is None:
                    judge.observe(r, *slots.read(r), now)
                else:
                    judge.ended(r)
            stalled = judge.verdict(now)
            if stalled is not None:
                failure = hang_error(stalled, spec.hang_timeout_s)
                _terminate(procs)
                break
            if progress is not None:
                tail.poll()
                progress(tail)
            # Wakes at once when a rank ends (its sentinel), else after POLL_S for the progress bar.
            multiprocessing.connection.wait([p.sentinel for p in procs if p.exitcode is None], POLL_S)
    except KeyboardInterrupt:
        _terminate(procs)
        write_status(run_dir, "failed", error={"message": "interrupted (Ctrl-C)", "rank": None})
        raise
    except BaseException:  # e.g. status.json cannot be written (a full disk): no rank outlives the launcher
        _terminate(procs)
        raise
    finally:
        tether.release()  # every rank has ended here (or was torn down)
        del store
    if progress is not None:
        tail.poll()
        progress(tail)
    if failure is not None:
        write_status(run_dir, "failed", error=failure)
        return LaunchResult("failed", failure, time.monotonic() - start)
    status = _read_state(run_dir)
    return LaunchResult(status.get("state", "failed"), status.get("error"), time.monotonic() - start)


def _read_state(run_dir: Path) -> dict:
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {"state": "failed", "error": {"message": "no status.json was written", "rank": 0}}
    if status.get("state") == "running":
        return {"state": "failed", "error": {"message": "ranks exited without finishing the run", "rank": 0}}
    return status
