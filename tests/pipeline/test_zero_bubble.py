"""ZB-H1: the split backward (B then W) equals the fused one, the method is SGD's step (transparency), multi-process
equals virtual, its schedule is valid with 1F1B's peak of microbatches held, and its bubble is the paper's formula,
below 1F1B's."""

from __future__ import annotations

import pytest
import torch
from test_pipeline import _flat, _make, _ranks, _sgd_flat, _stage_params, _train

from _dist import spawn
from harness.project.pipemodel import FREE, StageCosts, pipeline_tasks
from harness.project.simulate import period_s, simulate, simulated_bubble
from harness.schedule.ir import Op
from methods.pipeline.core.interleaver import validate
from methods.pipeline.flushed.schedules import one_f_one_b, zb_h1


def _stage(index: int, stages: int):
    from methods.pipeline.core.stage import Stage
    from methods.pipeline.core.versions import Live

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5))
    return Stage(index, stages, module, torch.optim.SGD(module.parameters(), lr=0.1), Live(module),
                 torch.nn.functional.cross_entropy)


@pytest.mark.parametrize("index,stages", [(1, 2), (1, 3), (0, 2)])
def test_the_split_backward_equals_the_fused_one(index, stages):
    """B then W gives the input gradient and the weight gradients of one backward (last, middle and first stage)."""
    torch.manual_seed(1)
    x, y, g = torch.randn(4, 6), torch.randint(0, 5, (4,)), torch.randn(4, 5)
    last = index == stages - 1
    grads = []
    for split in (False, True):
        stage = _stage(index, stages)
        stage.forward((0, 0), x, y if last else None)
        if split:
            dx = stage.backward_input((0, 0), None if last else g)
            assert all(p.grad is None for p in stage.module.parameters()) or stage.first
            stage.backward_weight((0, 0))
        else:
            dx = stage.backward((0, 0), None if last else g)
        grads.append(([p.grad.clone() for p in stage.module.parameters()], dx))
        assert stage.backwards_since_update == 1 and stage.in_flight() == 0
    (fused, dx_fused), (split, dx_split) = grads
    for a, b in zip(fused, split, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    if index == 0:
        assert dx_fused is None and dx_split is None
    else:
        torch.testing.assert_close(dx_fused, dx_split, rtol=1e-6, atol=1e-7)


def test_a_pending_weight_backward_is_held_memory():
    stage = _stage(1, 3)
    stage.forward((0, 0), torch.randn(4, 6))
    held = stage.held().activation_bytes
    stage.backward_input((0, 0), torch.randn(4, 5))
    assert stage.held().activation_bytes == held and stage.held().microbatches == 1  # until W ran
    stage.backward_weight((0, 0))
    assert stage.held().microbatches == 0


@pytest.mark.parametrize("stages,micro", [(2, 4), (3, 5), (3, 1), (1, 3), (4, 8)])
def test_zb_h1_schedules_are_valid_and_hold_no_more_than_1f1b(stages, micro):
    schedule = zb_h1(stages, micro)
    validate(schedule)
    peak_1f1b = max(_peak(actions) for actions in one_f_one_b(stages, micro))
    for s, actions in enumerate(schedule):
        assert _peak(actions) <= peak_1f1b
        assert sum(a.op is Op.BACKWARD_WEIGHT for a in actions) == micro  # one W per microbatch
        # F and B in 1F1B's order: only the W passes move
        ours = [(a.op is Op.FORWARD, a.mb) for a in actions if a.op in (Op.FORWARD, Op.BACKWARD_INPUT)]
        assert ours == [(a.op is Op.FORWARD, a.mb) for a in one_f_one_b(stages, micro)[s]
                        if a.op in (Op.FORWARD, Op.BACKWARD)]


def _peak(actions) -> int:
    """Most microbatches held at once: a forward holds one until its W (ZB) or its backward (1F1B) ran."""
    held = peak = 0
    for a in actions:
        held += (a.op is Op.FORWARD) - (a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT))
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("stages,micro", [(2, 4), (4, 8), (4, 4), (6, 12)])
def test_zb_h1_bubble_is_the_papers_and_below_1f1bs(stages, micro):
    """T_F = T_B = T_W = 1 on free links: 1F1B takes (M + S - 1)·3, ZB-H1 3M + (S - 1)(T_F + T_B - T_W) = 3M + S - 1
    (Qi et al. 2024, Sec. 3.1)."""
    costs = [StageCosts(1.0, 2.0, 0.0, 0.0, 1.0, weight_share=0.5)] * stages
    ours = simulate(pipeline_tasks("zb-h1", costs, micro, 4), FREE)
    theirs = simulate(pipeline_tasks("1f1b", costs, micro, 4), FREE)
    assert period_s(theirs) == pytest.approx((micro + stages - 1) * 3)
    assert period_s(ours) == pytest.approx(3 * micro + (stages - 1))
    zb, one = simulated_bubble(ours, 3), simulated_bubble(theirs, 3)
    assert zb == pytest.approx((stages - 1) / (3 * micro + stages - 1))
    assert zb < one


