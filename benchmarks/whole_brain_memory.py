"""Each rank's memory when 3D-ResAttNet-34 trains on whole-brain volumes: data parallelism as a user would try
it first (DDP; with gradient accumulation; with activation checkpointing; both), fully sharded data parallelism
as a user with a model too large picks it (``strategy=fsdp2``: ZeRO-3, with and without checkpointing, with a
batch of one accumulated; ``fsdp2_shard_grad_op``: ZeRO-2) against the pipeline (2 and 4 stages, 1F1B and
GPipe), every contender at the same global batch, through the real command.

Each run trains two optimizer steps on synthetic ADNI volumes at the whole-brain view (2 mm: 80 x 104 x 88;
1.5 mm: 112 x 136 x 120), read from a disk cache in the training process (``data.cache.where=disk``,
``data.num_workers=0``: no volumes held in memory, no prefetched batches, which would come on top of
training's memory alike for every contender), and logs each rank's peak memory (``callbacks=[peak_memory]``; the pipeline logs
its own): the most it held above the interpreter and libraries, its model's parameters included (on CPUs
the resident set). Beside each peak, the estimate: the pipeline's plan for its stage, and for a rank
holding the whole model :func:`lightning_hybrid.placement.memory.training_memory` (what
``memory_budget=`` checks). ``--budget`` then runs each contender once more under ``memory_budget=``:
those over it are refused before training (the message is printed), the others train.

    python benchmarks/whole_brain_memory.py                                  # 2 mm, every contender
    python benchmarks/whole_brain_memory.py --view 1.5mm --contenders ddp pipe2_1f1b
    python benchmarks/whole_brain_memory.py --budget 1100MiB --contenders ddp_ckpt_accum pipe2_1f1b pipe4_1f1b
    python benchmarks/whole_brain_memory.py --budget "[500MiB,1200MiB]" --contenders fsdp_ckpt_accum pipe2_1f1b  # one a rank
    python benchmarks/whole_brain_memory.py --budget 1000MiB --contenders pipe2_1f1b_no_headroom pipe2_1f1b  # headroom

On CPUs the peak is the resident set's, and glibc keeps freed memory resident: its mmap threshold rises
with each large block freed (up to 32 MiB), after which tensors come from heaps that return little, so a
rank's resident peak exceeds what its tensors ever held at once, by up to 500 MiB here. The runs therefore
fix the threshold at 64 KiB (``MALLOC_MMAP_THRESHOLD_``, ``--malloc-mmap-threshold``): every tensor's
memory is mapped for it and given back when it is freed, and the resident peak is the tensors' peak, what
CUDA's ``max_memory_allocated`` counts on a GPU (the allocator's cache apart). ``--malloc-mmap-threshold
default`` measures with glibc's own behaviour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

VIEWS = {"2mm": (80, 104, 88), "1.5mm": (112, 136, 120)}
BATCH = 8  # the global batch of every contender
STEPS = 2  # optimizer steps: the second holds the optimizer's state beside the activations


def contenders(view: tuple[int, ...] = VIEWS["2mm"]) -> dict[str, tuple[int, list[str]]]:
    """name -> (ranks, overrides): DDP's 4 samples a rank, or 1 a step accumulated 4 times; the pipeline's
    whole batch in 8 micro-batches of one (planned at set-up for one sample of ``view``)."""
    def ddp(per_step: int, checkpointed: bool) -> tuple[int, list[str]]:
        return 2, ["strategy=ddp", "trainer.devices=2", f"data.batch_size={per_step}",
                   f"trainer.accumulate_grad_batches={BATCH // 2 // per_step}",
                   f"trainer.limit_train_batches={STEPS * BATCH // 2 // per_step}", f"model.checkpoint_blocks={str(checkpointed).lower()}"]

    def fsdp(per_step: int, checkpointed: bool, alias: str = "fsdp2") -> tuple[int, list[str]]:
        return 2, [f"strategy={alias}", *ddp(per_step, checkpointed)[1][1:]]

    def pipe(stages: int, schedule: str) -> tuple[int, list[str]]:
        return stages, ["strategy=hybrid", f"trainer.devices={stages}", f"strategy.pipeline_stages={stages}",
                        f"data.batch_size={BATCH}", f"strategy.micro_batches={BATCH}", f"strategy.schedule={schedule}",
                        "strategy.optimizer_slots=2", f"trainer.limit_train_batches={STEPS}", f"strategy.input_shape=[1,{','.join(map(str, view))}]",
                        *(["allow_cpu_oversubscription=true"] if stages > os.cpu_count() else [])]

    return {"ddp": ddp(4, False), "ddp_accum": ddp(1, False), "ddp_ckpt": ddp(4, True), "ddp_ckpt_accum": ddp(1, True),
            "fsdp": fsdp(4, False), "fsdp_ckpt": fsdp(4, True), "fsdp_ckpt_accum": fsdp(1, True),
            "fsdp_zero2": fsdp(4, False, "fsdp2_shard_grad_op"), "fsdp_zero2_ckpt": fsdp(4, True, "fsdp2_shard_grad_op"),
            "pipe2_1f1b": pipe(2, "1F1B"), "pipe2_gpipe": pipe(2, "GPipe"), "pipe4_1f1b": pipe(4, "1F1B"),
            # the fastest placement that fits, however full (no memory headroom): what a binding budget does to it
            "pipe2_1f1b_no_headroom": (2, [*pipe(2, "1F1B")[1], "strategy.placement_options.memory_headroom=0"]),
            "pipe4_gpipe": pipe(4, "GPipe")}


def common(view: tuple[int, ...], data_root: Path) -> list[str]:
    shape = ",".join(map(str, view))
    return ["data=adni_phantoms", "data.subjects=64", f"data.root={data_root}", f"data.view.image_shape=[{shape}]",
            f"data.volume_shape=[{shape}]", "data.augment.where=null", "data.cache.where=disk", "data.num_workers=0", "model=resattnet3d_34", "optimizer=adam_mri",
            "callbacks=[peak_memory]", "logger=csv", "trainer.enable_progress_bar=false", "trainer.num_sanity_val_steps=0",
            "trainer.limit_val_batches=0", "trainer.limit_test_batches=0", "trainer.max_epochs=1",
            "+trainer.enable_checkpointing=false", "test=false"]


def data_parallel_estimate(view: tuple[int, ...], overrides: list[str]) -> float:
    """MiB a rank of DDP (or of fully sharded data parallelism) needs for these overrides (what ``memory_budget``
    checks)."""
    from lightning_hybrid.models import ResAttNet3D
    from lightning_hybrid.placement.memory import training_memory

    settings = dict(o.split("=", 1) for o in overrides)
    sharded = settings["strategy"].startswith("fsdp2")
    need = training_memory(ResAttNet3D(depth=34), (1, *view), int(settings["data.batch_size"]), optimizer_slots=2,
                           checkpointed=settings["model.checkpoint_blocks"] == "true", shards=2 if sharded else 1,
                           reshard_after_forward=settings["strategy"] == "fsdp2")
    return need.total / 2**20


def run(name: str, overrides: list[str], run_dir: Path, env: dict[str, str]) -> dict:
    """One run through the command (kept: a rerun reads its results); its exit status, peaks and estimates."""
    result_file = run_dir / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "lightning_hybrid.cli", *overrides, f"hydra.run.dir={run_dir}"]
    print(f"[{name}] {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    metrics_file = run_dir / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() and proc.returncode == 0 else {}
    result = {
        "returncode": proc.returncode, "wall_s": time.perf_counter() - start,
        "peaks": [v for k, v in sorted(metrics.items()) if k.startswith("memory/rank") and k.endswith("_peak_MiB")],
        "estimates": [v for k, v in sorted(metrics.items()) if k.startswith("memory/rank") and k.endswith("_estimate_MiB")],
        "error": next((line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error: ")), None),
    }
    if proc.returncode != 0 and result["error"] is None:
        print((proc.stdout + proc.stderr)[-4000:], file=sys.stderr)
    result_file.write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--view", choices=list(VIEWS), default="2mm")
    parser.add_argument("--contenders", nargs="+", choices=list(contenders()), default=list(contenders()))
    parser.add_argument("--budget", default=None, help="memory_budget for a second run of each contender, e.g. 1100MiB")
    parser.add_argument("--malloc-mmap-threshold", default="65536",
                        help="MALLOC_MMAP_THRESHOLD_ (bytes) of the runs, or 'default' for glibc's dynamic threshold")
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/results/whole_brain_memory"))
    args = parser.parse_args()
    view = VIEWS[args.view]
    env = dict(os.environ)
    if args.malloc_mmap_threshold != "default":
        env["MALLOC_MMAP_THRESHOLD_"] = str(int(args.malloc_mmap_threshold))
    tag = args.view + (f"_mmap{args.malloc_mmap_threshold}" if args.malloc_mmap_threshold != "default" else "")
    base = common(view, args.workdir / f"data_{args.view}")
    print(f"3D-ResAttNet-34 at {'x'.join(map(str, view))} ({args.view}), global batch {BATCH}, {STEPS} steps, Adam")
    print("| contender | ranks | batch a step a rank | peak MiB per rank (estimate) | largest peak | vs DDP | estimate / peak |")
    print("|---|---|---|---|---|---|---|")
    table = contenders(view)
    ddp_peak = None
    for name in args.contenders:
        ranks, overrides = table[name]
        r = run(name, [*base, *overrides], args.workdir / tag / name, env)
        if r["returncode"] != 0:
            print(f"| {name} | {ranks} | | failed: {r['error'] or r['returncode']} | | | |", flush=True)
            continue
        estimates = r["estimates"] or [data_parallel_estimate(view, overrides)] * len(r["peaks"])
        ddp_peak = max(r["peaks"]) if name == "ddp" else ddp_peak
        per_step = dict(o.split("=", 1) for o in overrides)["data.batch_size"]
        if name.startswith("pipe"):
            per_step = f"{per_step} in {BATCH} micro-batches"
        ratios = [e / p for p, e in zip(r["peaks"], estimates)]
        versus = f"{max(r['peaks']) / ddp_peak:.2f}x" if ddp_peak else ""  # ddp among the contenders, run first
        print(f"| {name} | {ranks} | {per_step} | {', '.join(f'{p:.0f} ({e:.0f})' for p, e in zip(r['peaks'], estimates))} | "
              f"{max(r['peaks']):.0f} | {versus} | {min(ratios):.2f}-{max(ratios):.2f} |", flush=True)
    if args.budget is None:
        return
    print(f"\nUnder memory_budget={args.budget}:")
    for name in args.contenders:
        ranks, overrides = table[name]
        folder = f"{tag}_budget_{args.budget.strip('[]').replace(',', '_')}"  # a list ([500MiB,1200MiB]): one a rank
        r = run(name, [*base, *overrides, f"memory_budget={args.budget}"], args.workdir / folder / name, env)
        estimates = r["estimates"] or [data_parallel_estimate(view, overrides)] * len(r["peaks"])
        verdict = (f"trains: peaks (estimates) {', '.join(f'{p:.0f} ({e:.0f})' for p, e in zip(r['peaks'], estimates))} MiB"
                   if r["returncode"] == 0
                   else f"refused before training: {r['error']}")
        print(f"- {name}: {verdict}", flush=True)


if __name__ == "__main__":
    main()
