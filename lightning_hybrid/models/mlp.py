"""The multilayer perceptron of cNeural (Gu et al. 2013, paper 002): 784-40-10 with sigmoid units."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from lightning_hybrid.models.checkpointing import Blocks
from lightning_hybrid.models.lenet import make_activation


class MLP(Blocks):
    """Fully connected network; the default is paper 002's 784-40-10 sigmoid MLP.

    Blocks: ``flatten`` (any input shape to ``in_features``), then one ``hidden{i}`` block
    (Linear + activation) per entry of ``hidden``, then ``output`` (Linear, logits). The output
    sigmoid of the paper is replaced by logits for the cross-entropy loss; prediction is the
    argmax either way. 31,810 parameters with the defaults.

    Example::

        >>> import torch
        >>> MLP()(torch.zeros(4, 1, 28, 28)).shape
        torch.Size([4, 10])
        >>> MLP(hidden=(128, 64), activation="relu")(torch.zeros(4, 784)).shape
        torch.Size([4, 10])
    """

    def __init__(
        self,
        in_features: int = 784,
        hidden: Sequence[int] = (40,),
        num_classes: int = 10,
        activation: str = "sigmoid",
        checkpoint_blocks: bool = False,
    ) -> None:
        widths = [in_features, *hidden]
        blocks: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
        for i, (fan_in, fan_out) in enumerate(zip(widths, widths[1:])):
            blocks[f"hidden{i}"] = nn.Sequential(nn.Linear(fan_in, fan_out), make_activation(activation))
        blocks["output"] = nn.Linear(widths[-1], num_classes)
        super().__init__(blocks)
        self.checkpoint_blocks = checkpoint_blocks
        self.num_classes = num_classes
