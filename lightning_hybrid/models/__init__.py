"""Networks: plain ``nn.Module`` s built as ordered sequences of named blocks."""

from lightning_hybrid.models.lenet import LeNet5
from lightning_hybrid.models.mlp import MLP

__all__ = ["LeNet5", "MLP"]
