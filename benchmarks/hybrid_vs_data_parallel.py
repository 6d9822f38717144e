"""The hybrid pipeline against what users would pick instead, on the same heterogeneous CPU ranks.

3D-ResAttNet-18 (33.6 M parameters) on synthetic ADNI volumes at a CPU resolution, through the real
CLI, contenders one after another (never sharing the cores), each scenario's global batch the same:

* ``ddp``: Lightning's DDP, the batch split evenly over the ranks;
* ``ddp_ckpt``: DDP with every block's activations recomputed in backward (``model.checkpoint_blocks=true``),
  what a user short of memory tries first;
* ``balanced``: balanced data parallelism (shares in proportion to the measured speeds);
* ``fsdp``: fully sharded data parallelism (``strategy=fsdp2``: torch's ``fully_shard`` over the blocks, ZeRO-3),
  what a user with a model too large picks today; ``fsdp_zero2``: its faster form, the parameters kept
  gathered from forward to backward (``strategy=fsdp2_shard_grad_op``, ZeRO-2);
* ``hybrid``: the pipeline at its defaults (2 stages a replica, ``ranks / 2`` replicas, GABRA on the probed
  speeds, the blocks' measured times, its default micro-batches), as a user first types it;
* ``hybrid_m<M>``: the pipeline, one stage per rank, placed by GABRA on the probed speeds, the global
  batch in ``M`` micro-batches (``--micro-batches``: each count a contender, so the best is measured,
  not guessed; a 1F1B pipeline needs at least as many as its stages); ``hybrid_..._timed``: the same, placed
  on its blocks' measured times instead of their FLOPs (``strategy.placement_options.block_cost=time``);
* ``hybrid_2x2_m<M>`` (4 ranks): 2 replicas of a 2-stage pipeline (pipeline x data parallelism), each
  replica half the global batch in ``M`` micro-batches; a replica is ranks 0-1 or 2-3, so the scenario
  of speeds [1, 1, 2, 2] slows ranks 0 and 2 (each replica a slow and a fast rank, as a user would pair
  them; DDP and balanced data parallelism do not care which ranks are slow).

Scenarios: ``equal`` (2 ranks), ``equal_tcp`` (the same inside a network namespace of its own, unshaped:
every byte between the ranks crosses TCP with an Ethernet MTU, as between two hosts; needs root),
``speeds_1_2`` (2 ranks, rank 0 simulated 2x slower in its compute), ``speeds_1_1_2_2`` (4 ranks, ranks 0
and 2 2x slower, by sleeping), ``speeds_1_1_2_2_shares`` (the same speeds as CPU time: a quarter and half a
core a rank, :class:`~lightning_hybrid.sim.cpu_share.CpuShare`; a sleeping rank lends its core to ranks
sharing it, so on 2 cores the sleeping scenario rewards ranks that take turns; needs root), ``contention`` (2 ranks each pinned to a core, one competing process on rank 1's core:
real CPU contention, about 2x). Each run trains ``--epochs`` epochs; the table gives the last epoch's
seconds and training samples per second, each contender's speed-up over DDP, for the pipeline its bound: the
share of DDP's throughput its bubble and the ranks' speeds allow (M/(M+S-1), S stages, M micro-batches, times
the ranks' summed speed over DDP's, ranks x the slowest; :func:`pipeline_bound`), each rank's peak memory above its start (``callbacks=[...,peak_memory]``; the hybrid strategy logs
its own beside its plan's estimate) and, for the pipeline, where each stage's training step went (ms
computing / waiting for a neighbour / finishing its sends, the strategy's ``pipeline/rank<r>_*_ms``).
Every run writes a checkpoint each epoch (Lightning's default), so the peaks include it: the hybrid
strategy's rank 0 gathers the whole model and optimizer state into its memory for it. The budget run
writes none: its peaks are training's.

``--budget MiB`` adds the model that does not fit: every rank may hold that much. The cost model
(FLOPs and bytes per block on the meta device, :func:`~lightning_hybrid.placement.profile_blocks`)
gives DDP's need per rank (the whole model: parameters, gradients, momentum, one batch's
activations), and the hybrid pipeline trains on 4 ranks with the budget as each device's memory.

    python benchmarks/hybrid_vs_data_parallel.py                        # every scenario
    python benchmarks/hybrid_vs_data_parallel.py --scenario speeds_1_2 --epochs 2 --budget 300
    python benchmarks/hybrid_vs_data_parallel.py --scenario equal --micro-batches 2 4 8
    python benchmarks/hybrid_vs_data_parallel.py --micro-batch-cost    # a sample's cost per batch size, a block's FLOP/s
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from epoch_time import epoch_times

SIZE = 48  # voxels per side: ResAttNet-18 at a CPU resolution
BATCH = 8  # the global batch of every contender
DATA = ["data=adni_phantoms", "data.subjects=64", f"data.view.image_shape=[{SIZE},{SIZE},{SIZE}]",
        f"data.volume_shape=[{SIZE},{SIZE},{SIZE}]", "data.augment.where=null", "model=resattnet3d_18",
        "optimizer=adam_mri", "callbacks=[epoch_timer,peak_memory]", "logger=csv", "trainer.enable_progress_bar=false",
        "trainer.num_sanity_val_steps=0", "trainer.limit_val_batches=0", "trainer.limit_test_batches=0"]
#: name -> (ranks, overrides, the cores a competing process runs on, inside an unshaped network namespace,
#: the ranks' simulated speeds (None: real contention, not known beforehand))
SCENARIOS = {
    "equal": (2, [], None, False, (1, 1)),
    "equal_tcp": (2, [], None, True, (1, 1)),
    "speeds_1_2": (2, ["sim.slowdown=[2.0,1.0]"], None, False, (1, 2)),
    "speeds_1_1_2_2": (4, ["sim.slowdown=[2.0,1.0,2.0,1.0]", "allow_cpu_oversubscription=true"], None, False, (1, 2, 1, 2)),
    "speeds_1_1_2_2_shares": (4, ["sim.cpu_share=[0.25,0.5,0.25,0.5]", "allow_cpu_oversubscription=true"], None, False,
                              (1, 2, 1, 2)),
    "contention": (2, ["sim.affinity=[[0],[1]]"], [1], False, None),
}


def contenders(ranks: int, micro_batches: list[int]) -> dict[str, list[str]]:
    per_rank = f"data.batch_size={BATCH // ranks}"
    pipelines = {
        f"hybrid_m{m}": ["strategy=hybrid", f"trainer.devices={ranks}", f"strategy.pipeline_stages={ranks}",
                         f"data.batch_size={BATCH}", f"strategy.micro_batches={m}", "strategy.optimizer_slots=2",
                         f"strategy.input_shape=[1,{SIZE},{SIZE},{SIZE}]"]
        for m in micro_batches if ranks <= m <= BATCH  # 1F1B: at least a micro-batch per stage
    }
    if ranks == 4:  # 2 replicas of a 2-stage pipeline, each half the global batch
        pipelines.update({
            f"hybrid_2x2_m{m}": ["strategy=hybrid", "trainer.devices=4", "strategy.pipeline_stages=2", "strategy.data_parallel=2",
                                 f"data.batch_size={BATCH // 2}", f"strategy.micro_batches={m}", "strategy.optimizer_slots=2",
                                 f"strategy.input_shape=[1,{SIZE},{SIZE},{SIZE}]"]
            for m in micro_batches if 2 <= m <= BATCH // 2
        })
    # each pipeline placed on its blocks' measured times instead of their FLOPs
    pipelines.update({f"{name}_timed": [*overrides, "strategy.placement_options.block_cost=time"]
                      for name, overrides in list(pipelines.items())})
    replicas = ranks // 2
    return {
        "ddp": ["strategy=ddp", f"trainer.devices={ranks}", per_rank],
        "ddp_ckpt": ["strategy=ddp", f"trainer.devices={ranks}", per_rank, "model.checkpoint_blocks=true"],
        "balanced": ["strategy=balanced", f"trainer.devices={ranks}", per_rank],
        "fsdp": ["strategy=fsdp2", f"trainer.devices={ranks}", per_rank],
        "fsdp_zero2": ["strategy=fsdp2_shard_grad_op", f"trainer.devices={ranks}", per_rank],
        # the pipeline as a user first types it: 2 stages (the default) a replica, everything else at its default
        # but the optimizer's two state tensors a parameter (Adam), which only its memory plan reads
        "hybrid": ["strategy=hybrid", f"trainer.devices={ranks}", f"strategy.data_parallel={replicas}",
                   f"data.batch_size={BATCH // replicas}", "strategy.optimizer_slots=2"],
        **pipelines,
    }


def run(name: str, overrides: list[str], run_dir: Path, competitor_cores: list[int] | None, tcp: bool = False) -> dict:
    if not (run_dir / "metrics.json").is_file():
        from lightning_hybrid.sim import Competitor
        from lightning_hybrid.sim.link import ShapedLink

        cmd = [sys.executable, "-m", "lightning_hybrid.cli", *overrides, f"hydra.run.dir={run_dir.resolve()}"]
        print(f"[{name}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        with ExitStack() as stack:
            if competitor_cores:
                stack.enter_context(Competitor(competitor_cores, 1, duty=1.0))
            if tcp:
                cmd = stack.enter_context(ShapedLink(None)).wrap(cmd)
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        (run_dir / "wall_s.txt").write_text(f"{time.perf_counter() - start:.1f}\n")
    metrics = json.loads((run_dir / "metrics.json").read_text())
    peaks = [v for k, v in sorted(metrics.items()) if k.startswith("memory/rank") and k.endswith("_peak_MiB")]
    estimates = [v for k, v in sorted(metrics.items()) if k.startswith("memory/rank") and k.endswith("_estimate_MiB")]
    epoch_s = epoch_times(run_dir)[-1]
    scans = re.search(r"(\d+)/\d+/\d+ scans \(train/val/test\)", (run_dir / "cli.log").read_text())
    stages = sorted({int(k.split("_")[0].removeprefix("pipeline/rank")) for k in metrics if k.startswith("pipeline/rank")})
    stage_ms = [tuple(metrics[f"pipeline/rank{r}_{part}_ms"] for part in ("compute", "wait", "send")) for r in stages]
    # every contender drops the training set's last partial batch (the ADNI datamodule's drop_last_train; DDP's
    # per-rank batches of the padded split): the samples trained an epoch are whole global batches
    trained = int(scans.group(1)) // BATCH * BATCH if scans else float("nan")
    return {"epoch_s": epoch_s, "samples_per_s": trained / epoch_s,
            "peaks": peaks, "estimates": estimates, "stage_ms": stage_ms}


def row(runs: list[dict], results: dict[str, list[dict]], speeds: tuple[float, ...] | None, ranks: int, name: str) -> str:
    """A contender's cells: the median epoch over its repetitions (and their range), its speed-up over DDP's and
    FSDP's medians, its bound, and its first run's peaks and stage times."""
    epoch = statistics.median(r["epoch_s"] for r in runs)
    spread = f" ({min(r['epoch_s'] for r in runs):.1f}-{max(r['epoch_s'] for r in runs):.1f})" if len(runs) > 1 else ""
    versus = [f"{statistics.median(r['epoch_s'] for r in results[other]) / epoch:.2f}x" if other in results else ""
              for other in ("ddp", "fsdp")]
    share = pipeline_bound(name, speeds, ranks)
    first = runs[0]
    memory = ", ".join(f"{p:.0f}" + (f" ({first['estimates'][i]:.0f})" if i < len(first["estimates"]) else "")
                       for i, p in enumerate(first["peaks"]))
    stages = "; ".join(f"{c:.0f} / {w:.0f} / {s:.0f}" for c, w, s in first["stage_ms"])
    return (f"{epoch:.1f}{spread} | {statistics.median(r['samples_per_s'] for r in runs):.2f} | {' | '.join(versus)} | "
            f"{f'{share:.2f}x' if share else ''} | {memory} | {stages} |")


def pipeline_bound(name: str, speeds: tuple[float, ...] | None, ranks: int) -> float | None:
    """The most of DDP's throughput a pipeline contender can reach if nothing but its bubble and the ranks'
    speeds cost: M/(M+S-1) (S stages, M micro-batches) times the ranks' summed speed over DDP's, which moves at
    its slowest rank's (ranks x the slowest); each sample costing the same in any micro-batch."""
    if not name.startswith("hybrid_"):
        return None
    stages = 2 if name.startswith("hybrid_2x2_") else ranks
    m = int(name.removesuffix("_timed").rsplit("_m", 1)[1])
    capacity = sum(speeds) / (len(speeds) * min(speeds)) if speeds else 1.0
    return m / (m + stages - 1) * capacity


