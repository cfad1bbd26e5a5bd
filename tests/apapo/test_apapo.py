"""APapo's numerics: one stage (or K = 1) equals SGD with the same accumulation, K = 2 is exactly PipeDream-2BW's
update, versions action by action, several tensors across a boundary, multi-process equals virtual, partition.json."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch.func import functional_call

from _dist import context, spawn, train_steps
from harness.data.tensors import Batch, DataOrder

RESNET = {"depth": 8}
# node 7 is block 1's second conv: the cut there carries block 1's input (the skip) and relu(conv1) (two tensors)
THROUGH_A_SKIP = [7]


def _make(name, params=None, rank=0, world_size=1, run_dir=None, workload="digits-resnet"):
    cls, ctx = context(name, rank, world_size, params, workload=workload, run_dir=run_dir,
                       options=RESNET if workload == "digits-resnet" else None)
    return cls(ctx)


def _train(method, steps, batch_size=32, evaluate_after=None):
    def evaluate(t):  # as the runner does between steps: a collective with microbatches in flight
        if t == evaluate_after:
            method.evaluate(method.ctx.workload.test)
    return train_steps(method, steps, batch_size, between=evaluate)


def _flat(method) -> torch.Tensor:
    """Every stage's parameters (its first replica's), in model order."""
    stages = method.stages
    return torch.cat([p.detach().flatten() for s in sorted(stages) for p in stages[s].module.parameters()])


def _reference(steps: int, microbatches: int, delay: int, batch_size: int = 32) -> torch.Tensor:
    """The documented update, on the whole model: W(t+1) = W(t) - SGD(grad f(W(max(0, t - D)))) with the batch's
    gradient accumulated over M microbatch slices (each loss weighted by its share)."""
    method = _make("sgd")
    model, optimizer, loss_fn = method.model, method.optimizer, method.ctx.workload.loss
    data = method.ctx.workload.train
    order = DataOrder(len(data), batch_size, seed=0)
    versions = {0: {k: v.detach().clone() for k, v in model.named_parameters()}}
    for t in range(steps):
        used = {k: v.clone().requires_grad_(True) for k, v in versions[max(0, t - delay)].items()}
        batch = Batch(t, 0.0, order.batch(t), data, 0)
        x, y = batch.inputs(), batch.targets()
        for xs, ys in zip(torch.tensor_split(x, microbatches), torch.tensor_split(y, microbatches), strict=True):
            loss = loss_fn(functional_call(model, used, (xs,)), ys) * (len(ys) / len(y))
            loss.backward()
        for name, p in model.named_parameters():
            p.grad = used[name].grad
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        versions[t + 1] = {k: v.detach().clone() for k, v in model.named_parameters()}
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("params", [
    {"stages": 1, "partition": "uniform"},                                    # one stage: D = 0 whatever K
    {"stages": 3, "partition": "uniform", "iterations_in_flight": 1},        # a flush every iteration
    {"stages": 2, "partition": THROUGH_A_SKIP, "iterations_in_flight": 1},   # two tensors cross the boundary
])
def test_without_delay_apapo_is_sgd_with_the_same_accumulation(params):
    method = _make("apapo", {**params, "microbatches": 4})
    _train(method, 5)
    expected = _reference(5, 4, delay=0)
    torch.testing.assert_close(_flat(method), expected, rtol=0, atol=1e-6)
    sgd = _make("sgd")
    _train(sgd, 5)
    torch.testing.assert_close(_flat(method), torch.cat([p.detach().flatten() for p in sgd.model.parameters()]),
                               rtol=0, atol=1e-6)


@pytest.mark.parametrize("stages,microbatches,partition", [(2, 4, THROUGH_A_SKIP), (3, 2, "uniform"),
                                                           (4, 1, "uniform")])
def test_two_iterations_in_flight_give_2bws_update_exactly(stages, microbatches, partition):
    method = _make("apapo", {"stages": stages, "partition": partition, "microbatches": microbatches,
                             "iterations_in_flight": 2, "delays": "uniform", "prediction": "none"})
    _train(method, 6)
    torch.testing.assert_close(_flat(method), _reference(6, microbatches, delay=1), rtol=0, atol=1e-6)


def test_three_iterations_in_flight_delay_two_updates():
    method = _make("apapo", {"stages": 3, "partition": "uniform", "microbatches": 1, "iterations_in_flight": 3,
                             "delays": "uniform", "prediction": "none"})
    _train(method, 6)
    torch.testing.assert_close(_flat(method), _reference(6, 1, delay=2), rtol=0, atol=1e-6)


def test_every_forward_and_backward_uses_version_t_minus_one_action_by_action():
    method = _make("apapo", {"stages": 3, "partition": "uniform", "microbatches": 2, "delays": "uniform",
                             "prediction": "none"})
    data = method.ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    seen = {}
    for t in range(6):
        schedule = method.segment(t)
        views = method.views(Batch(t, 0.0, order.batch(t), data, 0), [16, 16], [2 * t, 2 * t + 1], iteration=t)
        for rank, trace in enumerate(method.executor.run(schedule, views)):
            for e in trace.events:
                if e.op in ("forward", "backward"):
                    assert e.version == max(0, e.iteration - 1), (rank, e)
                    seen.setdefault((e.stage, e.mb), set()).add(e.version)
    assert all(len(v) == 1 for v in seen.values())  # forward and backward of a microbatch: the same version
    held = [st.policy.held() for st in method.workers.values()]
    assert max(held) <= 2  # double buffering: at most two copies besides the live weights


def test_a_boundary_through_a_skip_carries_both_tensors_as_one_payload():
    method = _make("apapo", {"stages": 2, "partition": THROUGH_A_SKIP})
    block = method.stages[1].module[0]
    assert block.in_shapes == [(16, 8, 8), (16, 8, 8)]
    assert method.shapes[1] == (2 * 16 * 8 * 8,)


def test_the_antichain_plan_and_its_record(tmp_path):
    method = _make("apapo", {"stages": 3, "replicate": False}, run_dir=tmp_path)
    _train(method, 2)
    method.finish()
    record = json.loads((tmp_path / "partition.json").read_text())
    assert record["mode"] == "antichain" and record["method"] == "apapo"
    stages = record["graph_plan"]["stages"]
    assert len(stages) == 3 and sorted(n for s in stages for n in s["nodes"]) == list(range(len(record["layers"])))
    assert all(s["predicted_s"] > 0 and s["measured_compute_s"] > 0 for s in record["stages"])
    assert record["dp_states"] > len(record["layers"]) // 2
    choice = record["choice"]  # why: the chosen plan's predicted time beside the alternatives'
    assert choice["chosen"] == "pipeline, one rank per stage" and choice["stages"] == 3
    assert choice["predicted_s"] == pytest.approx(choice["one_rank_per_stage_s"]) and choice["data_parallel_s"] > 0
    assert record["schedule"]["delays"] == [1, 1, 0] and record["schedule"]["prediction"] == "lwp_v"


def test_a_counted_profile_makes_the_plan_the_same_on_every_run(tmp_path):
    """profile = 'counted' with given speeds and bandwidth: FLOPs and bytes, no clock, so two runs (here with
    different torch thread counts, which change every measured time) plan exactly the same cut."""
    params = {"stages": 3, "replicate": True, "profile": "counted", "rank_speeds": [1.0, 1.0, 0.5], "bandwidth": 1e9}
    records = []
    for threads, run_dir in [(1, tmp_path / "a"), (2, tmp_path / "b")]:
        run_dir.mkdir()
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            method = _make("apapo", params, run_dir=run_dir)
            _train(method, 1)
            method.finish()
        finally:
            torch.set_num_threads(before)
        records.append(json.loads((run_dir / "partition.json").read_text()))
    first, second = records
    assert [layer["forward_s"] for layer in first["layers"]] == [layer["forward_s"] for layer in second["layers"]]
    assert first["graph_plan"] == second["graph_plan"] and first["choice"] == second["choice"]
    assert first["choice"]["deterministic"] and first["profile"] == "counted"
    convs = [layer for layer in first["layers"] if layer["name"].startswith("conv") or "conv" in layer["name"]]
    assert convs and all(layer["forward_s"] > 0 and layer["backward_s"] > layer["forward_s"] for layer in convs)


def _ranks(rank, world_size, params, steps, run_dir):
    method = _make("apapo", params, rank, world_size, run_dir=run_dir)
    losses = _train(method, steps, evaluate_after=1)
    result = method.evaluate(method.ctx.workload.test)
    method.finish()
    flat = {s: torch.cat([p.detach().flatten() for p in st.module.parameters()]) for s, st in method.stages.items()}
    return flat, losses, (result.accuracy, result.loss), method.layer_plan.groups


@pytest.mark.slow
@pytest.mark.parametrize("params,world_size", [
    ({"partition": THROUGH_A_SKIP, "overlap": True}, 2),
    ({"partition": THROUGH_A_SKIP, "overlap": False, "microbatches": 2}, 2),
    ({"partition": "uniform", "replicas": [2, 1], "microbatches": 4}, 3),
    ({"partition": "uniform", "stages": 3, "overlap": False, "microbatches": 2}, 3),
])
def test_multi_process_equals_the_virtual_executor(params, world_size, tmp_path):
    out = spawn(_ranks, world_size, params, 5, tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        virtual = _make("apapo", params)
        _train(virtual, 5)
        result = virtual.evaluate(virtual.ctx.workload.test)
    finally:
        torch.set_num_threads(threads)
    for got, _, evaluation, groups in out:
        assert groups == virtual.layer_plan.groups
        for s, flat in got.items():
            expected = torch.cat([p.detach().flatten() for p in virtual.stages[s].module.parameters()])
            torch.testing.assert_close(flat, expected, rtol=0, atol=1e-6)
        assert evaluation[0] == result.accuracy and evaluation[1] == pytest.approx(result.loss, rel=1e-6)
    record = json.loads((tmp_path / "partition.json").read_text())
    assert record["schedule"]["overlap"] == params.get("overlap", True)


def _planned(rank, world_size, run_dir):
    method = _make("apapo", {"bandwidth": 1e9}, rank, world_size, run_dir=run_dir)
    _train(method, 3)
    method.finish()
    return method.layer_plan.groups, method.plan.ranges


@pytest.mark.slow
def test_every_rank_runs_the_plan_rank_0_solved(tmp_path):
    plans = spawn(_planned, 3, tmp_path)
    assert all(plan == plans[0] for plan in plans)
    record = json.loads((tmp_path / "partition.json").read_text())
    assert [tuple(s["ranks"]) for s in record["graph_plan"]["stages"]] == list(plans[0][0])
    assert len(record["rank_speeds"]) == 3


def test_configurations_are_checked():
    from methods.pipeline.apapo.apapo import APapo

    assert "chooses the replicas" in APapo.check_world_size(3, APapo.Params(replicas=[2, 1]))
    assert APapo.check_world_size(3, APapo.Params()) is None  # the DP picks stages and replicas over 3 ranks
    assert "stages = 2 but world_size = 3" in APapo.check_world_size(3, APapo.Params(partition="uniform", stages=2))
    assert "rank_speeds" in APapo.check_world_size(2, APapo.Params(rank_speeds=[1.0]))
    assert "exceeds batch_size" in APapo.check_world_size(2, APapo.Params(microbatches=64))


def test_the_layer_split_of_a_branching_model_equals_the_model():
    from methods.pipeline.apapo import layers
    from methods.pipeline.apapo.antichain import Hardware, antichain_partition

    class Branching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = torch.nn.Linear(6, 5), torch.nn.Linear(6, 5), torch.nn.Linear(10, 3)
            self.skip = torch.nn.Linear(6, 3)

        def forward(self, x):
            h = torch.cat([torch.relu(self.a(x)), torch.tanh(self.b(x))], dim=1)
            return self.c(h) + self.skip(x)

    torch.manual_seed(0)
    model = Branching()
    x = torch.randn(4, 6)
    model(x).sum().backward()
    expected = model(x).detach()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    traced = layers.trace(model, x)
    graph = traced.graph
    # The DP's plans (they depend on measured times), and, so that the test does not, every chain of down-sets.
    chains = []
    for stages in (2, 3, 4):
        plan = antichain_partition(graph, Hardware.uniform(stages), replicate=False)
        prefixes, total = [], 0
        for stage in plan.stages:
            total |= sum(1 << i for i in stage.nodes)
            prefixes.append(total)
        chains.append(prefixes)
    cuts = [d for d in graph.down_sets() if d & 1 and d != graph.full]
    chains += [[d, graph.full] for d in cuts]
    chains += [[d, e, graph.full] for d in cuts for e in cuts if d != e and d & e == d]
    assert len(chains) > 3 + 20
    for prefixes in chains:
        clone = copy.deepcopy(layers.split(traced, prefixes))
        h = x.clone().requires_grad_(True)
        for module in clone:
            h = module(h)
        # The same operations on the same values; equal up to the last bit a BLAS kernel may round differently.
        torch.testing.assert_close(h, expected, rtol=1e-6, atol=1e-7, msg=lambda m, cut=prefixes: f"{cut}: {m}")
        h.sum().backward()
        got = dict(p for m in clone for p in m.named_parameters())
        for name, grad in grads.items():
            key = next(k for k in got if k.endswith(name.replace(".", "_")) or k.endswith(name))
            torch.testing.assert_close(got[key].grad, grad, rtol=1e-6, atol=1e-7)


def test_measured_speeds_and_bandwidths_snap_to_a_grid():
    from methods.pipeline.apapo.hardware import snap

    assert snap(0.91, 0.5) == 1.0 and snap(1.0, 0.5) == 1.0 and snap(0.96, 0.5) == 1.0  # equal ranks plan as equal
    assert snap(0.5, 0.5) == 0.5 and snap(0.69, 0.5) == pytest.approx(2 ** -0.5)
    assert snap(1.3e9, 1.0) == 2.0**30 and snap(0.0, 1.0) == 0.0
