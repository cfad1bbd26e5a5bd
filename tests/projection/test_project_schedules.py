"""The projection simulates the very schedule a pipeline method runs: its steady-state step, repeated, equals the
method's own steps action for action, and the messages the simulator pairs are the executors' keys."""

from __future__ import annotations

import pytest

from _dist import context
from harness.project.links import link_of
from harness.project.pipemodel import FREE, StageCosts, pipeline_tasks
from harness.schedule.ir import message_key, message_of

COSTS = StageCosts(1.0, 2.0, 0.5, 0.1, 10.0)
STEPS = 3


def pipeline_methods() -> list[str]:
    """Every registered pipeline method (an alias of one counts once)."""
    from harness import registry

    seen, names = set(), []
    for name in registry.METHODS.names():
        cls = registry.METHODS.get(name)
        if getattr(cls, "family", None) == "pipeline" and cls not in seen:
            seen.add(cls)
            names.append(name)
    return names


def _first_step(name: str, stages: int, microbatches: int) -> int:
    """The runner step the projection's step 0 stands for (its steady state)."""
    if name == "apapo":
        from methods.pipeline.apapo.apapo import APapo
        from methods.pipeline.apapo.schedule import version_delays

        fields = APapo.Params.model_fields
        delays = version_delays(stages, microbatches, fields["iterations_in_flight"].default, fields["delays"].default)
        return max(delays) + 2
    return {"pipedream": stages - 1, "pb": 2 * (stages - 1), "qfb": 1}.get(name, 0)


def _ran(name: str, method, step: int, stages: int, microbatches: int) -> list[list[tuple]]:
    """Per rank, the (op, stage, mb, iteration) the method's executor runs in the runner step that projected step
    `step` stands for: a flushed pipeline's one minibatch schedule with ids advanced by M a step; PipeDream's tick
    S-1+step; PB's tick 2(S-1)+step; APapo's segment t0+step; Q-FB's window 1+step."""
    t = _first_step(name, stages, microbatches) + step
    shift = 0
    if name == "pipedream":
        schedule = method.tick_schedule(t)
    elif name == "pb":
        schedule = method.schedule_at(t)  # tick t with t + 1 samples entered, as train_step runs it
    elif name == "apapo":
        schedule = method.segment(t)
    elif name == "qfb":
        schedule = method.rank_schedule(t)
    else:
        schedule, shift = method.schedule, step * microbatches
    return [[(a.op.value, a.stage, -1 if a.mb is None else a.mb + shift, a.iteration) for a in actions]
            for actions in schedule]


#: The run params that make each method's virtual run the projection's shape: one stage per rank, uniform blocks.
SHAPE = {"pb": {"batch_size": 1}, "apapo": {"replicate": False}}


@pytest.mark.parametrize("name", pipeline_methods())
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (3, 2), (3, 6)])
def test_the_projected_steps_are_the_steps_the_method_runs(name, stages, microbatches, tmp_path):
    """Every registered pipeline method gives its steady-state step (Method.step_schedule), and the projection's
    steps are the method's own, action for action."""
    from harness import registry

    cls = registry.METHODS.get(name)
    step = cls.step_schedule(stages, microbatches)
    assert step is not None, f"{name} gives no step_schedule: the projection cannot re-shape it"
    v = step.stage_count // stages
    params = {"stages": step.stage_count, "partition": "uniform", **SHAPE.get(name, {})}
    if "microbatches" in cls.Params.model_fields and name != "pb":
        params["microbatches"] = microbatches
    model = "digits-mlp" if step.stage_count <= 3 else "digits-resnet"  # 3 and 11 blocks
    cls, ctx = context(name, 0, 1, params, workload=model, run_dir=tmp_path)
    method = cls(ctx)
    tasks = pipeline_tasks(name, [COSTS] * step.stage_count, microbatches, STEPS, ranks=stages)
    assert len(tasks) == stages and v >= 1
    for k in range(STEPS):
        projected = [[(t.op, t.stage, t.mb, t.iteration) for t in rank if t.step == k] for rank in tasks]
        assert projected == _ran(name, method, k, stages, microbatches), (name, k)


