"""APapo's delay handling: each variant (per-stage delays, spike compensation, velocity prediction) is exactly its
documented update, stage by stage, against a hand-written loop over the same stage modules; bad combinations are
refused naming the field."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError
from torch.func import functional_call

from _dist import context
from harness.data.tensors import Batch, DataOrder
from methods.pipeline.apapo.schedule import version_delays
from methods.pipeline.compensation.spike import SpikeCompensatedSGD

RESNET = {"depth": 8}


def _make(params):
    cls, ctx = context("apapo", 0, 1, params, workload="digits-resnet", options=RESNET)
    return cls(ctx)


def _flat(modules) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for m in modules for p in m.parameters()])


def _reference(modules, params, steps: int, batch_size: int = 32) -> torch.Tensor:
    """The documented update, stage by stage, on copies of the stage modules: stage s's forwards and backwards of
    iteration t use its version k = max(0, t - D_s), or with lwp_v that version predicted D_s updates ahead
    (w_k - lr·D_s·v_k, v_k its velocity after update k); its optimizer is SGD, or SC_{D_s} with compensation."""
    lr, momentum, m = params["lr"], params["momentum"], params["microbatches"]
    delays = version_delays(len(modules), m, 2, params.get("delays", "uniform"))
    optimizers = [SpikeCompensatedSGD(mod.parameters(), lr=lr, momentum=momentum, delay=d)
                  if params.get("compensation") == "sc" else torch.optim.SGD(mod.parameters(), lr=lr, momentum=momentum)
                  for mod, d in zip(modules, delays, strict=True)]

    def snapshot(s):
        opt = optimizers[s]
        weights = {k: p.detach().clone() for k, p in modules[s].named_parameters()}
        velocity = {k: opt.state[p]["momentum_buffer"].clone() if "momentum_buffer" in opt.state[p]
                    else torch.zeros_like(p) for k, p in modules[s].named_parameters()}
        return weights, velocity

    versions = [{0: snapshot(s)} for s in range(len(modules))]
    probe = _make({**params, "stages": len(modules)})
    data, loss_fn = probe.ctx.workload.train, probe.ctx.workload.loss
    order = DataOrder(len(data), batch_size, seed=0)
    for t in range(steps):
        used = []
        for s, d in enumerate(delays):
            weights, velocity = versions[s][max(0, t - d)]
            if params.get("prediction") == "lwp_v" and d > 0:
                weights = {k: w - lr * d * velocity[k] for k, w in weights.items()}
            used.append({k: w.clone().requires_grad_(True) for k, w in weights.items()})
        batch = Batch(t, 0.0, order.batch(t), data, 0)
        x, y = batch.inputs(), batch.targets()
        for xs, ys in zip(torch.tensor_split(x, m), torch.tensor_split(y, m), strict=True):
            h = xs
            for mod, w in zip(modules, used, strict=True):
                h = functional_call(mod, w, (h,))
            (loss_fn(h, ys) * (len(ys) / len(y))).backward()
        for s, mod in enumerate(modules):
            for name, p in mod.named_parameters():
                p.grad = used[s][name].grad
            optimizers[s].step()
            optimizers[s].zero_grad(set_to_none=True)
            versions[s][t + 1] = snapshot(s)
    return _flat(modules)


VARIANTS = [
    {"delays": "per_stage", "compensation": "none", "prediction": "none"},
    {"delays": "uniform", "compensation": "sc", "prediction": "none"},
    {"delays": "uniform", "compensation": "none", "prediction": "lwp_v"},
    {"delays": "per_stage", "compensation": "none", "prediction": "lwp_v"},  # the default
    {"delays": "per_stage", "compensation": "sc", "prediction": "lwp_v"},
]


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 2)])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "+".join(f"{k}={x}" for k, x in v.items()))
def test_each_delay_handling_variant_is_its_documented_update_exactly(variant, stages, microbatches):
    params = {"partition": "uniform", "microbatches": microbatches, "lr": 0.05, "momentum": 0.9, **variant}
    method = _make({**params, "stages": stages})
    modules = [copy.deepcopy(method.stages[s].module) for s in sorted(method.stages)]
    data = method.ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    for t in range(6):
        method.train_step(Batch(t, t / order.steps_per_epoch, order.batch(t), data, 0))
    method.end_training()
    got = _flat([method.stages[s].module for s in sorted(method.stages)])
    torch.testing.assert_close(got, _reference(modules, params, 6), rtol=0, atol=1e-6)


def test_per_stage_delays_leave_the_last_stage_fresh_action_by_action():
    method = _make({"stages": 3, "partition": "uniform", "microbatches": 2, "delays": "per_stage"})
    assert method.delays == (1, 1, 0)
    data = method.ctx.workload.train
    order = DataOrder(len(data), 32, seed=0)
    for t in range(5):
        views = method.views(Batch(t, 0.0, order.batch(t), data, 0), [16, 16], [2 * t, 2 * t + 1], iteration=t)
        for trace in method.executor.run(method.segment(t), views):
            for e in trace.events:
                if e.op in ("forward", "backward"):
                    assert e.version == max(0, e.iteration - method.delays[e.stage]), e


def test_spike_compensation_uses_each_stages_own_delay():
    method = _make({"stages": 3, "partition": "uniform", "microbatches": 2, "delays": "per_stage",
                    "compensation": "sc"})
    assert [method.stages[s].optimizer.param_groups[0]["delay"] for s in sorted(method.stages)] == [1, 1, 0]


def test_bad_combinations_name_the_field():
    from methods.pipeline.apapo.apapo import APapo

    with pytest.raises(ValidationError, match="prediction = 'lwp_v'.*momentum 0"):
        APapo.Params(prediction="lwp_v", momentum=0.0)
    with pytest.raises(ValidationError, match="compensation = 'sc'.*nesterov"):
        APapo.Params(compensation="sc", momentum=0.9, nesterov=True)
    with pytest.raises(ValidationError, match="delays"):
        APapo.Params(delays="stale")


def test_the_default_is_per_stage_delays_with_velocity_prediction_and_none_without_momentum():
    from methods.pipeline.apapo.apapo import APapo

    default = APapo.Params(momentum=0.9)
    assert (default.delays, default.compensation, default.prediction) == ("per_stage", "none", "lwp_v")
    resolved = APapo.Params(momentum=0.0)
    assert resolved.prediction == "none"  # no velocity to predict with: the default resolves, spec.json records it
    assert APapo.Params.model_validate(resolved.model_dump()).prediction == "none"