def micro_batch_cost(batches: tuple[int, ...] = (1, 2, 4, 8), repeats: int = 3) -> str:
    """ResAttNet-18's forward and backward at 48^3 on one thread (a rank's share of these cores), per batch
    size: the cost of a sample as micro-batches shrink (the bubble bound assumes it does not change)."""
    import torch

    from lightning_hybrid.models import ResAttNet3D

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = ResAttNet3D(depth=18)
    step = {}
    for b in batches:
        x = torch.randn(b, 1, SIZE, SIZE, SIZE)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            net(x).sum().backward()
            times.append(time.perf_counter() - start)
        step[b] = min(times)
    reference = step[4] / 4 if 4 in step else None
    rows = ["| batch | ms a step | ms a sample | a sample vs at batch 4 |", "|---|---|---|---|"]
    rows += [f"| {b} | {1000 * t:.0f} | {1000 * t / b:.0f} | {f'{t / b / reference:.2f}x' if reference else ''} |"
             for b, t in step.items()]
    return "\n".join(rows)


def block_rates(batch: int = 2) -> str:
    """Each block of ResAttNet-18 at 48^3 timed on one thread (a micro-batch of ``batch``) beside its counted
    FLOPs: the FLOP/s it runs at, which a placement by FLOPs takes to be the same for every block."""
    import torch

    from lightning_hybrid.models import ResAttNet3D
    from lightning_hybrid.placement import profile_blocks

    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = profile_blocks(ResAttNet3D(depth=18), torch.randn(batch, 1, SIZE, SIZE, SIZE), measure_time=True, repeats=2)
    rows = ["| block | GFLOP | ms | GFLOP/s | parameters (M) |", "|---|---|---|---|---|"]
    rows += [f"| {b.name} | {b.cost / 1e9:.2f} | {1000 * b.time:.1f} | {b.cost / b.time / 1e9:.1f} | {b.params / 1e6:.2f} |"
             for b in blocks]
    return "\n".join(rows)


