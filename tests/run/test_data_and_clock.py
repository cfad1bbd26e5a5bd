"""The shared data order, batches and shards, the train clock, and the metrics writer."""

from __future__ import annotations

import json
import time

import pytest
import torch

from harness.data import sources, tensors
from harness.run.clock import TrainClock
from harness.run.loop import StepPlan
from harness.run.records import MetricsWriter, write_json


def test_data_order_is_seeded_covers_each_epoch_and_differs_by_epoch():
    order = DataOrder = tensors.DataOrder(100, 10, seed=3)
    again = tensors.DataOrder(100, 10, seed=3)
    assert torch.equal(torch.cat([order.batch(s) for s in range(10)]).sort().values, torch.arange(100))
    assert all(torch.equal(order.batch(s), again.batch(s)) for s in range(25))
    assert not torch.equal(order.batch(0), order.batch(10))  # a new permutation each epoch
    assert not torch.equal(order.batch(0), tensors.DataOrder(100, 10, seed=4).batch(0))
    assert DataOrder.steps_per_epoch == 10 and tensors.DataOrder(105, 10, 0).steps_per_epoch == 10  # drop last
    with pytest.raises(ValueError, match="larger than the training set"):
        tensors.DataOrder(5, 10, 0)


def test_shards_partition_the_global_batch():
    train, _ = sources.synthetic(64, 8, 4, 3)
    batch = tensors.Batch(0, 0.0, torch.arange(12), train, 0)
    shards = [batch.shard_indices(r, 3) for r in range(3)]
    assert torch.equal(torch.cat(shards), torch.arange(12))
    x, y = batch.shard(1, 3)
    assert torch.equal(x, train.x[4:8]) and torch.equal(y, train.y[4:8])


def test_digits_split_is_fixed_and_stratified():
    train, test = sources.digits()
    assert (len(train), len(test)) == (1437, 360)
    assert torch.bincount(test.y).min() >= 35  # every class present in proportion
    train2, _ = sources.digits()
    assert torch.equal(train.x, train2.x)


def test_plan_from_budget():
    from harness.budget import Budget

    plan = StepPlan.from_budget(Budget(max_epochs=2.5, eval_every_epochs=0.5, max_steps=1000), steps_per_epoch=44)
    assert plan.max_steps == 110 and plan.eval_every_steps == 22
    assert StepPlan.from_budget(Budget(max_steps=7, max_epochs=1), 44).max_steps == 7


def test_train_clock_excludes_blocks_and_setup():
    clock = TrainClock()
    time.sleep(0.05)
    assert clock.train() == 0.0  # set-up is not train time
    clock.start_training()
    time.sleep(0.05)
    with clock.excluded():
        time.sleep(0.1)
        with clock.excluded():  # nested blocks are excluded once
            time.sleep(0.01)
    t = clock.train()
    assert 0.04 < t < 0.09, t
    assert clock.wall() > t + 0.15


def test_writer_appends_whole_lines_and_nonfinite_stays_valid_json(tmp_path):
    clock = TrainClock()
    writer = MetricsWriter(tmp_path / "m.jsonl", 1, clock)
    writer.write("train", step=1, loss=float("nan"))
    writer.write("eval", step=1, test_accuracy=0.5)
    writer.close()
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in lines] == ["train", "eval"] and lines[0]["loss"] == "nan" and lines[0]["rank"] == 1
    write_json(tmp_path / "s.json", {"a": float("inf")})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": "inf"}
