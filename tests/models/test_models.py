"""LeNet-5 and the MLP: layer structure, shapes, parameter counts, options."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hybrid.models import MLP, LeNet5


def n_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def test_lenet5_layers_follow_paper_000():
    net = LeNet5()
    assert [name for name, _ in net.named_children()] == ["c1", "s2", "c3", "s4", "c5", "f6", "output"]
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    pools = [m for m in net.modules() if isinstance(m, (nn.MaxPool2d, nn.AvgPool2d))]
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    # 3 convolutions, 2 poolings, 1 fully connected hidden layer and the output layer
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [(1, 6, (5, 5)), (6, 16, (5, 5)), (16, 120, (5, 5))]
    assert len(pools) == 2
    assert [(l.in_features, l.out_features) for l in linears] == [(120, 84), (84, 10)]
    assert n_params(net) == 61706


def test_lenet5_shapes_per_block():
    net = LeNet5()
    x = torch.randn(3, 1, 28, 28)
    shapes = []
    for block in net:
        x = block(x)
        shapes.append(tuple(x.shape[1:]))
    assert shapes == [(6, 28, 28), (6, 14, 14), (16, 10, 10), (16, 5, 5), (120,), (84,), (10,)]


def test_lenet5_options():
    net = LeNet5(num_classes=3, activation="tanh", pooling="avg")
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 3)
    assert any(isinstance(m, nn.Tanh) for m in net.modules())
    assert any(isinstance(m, nn.AvgPool2d) for m in net.modules())
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        LeNet5(activation="gelu")
    with pytest.raises(ValueError, match="unknown pooling"):
        LeNet5(pooling="median")


def test_mlp_is_784_40_10_sigmoid():
    net = MLP()
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    assert [(l.in_features, l.out_features) for l in linears] == [(784, 40), (40, 10)]
    assert sum(isinstance(m, nn.Sigmoid) for m in net.modules()) == 1
    assert n_params(net) == 31810
    assert net(torch.randn(5, 1, 28, 28)).shape == (5, 10)


def test_mlp_hidden_layers():
    net = MLP(in_features=20, hidden=[16, 8], num_classes=4, activation="relu")
    assert [name for name, _ in net.named_children()] == ["flatten", "hidden0", "hidden1", "output"]
    assert net(torch.randn(2, 20)).shape == (2, 4)
