"""ddp's gradient accumulation (microbatches = k): on 2 real gloo ranks the steps equal microbatches = 1's, with the
same bytes on the wire (one all-reduce per step), for ddp and every compressed ddp (their hooks see the summed shard
gradient once per step; the stochastic ones draw the same numbers, and on these seeds no rounding decision flips
between the two sums); its plan holds one microbatch's activations and so does the step; 'auto' picks the fewest
microbatches whose plan fits; a bad value is one line."""

from __future__ import annotations

import pytest
import torch

from _dist import context, spawn, train_steps

BATCH = 32  # 16 samples a rank: 3 microbatches are slices of 6, 5 and 5 (the weighting by share is exercised)


def _steps(rank: int, world_size: int, method: str, params: dict, microbatches: list[int]):
    """For each k: the parameters after each of 3 steps, the losses, the ledger's gradient bytes, and the plan's and
    the first steps' held activations."""
    out = {}
    for k in microbatches:
        cls, ctx = context(method, rank, world_size, {"batch_size": BATCH, "lr": 0.05, "momentum": 0.9,
                                                      "microbatches": k, **params})
        m = cls(ctx)
        planned = m.memory_plan()[rank].activations
        history: list[torch.Tensor] = []

        def keep(_step: int, method=m, into=history) -> None:
            into.append(torch.cat([p.detach().flatten().clone() for p in method.network.parameters()]))

        losses = train_steps(m, 3, BATCH, between=keep)
        out[k] = {"params": history, "losses": losses, "bytes": ctx.comm.ledger.by_category().get("gradients"),
                  "planned": planned, "held": m.memory_held()[rank].activations}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method, params", [("ddp", {}), ("fp16", {}), ("powersgd", {"start_iter": 2}), ("qsgd", {}),
                                            ("terngrad", {}), ("onebit", {}), ("dgc", {"density": 0.01})])
def test_accumulated_steps_equal_one_microbatch_with_the_same_bytes(method, params):
    for rank in spawn(_steps, 2, method, params, [1, 3]):
        one, three = rank[1], rank[3]
        for step, (a, b) in enumerate(zip(one["params"], three["params"], strict=True)):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{method}: step {step + 1} differs")
        assert three["losses"] == pytest.approx(one["losses"], rel=1e-5)
        assert three["bytes"] == one["bytes"] and one["bytes"][0] > 0  # one all-reduce per step, not one per slice
        # one slice of 6 samples held at a time, planned as such: less than the 16-sample shard's, and equal to it
        assert three["planned"] < one["planned"] and three["held"] < one["held"]
        assert three["held"] <= three["planned"]


def _plans(rank: int, world_size: int):
    """ddp's plan at every k from 1 to the 16-sample shard, then the k that 'auto' picks under budgets around them."""
    plans = {}
    for k in range(1, BATCH // world_size + 1):
        cls, ctx = context("ddp", rank, world_size, {"batch_size": BATCH, "microbatches": k})
        plans[k] = cls(ctx).memory_plan()[rank].total
    budgets = {"none": None, "roomy": max(plans.values()), "tiny": min(plans.values()) - 1,
               **{f"at {k}": plans[k] for k in plans}}
    chosen, logged = {}, []
    for name, budget in budgets.items():
        cls, ctx = context("ddp", rank, world_size, {"batch_size": BATCH, "microbatches": "auto"})
        ctx.memory_per_rank = budget
        ctx.log = lambda kind, **fields: logged.append((kind, fields))
        method = cls(ctx)
        chosen[name] = (method.microbatches, method.memory_plan()[rank].total)
    return plans, budgets, chosen, logged


def test_auto_picks_the_fewest_microbatches_whose_plan_fits():
    (plans, budgets, chosen, logged), _ = spawn(_plans, 2)
    # on this MLP a later microbatch's backward, adding into gradients that exist, needs more than the shard's few
    # activations save: the plans do not fall with k, which is why 'auto' does not bisect
    assert chosen["none"][0] == 1 and chosen["roomy"][0] == 1
    for name, budget in budgets.items():
        if budget is None or budget < min(plans.values()):
            continue
        fewest = min(k for k, need in plans.items() if need <= budget)  # by brute force: every k planned
        assert chosen[name] == (fewest, plans[fewest]), name
    # nothing fits: the smallest plan there is, which the runner's gate refuses on
    smallest = min(plans, key=lambda k: (plans[k], k))
    assert chosen["tiny"] == (smallest, plans[smallest])
    k = chosen["at 16"][0]
    assert ("microbatches", {"asked": "auto", "chosen": k, "samples_per_microbatch": -(-16 // k),
                             "planned_bytes": plans[k], "memory_per_rank": plans[16]}) in logged


SUITE = """name = "v"
workload = "digits-mlp"
seeds = [0]
[budget]
max_steps = 3
[defaults]
batch_size = 32
[[run]]
method = "{method}"
world_size = 2
params = {{ microbatches = {value} }}
"""


@pytest.mark.parametrize("method", ["ddp", "qsgd", "powersgd"])
@pytest.mark.parametrize("value, wanted", [
    ("0", "run[0].params.microbatches: Value error, microbatches must be a whole number of at least 1 or 'auto', "
          "got 0"),
    ('"many"', "microbatches must be a whole number of at least 1 or 'auto', got 'many'"),
    ("2.5", "microbatches must be a whole number of at least 1 or 'auto', got 2.5"),
    ("true", "microbatches must be a whole number of at least 1 or 'auto', got True"),
    ("17", "run[0].params.microbatches: batch_size 32 cannot be cut into 34 microbatches (2 data-parallel shards of "
           "17 each): each needs at least 1 sample"),
])
def test_a_bad_microbatches_is_one_line(tmp_path, method, value, wanted):
    from harness.suite.expand import expand_suite
    from harness.suite.files import FileError

    path = tmp_path / "v.toml"
    path.write_text(SUITE.format(method=method, value=value))
    with pytest.raises(FileError) as caught:
        expand_suite(path)
    assert wanted in str(caught.value) and "\n" not in str(caught.value)
    path.write_text(SUITE.format(method=method, value='"auto"'))
    assert len(expand_suite(path)) == 1
