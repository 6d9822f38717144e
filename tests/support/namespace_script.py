"""A user's script in one Lightning namespace (``--namespace lightning``: ``import lightning as L``; or
``pytorch_lightning``), optionally with the other one made uninstalled (``--block``: its imports fail,
as where pip never installed it): fits a small module of that namespace with ``strategy=NAME`` on 2
CPU processes and writes rank 0's final parameters and the strategy's class to ``OUT/result.pt``."""

from __future__ import annotations

import argparse
import importlib.abc
import sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--namespace", choices=["lightning", "pytorch_lightning"], default="lightning")
parser.add_argument("--block", nargs="*", default=[], help="packages to make unimportable (e.g. pytorch_lightning lightning_fabric)")
parser.add_argument("--strategy", default="ssp")
parser.add_argument("--devices", type=int, default=2)
parser.add_argument("--iterable", action="store_true", help="the training data as an IterableDataset")
parser.add_argument("--batch-sampler", action="store_true", help="a DataLoader with a batch_sampler of its own (no batch_size)")
args = parser.parse_args()


class Uninstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in args.block:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the test)", name=fullname)
        return None


sys.meta_path.insert(0, Uninstalled())

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

if args.namespace == "lightning":
    import lightning as L  # noqa: E402

    from lightning_hybrid.lightning.straggler import StragglerReport  # noqa: E402
else:
    import pytorch_lightning as L  # noqa: E402

    from lightning_hybrid.straggler import StragglerReport  # noqa: E402

import lightning_hybrid  # noqa: E402,F401  (registers the aliases)


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


g = torch.Generator().manual_seed(0)
x = torch.randn(64, 4, generator=g)
pairs = TensorDataset(x, x.sum(1, keepdim=True))


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(pairs)


if args.batch_sampler:
    data = DataLoader(pairs, batch_sampler=torch.utils.data.BatchSampler(range(len(pairs)), 8, drop_last=False))
else:
    data = DataLoader(Stream() if args.iterable else pairs, batch_size=8)
L.seed_everything(0)
module = Regression()
report = StragglerReport()
trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy=args.strategy, max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    callbacks=[report])
trainer.fit(module, data)
if trainer.is_global_zero:
    strategy = type(trainer.strategy)
    torch.save({"strategy": f"{strategy.__module__}.{strategy.__qualname__}",
                "loaded": sorted(name for name in ("pytorch_lightning", "lightning") if name in sys.modules),
                "reports": len(report.findings),
                "params": {k: v.detach().cpu() for k, v in module.state_dict().items()}}, args.out / "result.pt")
