"""Q-FB's in-flight credits: how far a stage's forward lane may run ahead of its backward lane, and the order in which
the two lanes, so bounded, hold the most at once (what the memory plan walks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from harness.schedule.held import in_flight_peaks
from harness.schedule.ir import Action, Op, Schedule, split_lanes

#: The forward-lane ops whose first on a microbatch takes a credit (its receive, or the first stage's forward).
TAKES = (Op.RECV_ACT, Op.FORWARD)

#: How many microbatches more than its one-lane order holds a stage's two lanes may hold at once: the forward lane
#: runs the next microbatch's forward while the backward lane runs the current one's backward, and no further.
AHEAD = 1


def lane_credits(steps: Sequence[Schedule]) -> dict[tuple[int, int], int]:
    """(worker, stage) -> the most microbatches the stage may hold at once (forward done, backward not yet) when its
    lanes run the steps' lists: what the lists hold in their own (one-lane) order, plus AHEAD."""
    return {where: held + AHEAD for where, held in in_flight_peaks(steps).items()}


def lane_order(steps: Sequence[Schedule], credits: Mapping[tuple[int, int], int]) -> list[Schedule]:
    """Each step's lists as one sequence per worker in the order its two lanes hold the most at once: the forward
    lane's next action whenever it may run, else the backward lane's. A microbatch's first forward-lane action on a
    stage (its receive, or its forward on the first stage) takes one of the stage's credits and its backward gives
    it back (lanes.py, ForwardLaneExecutor: it waits while its stage holds its credits' worth). A step's lanes both
    end before the next step's begin (LaneExecutor.run returns once both are done); what a stage holds carries over
    from step to step."""
    holding: dict[tuple[int, int], int] = {}
    taken: set[tuple[int, int, tuple]] = set()
    out: list[Schedule] = []
    for schedule in steps:
        ordered = []
        for worker, actions in enumerate(schedule):
            forward, backward = split_lanes(actions)
            merged: list[Action] = []
            i = j = 0
            while i < len(forward) or j < len(backward):
                a = forward[i] if i < len(forward) else None
                where = (worker, a.stage) if a is not None else None
                takes = a is not None and a.op in TAKES and (worker, a.stage, a.key) not in taken
                if a is not None and (not takes or holding.get(where, 0) < credits.get(where, 1)):
                    i += 1
                    if takes:
                        holding[where] = holding.get(where, 0) + 1
                        taken.add((worker, a.stage, a.key))
                elif j < len(backward):
                    a, j = backward[j], j + 1
                    if a.op is Op.BACKWARD:
                        holding[(worker, a.stage)] = holding.get((worker, a.stage), 0) - 1
                        taken.discard((worker, a.stage, a.key))
                else:
                    raise ValueError(f"worker {worker}: the forward {a} waits for a credit no backward frees")
                merged.append(a)
            ordered.append(merged)
        out.append(ordered)
    return out
