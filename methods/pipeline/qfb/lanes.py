"""Lanes: a stage's forwards and backwards run at the same time on two threads of one rank, on the same weights."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any

import torch

from harness.comm.communicator import Communicator
from harness.memory.peak import thread as allocator_thread
from harness.schedule.ir import FORWARD_LANE_OPS, Action, Op, Schedule, split_lanes
from harness.trace import TraceEvent
from methods.pipeline.core.executor import Microbatches, ProcessExecutor, Trace, Wire
from methods.pipeline.core.placement import Placement
from methods.pipeline.core.stage import Key, Stage

#: The lanes' indices (a trace event's `lane`); harness.schedule.ir.split_lanes says which ops run on which.
FORWARD_LANE, BACKWARD_LANE = 0, 1


def labelled(trace: Trace) -> Trace:
    """The trace with every event's `lane` set from its op (for a list run in one thread, as in the virtual mode)."""
    return Trace([e._replace(lane=FORWARD_LANE if e.op in FORWARD_LANE_OPS else BACKWARD_LANE) for e in trace.events])


class LaneStage(Stage):
    """A Stage whose forwards and backwards may run on two threads at once. They share the module, hence the weights
    (no copy); the backward of microbatch `key` waits until its forward is done (`backward_version_of`, which the
    executor calls first, blocks until then), which only matters at the last stage: elsewhere the output gradient
    arrives after the forward by construction. The executor times that wait as part of the backward action, so the
    time it ended is kept in `ready_at[key]` and LaneExecutor starts the backward's trace event there (the wait shows
    as idle, not as compute). The version a forward used is kept apart from the saved microbatch (`versions`), since
    the backward may consume that before the forward lane asks for it. `abort()` wakes a waiting backward with an
    error (the other lane failed).

    `credits` (set where the lanes are threads: LaneExecutor): the most microbatches the stage holds at once, from
    the forward lane's first action on one (its receive, or its forward on the first stage) to the end of its
    backward (methods/pipeline/qfb/credits.py: the one-lane order's most plus one); `take_credit` waits for one."""

    #: Seconds a backward waits for its forward before it gives up (a lost forward would otherwise hang the rank).
    wait_s = 600.0
    #: How many windows back a forward's version is kept for its backward: a backward runs at most this many windows
    #: after its forward (2 when each window's backwards finish in the window or the next; sync = "ahead" sets more).
    keep_windows = 2

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.versions: dict[Key, int] = {}  # microbatch -> the weight version its forward used (recent windows)
        self.ready_at: dict[Key, float] = {}  # perf_counter() when a backward that waited for its forward could start
        self.failed: str | None = None
        self.done = threading.Condition()
        self.credits: int | None = None
        self.holding: set[Key] = set()  # received or forwarded, backward not yet done (counted only with credits)

    def forward(self, key: Key, x: torch.Tensor, y: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
        out = super().forward(key, x, y, scale)
        version = super().version_of(key)  # before the key is published: no backward can have taken it yet
        with self.done:
            for old in [k for k in self.versions if k[0] < key[0] - self.keep_windows]:  # windows long done
                del self.versions[old]
            self.versions[key] = version
            self.done.notify_all()
        return out

    def take_credit(self, key: Key) -> None:
        """Count microbatch `key` as held (once), first waiting until the stage holds fewer than its credits (a
        backward ended); nothing without credits."""
        if self.credits is None:
            return
        with self.done:
            if key in self.holding:
                return
            if not self.done.wait_for(lambda: len(self.holding) < self.credits or self.failed is not None,
                                      self.wait_s):
                raise RuntimeError(f"stage {self.index}: microbatch {key} found no credit within {self.wait_s:.0f} s "
                                   f"({len(self.holding)} microbatches held)")
            if self.failed is not None:
                raise RuntimeError(f"stage {self.index}: {self.failed}")
            self.holding.add(key)

    def backward(self, key: Key, grad_output: torch.Tensor | None = None) -> torch.Tensor | None:
        grad = super().backward(key, grad_output)
        if self.credits is not None:
            with self.done:  # its bytes are freed: the credit goes back to the forward lane
                self.holding.discard(key)
                self.done.notify_all()
        return grad

    def version_of(self, key: Key) -> int:
        self.wait_for_forward(key)
        return self.versions[key]

    def backward_version_of(self, key: Key) -> int:
        self.wait_for_forward(key)  # then the microbatch is saved, and only this backward will take it
        return super().backward_version_of(key)

    def wait_for_forward(self, key: Key) -> None:
        """Block until the forward of `key` is done (noting when, if it had to wait); raise if the other lane failed."""
        with self.done:
            if key not in self.versions:
                if not self.done.wait_for(lambda: key in self.versions or self.failed is not None, self.wait_s):
                    raise RuntimeError(f"stage {self.index}: the forward of microbatch {key} did not run within "
                                       f"{self.wait_s:.0f} s")
                self.ready_at[key] = time.perf_counter()
            if self.failed is not None:
                raise RuntimeError(f"stage {self.index}: {self.failed}")

    def abort(self, reason: str) -> None:
        with self.done:
            self.failed = reason
            self.done.notify_all()
        self.policy.abort(reason)


class LaneThread:
    """A daemon thread that runs the callables given to `submit` one after another, with its own intra-op thread
    count (torch's OpenMP thread count is per calling thread)."""

    def __init__(self, name: str, threads: int):
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, args=(threads,), name=name, daemon=True)
        self.thread.start()

    def _loop(self, threads: int) -> None:
        torch.set_num_threads(threads)
        while (job := self.jobs.get()) is not None:
            fn, future = job
            del job  # the job's callable holds the step's microbatch views (the batch): let go of it with `fn`
            if future.set_running_or_notify_cancel():
                try:
                    with allocator_thread():  # its allocations join the rank's allocator peak while it is measured
                        try:
                            result = fn()
                        finally:  # before the caller wakes: the batch is the step's, not this thread's until the
                            del fn  # next job comes (its free would be unseen by the meter, and a step late)
                    future.set_result(result)
                except BaseException as error:  # noqa: BLE001 - handed to the caller through the future
                    future.set_exception(error)

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self.jobs.put((fn, future))
        return future

    def close(self) -> None:
        self.jobs.put(None)


