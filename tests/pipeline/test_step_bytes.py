"""core/step_bytes.py's walk of a rank's bytes over steps: a flushed schedule's message keys recur every step (its
iteration stays 0), and the walk's bytes must not grow with the number of steps walked."""

from __future__ import annotations

import pytest

from methods.pipeline.core.step_bytes import StageTerms, rank_peaks
from methods.pipeline.flushed.schedules import gpipe, one_f_one_b, zb_h1

TERMS = {(0, 0): StageTerms(weights=10, gradients=10, optimizer=20, saved=1000, output=100, recv_grad=100, batch=8),
         (1, 1): StageTerms(weights=10, gradients=10, optimizer=20, saved=1000, input=100, recv_act=100,
                            grad_input=100, batch=8)}


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b, zb_h1])
def test_a_flushed_schedules_recurring_keys_do_not_grow_its_bytes(schedule):
    step = schedule(2, 4)
    few, many = (rank_peaks([step] * n, TERMS) for n in (3, 12))
    assert few == many
    # the sends of a step are retired at the end of the next: at most two steps' outputs are held on stage 0
    assert few[0].buffers <= 2 * 4 * 100 + 4 * 100