@pytest.mark.parametrize("stages,micro", [(2, 4), (3, 5), (3, 1), (1, 3)])
def test_zb_h1_is_transparent(stages, micro):
    """Equal to single-process SGD after each step, as gpipe and 1f1b (the split backward sums to the fused one)."""
    reference, _ = _sgd_flat(3)
    method = _make("zb-h1", params={"stages": stages, "microbatches": micro})
    _train(method, 3)
    torch.testing.assert_close(_flat(method), reference, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_multi_process_zb_h1_equals_the_virtual_one():
    out = spawn(_ranks, 3, "zb-h1", {"microbatches": 4}, 4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        virtual = _make("zb-h1", params={"microbatches": 4, "stages": 3})
        losses = _train(virtual, 4)
    finally:
        torch.set_num_threads(threads)
    for s, (params_s, losses_s, _, _, _) in enumerate(out):
        for a, b in zip(params_s, _stage_params(virtual, s), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
        if s == 2:
            assert losses_s == pytest.approx(losses, rel=1e-6)


def test_the_reports_ideal_bubble_of_a_zb_h1_run_is_its_own_formula(tmp_path):
    """The gantt's and the Pipelines section's ideal for zb-h1: (p-1)(T_F + T_B - T_W) / (M(T_F + T_B + T_W) +
    (p-1)(T_F + T_B - T_W)) with the traced medians (stage 0's empty W left out), not 1F1B's (p-1)/(M+p-1)."""
    import pandas as pd

    from harness.report.pipeline import ideal_bubble_of
    from harness.results import RunResult
    from harness.trace import ideal_bubble, zb_h1_bubble

    assert zb_h1_bubble(2, 4, 1.0, 1.0, 1.0) == pytest.approx(1 / 13)
    # op, mb, start, end, version, stage, iteration, lane: F 1 s, B 2 s, W 1 s on stage 1; stage 0's W 0 s
    rank0 = [["forward", 0, 0.0, 1.0, 0, 0, 0, 0], ["backward_input", 0, 5.0, 8.0, 0, 0, 0, 0],
             ["backward_weight", 0, 8.0, 8.0, 0, 0, 0, 0]]
    rank1 = [["forward", 0, 1.0, 2.0, 0, 1, 0, 0], ["backward_input", 0, 2.0, 4.0, 0, 1, 0, 0],
             ["backward_weight", 0, 4.0, 5.0, 0, 1, 0, 0]]
    metrics = pd.DataFrame([{"kind": "trace", "rank": r, "worker": r, "step": 2, "events": ev}
                            for r, ev in enumerate((rank0, rank1))])
    spec = {"method": "zb-h1", "world_size": 2, "params": {"microbatches": 4}}
    run = RunResult(tmp_path, spec, None, None, metrics)
    assert ideal_bubble_of(run) == pytest.approx(zb_h1_bubble(2, 4, 1.0, 2.0, 1.0))
    assert ideal_bubble_of(run) != pytest.approx(ideal_bubble(2, 4))
