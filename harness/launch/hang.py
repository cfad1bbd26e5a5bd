"""Hang detection from the ranks' heartbeats (harness/run/heartbeat.py): which rank made no progress for the hang
timeout, judged on the watcher's own clock, and the error a hung run is failed with."""

from __future__ import annotations


def hang_error(rank: int, timeout_s: float) -> dict:
    """status.json's error for a run torn down because `rank` stalled."""
    return {"message": f"rank {rank} made no progress for {timeout_s:g} s (stopped?)", "rank": rank}


class StallJudge:
    """When each rank's progress and beats last changed, on the watcher's clock (so ranks share no clock).

    The run is hung when some watched rank's progress has not changed for `timeout_s`. Its peers then stall too
    (they wait for it in a collective), so the rank named is chosen over every watched rank: first one whose beats
    have stopped as well (the whole process is stopped or frozen: a blocked peer still beats), then the one whose
    progress stopped first, then the lowest rank.
    """

    def __init__(self, world_size: int, timeout_s: float, now: float, watch_all: bool = True):
        """`watch_all`: every rank is watched from `now` (a rank that never beats stalls too); otherwise a rank is
        watched from its first observation on."""
        self.timeout_s = timeout_s
        self.seen: list[tuple[int, int] | None] = [None] * world_size
        self.progress_at = [now] * world_size
        self.beat_at = [now] * world_size
        self.watched = set(range(world_size)) if watch_all else set()
        self._ended: set[int] = set()

    def observe(self, rank: int, progress: int, beats: int, now: float) -> None:
        if rank not in self._ended:
            self.watched.add(rank)
        old = self.seen[rank]
        if old is None or progress != old[0]:
            self.progress_at[rank] = now
        if old is None or beats != old[1]:
            self.beat_at[rank] = now
        self.seen[rank] = (progress, beats)

    def ended(self, rank: int) -> None:
        """`rank` has ended its run: it is no longer watched."""
        self._ended.add(rank)
        self.watched.discard(rank)

    def verdict(self, now: float) -> int | None:
        """The rank to blame if the run is hung now, else None."""
        if not any(now - self.progress_at[r] >= self.timeout_s for r in self.watched):
            return None

        def blame(r: int) -> tuple[bool, float, int]:
            silent = now - self.beat_at[r] >= self.timeout_s / 2
            return silent, now - self.progress_at[r], -r

        return max(self.watched, key=blame)
