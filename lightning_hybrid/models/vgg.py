"""VGG-16 (Simonyan and Zisserman 2015, configuration D), the network MoDNN (paper 001) partitions."""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from lightning_hybrid.models.checkpointing import Blocks

#: Output channels of the 13 convolutions, 'M' a 2x2 max pooling (configuration D).
VGG16_LAYERS = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG16(Blocks):
    """VGG-16 as an ordered sequence of named blocks: ``conv1_1`` ... ``conv5_3`` (3x3 convolution,
    padding 1, ReLU), ``pool1`` ... ``pool5`` (2x2 max pooling), ``flatten``, ``fc6``, ``fc7`` (Linear,
    ReLU, Dropout) and ``fc8`` (class logits).

    Args:
        num_classes: outputs of ``fc8`` (1000 for ImageNet).
        in_channels: image channels.
        input_size: the images' height and width (224 for ImageNet); sets ``fc6``'s input size.
        width: scales every convolution's channels (1.0 is the real VGG-16; 1/16 makes a small one).
        fc_width: units of ``fc6`` and ``fc7`` (4096 in the real VGG-16).
        batch_norm: a BatchNorm after each convolution (VGG-16-BN).
        checkpoint_blocks: recompute each block's activations in backward instead of keeping them
            (:mod:`lightning_hybrid.models.checkpointing`): less memory, a second forward per block.

    The real network (defaults) has 138.4 M parameters, 123.6 M of them in the fully-connected
    layers (fc6 25088 x 4096, fc7 4096 x 4096, fc8 4096 x 1000). Weights are random (Kaiming) unless
    you load your own (e.g. ``torchvision``'s ``vgg16`` state dict renamed, or a pruned one).

    Example::

        >>> import torch
        >>> VGG16(num_classes=10, input_size=32, width=1 / 16, fc_width=64)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        num_classes: int = 1000,
        in_channels: int = 3,
        input_size: int = 224,
        width: float = 1.0,
        fc_width: int = 4096,
        batch_norm: bool = False,
        dropout: float = 0.5,
        checkpoint_blocks: bool = False,
    ) -> None:
        if input_size % 32 or input_size < 32:
            raise ValueError(f"input_size must be a multiple of 32 (five 2x2 poolings), got {input_size}")
        if not width > 0:
            raise ValueError(f"width must be positive, got {width}")
        blocks: OrderedDict[str, nn.Module] = OrderedDict()
        channels, stage, index = in_channels, 1, 1
        for item in VGG16_LAYERS:
            if item == "M":
                blocks[f"pool{stage}"] = nn.MaxPool2d(2, 2)
                stage, index = stage + 1, 1
                continue
            out = max(1, round(item * width))
            layers: list[nn.Module] = [nn.Conv2d(channels, out, 3, padding=1)]
            if batch_norm:
                layers.append(nn.BatchNorm2d(out))
            layers.append(nn.ReLU(inplace=True))
            blocks[f"conv{stage}_{index}"] = nn.Sequential(*layers)
            channels, index = out, index + 1
        side = input_size // 32
        blocks["flatten"] = nn.Flatten()
        blocks["fc6"] = nn.Sequential(nn.Linear(channels * side * side, fc_width), nn.ReLU(inplace=True), nn.Dropout(dropout))
        blocks["fc7"] = nn.Sequential(nn.Linear(fc_width, fc_width), nn.ReLU(inplace=True), nn.Dropout(dropout))
        blocks["fc8"] = nn.Linear(fc_width, num_classes)
        super().__init__(blocks)
        self.checkpoint_blocks = checkpoint_blocks
        self.num_classes = num_classes
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0, 0.01)
                nn.init.zeros_(module.bias)
