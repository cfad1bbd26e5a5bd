"""methods/blocks.py: the block utilities local and pipeline methods share."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.comm.communicator import Communicator
from harness.data.tensors import TensorData
from harness.split import uniform_split
from methods.blocks import classifier_sums, default_parts, evaluate_chain, output_shapes


def test_default_parts_is_one_per_rank_or_two_in_the_virtual_mode():
    assert default_parts(None, 4) == 4 and default_parts(None, 1) == 2 and default_parts(3, 1) == 3


def test_uniform_split_covers_every_block_in_order():
    assert uniform_split(7, 3) == [(0, 3), (3, 5), (5, 7)]
    with pytest.raises(ValueError, match="cannot cut 2 blocks into 3 parts"):
        uniform_split(2, 3)


def test_output_shapes_probe_in_eval_mode_and_leave_batchnorm_statistics_alone():
    blocks = [nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)), nn.Sequential(nn.Flatten(), nn.Linear(144, 3))]
    before = blocks[0][1].running_mean.clone()
    assert output_shapes(blocks, torch.randn(2, 1, 8, 8)) == [(4, 6, 6), (3,)]
    assert torch.equal(blocks[0][1].running_mean, before) and blocks[0].training


def test_a_chain_in_one_process_scores_every_segment_like_the_whole_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3))
    test = TensorData(torch.randn(37, 5), torch.randint(3, (37,)))
    loss = nn.functional.cross_entropy
    totals = evaluate_chain({0: model[0:2], 1: model[2:]}, [0, 0], [(5,), (6,)], test, Communicator(0, 1), 8,
                            torch.device("cpu"), lambda i, h, y: classifier_sums(h, y, loss) if i == 1 else None,
                            width=3)
    expected = classifier_sums(model(test.x), test.y, loss)
    assert totals.shape == (2, 3) and torch.equal(totals[0], torch.zeros(3))
    torch.testing.assert_close(totals[1], expected)