@pytest.mark.parametrize("name", pipeline_methods())
def test_every_pipelines_projected_steps_simulate_to_completion(name):
    """Eight steps of each method's schedule run through the simulator with no deadlock (APapo's several
    iterations in flight and Q-FB's windows included): every rank ends, and the steady period is positive."""
    from harness.project.pipemodel import SIMULATED_STEPS, run_on_link

    stages = 3 * (2 if name == "interleaved-1f1b" else 1)  # interleaved: 3 ranks of 2 stages each
    tasks = pipeline_tasks(name, [COSTS] * stages, 3, SIMULATED_STEPS, ranks=3)
    period, busy, bubble = run_on_link(tasks, FREE)
    assert period > 0 and busy > 0 and 0 <= bubble < 1


@pytest.mark.parametrize("name", ["ddp", "no-such-method"])
def test_a_method_without_a_step_schedule_is_not_projected(name):
    """ddp gives none; a method this installation lacks (a plug-in's run folder) neither, and is no crash."""
    with pytest.raises(ValueError, match=f"{name}: its method gives no schedule to re-shape"):
        pipeline_tasks(name, [COSTS] * 2, 2, 1)


def test_the_simulator_keys_messages_as_the_executors_do():
    from harness.schedule.ir import Action, Op

    for op in (Op.SEND_ACT, Op.RECV_ACT, Op.SEND_GRAD, Op.RECV_GRAD):
        action = Action(op, 2, 5, 1)
        assert message_of(action) == message_key(op.value, 2, 1, 5)
    # an activation received at stage 2 is the one stage 1 sent; a gradient received there, stage 3's
    assert message_key("recv_act", 2, 0, 5) == message_key("send_act", 1, 0, 5)
    assert message_key("recv_grad", 2, 0, 5) == message_key("send_grad", 3, 0, 5)


def test_each_workload_is_compared_with_its_own_baseline():
    """A label that ran on several workloads is a configuration on each; each workload's configurations are set
    against the requested baseline where it ran there, else the workload's first ddp, else nothing."""
    from types import SimpleNamespace

    from harness.project.tables import workload_bases

    def config(workload: str, label: str, method: str):
        return SimpleNamespace(workload=workload, model=SimpleNamespace(label=label, method=method))

    calibrations = [config("mlp", "gpipe", "gpipe"), config("mlp", "ddp", "ddp"), config("gpt", "gpipe adamw", "gpipe"),
                    config("gpt", "ddp adamw", "ddp"), config("gpt", "qsgd adamw", "qsgd"), config("cnn", "pb", "pb")]
    suite = SimpleNamespace(calibrations=calibrations)
    bases = {w: c.model.label for w, c in workload_bases(suite, None).items()}
    assert bases == {"mlp": "ddp", "gpt": "ddp adamw"}  # cnn has no ddp: nothing to compare with
    bases = {w: c.model.label for w, c in workload_bases(suite, "qsgd adamw").items()}
    assert bases == {"gpt": "qsgd adamw", "mlp": "ddp"}


