"""A rank's heartbeat: its progress (training steps, or being alive between them) and its liveness, published by a
thread for a watcher (the local launcher's shared memory, or the rendezvous store under SLURM; docs/design.md).

Two counters per rank, both published every `beat_s` by a daemon thread of the rank:
- `progress`: the training steps this process has finished, plus one per beat while the rank is *not* inside a
  training step. Set-up, the rendezvous, evaluation, checkpoints and the end of the run have no step counter of
  their own and may take longer than any timeout (an ImageNet evaluation, a slow filesystem), so there the rank
  counts as progressing while it is alive. The first step a process takes counts as set-up too (lazy
  initialisation, warm-up, a pipeline filling). So `progress` stops only when the rank is inside a training step
  that does not end, or when the whole process is stopped.
- `beats`: one per beat, always. A rank blocked in a collective, waiting for a stopped peer, still beats; a
  stopped (SIGSTOP) or frozen process does not, which is how a watcher names the stopped rank, not its peers.

The hot path is `begin_step` and `end_step`, two attribute updates on the main thread (well under a microsecond per
step); nothing is written to shared memory or the network there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

#: A beat at most this often, and at least ten times per hang timeout (docs/suites.md, hang_timeout_s).
MIN_BEAT_S = 0.01
MAX_BEAT_S = 1.0


def beat_interval(hang_timeout_s: float) -> float:
    """Seconds between beats for a hang timeout: a tenth of it, at most MAX_BEAT_S and at least MIN_BEAT_S (a tiny
    timeout must not spin the heartbeat thread)."""
    return max(MIN_BEAT_S, min(MAX_BEAT_S, hang_timeout_s / 10))


class Heartbeat:
    """This rank's counters and the thread that publishes them. `publish(progress, beats)` is called on that thread
    as it starts and then every `beat_s` (it may block: the next beat waits); without one, `start` does nothing and
    the step calls only count."""

    def __init__(self, publish: Callable[[int, int], None] | None = None, beat_s: float = MAX_BEAT_S):
        self.steps = 0  # training steps finished by this process
        self.publish = publish
        self.beat_s = beat_s
        self._in_step = False
        self._idle = 0
        self._beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def begin_step(self) -> None:
        """A training step starts: until `end_step`, only its end counts as progress (not the process's first)."""
        self._in_step = self.steps > 0

    def end_step(self) -> None:
        self.steps += 1
        self._in_step = False

    def counters(self) -> tuple[int, int]:
        """(progress, beats) as published now."""
        return self.steps + self._idle, self._beats

    def beat(self) -> None:
        """One beat: count liveness (and progress, outside a step) and publish."""
        if not self._in_step:
            self._idle += 1
        self._beats += 1
        if self.publish is not None:
            self.publish(*self.counters())

    def start(self) -> Heartbeat:
        if self.publish is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dtbench-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self, wait_s: float = 5.0) -> None:
        """Stop beating (the rank has ended its run); waits up to `wait_s` for the thread (a publish may block)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait_s)

    def _run(self) -> None:
        self.beat()
        while not self._stop.wait(self.beat_s):
            self.beat()


class SharedSlots:
    """The local launcher's shared memory: an int64 array of (progress, beats) per rank, written by each rank's
    heartbeat thread and read by the launcher. Aligned 8-byte stores and loads, so no lock: a reader sees each
    counter whole, at worst one beat behind the other."""

    def __init__(self, ctx, world_size: int):
        self.world_size = world_size
        self.array = ctx.RawArray("q", 2 * world_size)

    def writer(self, rank: int) -> Callable[[int, int], None]:
        array, at = self.array, 2 * rank

        def publish(progress: int, beats: int) -> None:
            array[at] = progress
            array[at + 1] = beats

        return publish

    def read(self, rank: int) -> tuple[int, int]:
        return self.array[2 * rank], self.array[2 * rank + 1]
