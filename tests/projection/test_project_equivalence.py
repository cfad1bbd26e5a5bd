"""The projection's simulator and the virtual executor's Interleaver interpret every pipeline method's step schedule
alike: both run it to completion, each lane runs the same actions in the same order, messages pair the same sender
and receiver, and the simulator's timeline is an order the Interleaver accepts (no receive before its send, one
stream's messages in order, no sync before every replica reached it)."""

from __future__ import annotations

import pytest
from test_project_schedules import pipeline_methods

from harness.project.pipemodel import FREE, StageCosts, required_step_schedule, schedule_tasks
from harness.project.simulate import simulate
from harness.schedule.ir import RECEIVES, SENDS, Action, Op, message_of
from harness.trace import StepSchedule
from methods.pipeline.core.interleaver import Interleaver
from methods.pipeline.core.placement import Placement

STEPS = 3
#: Unequal costs per op, so that the simulator's timeline is not a lockstep one: forward, backward, update, send
#: seconds, bytes per message.
COSTS = StageCosts(1.0, 2.5, 0.25, 0.125, 1.0)


def _actions(step: StepSchedule, steps: int) -> list[list[Action]]:
    """The step repeated `steps` times with its ids advanced, as the executors would see them (Action objects)."""
    return [[Action(Op(a.op), a.stage, None if a.mb is None else a.mb + r * step.shift,
                    a.iteration + r * step.iteration_shift)
             for r in range(steps) for a in actions] for actions in step.ranks]


def _placement(step: StepSchedule) -> Placement:
    ranks = len(step.ranks)
    if step.stage_count > ranks:
        return Placement.interleaved(ranks, step.stage_count // ranks)
    return Placement.one_per_rank(ranks)


def _primed(placement: Placement, actions: list[list[Action]]) -> Interleaver:
    """An Interleaver with the messages the window receives but does not send (sent before it: a steady-state step
    of PipeDream, PB or APapo) already in flight, in the order their receivers take them; the simulator lets such a
    receive through at once."""
    sent = {message_of(a) for rank in actions for a in rank if a.op in (Op.SEND_ACT, Op.SEND_GRAD)}
    interleaver = Interleaver(placement)
    for rank in actions:
        for a in rank:
            if a.op in (Op.RECV_ACT, Op.RECV_GRAD) and message_of(a) not in sent:
                kind, stage, iteration, mb = message_of(a)
                send = Action(Op.SEND_ACT if kind == "act" else Op.SEND_GRAD, stage, mb, iteration)
                interleaver.commit(placement.owner(stage, mb), send)
    return interleaver


def _ident(op: str, stage: int, mb: int | None, iteration: int) -> tuple:
    return op, stage, -1 if mb is None else mb, iteration


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("method", pipeline_methods())
def test_simulator_and_interleaver_run_every_schedule_alike(method: str, stages: int):
    step = required_step_schedule(method, stages, 4)
    actions = _actions(step, STEPS)
    placement = _placement(step)
    interleaver = _primed(placement, actions)
    order = interleaver.advance(actions)  # raises Deadlock if it cannot run
    spans = simulate(schedule_tasks(step, [COSTS] * step.stage_count, STEPS), FREE)

    # each lane runs the same actions in the same order (a lane's order in the simulator: its start times)
    interleaved: dict[tuple[int, int], list[tuple]] = {}
    for w, a in order:
        interleaved.setdefault((w, step.lane(a.op.value)), []).append(_ident(a.op.value, a.stage, a.mb, a.iteration))
    simulated: dict[tuple[int, int], list[tuple]] = {}
    for r, rank in enumerate(spans):
        for s in sorted(rank, key=lambda s: (s.start, s.end)):
            t = s.task
            simulated.setdefault((r, t.lane), []).append(_ident(t.op, t.stage, t.mb, t.iteration))
    assert simulated == interleaved

    # the same messages between the same ranks
    def pairs(events):
        out: dict[tuple, list] = {}
        for rank, op, message in events:
            out.setdefault(message, [None, None])[op in RECEIVES] = rank
        return out

    from_order = pairs((w, a.op.value, message_of(a)) for w, a in order if a.op.value in (*SENDS, *RECEIVES))
    from_spans = pairs((r, s.task.op, s.task.message) for r, rank in enumerate(spans) for s in rank
                       if s.task.op in (*SENDS, *RECEIVES))
    assert from_spans == from_order

    # the simulator's timeline, replayed through the Interleaver's rules: sends before the receives that end with
    # them, a sync's members all at once
    replay = _primed(placement, actions)
    timeline = sorted(((s.end, s.task.op in RECEIVES, s.start, r, s) for r, rank in enumerate(spans) for s in rank),
                      key=lambda item: item[:4])
    syncs: dict[tuple, set[tuple[float, float]]] = {}
    for _, _, _, r, s in timeline:
        t = s.task
        a = Action(Op(t.op), t.stage, None if t.mb < 0 else t.mb, t.iteration)
        if a.op is Op.SYNC_GRADS:
            syncs.setdefault((t.stage, t.mb, t.iteration, t.step), set()).add((s.start, s.end))
            continue
        assert replay.ready(r, a), f"rank {r} ran {a} at {s.start:g}..{s.end:g} before the Interleaver could"
        replay.commit(r, a)
    assert all(len(times) == 1 for times in syncs.values())  # every replica of a sync starts and ends together
    assert replay.in_flight == interleaver.in_flight  # what the window leaves for the next one


def test_the_replay_catches_a_receive_before_its_send():
    """The check above can fail: a timeline whose receive ran before the matching send is refused."""
    replay = Interleaver(Placement.one_per_rank(2))
    assert not replay.ready(1, Action(Op.RECV_ACT, 1, 0))
    replay.commit(0, Action(Op.SEND_ACT, 0, 0))
    assert replay.ready(1, Action(Op.RECV_ACT, 1, 0))
