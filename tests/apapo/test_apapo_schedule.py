"""APapo's asynchronous multi-iteration schedule as data: valid with several iterations in flight, step by step; the
1F1B memory bound; the version gate; a flush when K = 1 (1F1B's order); the 2BW delay, action by action."""

from __future__ import annotations

import pytest

from harness.schedule.ir import Op, compute_order
from methods.pipeline.apapo.schedule import apapo, gate, segment, version_delay, version_delays, version_of
from methods.pipeline.apapo.schedule import apapo_drain as drain
from methods.pipeline.core.interleaver import Interleaver, validate
from methods.pipeline.core.placement import Placement, place
from methods.pipeline.flushed.schedules import one_f_one_b

CASES = [(s, m, k, rule) for s in (1, 2, 3, 4) for m in (1, 2, 3, 4, 5) for k in (1, 2, 3)
         for rule in ("uniform", "per_stage")]


@pytest.mark.parametrize("stages,microbatches,k,rule", CASES)
def test_the_whole_run_and_every_step_are_valid(stages, microbatches, k, rule):
    iterations = 5
    validate(apapo(stages, microbatches, k, iterations, rule))
    d = version_delays(stages, microbatches, k, rule)
    sim = Interleaver(Placement.one_per_rank(stages))
    for t in range(iterations):
        sim.advance([segment(s, stages, microbatches, d, t) for s in range(stages)])
        assert not sim.in_flight  # no message crosses a step (the runner evaluates between steps)
    sim.advance([drain(s, stages, microbatches, d, iterations) for s in range(stages)])
    assert not sim.in_flight


@pytest.mark.parametrize("stages,microbatches,k,rule", CASES)
def test_each_stage_runs_every_microbatch_once_and_one_update_per_iteration(stages, microbatches, k, rule):
    iterations = 4
    for actions in apapo(stages, microbatches, k, iterations, rule):
        total = iterations * microbatches
        assert [a.mb for a in actions if a.op is Op.FORWARD] == list(range(total))
        assert [a.mb for a in actions if a.op is Op.BACKWARD] == list(range(total))
        updates = [a.iteration for a in actions if a.op is Op.UPDATE]
        assert updates == list(range(iterations))
        for a in actions:
            if a.mb is not None:
                assert a.iteration == a.mb // microbatches


