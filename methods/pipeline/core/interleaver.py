"""A schedule's order without processes: the Interleaver, the walk's handler of messages and collectives, and the
validator."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from harness.schedule.ir import RECEIVES, Action, Message, Op, Schedule, destination_stage, message_of
from harness.schedule.walk import Handler, walk
from methods.pipeline.core.placement import Placement


def stream_of(message: Message, placement: Placement) -> tuple[str, int, int, int]:
    """(kind, sending stage, source rank, destination rank): messages of one stream travel in order (one tag)."""
    kind, stage, _, mb = message
    return (kind, stage, placement.owner(stage, mb), placement.owner(destination_stage(message), mb))


class Interleaver(Handler[Action]):
    """Runs every worker's action list in one thread, in the walk's order (a worker runs until its next action is a
    receive whose message has not been sent yet, or a SYNC_GRADS that not all of its stage's replicas have reached;
    then the next worker gets a turn); a sync is done for all its replicas when the last of them reaches it.

    Messages of one stream (same kind, stage and pair of ranks) must be received in the order they were sent, as
    one tag between two ranks delivers them; a receive that would overtake an earlier message raises ValueError.
    `run(worker, action)` given to `advance` does the work. Messages in flight persist across calls to `advance`, so
    an asynchronous schedule can be fed tick by tick. With a no-op `run`, it checks a schedule."""

    def __init__(self, placement: Placement):
        self.placement = placement
        self.streams: dict[tuple, deque[Message]] = {}
        self.arrived: dict[tuple[int, int, int], list[int]] = {}  # (stage, iteration, round) -> workers at the sync
        self.execute: Callable[[int, Action], None] = lambda worker, action: None

    @property
    def in_flight(self) -> set[Message]:
        return {m for queue in self.streams.values() for m in queue}

    def ready(self, worker: int, action: Action) -> bool:
        """Whether `action` can run now on `worker` (a receive whose message came; not a sync it already waits at)."""
        if action.op in RECEIVES:
            message = message_of(action)
            queue = self.streams.get(stream_of(message, self.placement))
            if not queue or message not in queue:
                return False
            if queue[0] != message:
                raise ValueError(f"worker {worker}: {action} would overtake {queue[0]} on one stream: a receive "
                                 f"order that differs from the send order")
            return True
        return action.op is not Op.SYNC_GRADS or worker not in self.arrived.get(_sync_key(action), ())

    def commit(self, worker: int, action: Action) -> None:
        """Take a received message off its stream, or put a sent one on."""
        message = message_of(action)
        if action.op in RECEIVES:
            self.streams[stream_of(message, self.placement)].popleft()
        elif message is not None:
            if message in self.in_flight:
                raise ValueError(f"worker {worker} sends {action} twice")
            expected = self.placement.owner(action.stage, action.mb)
            if expected != worker:
                raise ValueError(f"worker {worker} runs {action}, which belongs to rank {expected}")
            self.streams.setdefault(stream_of(message, self.placement), deque()).append(message)

    def run(self, worker: int, action: Action) -> Sequence[int]:
        if action.op is Op.SYNC_GRADS:
            members = self.arrived.setdefault(_sync_key(action), [])
            members.append(worker)
            if len(members) < self.placement.replicas(action.stage):
                return ()
            del self.arrived[_sync_key(action)]
        else:
            members = [worker]
            self.commit(worker, action)
        for member in members:
            self.execute(member, action)
        return members

    def advance(self, schedule: Schedule, run: Callable[[int, Action], None] = lambda w, a: None) -> list[
            tuple[int, Action]]:
        """Run `schedule` (one list per worker) to its end; returns the global order in which actions ran."""
        if len(schedule) != self.placement.world_size:
            raise ValueError(f"schedule has {len(schedule)} workers, the placement {self.placement.world_size}")
        self.execute = run
        return walk(schedule, self)


def _sync_key(action: Action) -> tuple[int, int, int]:
    return (action.stage, action.iteration, action.mb)  # type: ignore[return-value]


def validate(schedule: Schedule, placement: Placement | None = None) -> None:
    """Raise if `schedule` deadlocks, leaves a message unreceived, receives a stream out of order, runs an action on a
    rank that does not own it, runs a backward of a microbatch before its forward (or either twice)."""
    placement = placement or Placement.one_per_rank(len(schedule))
    for w, actions in enumerate(schedule):
        forwards, backwards, weights = set(), set(), set()
        for a in actions:
            ident = (a.stage, a.iteration, a.mb)
            if a.op is Op.FORWARD:
                if ident in forwards:
                    raise ValueError(f"worker {w} runs the forward of {a} twice")
                forwards.add(ident)
            elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
                if ident not in forwards or ident in backwards:
                    raise ValueError(f"worker {w} runs the backward of {a} before its forward, or twice")
                backwards.add(ident)
            elif a.op is Op.BACKWARD_WEIGHT:
                if ident not in backwards or ident in weights:
                    raise ValueError(f"worker {w} runs the weight backward of {a} before its input backward, or twice")
                weights.add(ident)
            if a.op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT) and \
                    placement.owner(a.stage, a.mb) != w:
                raise ValueError(f"worker {w} runs {a}, which belongs to rank {placement.owner(a.stage, a.mb)}")
    sim = Interleaver(placement)
    sim.advance(schedule)
    if sim.in_flight:
        raise ValueError(f"messages never received: {sorted(sim.in_flight)}")
