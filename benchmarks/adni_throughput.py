"""Does the ADNI input pipeline keep the accelerator busy? End-to-end training against compute alone.

3D-ResAttNet-18 at the ADNI datamodule's whole-brain view (112 x 136 x 120 voxels of 1.5 mm), batch 6, SGD, on synthetic ADNI volumes, on whatever
accelerator is present (CUDA if available, else the CPU):

* compute only: forward, backward and SGD step, over and over, on one batch already on the device;
* end to end: ``Trainer.fit`` with :class:`~lightning_hybrid.data.ADNIDataModule` (loading, batching,
  transfer, augmentation, Lightning's loop and logging) for the same number of steps;

each timed after warm-up steps, and their ratio (1.0: the input pipeline costs nothing). Contenders
are datamodule settings, run one after another in this process:

* ``device`` (the defaults): preprocessed volumes held on the accelerator (``cache="auto"``: on a
  GPU when they fit a quarter of its free memory; on the CPU this is ``host``), batches gathered
  there, augmentation batched on the device;
* ``host``: preprocessed volumes in host memory, 2 loader workers, pinned memory, augmentation
  batched on the device (the defaults before ``cache="auto"``);
* ``workers``: host memory, MONAI's random transforms per sample in up to 8 loader workers;
* ``before``: the earlier defaults (no loader workers, MONAI augmentation in the training process).

    python benchmarks/adni_throughput.py                    # on the GPU if there is one
    python benchmarks/adni_throughput.py --steps 3 --warmup 1 --contender device --contender before   # a quick CPU run
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from lightning_hybrid import ClassifierModule
from lightning_hybrid.data import ADNIDataModule
from lightning_hybrid.data.adni_phantoms import write_adni_phantoms
from lightning_hybrid.models import ResAttNet3D

CONTENDERS = {
    "device": dict(cache={"where": "auto"}, augment={"where": "device"}, num_workers="auto", pin_memory="auto"),
    "host": dict(cache={"where": "memory"}, augment={"where": "device"}, num_workers="auto", pin_memory="auto"),
    "workers": dict(cache={"where": "memory"}, augment={"where": "workers"}, num_workers="auto", pin_memory="auto"),
    "before": dict(cache={"where": "memory"}, augment={"where": "workers"}, num_workers=0, pin_memory=False),
}


class StepTimer(pl.Callback):
    """Wall-clock time from the start of training step ``warmup`` to the end of the last one."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.end, self.seen, self.steps = warmup, None, None, 0, 0

    def _sync(self, pl_module: pl.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.seen == self.warmup:
            self._sync(pl_module)
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen += 1
        if self.seen > self.warmup:
            self._sync(pl_module)
            self.end, self.steps = time.perf_counter(), self.steps + 1


def make_net(base_channels: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return ResAttNet3D(depth=18, base_channels=base_channels)


def compute_only(device: torch.device, shape, batch: int, steps: int, warmup: int, base_channels: int) -> float:
    """Samples per second of forward + backward + SGD step on a batch already on ``device``."""
    net = make_net(base_channels).to(device).train()
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    x = torch.randn(batch, 1, *shape, device=device)
    y = torch.randint(0, 2, (batch,), device=device)
    start = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return batch * steps / (time.perf_counter() - start)


def end_to_end(csv_path: Path, cache_dir: Path, settings: dict, accelerator: str, shape, batch: int, steps: int,
               warmup: int, base_channels: int) -> float:
    """Samples per second of Trainer.fit on the ADNI datamodule, from step ``warmup`` on."""
    pl.seed_everything(0)
    settings = {**settings, "cache": {**settings["cache"], "dir": cache_dir}}
    dm = ADNIDataModule({"csv_path": csv_path}, view={"image_shape": shape}, batch_size=batch,
                        split={"val_fraction": 0.05, "test_fraction": 0.05}, **settings)
    module = ClassifierModule(make_net(base_channels), optimizer=partial(torch.optim.SGD, lr=1e-4, momentum=0.9))
    timer = StepTimer(warmup)
    trainer = pl.Trainer(accelerator=accelerator, devices=1, max_epochs=100, max_steps=warmup + steps,
                         limit_val_batches=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[timer], num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    return batch * timer.steps / (timer.end - timer.start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default: 40 on CUDA, 3 on the CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default: 10 on CUDA, 1 on the CPU)")
    parser.add_argument("--subjects", type=int, default=60, help="synthetic subjects (each has 1-2 scans)")
    parser.add_argument("--shape", type=int, nargs=3, default=(112, 136, 120))
    parser.add_argument("--batch", type=int, default=6)
    parser.add_argument("--base-channels", type=int, default=64, help="ResAttNet width (64: the paper's network)")
    parser.add_argument("--contender", action="append", choices=sorted(CONTENDERS), help="repeatable; default: all")
    parser.add_argument("--data", type=Path, default=None, help="folder for the synthetic volumes (default: a temp dir)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    steps = args.steps or (40 if cuda else 3)
    warmup = args.warmup if args.warmup is not None else (10 if cuda else 1)
    name = torch.cuda.get_device_name(device) if cuda else f"CPU ({torch.get_num_threads()} threads)"
    with tempfile.TemporaryDirectory(prefix="lh_adni_") as tmp:
        root = args.data or Path(tmp) / "synth"
        csv_path = root / "adni.csv"
        if not csv_path.is_file():
            volume = [round(s * 1.25) for s in args.shape]  # resampled to 1.5 mm, then padded or cropped
            write_adni_phantoms(root, subjects=args.subjects, shape=tuple(volume), seed=0)
        shape = tuple(args.shape)
        compute = compute_only(device, shape, args.batch, steps, warmup, args.base_channels)
        rows = []
        for contender in args.contender or list(CONTENDERS):
            e2e = end_to_end(csv_path, Path(tmp) / "cache", CONTENDERS[contender], "gpu" if cuda else "cpu", shape,
                             args.batch, steps, warmup, args.base_channels)
            rows.append((contender, e2e))
    print(f"\n3D-ResAttNet-18 (base {args.base_channels}), {'x'.join(map(str, shape))}, batch {args.batch}, SGD, on {name}; "
          f"{steps} timed steps after {warmup}; torch {torch.__version__}, Lightning {pl.__version__}\n")
    print("| contender | end-to-end samples/s | compute-only samples/s | ratio |")
    print("|---|---|---|---|")
    for contender, e2e in rows:
        print(f"| {contender} | {e2e:.2f} | {compute:.2f} | {e2e / compute:.2f} |")


if __name__ == "__main__":
    main()