@pytest.mark.parametrize("stages,microbatches,k,rule", CASES)
def test_at_most_s_minus_s_microbatches_and_k_iterations_are_in_flight(stages, microbatches, k, rule):
    for s, actions in enumerate(apapo(stages, microbatches, k, 6, rule)):
        in_flight: set[int] = set()
        for a in actions:
            if a.op is Op.FORWARD:
                in_flight.add(a.mb)
                assert len(in_flight) <= stages - s
                assert len({mb // microbatches for mb in in_flight}) <= max(1, k if stages > 1 else 1)
            elif a.op is Op.BACKWARD:
                in_flight.remove(a.mb)


@pytest.mark.parametrize("stages,microbatches,k,rule", CASES)
def test_every_forward_finds_its_weight_version_made_and_kept(stages, microbatches, k, rule):
    """Before F(u) at stage s, version t - D_s exists (that many updates ran) and, with D_s >= 1, no update newer
    than the one of iteration t - 1 has run (so at most D_s + 1 versions are in use): the 2BW bound for D = 1."""
    delays = version_delays(stages, microbatches, k, rule)
    for s, actions in enumerate(apapo(stages, microbatches, k, 6, rule)):
        updates = 0
        for a in actions:
            if a.op is Op.UPDATE:
                updates += 1
            elif a.op is Op.FORWARD:
                t = a.mb // microbatches
                assert updates >= version_of(a.mb, microbatches, delays[s])
                assert updates <= t  # iteration t's own update comes after its forwards


@pytest.mark.parametrize("stages,microbatches,k", [(s, m, k) for s in (2, 3, 4) for m in (1, 2, 3, 4) for k in (2, 3)])
def test_per_stage_delays_are_the_least_that_keep_1f1bs_bound(stages, microbatches, k):
    """per_stage: D_s = min(K-1, ceil((S-1-s)/M)); at that delay the version term of the gate never binds (so the
    stage runs plain 1F1B, no extra bubble), and one version less would bind for some forward (it is the least)."""
    delays = version_delays(stages, microbatches, k, "per_stage")
    assert delays[-1] == 0 and list(delays) == sorted(delays, reverse=True)
    for s, d in enumerate(delays):
        assert d <= k - 1
        if d == -(-(stages - 1 - s) // microbatches):  # not capped by K
            assert all(gate(u, s, stages, microbatches, d) == max(-1, u - (stages - s)) for u in range(30))
        if d > 0:
            assert any(gate(u, s, stages, microbatches, d - 1) > max(-1, u - (stages - s)) for u in range(30))


def test_per_stage_delays_at_two_stages_are_pipedreams():
    assert version_delays(2, 4, 2, "per_stage") == (1, 0)
    assert version_delays(4, 4, 2, "per_stage") == (1, 1, 1, 0)
    assert version_delays(4, 1, 3, "per_stage") == (2, 2, 1, 0)  # capped at K - 1 = 2 at stage 0
    assert version_delays(3, 2, 2, "uniform") == (1, 1, 1) and version_delays(1, 4, 3, "per_stage") == (0,)
    with pytest.raises(ValueError, match="unknown delay rule"):
        version_delays(2, 4, 2, "stale")


def test_k1_is_a_flush_with_1f1bs_order_every_iteration():
    for stages, microbatches in [(2, 4), (3, 3), (4, 2)]:
        run = compute_order(apapo(stages, microbatches, 1, 3))
        expected = compute_order(one_f_one_b(stages, microbatches))
        for s in range(stages):
            per_iteration = len(expected[s])
            for t in range(3):
                got = run[s][t * per_iteration:(t + 1) * per_iteration]
                renamed = [e.replace(f"@{t}", "") for e in got]
                assert [_strip(e, t, microbatches) for e in renamed] == expected[s]


def _strip(text: str, iteration: int, microbatches: int) -> str:
    """'0F5' of iteration 1 with M = 4 -> '0F1' (microbatch within the iteration)."""
    for op in ("F", "B"):
        if op in text:
            stage, mb = text.split(op)
            return f"{stage}{op}{int(mb) - iteration * microbatches}"
    return text


def test_with_m_at_least_s_minus_one_the_gate_is_plain_1f1b():
    """2BW's condition m >= d: the version gate never holds a forward back; the steady state is 1F1B."""
    for stages in (2, 3, 4):
        for microbatches in range(stages - 1, stages + 3):
            for s in range(stages):
                for u in range(40):
                    assert gate(u, s, stages, microbatches, 1) == max(-1, u - (stages - s))


def test_small_microbatch_counts_throttle_the_pipeline():
    # S = 4, M = 1, K = 2: stage 0 may run only 2 forwards ahead (versions t-1 must exist), not 1F1B's 4
    order = compute_order(apapo(4, 1, 2, 4))[0]
    assert order[:4] == ["0F0", "0F1@1", "0B0", "0U"]


def test_a_replicated_stage_takes_microbatches_round_robin_and_syncs_every_iteration():
    placement = Placement.replicated([2, 1])
    schedule = place(apapo(2, 4, 2, 3), placement)
    validate(schedule, placement)
    assert all(a.mb % 2 == 0 for a in schedule[0] if a.op is Op.FORWARD)
    syncs = [a for a in schedule[0] if a.op is Op.SYNC_GRADS]
    assert [a.iteration for a in syncs] == [0, 1, 2] and syncs == [a for a in schedule[1] if a.op is Op.SYNC_GRADS]


def test_a_single_stage_has_no_delay():
    assert version_delay(1, 3) == 0 and version_delay(2, 2) == 1 and version_delay(4, 3) == 2
    assert [version_of(u, 2, 1) for u in range(8)] == [0, 0, 0, 0, 1, 1, 2, 2]  # 2BW: max(floor(k/m) - 1, 0)
