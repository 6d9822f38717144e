"""3D-ResAttNet cost per block (parameters, FLOPs, output shape) and CPU step time.

    python benchmarks/resattnet3d_cost.py --shape 96 112 96 --batch 6

FLOPs come from torch.utils.flop_counter (forward, one volume); the step time is forward +
backward + SGD step for a batch, the mean of --repeats after one warm-up, on this machine's CPU.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from lightning_hybrid.models import ResAttNet3D


def block_costs(net: torch.nn.Module, shape: tuple[int, int, int]) -> list[tuple[str, int, int, tuple[int, ...]]]:
    x = torch.zeros(1, 1, *shape)
    rows = []
    with torch.no_grad():
        for name, block in net.named_children():
            with FlopCounterMode(display=False) as counter:
                x = block(x)
            rows.append((name, sum(p.numel() for p in block.parameters()), counter.get_total_flops(), tuple(x.shape[1:])))
    return rows


def step_time(net: torch.nn.Module, shape: tuple[int, int, int], batch: int, repeats: int) -> float:
    optimizer = torch.optim.SGD(net.parameters(), lr=1e-4)
    x, y = torch.randn(batch, 1, *shape), torch.randint(0, 2, (batch,))
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
        if i:
            times.append(time.perf_counter() - start)
    return sum(times) / len(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=3, default=(96, 112, 96))
    parser.add_argument("--batch", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    shape = tuple(args.shape)
    for depth in (18, 34):
        net = ResAttNet3D(depth=depth)
        rows = block_costs(net, shape)
        total_params, total_flops = sum(r[1] for r in rows), sum(r[2] for r in rows)
        print(f"\n### 3D-ResAttNet-{depth}, input 1x{'x'.join(map(str, shape))}\n")
        print("| block | parameters | GFLOPs (forward) | output |\n|---|---|---|---|")
        for name, params, flops, out in rows:
            print(f"| {name} | {params:,} | {flops / 1e9:.2f} | {'x'.join(map(str, out))} |")
        print(f"| total | {total_params:,} | {total_flops / 1e9:.2f} | |")
        seconds = step_time(net, shape, args.batch, args.repeats)
        print(f"\nCPU training step (batch {args.batch}, forward + backward + SGD): {seconds:.2f} s")


if __name__ == "__main__":
    main()
