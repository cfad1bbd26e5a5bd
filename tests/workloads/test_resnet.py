"""Tests of the CIFAR ResNets: parameter counts, block structure, shapes and splittability."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.models import resnet

pytestmark = pytest.mark.usefixtures("one_thread")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_resnet20_has_option_a_parameter_count():
    # Option A (parameter-free shortcuts) ResNet-20: 269,722. The 272,474 sometimes quoted is option B, which
    # adds 1x1 conv + BN projections at the two downsampling blocks: (16*32 + 2*32) + (32*64 + 2*64) = 2,752.
    assert count_parameters(resnet.resnet20()) == 269_722
    assert 269_722 + (16 * 32 + 2 * 32) + (32 * 64 + 2 * 64) == 272_474


@pytest.mark.parametrize("depth, expected", [(8, 75_290), (20, 269_722), (32, 464_154), (44, 658_586),
                                             (56, 853_018), (110, 1_727_962)])
def test_cifar_resnet_parameter_counts_match_the_paper(depth, expected):
    # He et al. 2016, table 6: 0.27M, 0.46M, 0.66M, 0.85M, 1.7M for depths 20, 32, 44, 56, 110.
    assert count_parameters(resnet.cifar_resnet(depth)) == expected


def test_shortcuts_are_parameter_free():
    model = resnet.resnet20()
    kernel_sizes = {m.kernel_size for m in model.modules() if isinstance(m, nn.Conv2d)}
    assert kernel_sizes == {(3, 3)}
    assert sum(isinstance(m, nn.Conv2d) for m in model.modules()) == 19  # + 1 linear = 20 weighted layers


def test_resnet20_is_a_sequential_of_11_blocks():
    model = resnet.resnet20()
    assert type(model) is nn.Sequential
    assert len(model) == 11
    assert isinstance(model[0][0], nn.Conv2d) and model[0][0].out_channels == 16
    assert all(isinstance(model[i], resnet.BasicBlock) for i in range(1, 10))
    assert isinstance(model[10][-1], nn.Linear) and model[10][-1].out_features == 10


def test_output_shape_and_classes():
    x = torch.randn(2, 3, 32, 32)
    assert resnet.resnet20()(x).shape == (2, 10)
    assert resnet.resnet20(classes=100)(x).shape == (2, 100)


def test_stage_shapes():
    model = resnet.resnet20().eval()
    x = torch.randn(2, 3, 32, 32)
    shapes = {}
    for i, block in enumerate(model):
        x = block(x)
        shapes[i] = tuple(x.shape)
    assert shapes[0] == shapes[3] == (2, 16, 32, 32)
    assert shapes[4] == shapes[6] == (2, 32, 16, 16)
    assert shapes[7] == shapes[9] == (2, 64, 8, 8)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_running_blocks_one_by_one_equals_the_model(mode):
    torch.manual_seed(0)
    model = resnet.resnet20().train(mode == "train")
    x = torch.randn(4, 3, 32, 32)
    expected = model(x)
    out = x
    for block in model:
        out = block(out)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # and a pipeline split between any two blocks gives the same result
    activations = [x]
    for block in model:
        activations.append(block(activations[-1]))
    for cut in range(1, len(model)):
        torch.testing.assert_close(model[cut:](activations[cut]), expected, rtol=0, atol=0)


def test_downsampling_shortcut_subsamples_and_zero_pads_channels():
    block = resnet.BasicBlock(16, 32, stride=2)
    x = torch.randn(2, 16, 8, 8)
    shortcut = block.shortcut(x)
    assert shortcut.shape == (2, 32, 4, 4)
    torch.testing.assert_close(shortcut[:, :16], x[:, :, ::2, ::2])
    assert torch.count_nonzero(shortcut[:, 16:]) == 0
    same = resnet.BasicBlock(16, 16)
    torch.testing.assert_close(same.shortcut(x), x)


def test_conv_init_is_kaiming_normal_fan_out():
    torch.manual_seed(0)
    model = resnet.cifar_resnet(56)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    wide = torch.cat([c.weight.flatten() for c in convs if c.out_channels == 64])
    expected_std = (2.0 / (3 * 3 * 64)) ** 0.5
    assert abs(wide.std().item() / expected_std - 1) < 0.02
    assert abs(wide.mean().item()) < 0.05 * expected_std
    # where in and out channels differ, fan_out (not fan_in) sets the scale
    for conv in (c for c in convs if c.in_channels != c.out_channels):
        expected_std = (2.0 / (3 * 3 * conv.out_channels)) ** 0.5
        assert abs(conv.weight.std().item() / expected_std - 1) < 0.15, (conv, conv.weight.std().item())
    batch_norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(torch.all(bn.weight == 1) and torch.all(bn.bias == 0) for bn in batch_norms)


@pytest.mark.parametrize("depth", [0, 2, 7, 19, 21, 100])
def test_invalid_depth_raises(depth):
    with pytest.raises(ValueError, match="6n\\+2"):
        resnet.cifar_resnet(depth)


def test_sgd_steps_reduce_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    model = resnet.cifar_resnet(8)
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_the_groupnorm_variant_replaces_every_batchnorm_and_works_at_batch_size_one():
    from harness import registry

    model = resnet.resnet20(norm="group")
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    groups = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(groups) == 19 and {g.num_channels // g.num_groups for g in groups} == {4}
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert registry.WORKLOADS.get("cifar10-resnet20").Options(norm="group").norm == "group"


@pytest.mark.parametrize("name", ["cifar10-resnet20", "cifar10-resnet"])
@pytest.mark.parametrize("depth, expected, paper", [(20, 269_722, 0.27e6), (56, 853_018, 0.85e6),
                                                    (110, 1_727_962, 1.7e6)])
def test_the_cifar10_workloads_depth_option_gives_the_paper_s_resnets(name, depth, expected, paper):
    # He et al. 2016, table 6: ResNet-20, -56 and -110 have 0.27M, 0.85M and 1.7M parameters.
    from harness import registry

    model = registry.WORKLOADS.get(name).meta_model({"depth": depth})
    assert all(p.is_meta for p in model.parameters())
    assert count_parameters(model) == expected and round(expected / paper, 1) == 1.0
    assert len(model) == 3 * (depth - 2) // 6 + 2  # stem, 3n BasicBlocks, head
    assert model[-1][-1].out_features == 10


def test_the_cifar10_workloads_default_to_resnet20_and_share_everything_but_the_name():
    from harness import registry

    old, new = registry.WORKLOADS.get("cifar10-resnet20"), registry.WORKLOADS.get("cifar10-resnet")
    assert (old.name, new.name) == ("cifar10-resnet20", "cifar10-resnet")
    assert old.Options().depth == 20 and old.Options().norm == "batch"
    assert count_parameters(old.meta_model()) == count_parameters(new.meta_model()) == 269_722
    assert (old.build, old.make_model, old.Options, old.budget, old.hyperparameters, old.dataset) == (
        new.build, new.make_model, new.Options, new.budget, new.hyperparameters, new.dataset)


@pytest.mark.parametrize("depth", [110, 56])
def test_deep_cifar_resnets_forward_cifar_shapes(depth):
    torch.manual_seed(0)
    model = resnet.cifar_resnet(depth).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = model[0](x)
        assert out.shape == (2, 16, 32, 32)
        n = (depth - 2) // 6
        for i, block in enumerate(model[1:-1]):
            out = block(out)
            assert out.shape == (2, (16, 32, 64)[i // n], 32 >> (i // n), 32 >> (i // n))
        assert model[-1](out).shape == (2, 10)


@pytest.mark.parametrize("depth", [21, 100, 2])
def test_a_depth_other_than_6n_plus_2_is_refused_by_the_options(depth):
    from pydantic import ValidationError

    from harness import registry

    with pytest.raises(ValidationError, match="6n\\+2|greater than or equal to 8"):
        registry.WORKLOADS.get("cifar10-resnet").Options.model_validate({"depth": depth})
