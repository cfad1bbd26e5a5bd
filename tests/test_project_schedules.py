"""The projection simulates the very schedule a pipeline method runs: its steady-state step, repeated, equals the
method's own steps action for action, and the messages the simulator pairs are the executors' keys."""

from __future__ import annotations

import pytest

from _dist import context
from harness.project.pipemodel import StageCosts, pipeline_tasks
from harness.trace import message_key
from methods.pipeline.core.interleaver import message_of

COSTS = StageCosts(1.0, 2.0, 0.5, 0.1, 10.0)
STEPS = 3


def _ran(name: str, method, step: int, stages: int, microbatches: int) -> list[list[tuple]]:
    """Per rank, the (op, stage, mb, iteration) the method's executor runs in projected step `step`: a flushed
    pipeline's one minibatch schedule with ids advanced by M a step; PipeDream's tick S-1+step."""
    if name == "pipedream":
        schedule, shift = method.tick_schedule(stages - 1 + step), 0
    else:
        schedule, shift = method.schedule, step * microbatches
    return [[(a.op.value, a.stage, -1 if a.mb is None else a.mb + shift, a.iteration) for a in actions]
            for actions in schedule]


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (3, 2), (3, 5)])
def test_the_projected_steps_are_the_steps_the_method_runs(name, stages, microbatches, tmp_path):
    params = {"stages": stages, "partition": "uniform"}
    if name != "pipedream":
        params["microbatches"] = microbatches
    cls, ctx = context(name, 0, 1, params, run_dir=tmp_path)
    method = cls(ctx)
    tasks = pipeline_tasks(name, [COSTS] * stages, microbatches, STEPS)
    for step in range(STEPS):
        projected = [[(t.op, t.stage, t.mb, t.iteration) for t in rank if t.step == step] for rank in tasks]
        assert projected == _ran(name, method, step, stages, microbatches), (name, step)


@pytest.mark.parametrize("name", ["ddp", "no-such-method"])
def test_a_method_without_a_step_schedule_is_not_projected(name):
    """ddp gives none; a method this installation lacks (a plug-in's run folder) neither, and is no crash."""
    with pytest.raises(ValueError, match=f"{name}: its method gives no schedule to re-shape"):
        pipeline_tasks(name, [COSTS] * 2, 2, 1)


def test_the_simulator_keys_messages_as_the_executors_do():
    from methods.pipeline.core.actions import Action, Op

    for op in (Op.SEND_ACT, Op.RECV_ACT, Op.SEND_GRAD, Op.RECV_GRAD):
        action = Action(op, 2, 5, 1)
        assert message_of(action) == message_key(op.value, 2, 1, 5)
    # an activation received at stage 2 is the one stage 1 sent; a gradient received there, stage 3's
    assert message_key("recv_act", 2, 0, 5) == message_key("send_act", 1, 0, 5)
    assert message_key("recv_grad", 2, 0, 5) == message_key("send_grad", 3, 0, 5)
