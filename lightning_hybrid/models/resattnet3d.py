"""3D-ResAttNet: a 3D ResNet with residual self-attention, for structural MRI (paper 003's model)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from lightning_hybrid.models.checkpointing import Blocks

#: BasicBlocks per stage for each depth (as 2D ResNet-18/34).
STAGE_BLOCKS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class BasicBlock3d(nn.Module):
    """Two 3x3x3 convolutions with BatchNorm and ReLU, and a (projected) identity shortcut."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv3d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm3d(channels)
        self.conv2 = nn.Conv3d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm3d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv3d(in_channels, channels, 1, stride=stride, bias=False), nn.BatchNorm3d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResidualSelfAttention3d(nn.Module):
    """Self-attention over the positions of a 3D feature map, added back with a learnable scale.

    Query, key and value are 1x1x1 convolutions (query and key reduced to ``channels // reduction``);
    ``out = x + gamma * attention(x)`` with ``gamma`` starting at 0, so the block starts as identity.
    Its cost grows with the square of the number of positions: place it on coarse feature maps.
    """

    def __init__(self, channels: int, reduction: int = 8) -> None:
        super().__init__()
        inner = max(channels // reduction, 1)
        self.query = nn.Conv3d(channels, inner, 1)
        self.key = nn.Conv3d(channels, inner, 1)
        self.value = nn.Conv3d(channels, channels, 1)
        self.gamma = nn.Parameter(torch.zeros(1))

    def reset_parameters(self) -> None:
        """``gamma`` back to 0 (the block as identity); its convolutions reset themselves."""
        nn.init.zeros_(self.gamma)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c = x.shape[:2]
        q = self.query(x).flatten(2).transpose(1, 2)  # (b, n, inner)
        k = self.key(x).flatten(2)  # (b, inner, n)
        v = self.value(x).flatten(2)  # (b, c, n)
        attention = torch.softmax(q @ k / q.shape[-1] ** 0.5, dim=-1)  # (b, n, n)
        out = (v @ attention.transpose(1, 2)).view_as(x)
        return x + self.gamma * out


class ClassifierHead(nn.Module):
    """Global average pooling, dropout and a linear layer to class logits."""

    def __init__(self, channels: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool3d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self.pool(x).flatten(1)))


class ResAttNet3D(Blocks):
    """3D-ResAttNet-18/34 (Zhang et al. 2021, used by Akintoye et al. 2022 for ADNI): a 3D ResNet of
    BasicBlocks with residual self-attention after chosen stages and a classifier head.

    The network is an ``nn.Sequential`` of named blocks, in order: ``stem`` (7x7x7 convolution,
    stride 2, BatchNorm, ReLU, 3x3x3 max pooling, stride 2), ``layer{s}_{i}`` (BasicBlock ``i`` of
    stage ``s``; the first block of stages 2-4 halves the resolution), ``attention{s}`` after each
    stage in ``attention_stages``, and ``head``. Each block is a candidate partition for the
    pipeline strategy.

    Args:
        depth: 18 or 34 (BasicBlocks per stage (2, 2, 2, 2) or (3, 4, 6, 3)).
        in_channels: image channels (1 for T1-weighted MRI).
        num_classes: 2 for AD vs NC or pMCI vs sMCI.
        base_channels: channels of the first stage (64 in the paper); stages double it.
        attention_stages: stages followed by self-attention (default 3 and 4: 1/16 and 1/32 of
            the input resolution, where attention over all positions is affordable).
        dropout: before the final linear layer.
        checkpoint_blocks: recompute each block's activations in backward instead of keeping them
            (:mod:`lightning_hybrid.models.checkpointing`): less memory, a second forward per block.

    Example::

        >>> import torch
        >>> net = ResAttNet3D(depth=18, base_channels=8)
        >>> net(torch.zeros(2, 1, 32, 32, 32)).shape
        torch.Size([2, 2])
        >>> [name for name, _ in net.named_children()][:3]
        ['stem', 'layer1_0', 'layer1_1']
    """

    def __init__(
        self,
        depth: int = 18,
        in_channels: int = 1,
        num_classes: int = 2,
        base_channels: int = 64,
        attention_stages: Sequence[int] = (3, 4),
        dropout: float = 0.2,
        checkpoint_blocks: bool = False,
    ) -> None:
        if depth not in STAGE_BLOCKS:
            raise ValueError(f"depth must be one of {sorted(STAGE_BLOCKS)}, got {depth}")
        if not set(attention_stages) <= {1, 2, 3, 4}:
            raise ValueError(f"attention_stages must be among the stages 1-4, got {list(attention_stages)}")
        blocks: OrderedDict[str, nn.Module] = OrderedDict(
            stem=nn.Sequential(
                nn.Conv3d(in_channels, base_channels, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm3d(base_channels),
                nn.ReLU(inplace=True),
                nn.MaxPool3d(3, stride=2, padding=1),
            )
        )
        channels = base_channels
        for stage, count in enumerate(STAGE_BLOCKS[depth], start=1):
            out_channels = base_channels * 2 ** (stage - 1)
            for i in range(count):
                stride = 2 if stage > 1 and i == 0 else 1
                blocks[f"layer{stage}_{i}"] = BasicBlock3d(channels, out_channels, stride)
                channels = out_channels
            if stage in attention_stages:
                blocks[f"attention{stage}"] = ResidualSelfAttention3d(channels)
        blocks["head"] = ClassifierHead(channels, num_classes, dropout)
        super().__init__(blocks)
        self.checkpoint_blocks = checkpoint_blocks
        self.depth = depth
        self.num_classes = num_classes
        self.init_weights()

    def init_weights(self, block: nn.Module | None = None) -> None:
        """Kaiming-normal convolution weights (fan-out, as ResNet's), of ``block`` (one of the blocks) or
        of every block. ``__init__`` calls it after building them all; a pipeline stage built on the meta
        device (``configure_model()``) calls it for each block after ``reset_parameters()``, so that its
        values are those of ``__init__``."""
        for module in (block if block is not None else self).modules():
            if isinstance(module, nn.Conv3d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
