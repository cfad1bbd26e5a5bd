"""Pipeline schedules as data: validity, torch's action order, 1F1B's memory bound, PipeDream's exact delays."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from methods.pipeline.schedule import (
    Action,
    Deadlock,
    Interleaver,
    Op,
    compute_order,
    gpipe,
    one_f_one_b,
    pipedream,
    pipedream_delay,
    pipedream_drain,
    pipedream_tick,
    validate,
)

CASES = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 3), (3, 8), (4, 4), (4, 9), (5, 2)]


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
@pytest.mark.parametrize("stages,micro", CASES)
def test_flushed_schedules_are_valid_and_complete(make, stages, micro):
    schedule = make(stages, micro)
    validate(schedule)
    for s, actions in enumerate(schedule):
        assert [a.mb for a in actions if a.op is Op.FORWARD] == list(range(micro))
        assert sorted(a.mb for a in actions if a.op is Op.BACKWARD) == list(range(micro))
        assert actions[-1] == Action(Op.UPDATE) and sum(a.op is Op.UPDATE for a in actions) == 1
        assert sum(a.op is Op.SEND_ACT for a in actions) == (micro if s < stages - 1 else 0)
        assert sum(a.op is Op.SEND_GRAD for a in actions) == (micro if s > 0 else 0)


def _torch_order(cls, stages, micro):
    """torch.distributed.pipelining's own action order (its schedule IR), computed without a process group."""
    order = cls._get_pipeline_order(SimpleNamespace(_num_stages=stages, _n_microbatches=micro))
    return [[a.computation_type.value + str(a.microbatch_index) for a in order[rank]
             if a is not None and a.computation_type.value in ("F", "B")] for rank in range(stages)]


@pytest.mark.parametrize("stages,micro", [(2, 2), (2, 4), (3, 3), (3, 6), (4, 4), (4, 8)])
def test_action_order_matches_torch_pipelining(stages, micro):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    ours = {name: [[a for a in stage if a != "U"] for stage in compute_order(make(stages, micro))]
            for name, make in (("gpipe", gpipe), ("1f1b", one_f_one_b))}
    assert ours["gpipe"] == _torch_order(ScheduleGPipe, stages, micro)
    # torch's 1F1B IR gets its last rank wrong (it starts at F1 and ends at F{M}, a microbatch that does not exist),
    # while its executor runs F0, B0, F1, B1, ... there; the other ranks match. The last stage is checked against
    # torch's executor by running Schedule1F1B on gloo (test_pipeline.py).
    theirs = _torch_order(Schedule1F1B, stages, micro)
    assert ours["1f1b"][:-1] == theirs[:-1]
    assert ours["1f1b"][-1] == [f"{op}{m}" for m in range(micro) for op in "FB"]


@pytest.mark.parametrize("stages,micro", [(2, 6), (4, 8), (4, 2)])
def test_1f1b_holds_at_most_s_minus_s_activations(stages, micro):
    def peak(actions):
        live = most = 0
        for a in actions:
            live += (a.op is Op.FORWARD) - (a.op is Op.BACKWARD)
            most = max(most, live)
        return most

    for s, (ours, fill) in enumerate(zip(one_f_one_b(stages, micro), gpipe(stages, micro), strict=True)):
        assert peak(ours) == min(stages - s, micro)
        assert peak(fill) == micro


@pytest.mark.parametrize("stages,minibatches", [(1, 3), (2, 5), (3, 7), (4, 10), (4, 2)])
def test_pipedream_has_exact_delays_and_no_flush(stages, minibatches):
    schedule = pipedream(stages, minibatches)
    validate(schedule)
    for s, actions in enumerate(schedule):
        d = pipedream_delay(s, stages)
        updates = 0
        forward_at: dict[int, int] = {}
        for a in actions:
            if a.op is Op.FORWARD:
                assert forward_at.setdefault(a.mb, updates) == max(0, a.mb - d)  # the newest weights
            elif a.op is Op.BACKWARD:
                assert updates == a.mb  # minibatches 0..t-1 applied, in order, none merged
                assert updates - forward_at[a.mb] == min(a.mb, d)  # the delay: S-1-s once the warm-up is over
            elif a.op is Op.UPDATE:
                updates += 1
        assert updates == minibatches


def test_pipedream_ticks_concatenate_to_the_whole_run():
    stages, n = 3, 6
    whole = pipedream(stages, n)
    for s in range(stages):
        ticks = [a for t in range(n) for a in pipedream_tick(s, stages, t)] + pipedream_drain(s, stages, n)
        assert ticks == whole[s]
    assert pipedream_tick(0, 3, 0) == [Action(Op.FORWARD, 0), Action(Op.SEND_ACT, 0)]
    assert pipedream_tick(2, 3, 0) == [Action(Op.RECV_ACT, 0), Action(Op.FORWARD, 0), Action(Op.BACKWARD, 0),
                                       Action(Op.SEND_GRAD, 0), Action(Op.UPDATE)]


def test_interleaver_feeds_an_asynchronous_schedule_tick_by_tick():
    stages, n = 3, 5
    sim = Interleaver(stages)
    for t in range(n):
        sim.advance([pipedream_tick(s, stages, t) for s in range(stages)])
    sim.advance([pipedream_drain(s, stages, n) for s in range(stages)])
    assert not sim.in_flight


def test_deadlocks_and_bad_schedules_are_caught():
    both_wait = [[Action(Op.RECV_GRAD, 0), Action(Op.FORWARD, 0), Action(Op.SEND_ACT, 0)],
                 [Action(Op.RECV_ACT, 0), Action(Op.FORWARD, 0), Action(Op.BACKWARD, 0), Action(Op.SEND_GRAD, 0)]]
    with pytest.raises(Deadlock, match="stage 0 at rG0"):
        validate(both_wait)
    with pytest.raises(ValueError, match="never received"):
        validate([[Action(Op.FORWARD, 0), Action(Op.SEND_ACT, 0)], [Action(Op.FORWARD, 1)]])
    with pytest.raises(ValueError, match="before its forward"):
        validate([[Action(Op.BACKWARD, 0), Action(Op.FORWARD, 0)]])
    with pytest.raises(ValueError, match="at least one"):
        gpipe(0, 4)