def budget_check(budget_mib: float) -> str:
    """DDP's need per rank from the cost model, against the budget."""
    import torch

    from lightning_hybrid.models import ResAttNet3D
    from lightning_hybrid.pipeline.materialize import meta_copy
    from lightning_hybrid.placement import profile_blocks

    net = meta_copy(ResAttNet3D(depth=18))
    blocks = profile_blocks(net, torch.empty(BATCH, 1, SIZE, SIZE, SIZE, device="meta"), optimizer_slots=2)
    need = (sum(b.memory for b in blocks) + max(b.workspace for b in blocks)) / 2**20
    verdict = "refused" if need > budget_mib else "fits"
    return f"DDP needs {need:.0f} MiB a rank (the whole model, Adam, a batch of {BATCH}): {verdict} by a {budget_mib:.0f} MiB budget"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="repeatable; default: all")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each contender (the table gives medians and ranges)")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[4, 8], help="the pipeline's micro-batch counts")
    parser.add_argument("--contenders", nargs="+", default=None, help="only these (ddp always runs: the reference)")
    parser.add_argument("--micro-batch-cost", action="store_true", help="only the cost of a sample per batch size, "
                        "and each block's FLOP/s")
    parser.add_argument("--budget", type=float, default=None, help="MiB a rank may hold: the model that does not fit")
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/results/hybrid_vs_data_parallel_runs"))
    args = parser.parse_args()
    if args.micro_batch_cost:
        print(micro_batch_cost())
        print()
        print(block_rates())
        return
    DATA.append(f"data.root={args.workdir / 'data'}")  # written once, for these settings
    rows = ["| scenario | contender | s/epoch (range) | samples/s | vs DDP | vs FSDP | bound | peak MiB per rank (plan's "
            "estimate) | ms a step per stage: compute / wait / send |", "|---|---|---|---|---|---|---|---|---|"]
    for scenario in args.scenario or list(SCENARIOS):
        ranks, sim, competitor, tcp, speeds = SCENARIOS[scenario]
        results = {}
        for repeat in range(args.repeats):  # contenders one after another, then again: a slow spell hits them alike
            for name, overrides in contenders(ranks, args.micro_batches).items():
                if args.contenders and name != "ddp" and name not in args.contenders:
                    continue
                folder = name if repeat == 0 else f"{name}_r{repeat}"
                results.setdefault(name, []).append(
                    run(f"{scenario}/{folder}", [*DATA, *sim, *overrides, f"trainer.max_epochs={args.epochs}"],
                        args.workdir / scenario / folder, competitor, tcp))
        for name, runs in results.items():
            rows.append(f"| {scenario} | {name} | {row(runs, results, speeds, ranks, name)}")
        print("\n".join(rows[-len(results):]), flush=True)
    if args.budget is not None:
        print(budget_check(args.budget))
        device = f"{{speed:1.0,memory:{args.budget:.0f}MiB}}"
        r = run("budget/hybrid", [*DATA, *contenders(4, [4])["hybrid_m4"], f"strategy.devices=[{','.join([device] * 4)}]",
                                  "allow_cpu_oversubscription=true", "+trainer.enable_checkpointing=false",
                                  f"trainer.max_epochs={args.epochs}"], args.workdir / "budget" / "hybrid", None)
        rows.append(f"| budget {args.budget:.0f} MiB, 4 ranks | hybrid | {r['epoch_s']:.1f} | {r['samples_per_s']:.2f} | "
                    f"DDP refused | | | {', '.join(f'{p:.0f} ({e:.0f})' for p, e in zip(r['peaks'], r['estimates']))} | |")
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
