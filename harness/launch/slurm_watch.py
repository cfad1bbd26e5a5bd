"""The hang watch of a SLURM run, inside its ranks: no parent process watches them there, so every rank publishes
its heartbeat to the rendezvous store, rank 0 judges them all, and the other ranks judge rank 0 by whether the store
it hosts still answers (docs/slurm.md, "Hangs")."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable

from harness.launch.hang import StallJudge, hang_error

KEY = "dtbench/heartbeat/{rank}"  # "<progress> <beats> <state>"; state: r running, d done, f failed
#: Longest a store call may wait for an answer (torch's client may then keep retrying: the silence watch below
#: does not rely on calls returning).
MAX_CALL_S = 5.0


class StoreWatch:
    """One rank's side of the watch; `publish` is its Heartbeat's sink and runs on the heartbeat thread.

    Every beat, the rank sets its key. Rank 0 then reads every rank's key and feeds a StallJudge; a rank is judged
    from the first time its key is seen (before that, the rendezvous's own timeout covers a missing rank), and no
    longer once it has ended. A rank other than 0 that cannot reach the store for `timeout_s` names rank 0: the
    store is served by rank 0's process, so it is stopped or frozen (a stopped rank 0 also stops its own watch).
    That silence is watched by a thread of its own, since a store call to a stopped host may never return. `on_hang
    (error)` is called once, with status.json's error; it ends the job (SlurmRun: writes status.json, then kills
    every task of the job). A rank that failed (its error is in status.json already) ends all watching.
    """

    def __init__(self, rank: int, world_size: int, addr: str, port: int, timeout_s: float,
                 on_hang: Callable[[dict], None], connect_timeout_s: float = 120.0):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.addr, self.port, self.connect_timeout_s = addr, port, connect_timeout_s
        self.on_hang = on_hang
        self.judge: StallJudge | None = None
        self._store = None
        self._gave_up = False
        self._heard: float | None = None  # when the store last answered
        self._fired = False
        self._present: set[str] = set()  # keys seen: a key missing from multi_get would block it

    def publish(self, progress: int, beats: int, state: str = "r") -> None:
        if self._fired or self._gave_up or (self._store is None and not self._connect()):
            return
        try:
            key = KEY.format(rank=self.rank)
            self._store.set(key, f"{progress} {beats} {state}")  # no reply: a stopped store takes it too
            if self.rank == 0:
                self._judge_all(time.monotonic())
            else:
                self._store.check([key])  # one that waits for the store's answer
            self._heard = time.monotonic()
        except RuntimeError:  # torch's store errors (time-outs, a closed connection): the silence watch decides
            pass

    def ended(self, failed: bool) -> None:
        """This rank's run has ended (call after stopping its Heartbeat): no more watching. A failed rank tells
        rank 0, whose judge would otherwise blame its silence for a hang and hide the real error."""
        self._gave_up = True
        if failed and self._store is not None and not self._fired:
            store, key = self._store, KEY.format(rank=self.rank)

            def tell() -> None:
                try:
                    store.set(key, "0 0 f")
                except RuntimeError:
                    pass

            thread = threading.Thread(target=tell, daemon=True)  # never blocks the rank's exit for long
            thread.start()
            thread.join(MAX_CALL_S)

    def _watch_silence(self) -> None:
        """Ranks other than 0: the store (rank 0's process) has not answered for timeout_s: name rank 0."""
        while not (self._fired or self._gave_up):
            time.sleep(min(1.0, self.timeout_s / 10))
            if not self._gave_up and time.monotonic() - self._heard >= self.timeout_s:
                self._fire(hang_error(0, self.timeout_s))

    def _connect(self) -> bool:
        import torch.distributed as dist

        try:
            store = dist.TCPStore(self.addr, self.port, None, is_master=False,
                                  timeout=datetime.timedelta(seconds=self.connect_timeout_s))
        except RuntimeError:  # no store: the rendezvous fails in the main thread and reports it
            self._gave_up = True
            return False
        store.set_timeout(datetime.timedelta(seconds=min(MAX_CALL_S, self.timeout_s / 2)))
        self._store = store
        self._heard = time.monotonic()
        self.judge = StallJudge(self.world_size, self.timeout_s, self._heard, watch_all=False)
        if self.rank != 0:
            threading.Thread(target=self._watch_silence, name="dtbench-store-watch", daemon=True).start()
        return True

    def _judge_all(self, now: float) -> None:
        keys = [KEY.format(rank=r) for r in range(self.world_size)]
        self._present.update(k for k in keys if k not in self._present and self._store.check([k]))
        ranks = [r for r, k in enumerate(keys) if k in self._present]
        values = self._store.multi_get([keys[r] for r in ranks]) if ranks else []
        for r, value in zip(ranks, values, strict=True):
            progress, beats, state = value.decode().split()
            if state == "f":
                self._gave_up = True
                return
            if state == "d":
                self.judge.ended(r)
            else:
                self.judge.observe(r, int(progress), int(beats), now)
        stalled = self.judge.verdict(now)
        if stalled is not None:
            self._fire(hang_error(stalled, self.timeout_s))

    def _fire(self, error: dict) -> None:
        if not self._fired:
            self._fired = True
            self.on_hang(error)
