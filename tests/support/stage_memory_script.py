"""Run by tests/strategies/test_stage_memory.py: a user's script pipelining a stack of wide linear blocks, built
in ``configure_model()`` or in ``__init__``, with ``HybridParallelStrategy`` (or one process).

    python stage_memory_script.py OUT --stages 2 --width 4096 --build configure [--steps 3] ...

Rank 0 writes ``result.pt``: the whole model's final state (``strategy.full_state_dict()``), the
losses, and per rank: the peak memory above the start, the plan's estimate of its stage, and the
bytes of parameters it held (real and freed) after training.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from threads import threads_per_process
from lightning_hybrid import HybridParallelStrategy
from lightning_hybrid.comm.collectives import all_gather_object
from lightning_hybrid.pipeline.materialize import tensor_bytes


def make_blocks(width: int, count: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict((f"block{i}", nn.Linear(width, width)) for i in range(count)))


class BlockStack(pl.LightningModule):
    """``count`` blocks of ``Linear(width, width)``, regression to a fixed target, SGD with momentum."""

    def __init__(self, width: int, count: int, build: str, lr: float = 0.01) -> None:
        super().__init__()
        self.width, self.count, self.build, self.lr = width, count, build, lr
        self.losses: list[float] = []
        if build == "init":
            self._build()

    def configure_model(self) -> None:
        if self.build == "configure" and not hasattr(self, "net"):
            self._build()

    def _build(self) -> None:
        torch.manual_seed(1)
        self.net = make_blocks(self.width, self.count)
        for block in self.net:  # initialisation of its own after building the blocks, as 3D-ResAttNet's
            self.init_weights(block)

    def init_weights(self, block: nn.Module) -> None:
        """The hook a pipeline stage built on the meta device replays after reset_parameters()."""
        nn.init.normal_(block.weight, std=0.05)

    def forward(self, x):
        return self.net(x)

    def pipeline_blocks(self) -> nn.Sequential:
        return self.net

    def pipeline_loss(self, output, target):
        return F.mse_loss(output, target)

    def on_pipeline_step(self, output, target, loss):
        self.losses.append(float(loss.detach()))

    def training_step(self, batch, batch_idx):  # one process (no pipeline)
        loss = F.mse_loss(self(batch[0]), batch[1])
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--stages", type=int, default=2, help="0: one process, no pipeline")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--build", choices=["configure", "init"], default="configure")
    parser.add_argument("--steps", type=int, default=3, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--memory", default=None, help="each device's memory for the plan, e.g. 600MB")
    parser.add_argument("--no-input-shape", action="store_true", help="plan at the first batch (no input_shape)")
    parser.add_argument("--checkpoint", action="store_true", help="save OUT/ckpt/last.ckpt at the end")
    parser.add_argument("--resume", default=None)
    parser.add_argument("--fork-ranks", action="store_true")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--processes-per-device", type=int, default=1, help="2: two stages share each device")
    args = parser.parse_args()
    torch.set_num_threads(threads_per_process(max(args.stages, 1)))
    args.out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    samples = args.batch * args.steps
    data = TensorDataset(torch.randn(samples, args.width, generator=g), torch.randn(samples, args.width, generator=g))
    if args.stages:
        devices = [{"speed": 1.0, **({"memory": args.memory} if args.memory else {})} for _ in range(args.stages)]
        strategy = HybridParallelStrategy(
            pipeline_stages=args.stages, micro_batches=args.micro, placement="uniform", devices=devices,
            input_shape=None if args.no_input_shape else [args.width], fork_ranks=args.fork_ranks,
            processes_per_device=args.processes_per_device,
        )
    else:
        strategy = "auto"
    callbacks = [pl.callbacks.ModelCheckpoint(dirpath=args.out / "ckpt", save_last=True)] if args.checkpoint else []
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=max(args.stages // args.processes_per_device, 1), strategy=strategy, max_epochs=args.epochs, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=args.checkpoint,
        callbacks=callbacks, num_sanity_val_steps=0, deterministic=True,
        use_distributed_sampler=False,  # one replica: every run sees the batches in the loader's order
    )
    module = BlockStack(args.width, args.blocks, args.build)
    trainer.fit(module, DataLoader(data, batch_size=args.batch), ckpt_path=args.resume)
    if args.stages:
        peak = strategy._peak.peak()  # training's, before the whole model is gathered below
        full = strategy.full_state_dict()
        estimate = strategy.placement.stages[strategy.mesh.stage_of(trainer.global_rank)].memory
    else:
        full, peak, estimate = {k: v.detach().clone() for k, v in module.state_dict().items()}, None, None
    held = (tensor_bytes([module]), tensor_bytes([module], freed=True), peak, estimate)
    ranks = all_gather_object(held) if dist.is_initialized() else [held]
    if trainer.is_global_zero:
        torch.save({"state": full, "losses": module.losses, "ranks": ranks}, args.out / "result.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
