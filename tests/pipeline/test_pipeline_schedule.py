"""Pipeline schedules as data: validity, torch's action order, memory bounds, exact delays, placement on replicas."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.schedule.ir import Action, Op, compute_order
from harness.schedule.walk import Deadlock
from methods.pipeline.core.interleaver import Interleaver, validate
from methods.pipeline.core.placement import Placement, place
from methods.pipeline.flushed.schedules import gpipe, interleaved_1f1b, one_f_one_b
from methods.pipeline.pipedream.schedule import pipedream, pipedream_delay, pipedream_drain, pipedream_tick

CASES = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 3), (3, 8), (4, 4), (4, 9), (5, 2)]


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
@pytest.mark.parametrize("stages,micro", CASES)
def test_flushed_schedules_are_valid_and_complete(make, stages, micro):
    schedule = make(stages, micro)
    validate(schedule)
    for s, actions in enumerate(schedule):
        assert {a.stage for a in actions} == {s}
        assert [a.mb for a in actions if a.op is Op.FORWARD] == list(range(micro))
        assert sorted(a.mb for a in actions if a.op is Op.BACKWARD) == list(range(micro))
        assert actions[-1] == Action(Op.UPDATE, s) and sum(a.op is Op.UPDATE for a in actions) == 1
        assert sum(a.op is Op.SEND_ACT for a in actions) == (micro if s < stages - 1 else 0)
        assert sum(a.op is Op.SEND_GRAD for a in actions) == (micro if s > 0 else 0)


def _torch_order(cls, stages, micro):
    """torch.distributed.pipelining's own action order (its schedule IR), computed without a process group."""
    order = cls._get_pipeline_order(SimpleNamespace(_num_stages=stages, _n_microbatches=micro))
    return [[str(a) for a in order[rank] if a is not None and a.computation_type.value in ("F", "B")]
            for rank in range(stages)]


@pytest.mark.parametrize("stages,micro", [(2, 2), (2, 4), (3, 3), (3, 6), (4, 4), (4, 8)])
def test_action_order_matches_torch_pipelining(stages, micro):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    ours = {name: [[a for a in rank if not a.endswith("U")] for rank in compute_order(make(stages, micro))]
            for name, make in (("gpipe", gpipe), ("1f1b", one_f_one_b))}
    assert ours["gpipe"] == _torch_order(ScheduleGPipe, stages, micro)
    # torch's 1F1B IR gets its last rank wrong (it starts at F1 and ends at F{M}, a microbatch that does not exist),
    # while its executor runs F0, B0, F1, B1, ... there; the other ranks match. The last stage is checked against
    # torch's executor by running Schedule1F1B on gloo (test_pipeline.py).
    theirs = _torch_order(Schedule1F1B, stages, micro)
    assert ours["1f1b"][:-1] == theirs[:-1]
    assert ours["1f1b"][-1] == [f"{stages - 1}{op}{m}" for m in range(micro) for op in "FB"]


