"""Delayed gradient averaging with AdamW against DDP's AdamW: progress a step where each rank's gradient is noisier
than its mean, at 2, 4 and 8 ranks.

A noisy quadratic, the standard model of a stochastic gradient (each of ``d`` coordinates: loss ``w^2 / 2``, the
rank's gradient ``w + sigma * noise``, independent between ranks, steps and coordinates), starting from ``w = 1``:
far from the optimum, where progress is limited by how long a step Adam dares. Adam's step is ``m / sqrt(v)``: DDP's
moments are those of the ranks' mean gradient, whose noise is ``sigma / sqrt(N)``; moments of a rank's own gradient
(delayed gradient averaging before 2026-11-29, ``rule="update"``, or local SGD's inner optimizer) see ``sigma``,
so its steps are about ``sqrt((1 + sigma^2 / N) / (1 + sigma^2))`` of DDP's. Real processes over gloo, one
invocation, every contender on the same seeds::

    python benchmarks/dga_adam.py                        # 2, 4 and 8 ranks, sigma 4, seeds 0-2
    python benchmarks/dga_adam.py --ranks 2 4 8 --sigma 4 16 --steps 300

Contenders (each rank's AdamW, lr 1e-3, weight decay 0.01): ``ddp`` (delay 0: the mean gradient every step),
``dga_d1``, ``dga_d2``, ``dga_d4`` (the moments of the average, every step taken again when the average arrives),
``own_moments_d1`` (the rule before: each rank's moments its own). Progress: the mean distance travelled towards the
optimum after the final sync point, per step; the table gives its median over the seeds, range, and ratio to DDP's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lightning_hybrid.comm.delayed_averaging import DelayedGradientAveraging  # noqa: E402

CONTENDERS = {"ddp": (0, None), "dga_d1": (1, None), "dga_d2": (2, None), "dga_d4": (4, None),
              "own_moments_d1": (1, "update")}
DIMENSIONS, LR = 4096, 1e-3


def progress(rank: int, world: int, delay: int, rule: str | None, sigma: float, steps: int, seed: int) -> float:
    """One contender's run on this rank: the mean distance from w = 1 towards 0 after the sync, per step."""
    w = torch.nn.Parameter(torch.ones(DIMENSIONS))
    optimizer = torch.optim.AdamW([w], lr=LR, weight_decay=0.01)
    dga = DelayedGradientAveraging(optimizer, delay, rule=rule)
    noise = torch.Generator().manual_seed(10_000 * seed + rank)
    for _ in range(steps):
        w.grad = w.detach() + sigma * torch.randn(DIMENSIONS, generator=noise)
        dga.exchange_gradients()
        dga.step()
    dga.sync()
    return float((1.0 - w.detach()).mean()) / steps


def worker(rank: int, world: int, port: int, settings: list[tuple], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = [progress(rank, world, *s) for s in settings]
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--sigma", type=float, nargs="+", default=[4.0], help="each rank's gradient noise (the mean is 1)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    args = parser.parse_args()
    print(f"AdamW lr {LR:g}, {DIMENSIONS} coordinates from 1 towards 0, {args.steps} steps, seeds {args.seeds}; "
          "progress a step after the final sync (x 1e-4), median [range], and its ratio to DDP's\n")
    print("| ranks | sigma | contender | progress / step | ratio to DDP | own moments' prediction |")
    print("|---|---|---|---|---|---|")
    for world in args.ranks:
        for sigma in args.sigma:
            settings = [(*CONTENDERS[c], sigma, args.steps, seed) for c in args.contenders for seed in args.seeds]
            with tempfile.TemporaryDirectory() as tmp:
                out = str(Path(tmp) / "results.pt")
                mp.start_processes(worker, args=(world, free_port(), settings, out), nprocs=world, start_method="spawn")
                results = torch.load(out)
            by = {c: results[i * len(args.seeds):(i + 1) * len(args.seeds)] for i, c in enumerate(args.contenders)}
            reference = statistics.median(by["ddp"]) if "ddp" in by else None
            predicted = ((1 + sigma**2 / world) / (1 + sigma**2)) ** 0.5
            for name, values in by.items():
                median = statistics.median(values)
                ratio = f"{median / reference:.2f}" if reference else "-"
                expect = f"{predicted:.2f}" if name.startswith("own_moments") else ""
                print(f"| {world} | {sigma:g} | {name} | {median * 1e4:.3f} [{min(values) * 1e4:.3f}, "
                      f"{max(values) * 1e4:.3f}] | {ratio} | {expect} |", flush=True)


if __name__ == "__main__":
    main()
