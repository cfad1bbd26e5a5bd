"""PipeDream's backward composed block by block as the first since its stage's update (pipedream/memory.py)."""

from __future__ import annotations

from torch import nn

from harness.memory import Footprint
from methods.pipeline.pipedream.memory import first_backward_peak


def test_a_first_backward_peaks_where_the_gradients_made_and_the_blocks_transient_outweigh_what_was_let_go():
    blocks = [nn.Linear(4, 4), nn.Linear(4, 2)]  # gradients 80 and 40 bytes
    prints = [Footprint(100, False, False, 30, 50), Footprint(60, False, False, 50, 20),
              Footprint(10, False, False, 20, 4)]
    transients = [7, 9, 3]  # the blocks', then the loss's
    # the loss: 3; block 1: 40 made + 9 + its output's gradient 20 - the loss's 10 saved = 59; block 0: 120 made + 7
    # + 50 - (10 + 60) let go = 107, less its input's gradient (30) after the first stage, which the walk sends
    assert first_backward_peak(prints, transients, [nn.Sequential(*blocks)], (0, 2), True, True) == 107
    assert first_backward_peak(prints, transients, blocks, (0, 2), False, True) == 77
    # not the last stage: no loss, and the last block's incoming gradient is the received one (a buffer)
    assert first_backward_peak(prints, transients, blocks, (0, 2), True, False) == max(40 + 9, 120 + 7 + 50 - 60)