def _torch_interleaved_order(ranks, chunks, micro):
    """ScheduleInterleaved1F1B's per-rank compute order, from its own rank-order function (no process group)."""
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    sched = object.__new__(ScheduleInterleaved1F1B)
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = ranks, chunks, micro
    sched.number_of_rounds = max(1, micro // ranks)
    sched.microbatches_per_round = micro // sched.number_of_rounds
    return [[str(a) for a in sched._calculate_single_rank_operations(r) if a is not None] for r in range(ranks)]


@pytest.mark.parametrize("ranks,chunks,micro", [(2, 2, 4), (2, 2, 8), (2, 3, 4), (3, 2, 6), (4, 2, 8), (2, 2, 2),
                                                 (2, 2, 3), (4, 2, 10)])
def test_interleaved_1f1b_matches_torch_and_is_valid(ranks, chunks, micro):
    schedule = interleaved_1f1b(ranks, chunks, micro)
    validate(schedule, Placement.interleaved(ranks, chunks))
    ours = [[a for a in rank if not a.endswith("U")] for rank in compute_order(schedule)]
    assert ours == _torch_interleaved_order(ranks, chunks, micro)
    for r, actions in enumerate(schedule):
        assert [a.stage for a in actions if a.op is Op.UPDATE] == [c * ranks + r for c in range(chunks)]


def test_interleaved_1f1b_refuses_microbatches_that_do_not_split_into_rounds():
    with pytest.raises(ValueError, match="multiple of the rank count"):
        interleaved_1f1b(4, 2, 9)  # 2 rounds of 4.5 microbatches


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
    assert pipedream_tick(0, 3, 0) == [Action(Op.FORWARD, 0, 0), Action(Op.SEND_ACT, 0, 0)]
    assert pipedream_tick(2, 3, 0) == [Action(Op.RECV_ACT, 2, 0), Action(Op.FORWARD, 2, 0),
                                       Action(Op.BACKWARD, 2, 0), Action(Op.SEND_GRAD, 2, 0), Action(Op.UPDATE, 2)]


@pytest.mark.parametrize("replicas,n", [([2, 1], 7), ([1, 2], 6), ([2, 2], 9), ([3, 1, 2], 11)])
def test_replicated_pipedream_rounds_are_valid_and_apply_every_minibatch(replicas, n):
    """1F1B-RR: minibatch t on replica t mod r; the replicas sync and update once per round of r minibatches (a
    partial last round closes in the drain), every replica the same number of times; fed tick by tick."""
    placement = Placement.replicated(replicas)
    stages = len(replicas)
    sim = Interleaver(placement)
    whole = [[] for _ in range(placement.world_size)]
    for t in range(n):
        tick = place([pipedream_tick(s, stages, t, replicas[s]) for s in range(stages)], placement)
        sim.advance(tick)
        for rank, actions in enumerate(tick):
            whole[rank] += actions
    drain = place([pipedream_drain(s, stages, n, replicas[s]) for s in range(stages)], placement)
    sim.advance(drain)
    assert not sim.in_flight
    for rank, actions in enumerate(whole):
        actions += drain[rank]
        (s,) = placement.stages_of(rank)
        r = replicas[s]
        assert [a.mb for a in actions if a.op is Op.FORWARD] == [t for t in range(n) if t % r == rank - min(
            placement.ranks_of(s))]
        rounds = -(-n // r)
        assert sum(a.op is Op.UPDATE for a in actions) == (rounds if r > 1 else n)
        assert sum(a.op is Op.SYNC_GRADS for a in actions) == (rounds if r > 1 else 0)


def test_place_sends_each_microbatch_to_its_replica_and_syncs_before_the_update():
    placement = Placement.replicated([2, 1])
    placed = place(gpipe(2, 4), placement)
    validate(placed, placement)
    assert compute_order(placed) == [["0F0", "0F2", "0B0", "0B2", "0U"], ["0F1", "0F3", "0B1", "0B3", "0U"],
                                     [f"1F{m}" for m in range(4)] + [f"1B{m}" for m in range(4)] + ["1U"]]
    assert [str(a) for a in placed[0][-2:]] == ["0S0", "0U"] and [str(a) for a in placed[1][-2:]] == ["0S0", "0U"]
    assert placement.owner(0, 3) == 1 and placement.stages_of(2) == [1]


def test_interleaver_feeds_an_asynchronous_schedule_tick_by_tick():
    stages, n = 3, 5
    sim = Interleaver(Placement.one_per_rank(stages))
    for t in range(n):
        sim.advance([pipedream_tick(s, stages, t) for s in range(stages)])
    sim.advance([pipedream_drain(s, stages, n) for s in range(stages)])
    assert not sim.in_flight


def test_deadlocks_and_bad_schedules_are_caught():
    both_wait = [[Action(Op.RECV_GRAD, 0, 0), Action(Op.FORWARD, 0, 0), Action(Op.SEND_ACT, 0, 0)],
                 [Action(Op.RECV_ACT, 1, 0), Action(Op.FORWARD, 1, 0), Action(Op.BACKWARD, 1, 0),
                  Action(Op.SEND_GRAD, 1, 0)]]
    with pytest.raises(Deadlock, match="worker 0 at 0rG0"):
        validate(both_wait)
    with pytest.raises(ValueError, match="never received"):
        validate([[Action(Op.FORWARD, 0, 0), Action(Op.SEND_ACT, 0, 0)], [Action(Op.FORWARD, 1, 1)]])
    with pytest.raises(ValueError, match="before its forward"):
        validate([[Action(Op.BACKWARD, 0, 0), Action(Op.FORWARD, 0, 0)]])
    with pytest.raises(ValueError, match="at least one"):
        gpipe(0, 4)
    out_of_order = [[Action(Op.FORWARD, 0, 0), Action(Op.SEND_ACT, 0, 0), Action(Op.FORWARD, 0, 1),
                     Action(Op.SEND_ACT, 0, 1)],
                    [Action(Op.RECV_ACT, 1, 1), Action(Op.FORWARD, 1, 1), Action(Op.RECV_ACT, 1, 0),
                     Action(Op.FORWARD, 1, 0)]]
    with pytest.raises(ValueError, match="overtake"):
        validate(out_of_order)  # one tag per stream: receives must come in send order
    lone_sync = [[Action(Op.SYNC_GRADS, 0, 0), Action(Op.UPDATE, 0)], [Action(Op.UPDATE, 0)]]
    with pytest.raises(Deadlock, match="0S0"):
        validate(lone_sync, Placement.replicated([2]))  # a replica never reaches its sync
    with pytest.raises(ValueError, match="belongs to rank 1"):
        validate([[Action(Op.FORWARD, 0, 1)], []], Placement.replicated([2]))
