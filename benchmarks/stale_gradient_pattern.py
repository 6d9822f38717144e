"""What a persistent straggler's stale gradients cost per step, without processes or timing noise.

Replays, in one process with plain SGD, the updates SSPStrategy's server makes with 2 workers of
which one is 4x slower (delay synchronization, s = 3, one push per worker per step), and DDP's. Per
cycle of two steps, SSP's server gets: two gradients of the fast worker at the cycle's parameters (a
step), then one of the fast worker at the new parameters and one of the straggler, computed at the
cycle's parameters: one step stale (a step, then everyone syncs). DDP averages two fresh gradients
per step. Same initial weights, same batches in the same order, so the only difference is the
stale gradient (the control ``fresh``, the same pattern with that gradient computed at the current
parameters, reproduces DDP exactly). ``stale x0.5`` and ``stale x0`` weight the stale gradient less.

    python benchmarks/stale_gradient_pattern.py --data-root ../shared/data/mnist --seeds 0 1 2 3 4 5

Prints the test accuracy after every 100 steps, mean +- standard error over the seeds.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lightning_hybrid.data.idx import read_idx
from lightning_hybrid.data.mnist import find_mnist_folder, normalize_images
from lightning_hybrid.models import LeNet5

#: name -> weight of the straggler's gradient in the cycle's second step, and whether it is stale
PATTERNS = {"ddp": None, "fresh": (1.0, False), "stale": (1.0, True), "stale x0.5": (0.5, True), "stale x0": (0.0, True)}


def load(root: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    folder = find_mnist_folder(root)
    if folder is None:
        raise SystemExit(f"no MNIST files under {root}")
    images = normalize_images(read_idx(folder / f"{split}-images-idx3-ubyte.gz"))
    labels = torch.from_numpy(read_idx(folder / f"{split}-labels-idx1-ubyte.gz").astype(np.int64))
    return images, labels


def gradient(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    net.zero_grad()
    F.cross_entropy(net(x), y).backward()
    return [p.grad.clone() for p in net.parameters()]


def train(pattern: str, seed: int, data, test, steps: int, lr: float, momentum: float, batch: int = 64) -> list[float]:
    """Test accuracy after every 100 steps of ``pattern`` (see the module docstring)."""
    (x, y), (xt, yt) = data, test
    torch.manual_seed(seed)
    net = LeNet5()
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed + 100))
    batches = (order[i : i + batch] for i in range(0, len(order) - batch + 1, batch))

    def grad_at(model: torch.nn.Module) -> list[torch.Tensor]:
        idx = next(batches)
        return gradient(model, x[idx], y[idx])

    def step(grads: list[torch.Tensor]) -> None:
        for p, g in zip(net.parameters(), grads):
            p.grad = g
        optimizer.step()

    straggler = PATTERNS[pattern]
    accuracies, taken = [], 0
    while taken < steps:
        stale_at = copy.deepcopy(net) if straggler and straggler[1] else net  # what the straggler read at the sync
        for half in (0, 1):
            first = grad_at(net)
            if straggler is None or half == 0:
                second = grad_at(net)
                step([(a + b) / 2 for a, b in zip(first, second)])
            else:
                second = grad_at(stale_at)
                step([(a + straggler[0] * b) / 2 for a, b in zip(first, second)])
            taken += 1
            if taken % 100 == 0:
                with torch.no_grad():
                    accuracies.append((net(xt).argmax(1) == yt).float().mean().item())
    return accuracies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps (at most 468 with batch 2 x 64)")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    data, test = load(args.data_root, "train"), load(args.data_root, "t10k")
    curves = {p: [train(p, s, data, test, args.steps, args.lr, args.momentum) for s in args.seeds] for p in args.patterns}
    points = len(next(iter(curves.values()))[0])
    print(f"LeNet-5, MNIST, SGD lr {args.lr} momentum {args.momentum}, 2 x 64 samples per step, seeds {args.seeds}")
    print("test accuracy after each 100 steps, mean +- standard error over the seeds\n")
    print("| pattern | " + " | ".join(f"step {100 * (k + 1)}" for k in range(points)) + " |")
    print("|---|" + "---|" * points)
    for name, runs in curves.items():
        cells = []
        for k in range(points):
            values = [run[k] for run in runs]
            se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
            cells.append(f"{statistics.fmean(values):.4f} +- {se:.4f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
