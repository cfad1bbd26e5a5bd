"""Pipelined Backpropagation: exact delays, spike compensation's impulse property, the two weight predictions, the
degenerate case, virtual = 2 processes, and the scaling rules."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from _dist import context, spawn
from harness.data.tensors import Batch, DataOrder
from harness.schedule.ir import Op
from methods.pipeline.compensation.spike import SpikeCompensatedSGD, spike_coefficients
from methods.pipeline.core.interleaver import validate
from methods.pipeline.core.placement import Placement
from methods.pipeline.pb.pb import scaled_hyperparameters
from methods.pipeline.pb.prediction import Predicted
from methods.pipeline.pb.schedule import pb_delay, pb_tick


def _make(params, rank=0, world_size=1, workload="digits-mlp", records=None):
    cls, ctx = context("pb", rank, world_size, params, workload=workload)
    if records is not None:
        ctx.log = lambda kind, **fields: records.append((kind, fields))
    return cls(ctx)


def _train(method, steps):
    data, size = method.ctx.workload.train, method.ctx.params.batch_size
    order = DataOrder(len(data), size, seed=0)
    losses = [method.train_step(Batch(t, 0.0, order.batch(t), data, 0)).loss for t in range(steps)]
    method.end_training()
    return losses


@pytest.mark.parametrize("stages,samples", [(1, 4), (2, 5), (3, 8), (5, 12)])
def test_pb_ticks_are_valid_and_each_sample_meets_its_delay(stages, samples):
    ticks = samples + 2 * (stages - 1)
    placement = Placement.one_per_rank(stages)
    whole = [[a for t in range(ticks) for a in pb_tick(s, stages, t, samples)] for s in range(stages)]
    validate(whole, placement)
    for s, actions in enumerate(whole):
        d, updates, forward_at = pb_delay(s, stages), 0, {}
        assert d == 2 * (stages - 1 - s)
        for a in actions:
            if a.op is Op.FORWARD:
                forward_at[a.mb] = updates
            elif a.op is Op.BACKWARD:
                assert updates == a.mb and updates - forward_at[a.mb] == min(a.mb, d)
            elif a.op is Op.UPDATE:
                updates += 1
        assert updates == samples and sorted(forward_at) == list(range(samples))


def test_the_delay_of_every_stage_in_the_traces_is_d_s():
    stages, steps = 4, 14
    records = []
    method = _make({"stages": stages, "batch_size": 1, "trace_steps": steps}, workload="digits-cnn",
                   records=records)
    _train(method, steps)
    events = [e for kind, f in records if kind == "trace" for e in f["events"]]
    for s in range(stages):
        forward = {e.mb: e.version for e in events if e.stage == s and e.op == "forward"}
        backward = {e.mb: e.version for e in events if e.stage == s and e.op == "backward"}
        assert backward, s
        checked = [i for i in backward if i in forward]  # step 0 is not traced (trace_steps counts from 1)
        assert len(checked) >= steps - 2 * stages
        for i in checked:
            assert backward[i] == i and forward[i] == max(0, i - pb_delay(s, stages))  # delay min(i, D_s)


@pytest.mark.parametrize("delay,momentum", [(1, 0.9), (4, 0.9), (6, 0.5), (3, 0.0)])
def test_spike_compensation_puts_a_delayed_impulse_on_the_undelayed_trajectory(delay, momentum):
    """One impulse gradient g: momentum SGD gets it at step 0; SC_D gets it D steps late. From the step it arrives
    on, the SC weights equal the undelayed ones."""
    g = torch.tensor([1.0, -2.0, 0.5])
    steps = 15

    def trajectory(optimizer_delay: int, arrive: int) -> list[torch.Tensor]:
        w = nn.Parameter(torch.zeros(3))
        opt = SpikeCompensatedSGD([w], lr=0.1, momentum=momentum, delay=optimizer_delay)
        out = []
        for step in range(steps):
            w.grad = g.clone() if step == arrive else torch.zeros(3)
            opt.step()
            out.append(w.detach().clone())
        return out

    undelayed = trajectory(0, 0)
    compensated = trajectory(delay, delay)
    for step in range(delay, steps):
        torch.testing.assert_close(compensated[step], undelayed[step], rtol=1e-6, atol=1e-7)
    uncompensated = trajectory(0, delay)
    if momentum > 0:
        assert not torch.allclose(uncompensated[delay], undelayed[delay])
    a, b = spike_coefficients(momentum, delay)
    if momentum:
        assert a / (1 - momentum) + b == pytest.approx(1 / (1 - momentum))


def test_spike_compensated_sgd_without_delay_is_torchs_momentum_sgd_bitwise():
    torch.manual_seed(0)
    ours, theirs = nn.Linear(5, 3), nn.Linear(5, 3)
    theirs.load_state_dict(ours.state_dict())
    opts = [SpikeCompensatedSGD(ours.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3),
            torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)]
    for _ in range(5):
        x = torch.randn(4, 5)
        for model, opt in zip((ours, theirs), opts, strict=True):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters(), strict=True))


def _predictions(delay_in_optimizer: int) -> tuple[dict, dict]:
    torch.manual_seed(0)
    module = nn.Linear(4, 2)
    opt = SpikeCompensatedSGD(module.parameters(), lr=0.1, momentum=0.9, delay=delay_in_optimizer)
    by_v = Predicted(module, opt, 3, "lwp_v", stash=False)
    by_w = Predicted(module, opt, 3, "lwp_w", stash=False)
    for _ in range(4):
        module.zero_grad()
        module(torch.randn(8, 4)).square().mean().backward()
        by_v.before_update()
        by_w.before_update()
        opt.step()
    return by_v.predicted(), by_w.predicted()


def test_the_two_weight_predictions_agree_under_momentum_sgd_and_differ_under_spike_compensation():
    v, w = _predictions(0)
    for name in v:
        torch.testing.assert_close(v[name], w[name], rtol=1e-5, atol=1e-6)
    v, w = _predictions(3)
    assert any((v[name] - w[name]).abs().max() > 1e-3 for name in v)


def test_one_stage_is_momentum_sgd_at_the_same_batch_bitwise():
    cls, ctx = context("sgd", 0, 1, {"batch_size": 4, "momentum": 0.9, "weight_decay": 1e-4})
    sgd = cls(ctx)
    _train(sgd, 25)
    pb = _make({"stages": 1, "batch_size": 4, "momentum": 0.9, "weight_decay": 1e-4})
    _train(pb, 25)
    ours = [p.detach() for p in pb.stages[0].module.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(ours, sgd.model.parameters(), strict=True))


def _ranks(rank, world_size, params, steps):
    method = _make(params, rank, world_size, workload="digits-cnn")
    losses = _train(method, steps)
    accuracy = method.evaluate(method.ctx.workload.test).accuracy
    method.finish()
    return {s: [p.detach().clone() for p in st.module.parameters()] for s, st in method.stages.items()}, losses, \
        accuracy


@pytest.mark.slow
@pytest.mark.parametrize("variant", [{}, {"compensation": "none", "prediction": "lwp_w",
                                      "backward_weights": "stashed"}])
def test_two_processes_equal_the_virtual_pipeline(variant):
    params = {"batch_size": 2, "lr": 0.01, "momentum": 0.9, **variant}
    out = spawn(_ranks, 2, params, 9)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        virtual = _make({**params, "stages": 2}, workload="digits-cnn")
        losses = _train(virtual, 9)
        accuracy = virtual.evaluate(virtual.ctx.workload.test).accuracy
    finally:
        torch.set_num_threads(threads)
    for stages, _, rank_accuracy in out:
        assert rank_accuracy == accuracy
        for s, weights in stages.items():
            for a, b in zip(weights, virtual.stages[s].module.parameters(), strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert out[1][1][:1] == [None] and losses[:1] == [None]  # the first sample reaches the last stage at step 1
    assert out[1][1][1:] == pytest.approx(losses[1:], rel=1e-5)


def test_scaling_rules_to_batch_one_and_their_record_in_the_spec(tmp_path):
    lr, m = scaled_hyperparameters(0.05, 0.9, 1, 128)
    assert m == pytest.approx(0.9 ** (1 / 128)) and lr == pytest.approx(0.05 * (1 - m) / (128 * 0.1))
    assert scaled_hyperparameters(0.05, 0.9, 128, 128) == pytest.approx((0.05, 0.9))
    assert 0.05 / 128 / lr > 100  # the earlier note's lr / B would have been ~120x too large
    from harness.suite.expand import expand_suite

    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\n[budget]\nmax_steps = 1\n[[run]]\nmethod = "pb"\n'
                     'params = { batch_size = 1, lr = 0.05, momentum = 0.9, reference_batch = 32, stages = 3 }\n')
    (spec,) = expand_suite(suite)
    # spec.json records the given lr and momentum and, beside them, the derived values the optimizer applies
    recorded = json.loads(spec.model_dump_json())["params"]
    assert recorded["lr"] == 0.05 and recorded["momentum"] == 0.9
    assert recorded["applied_momentum"] == pytest.approx(0.9 ** (1 / 32))
    assert recorded["applied_lr"] == scaled_hyperparameters(0.05, 0.9, 1, 32)[0] < 0.05 / 32
    from methods.pipeline.pb.pb import PBParams

    again = PBParams.from_spec(recorded)  # `dtbench rerun` reads spec.json again: derived anew, the same values
    assert again.model_dump() == recorded and again == spec.params
    assert PBParams(lr=0.05, momentum=0.9).applied_lr == 0.05  # no reference_batch: nothing derived
    with pytest.raises(ValueError, match=r"applied_lr\n  not what the keys it derives from give \(5\.1"):
        PBParams.from_spec({**recorded, "applied_lr": 0.5})
    with pytest.raises(ValueError, match="unknown key|Extra inputs"):
        PBParams.model_validate({**recorded})  # a derived key is not an input
    # a spec.json of the earlier form (the scaled values as lr and momentum, the given ones as reference_*) reruns
    old = {k: v for k, v in recorded.items() if not k.startswith("applied_")}
    old.update(lr=recorded["applied_lr"], momentum=recorded["applied_momentum"], reference_lr=0.05,
               reference_momentum=0.9)
    assert PBParams.from_spec(old).model_dump() == recorded
    with pytest.raises(ValueError, match="reference_lr"):  # half of the earlier form: an unknown key, not a crash
        PBParams.from_spec({k: v for k, v in old.items() if k != "reference_momentum"})


def test_a_derived_parameter_in_a_suite_is_refused_naming_it(tmp_path):
    from harness.suite.expand import expand_suite
    from harness.suite.files import FileError

    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\n[budget]\nmax_steps = 1\n[defaults]\napplied_lr = 0.1\n'
                     '[[run]]\nmethod = "pb"\nparams = { batch_size = 1, reference_batch = 32, stages = 3 }\n')
    with pytest.raises(FileError, match=r"s.toml: defaults.applied_lr: derived by method 'pb' from its other "
                                        r"parameters, not set \(the lr the optimizer applies"):
        expand_suite(suite)


def test_the_loop_logs_the_applied_lr(tmp_path):
    from harness.cli import main

    suite = tmp_path / "s.toml"
    suite.write_text('name = "s"\nworkload = "digits-mlp"\nthreads_per_rank = 1\n[budget]\nmax_steps = 2\n'
                     '[[run]]\nmethod = "pb"\nworld_size = 3\n'
                     'params = { batch_size = 1, lr = 0.05, momentum = 0.9, reference_batch = 32, stages = 3 }\n')
    assert main(["run", str(suite), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    (metrics,) = (tmp_path / "out" / "s").glob("*/metrics.jsonl")
    logged = [json.loads(line)["lr"] for line in metrics.read_text().splitlines() if '"train"' in line]
    assert logged and set(logged) == {scaled_hyperparameters(0.05, 0.9, 1, 32)[0]}


def test_the_groupnorm_cnn_works_at_batch_size_one():
    from harness import registry
    from harness.models.simple import digits_cnn

    instance = registry.WORKLOADS.get("digits-cnn").instantiate({"norm": "group"})
    model = instance.make_model()
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())
    assert model(torch.randn(1, 1, 8, 8)).shape == (1, 10)
    with pytest.raises(ValueError, match="unknown norm"):
        digits_cnn(10, "batch")


def test_velocity_prediction_without_momentum_is_refused_naming_the_field():
    from pydantic import ValidationError

    from methods.pipeline.pb.pb import PBParams

    with pytest.raises(ValidationError, match="prediction = 'lwp_v'.*momentum 0"):
        PBParams(momentum=0.0)  # lwp_v is pb's default prediction
    assert PBParams(momentum=0.0, prediction="none").prediction == "none"
    assert PBParams(momentum=0.0, prediction="lwp_w").prediction == "lwp_w"
