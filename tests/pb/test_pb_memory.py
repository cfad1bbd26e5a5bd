"""PB's memory plan: its steady state (where the allocator's window opens), the spike-compensated optimizer's step
temporaries and a stage's forward profiled whole, each against what the allocator or the schedule says."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.memory import SCALAR_OPERANDS
from harness.memory.peak import peak_of
from harness.schedule.ir import Op
from methods.pipeline.compensation.spike import SpikeCompensatedSGD
from methods.pipeline.pb.memory import stage_pass
from methods.pipeline.pb.pb import PBParams, PipelinedBackprop
from methods.pipeline.pb.schedule import pb_tick

CPU = torch.device("cpu")


def _in_flight(stages: int, ticks: int) -> list[list[int]]:
    """Per tick, each stage's samples forwarded and not yet backwarded, after the tick's forward."""
    counts, out = [0] * stages, []
    for t in range(ticks):
        row = []
        for s in range(stages):
            actions = pb_tick(s, stages, t, ticks)
            counts[s] += sum(a.op is Op.FORWARD for a in actions)
            row.append(counts[s])
            counts[s] -= sum(a.op is Op.BACKWARD for a in actions)
        out.append(row)
    return out


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_window_opens_at_the_first_step_where_every_stage_holds_its_steady_in_flight_set(stages):
    params = PBParams(optimizer="sgd", momentum=0.9, batch_size=1)
    first = PipelinedBackprop.steady_from(stages, params)  # 1-based: step k is tick k - 1
    steady = [2 * (stages - 1 - s) + 1 for s in range(stages)]
    flights = _in_flight(stages, first + 4)
    assert all(flights[t] == steady for t in range(first - 1, first + 4))
    assert flights[first - 2] != steady


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_spike_compensated_sgd_states_the_temporaries_the_allocator_sees(weight_decay, momentum):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    optimizer = SpikeCompensatedSGD(net.parameters(), lr=0.1, momentum=momentum, delay=2, weight_decay=weight_decay)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()  # the first step makes the velocities: state, not temporaries
    measured = peak_of(optimizer.step, CPU)
    assert measured <= optimizer.step_temporaries() <= measured + SCALAR_OPERANDS
    if weight_decay:  # the decayed gradient of the first weight with its bias's still bound: 2,048 + 128 bytes
        assert measured == 16 * 32 * 4 + 32 * 4


def test_a_stage_profiled_whole_keeps_its_saved_storages_and_output_and_leaves_gradients_as_they_were():
    torch.manual_seed(0)
    stage = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    x = torch.randn(4, 16)
    profiled = stage_pass(stage, x, None, first=False)
    storages: dict[int, int] = {}
    inputs = x.detach().requires_grad_(True)
    weights = {p.untyped_storage().data_ptr() for p in stage.parameters()} | {inputs.untyped_storage().data_ptr()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = stage(inputs)
    storages[out.untyped_storage().data_ptr()] = out.untyped_storage().nbytes()
    assert profiled.kept == sum(storages.values())
    grads = sum(p.numel() * 4 for p in stage.parameters())
    assert profiled.backward_peak >= grads - sum(storages.values())  # made every gradient; let go of what it saved
    assert all(p.grad is None for p in stage.parameters())