def test_a_two_lane_trace_runs_its_lanes_at_once_and_cannot_deadlock():
    """Q-FB's backward lane may start waiting for a gradient before its forward lane sent the activation that
    gradient needs (traced on a smoke run, seed 0). Run as one list in start order that deadlocks; run as two lanes
    (each its own events in order, as LaneExecutor's two threads) it completes, and the lanes overlap: a rank's
    forward lane computes while its backward lane waits or computes."""
    from harness.project.simulate import Task, busy_s, simulate
    from harness.trace import TraceEvent

    def ev(op, mb, start, stage, lane):
        return TraceEvent(op, mb, start, start + 0.001, -1, stage, 4, lane)

    rank0 = [ev("forward", 0, 0.0, 0, 0), ev("recv_grad", 0, 0.1, 0, 1), ev("send_act", 0, 0.2, 0, 0),
             ev("forward", 1, 0.3, 0, 0), ev("backward", 0, 0.5, 0, 1), ev("update", -1, 0.6, 0, 1)]
    rank1 = [ev("recv_act", 0, 0.0, 1, 0), ev("forward", 0, 0.3, 1, 0), ev("backward", 0, 0.35, 1, 1),
             ev("send_grad", 0, 0.4, 1, 1), ev("update", -1, 0.45, 1, 1)]

    def tasks(events, lanes=True):
        return [Task(e.op, e.stage, e.mb, 0.0 if e.op.startswith("recv") else 1.0, 10.0, e.iteration,
                     lane=e.lane if lanes else 0) for e in events]

    with pytest.raises(ValueError, match="deadlock"):
        simulate([tasks(rank0, lanes=False), tasks(rank1, lanes=False)], FREE)
    spans = simulate([tasks(rank0), tasks(rank1)], FREE)
    assert [len(s) for s in spans] == [6, 5]
    at = {(r, s.task.op, s.task.mb): (s.start, s.end) for r, rank in enumerate(spans) for s in rank}
    # rank 0: forward 0 [0, 1], send [1, 2], forward 1 [2, 3] on lane 0; rank 1's forward [2, 3], backward [3, 4]
    # (it waits for its own forward), send_grad [4, 5]; rank 0's backward [5, 6] while its forward lane is done
    assert at[(0, "forward", 1)] == (2.0, 3.0)
    assert at[(1, "backward", 0)][0] == at[(1, "forward", 0)][1] == 3.0
    assert at[(0, "backward", 0)] == (5.0, 6.0)
    assert at[(0, "recv_grad", 0)][0] == 0.0  # the backward lane posted its receive at once
    assert busy_s(spans, 0) == pytest.approx((5 + 4) / 2)


def test_a_ranks_lanes_end_a_step_together():
    """LaneExecutor.run returns when both lanes ended the step: a lane's next step waits for the other lane."""
    from harness.project.simulate import Task, simulate

    rank = [Task("forward", 0, 0, 1.0, step=0, lane=0), Task("backward", 0, 0, 5.0, step=0, lane=1),
            Task("forward", 0, 1, 1.0, step=1, lane=0), Task("backward", 0, 1, 1.0, step=1, lane=1)]
    spans = simulate([rank], FREE)[0]
    assert [(s.start, s.end) for s in spans] == [(0.0, 1.0), (1.0, 6.0), (6.0, 7.0), (7.0, 8.0)]


def test_lanes_overlap_and_busy_time_counts_them_once():
    """A backward whose forward ran before the simulated window does not wait: the two lanes compute at once, and
    the rank's busy time is the union of their spans."""
    from harness.project.simulate import Task, busy_s, simulate

    spans = simulate([[Task("forward", 0, 1, 2.0, lane=0), Task("backward", 0, 0, 3.0, lane=1)]], FREE)
    assert [(s.start, s.end) for s in spans[0]] == [(0.0, 2.0), (0.0, 3.0)]
    assert busy_s(spans, 0) == pytest.approx(3.0)


def test_a_pipeline_wider_than_the_model_is_copied_and_its_copies_all_reduce_before_each_update():
    """64 ranks and 3 blocks: the deepest pipeline of the method's schedule that fits (2 ranks; 64 is even), 32
    copies of it each on 1/32 of the batch, and before every update a sync whose all-reduce spans the 32 copies."""
    from harness.project.links import collective_s
    from harness.project.pipemodel import hybrid_shape
    from harness.project.simulate import Task, simulate

    assert hybrid_shape("gpipe", 64, 4, 3) == (2, 32)
    assert hybrid_shape("gpipe", 6, 4, 3) == (3, 2)
    assert hybrid_shape("interleaved-1f1b", 8, 4, 4) == (2, 4)  # 2 stages per rank: 2 ranks hold 4 stages
    with pytest.raises(ValueError, match="fits the model's 1 blocks"):
        hybrid_shape("interleaved-1f1b", 2, 4, 1)
    link = link_of("1gbit")
    spans = simulate([[Task("sync_grads", 0, -1, 0.0, 4e6, peers=32), Task("update", 0, -1, 1.0)]], link)[0]
    assert spans[0].end == pytest.approx(collective_s("all_reduce", 4e6, 32, link))
    assert spans[1].start == spans[0].end
