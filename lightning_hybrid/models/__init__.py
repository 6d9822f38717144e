"""Networks: plain ``nn.Module`` s built as ordered sequences of named blocks."""

from lightning_hybrid.models.lenet import LeNet5
from lightning_hybrid.models.mlp import MLP
from lightning_hybrid.models.resattnet3d import ResAttNet3D
from lightning_hybrid.models.vgg import VGG16

__all__ = ["LeNet5", "MLP", "ResAttNet3D", "VGG16"]
