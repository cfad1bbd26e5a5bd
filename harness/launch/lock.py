"""One writer per suite folder: `dtbench run` holds an exclusive lock on <out>/<suite>/.lock while it writes there."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".lock"


class FolderBusy(RuntimeError):
    """Another process holds the suite folder's lock."""


@contextlib.contextmanager
def suite_lock(suite_dir: Path) -> Iterator[int]:
    """Hold suite_dir/.lock (flock, exclusive, not waiting) for the block, yielding its descriptor; FolderBusy naming
    the holder's pid when another process has it. The kernel drops the lock when the last descriptor of it closes,
    however its holders exit, so a killed `dtbench run` leaves nothing to clean up. The local launcher hands each
    rank a duplicate of the descriptor (harness/launch/tether.py): the lock lasts until the last rank has ended."""
    suite_dir.mkdir(parents=True, exist_ok=True)
    path = suite_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise FolderBusy(f"{suite_dir}: another dtbench run (pid {holder}) is writing to this suite folder; "
                             "wait for it to end, or give this run another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield fd
    finally:
        os.close(fd)
