"""3D-ResAttNet: structure, shapes, gradients, attention, cost per block."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid.models import ResAttNet3D
from lightning_hybrid.models.resattnet3d import ResidualSelfAttention3d


@pytest.mark.parametrize("depth, blocks", [(18, 8), (34, 16)])
def test_blocks_are_an_ordered_sequence(depth, blocks):
    net = ResAttNet3D(depth=depth, base_channels=4)
    names = [name for name, _ in net.named_children()]
    assert names[0] == "stem" and names[-1] == "head"
    assert sum(name.startswith("layer") for name in names) == blocks
    assert names.index("attention3") == names.index(f"layer3_{[1, 5][depth == 34]}") + 1
    assert "attention4" in names and "attention2" not in names


@pytest.mark.parametrize("depth", [18, 34])
def test_forward_and_backward(depth):
    torch.manual_seed(0)
    net = ResAttNet3D(depth=depth, base_channels=8, num_classes=2)
    x = torch.randn(2, 1, 32, 32, 32)
    logits = net(x)
    assert logits.shape == (2, 2) and logits.dtype == torch.float32
    logits.sum().backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


def test_block_by_block_equals_the_whole():
    net = ResAttNet3D(depth=18, base_channels=4).eval()
    x = torch.randn(1, 1, 32, 40, 32)
    out = x
    for block in net:
        out = block(out)
    torch.testing.assert_close(out, net(x))


def test_attention_starts_as_identity_and_learns_a_scale():
    att = ResidualSelfAttention3d(16)
    x = torch.randn(2, 16, 3, 4, 5)
    torch.testing.assert_close(att(x), x)
    with torch.no_grad():
        att.gamma.fill_(0.5)
    assert not torch.allclose(att(x), x)


def test_parameter_counts_at_paper_width():
    counts = {d: sum(p.numel() for p in ResAttNet3D(depth=d).parameters()) for d in (18, 34)}
    assert counts == {18: 33_571_588, 34: 63_881_220}


def test_bad_arguments():
    with pytest.raises(ValueError, match="depth must be one of"):
        ResAttNet3D(depth=50)
    with pytest.raises(ValueError, match="attention_stages"):
        ResAttNet3D(attention_stages=(5,))
