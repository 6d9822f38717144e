"""LeNet-5 as used by Zhang et al. 2017 (paper 000) for the delay-synchronous MNIST experiments."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from lightning_hybrid.models.checkpointing import Blocks

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid}
_POOLS = {"max": nn.MaxPool2d, "avg": nn.AvgPool2d}


def make_activation(name: str) -> nn.Module:
    """Return a fresh activation module for ``name`` (one of ``relu``, ``tanh``, ``sigmoid``)."""
    try:
        return _ACTIVATIONS[name]()
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; choose one of {sorted(_ACTIVATIONS)}") from None


class LeNet5(Blocks):
    """LeNet-5: input, 3 convolutions, 2 poolings, 1 fully connected layer, output (paper 000, sec. 5).

    Paper 000 names only the layer counts; the sizes are LeCun et al. 1998's. For a 1x28x28 MNIST
    image (padded by 2 to LeCun's 32x32 in ``c1``) the blocks are, in order:

    ======  ============================================  =============
    block   layers                                        output shape
    ======  ============================================  =============
    c1      Conv2d(1, 6, 5, padding=2) + activation       6 x 28 x 28
    s2      pool 2x2, stride 2                            6 x 14 x 14
    c3      Conv2d(6, 16, 5) + activation                 16 x 10 x 10
    s4      pool 2x2, stride 2                            16 x 5 x 5
    c5      Conv2d(16, 120, 5) + activation, flatten      120
    f6      Linear(120, 84) + activation                  84
    output  Linear(84, num_classes) (logits)              num_classes
    ======  ============================================  =============

    61,706 parameters for 10 classes. LeCun used tanh and average ("subsampling") pooling; the
    defaults here are ReLU and max pooling, which train faster with SGD, and both are options.

    The network is an ``nn.Sequential`` of these named blocks, so strategies that cut a model into
    pipeline stages or partition layers across devices can walk ``net.named_children()``.

    Example::

        >>> import torch
        >>> net = LeNet5()
        >>> net(torch.zeros(8, 1, 28, 28)).shape
        torch.Size([8, 10])
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        activation: str = "relu",
        pooling: str = "max",
        checkpoint_blocks: bool = False,
    ) -> None:
        if pooling not in _POOLS:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {sorted(_POOLS)}")
        pool = _POOLS[pooling]
        blocks = OrderedDict(
            c1=nn.Sequential(nn.Conv2d(in_channels, 6, 5, padding=2), make_activation(activation)),
            s2=pool(2, 2),
            c3=nn.Sequential(nn.Conv2d(6, 16, 5), make_activation(activation)),
            s4=pool(2, 2),
            c5=nn.Sequential(nn.Conv2d(16, 120, 5), make_activation(activation), nn.Flatten()),
            f6=nn.Sequential(nn.Linear(120, 84), make_activation(activation)),
            output=nn.Linear(84, num_classes),
        )
        super().__init__(blocks)
        self.checkpoint_blocks = checkpoint_blocks
        self.num_classes = num_classes
