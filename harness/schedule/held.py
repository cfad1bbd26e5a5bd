"""The bytes a schedule holds, as a handler of the walk: per (worker, stage), what its microbatches hold from their
forward to the action that releases them, and the most at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from harness.schedule.ir import Action, Op, Schedule, split_lanes
from harness.schedule.walk import Handler, walk

#: What ends a microbatch's hold on a stage's activations: its backward, or a split backward's W (the first stage's
#: B is its whole backward).
RELEASES = (Op.BACKWARD, Op.BACKWARD_WEIGHT)


class Held(Handler[Action]):
    """Counts what each (worker, stage) holds: a forward adds `size(action)` (1: microbatches; a stage's activation
    bytes: bytes), its release takes it off; `peaks[(worker, stage)]` is the most it held at once."""

    def __init__(self, size: Callable[[Action], int] = lambda action: 1):
        self.size = size
        self.live: dict[tuple[int, int], dict[tuple, int]] = {}
        self.peaks: dict[tuple[int, int], int] = {}

    def run(self, worker: int, action: Action) -> Sequence[int]:
        where = (worker, action.stage)
        held = self.live.setdefault(where, {})
        if action.op is Op.FORWARD:
            held[action.key] = self.size(action)
            self.peaks[where] = max(self.peaks.get(where, 0), sum(held.values()))
        elif action.op in RELEASES or (action.op is Op.BACKWARD_INPUT and action.stage == 0):
            held.pop(action.key, None)
        return (worker,)


def in_flight_peaks(steps: Iterable[Schedule], lanes: bool = False) -> dict[tuple[int, int], int]:
    """(worker, stage) -> the most microbatches the stage holds at once (forward run, backward not yet) over the
    steps' schedules run in order, each worker's actions in its list's order. With `lanes` (forwards on a lane of
    their own, as Q-FB runs them) a step's forwards may all run before any of its backwards: its forward lane is
    taken first."""
    workers: dict[int, list[Action]] = {}
    for schedule in steps:
        for worker, actions in enumerate(schedule):
            if lanes:
                actions = [a for lane in split_lanes(actions) for a in lane]
            workers.setdefault(worker, []).extend(actions)
    held = Held()
    walk(list(workers.values()), held)
    return held.peaks