class ForwardLaneExecutor(ProcessExecutor):
    """The forward lane's executor: before a stage's microbatch's first action (its receive, or its forward on the
    first stage) it takes one of the stage's credits (LaneStage.take_credit), so that a received activation waits
    in its posted buffer, not decoded, while the stage holds its credits' worth (the wait is outside the trace
    event: idle)."""

    def starting(self, a: Action) -> None:
        if a.op in (Op.RECV_ACT, Op.FORWARD) and a.stage in self.stages:
            self.stages[a.stage].take_credit(a.key)


class LaneExecutor:
    """Runs one rank's action list as two lanes at once: the forward lane (receive activations, forward, send them
    on) and the backward lane (receive gradients, backward, send gradients back, update), each a ProcessExecutor on
    its own LaneThread with its own communicator (process group; the two share the rank's byte ledger). The stages
    are shared: LaneStages. `run` returns the merged trace, each event labelled with its lane. If a lane fails, the
    stages are aborted and its error is raised at once (the other lane may be blocked in a receive)."""

    def __init__(self, rank: int, stages: Mapping[int, LaneStage], comms: Sequence[Communicator],
                 placement: Placement, wire: Wire, threads: int):
        self.stages, self.wire = dict(stages), wire
        self.executors = [kind(rank, stages, comm, placement, wire)
                          for kind, comm in zip((ForwardLaneExecutor, ProcessExecutor), comms, strict=True)]
        self.threads = [LaneThread(f"qfb-lane{lane}", threads) for lane in (FORWARD_LANE, BACKWARD_LANE)]

    def run(self, actions: Sequence[Action], views: Mapping[int, Microbatches]) -> Trace:
        futures = [thread.submit(lambda ex=executor, lane=lane: ex.run(lane, views))
                   for thread, executor, lane in zip(self.threads, self.executors, split_lanes(actions), strict=True)]
        wait(futures, return_when=FIRST_EXCEPTION)
        for lane, future in enumerate(futures):
            if future.done() and future.exception() is not None:
                for stage in self.stages.values():
                    stage.abort(f"lane {lane} failed: {future.exception()}")
                raise future.exception()
        traces = [future.result() for future in futures]
        events = [self._compute_only(e._replace(lane=lane)) for lane, trace in enumerate(traces) for e in trace.events]
        return Trace(sorted(events, key=lambda e: e.start))

    def _compute_only(self, event: TraceEvent) -> TraceEvent:
        """A backward that waited for its forward starts when the wait ended (LaneStage.ready_at)."""
        if event.op != Op.BACKWARD.value or event.stage not in self.stages:
            return event
        ready = self.stages[event.stage].ready_at.pop((event.iteration, event.mb), None)
        return event if ready is None else event._replace(start=min(max(event.start, ready), event.end))

    def flush(self) -> None:
        for executor in self.executors:
            executor.flush()

    def close(self) -> None:
        for thread in self.threads:
            thread.close()


class SingleRankLanes:
    """The virtual mode's executor interface (a schedule in, one trace per rank out) for a pipeline of one rank
    (one stage, no messages): its lanes run as real threads, as on a rank of a multi-process run."""

    def __init__(self, lanes: LaneExecutor):
        self.lanes = lanes

    def run(self, schedule: Schedule, views: Mapping[int, Microbatches]) -> list[Trace]:
        return [self.lanes.run(schedule[0], views)]


class LabelledLanes:
    """The virtual executor of a several-rank pipeline with lanes: every rank's list runs in this one thread (the
    lanes simulated, same numerics), its trace labelled with lanes."""

    def __init__(self, executor: Any):
        self.executor = executor

    def run(self, schedule: Schedule, views: Mapping[int, Microbatches]) -> list[Trace]:
        return [labelled(trace) for trace in self.executor.run(schedule, views)]
