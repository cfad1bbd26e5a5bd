"""The one walk over a step's actions: each worker's list in its order, the workers interleaved as a handler allows.
What a reader needs of a schedule is a handler: its order (messages in stream order, syncs: the Interleaver and
validation), its time (the projection's simulator) or the bytes it holds (the memory plan)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

A = TypeVar("A")


class Deadlock(ValueError):
    """Raised when no worker can make progress: each waits for a message or collective that never comes."""


class Handler(Generic[A]):
    """What the walk asks of a reader. The defaults: every action may run at once, each alone, and a worker keeps
    running while it can, then the next one in turn has its go (worker order, wrapping round)."""

    def ready(self, worker: int, action: A) -> bool:
        """Whether `worker` may run `action`, its next one, now. Asked of every unfinished worker, in worker order,
        before each pick."""
        return True

    def run(self, worker: int, action: A) -> Sequence[int]:
        """Run `action`; return the workers whose next action is done by it: `worker`; none while a collective waits
        for its other members; every member once the last of them arrived."""
        return (worker,)

    def pick(self, ready: Sequence[int], last: int) -> int:
        """Which of the `ready` workers (in worker order) runs next; `last` ran the previous action."""
        return min(ready, key=lambda w: (w < last, w))


def walk(workers: Sequence[Sequence[A]], handler: Handler[A], name: Callable[[int], str] = "worker {}".format
         ) -> list[tuple[int, A]]:
    """Run every worker's action list to its end through `handler`; return (worker, action) in the order they were
    done. Raises Deadlock, naming each waiting worker (`name`) and its action, when no worker is ready."""
    cursor = [0] * len(workers)
    order: list[tuple[int, A]] = []
    last = 0
    while True:
        ready = [w for w, actions in enumerate(workers) if cursor[w] < len(actions)
                 and handler.ready(w, actions[cursor[w]])]
        if not ready:
            waiting = [f"{name(w)} at {actions[cursor[w]]}" for w, actions in enumerate(workers)
                       if cursor[w] < len(actions)]
            if waiting:
                raise Deadlock("deadlock, no worker can progress: " + "; ".join(waiting))
            return order
        last = handler.pick(ready, last)
        for w in handler.run(last, workers[last][cursor[last]]):
            order.append((w, workers[w][cursor[w]]))
            cursor[w] += 1
