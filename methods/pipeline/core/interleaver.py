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
        """Check that `worker` owns the action's microbatch; take a received message off its stream, or put a sent
        one on."""
        if action.mb is not None and self.placement.owner(action.stage, action.mb) != worker:
            raise ValueError(f"worker {worker} runs {action}, which belongs to rank "
                             f"{self.placement.owner(action.stage, action.mb)}")
        message = message_of(action)
        if action.op in RECEIVES:
            self.streams[stream_of(message, self.placement)].popleft()
        elif message is not None:
            if message in self.in_flight:
                raise ValueError(f"worker {worker} sends {action} twice")
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


#: A compute op's kind and the kind that must have run before it, once, for the same microbatch on the same worker.
_AFTER = {Op.FORWARD: ("forward", None), Op.BACKWARD: ("backward", "forward"),
          Op.BACKWARD_INPUT: ("backward", "forward"), Op.BACKWARD_WEIGHT: ("weight backward", "backward")}


def validate(schedule: Schedule, placement: Placement | None = None) -> None:
    """Raise if `schedule` runs a backward of a microbatch before its forward (or either twice), deadlocks, leaves a
    message unreceived, receives a stream out of order, or runs an action on a rank that does not own it."""
    placement = placement or Placement.one_per_rank(len(schedule))
    for w, actions in enumerate(schedule):
        done: set[tuple] = set()
        for a in (a for a in actions if a.op in _AFTER):
            kind, after = _AFTER[a.op]
            ident = (a.stage, a.iteration, a.mb)
            if (kind, ident) in done or (after is not None and (after, ident) not in done):
                raise ValueError(f"worker {w} runs the {kind} of {a} twice" + (f", or before its {after}" if after
                                                                                else ""))
            done.add((kind, ident))
    sim = Interleaver(placement)
    sim.advance(schedule)
    if sim.in_flight:
        raise ValueError(f"messages never received: {sorted(sim.in_flight)}")
