"""A rank's tie to its launcher: the rank ends as soon as the launcher does, however it ends (kill -9 included),
and holds the suite folder's lock until it has ended.

The launcher keeps the only write end of a pipe; each rank gets the read end and watches it from a thread. A
launcher that dies, of any signal, closes its end in the kernel, so the rank reads end-of-file at once and leaves
(os._exit: nothing of the run is written after its launcher is gone). A rank forked from the warm forkserver
(harness/launch/warm.py) first kills that server, its parent, which would otherwise take seconds of interpreter
finalization to follow its own launcher. The resource tracker then loses its last writer and exits by itself.

The suite folder's lock (harness/launch/lock.py, an flock) is held by an open file description: each rank gets a
duplicate of the launcher's descriptor, so the lock lasts until the last process of the run has closed it, by
ending. A new `dtbench run` into the folder cannot start while a rank of a killed one still lives.

A pipe, not Linux's parent-death signal: a rank's parent is the forkserver, not the launcher, and the pipe works
the same under spawn and on any POSIX system.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext

#: The exit status of a rank that ended because its launcher did (no one reads it: the launcher is gone).
ORPHANED_EXIT = 70


class HeldFd:
    """A file descriptor that a started process receives as its own duplicate (multiprocessing's fd passing, as a
    Connection is passed): the receiving process gets the descriptor number back."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(duplicate) -> int:
    return duplicate.detach()


@dataclass
class Tie:
    """What a rank receives: the read end of its launcher's pipe, the forkserver's pid (None under spawn) and a
    duplicate of the suite folder's lock descriptor (None where no lock is held)."""

    watch: Connection
    server_pid: int | None
    lock: HeldFd | int | None

    def hold(self) -> None:
        """In the rank: watch the launcher from a daemon thread and keep the lock's duplicate open until exit."""
        threading.Thread(target=self._wait_for_launcher, name="dtbench-tether", daemon=True).start()

    def _wait_for_launcher(self) -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                self.watch.recv_bytes()  # the launcher never writes: this returns only at its end
        if self.server_pid is not None and os.getppid() == self.server_pid:
            with contextlib.suppress(OSError):
                os.kill(self.server_pid, signal.SIGKILL)
        os._exit(ORPHANED_EXIT)


class Tether:
    """The launcher's side, for one run: `tie()` for each rank before it starts, `release()` once all have ended."""

    def __init__(self, ctx: BaseContext, server_pid: int | None, lock_fd: int | None):
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self.server_pid = server_pid
        self.lock_fd = lock_fd

    def tie(self) -> Tie:
        return Tie(self._reader, self.server_pid, HeldFd(self.lock_fd) if self.lock_fd is not None else None)

    def release(self) -> None:
        """Close both ends: ranks still alive (there should be none) read end-of-file and leave."""
        self._reader.close()
        self._writer.close()
