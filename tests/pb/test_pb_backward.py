"""PB's backward sees its forward's activations: in `saved` mode a stage differentiates the graph its forward built
(ReLU masks, GroupNorm statistics) through the weights current at backward time; `current` mode (recompute) takes
masks and statistics from the current weights instead, so it fails the same check."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from methods.pipeline.core.stage import Stage
from methods.pipeline.pb.prediction import Predicted


def _stage(mode: str, module: nn.Module) -> Stage:
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    policy = Predicted(module, optimizer, delay=2, prediction="none", stash=mode != "current")
    return Stage(0, 3, module, optimizer, policy, loss_fn=None, backward_mode=mode)  # type: ignore[arg-type]


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 4))


def _expected_mlp(forward_weights, current, x, delta):
    """The paper's backward by hand: activations and the ReLU mask from the forward's weights, gradients passed back
    through the current weights, each weight gradient = incoming gradient x the forward's activation."""
    w1f, b1f, _, _ = forward_weights
    w1c, _, w2c, _ = current
    h = x @ w1f.T + b1f
    mask, a = (h > 0).float(), torch.relu(h)
    grad_a = delta @ w2c
    grad_h = grad_a * mask
    return {"0.weight": grad_h.T @ x, "0.bias": grad_h.sum(0), "2.weight": delta.T @ a, "2.bias": delta.sum(0),
            "input": grad_h @ w1c}


def _run(mode: str, module: nn.Module, x: torch.Tensor, delta: torch.Tensor, shift: float):
    """Forward, then the live weights move (the updates of the delay), then the backward."""
    stage = _stage(mode, module)
    forward_weights = [p.detach().clone() for p in module.parameters()]
    stage.forward((0, 0), x)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(shift * torch.randn_like(p))
    current = [p.detach().clone() for p in module.parameters()]
    x_grad = stage.backward((0, 0), delta)
    grads = {name: p.grad for name, p in module.named_parameters()}
    return forward_weights, current, grads, x_grad


def test_saved_mode_differentiates_the_forwards_graph_through_the_current_weights():
    torch.manual_seed(2)
    x, delta = torch.randn(8, 6), torch.randn(8, 4)
    module = _mlp()
    forward_weights, current, grads, _ = _run("saved", module, x.clone(), delta, shift=0.5)
    expected = _expected_mlp(forward_weights, current, x, delta)
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-5, atol=1e-6)


def test_the_input_gradient_goes_through_the_current_weights():
    torch.manual_seed(2)
    x, delta = torch.randn(8, 6), torch.randn(8, 4)
    module = _mlp()
    stage = Stage(1, 3, module, torch.optim.SGD(module.parameters(), lr=0.1),
                  Predicted(module, torch.optim.SGD(module.parameters(), lr=0.1), 1, "none", True),
                  loss_fn=None, backward_mode="saved")  # type: ignore[arg-type]
    forward_weights = [p.detach().clone() for p in module.parameters()]
    stage.forward((0, 0), x.clone())
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(-1.5)
    current = [p.detach().clone() for p in module.parameters()]
    x_grad = stage.backward((0, 0), delta)
    torch.testing.assert_close(x_grad, _expected_mlp(forward_weights, current, x, delta)["input"], rtol=1e-5,
                               atol=1e-6)


def test_recompute_takes_the_mask_from_the_current_weights_and_fails_the_same_check():
    torch.manual_seed(2)
    x, delta = torch.randn(8, 6), torch.randn(8, 4)
    forward_weights, current, grads, _ = _run("current", _mlp(), x.clone(), delta, shift=0.5)
    expected = _expected_mlp(forward_weights, current, x, delta)
    assert not torch.allclose(grads["2.weight"], expected["2.weight"], rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("mode,matches", [("saved", True), ("current", False)])
def test_groupnorm_statistics_are_the_forwards(mode, matches):
    """A GroupNorm stage: its weight gradient is sum(delta * x_hat) with x_hat normalised by the forward's
    statistics; with the input's scale changed by the live conv before the backward, recompute normalises anew."""
    torch.manual_seed(3)
    module = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.GroupNorm(2, 4))
    x, delta = torch.randn(5, 2, 6, 6), torch.randn(5, 4, 6, 6)
    stage = _stage(mode, module)
    with torch.no_grad():
        h = module[0](x)
        x_hat = nn.functional.group_norm(h, 2)  # no affine: the forward's normalised activations
    stage.forward((0, 0), x)
    with torch.no_grad():
        module[0].weight.mul_(3.0).add_(0.2)
        module[0].bias.add_(1.0)
    stage.backward((0, 0), delta)
    expected = (delta * x_hat).sum(dim=(0, 2, 3))
    assert torch.allclose(module[1].weight.grad, expected, rtol=1e-4, atol=1e-5) is matches
