"""The `lightning-hybrid` command: a Hydra app that composes model x data x strategy x trainer.

    lightning-hybrid                                   # LeNet-5 on MNIST, one process
    lightning-hybrid strategy=ddp trainer.devices=2    # two processes, synchronous DDP
    lightning-hybrid -m optimizer.lr=0.01,0.05,0.1     # a sweep, one run folder per job
    lightning-hybrid --help                            # every config group and option

It trains, tests, and reports the final metrics and where the run's outputs are (also written to
``metrics.json`` in the run folder). The configs are in the repository's ``configs/`` folder,
shipped inside the package as ``lightning_hybrid.configs``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import hydra
import pytorch_lightning as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from pytorch_lightning.accelerators import CPUAccelerator

from lightning_hybrid.classifier import ClassifierModule
from lightning_hybrid.callbacks import HeterogeneitySimulator

log = logging.getLogger("lightning_hybrid")


def _logical_workers(quota: Any) -> int:
    """``${logical_workers:QUOTA}`` in configs: cNeural's k = min(cores, memory / quota) on this machine."""
    from lightning_hybrid.data.shards import logical_workers
    from lightning_hybrid.devices import parse_size

    return logical_workers(parse_size(quota))


OmegaConf.register_new_resolver("logical_workers", _logical_workers, replace=True)

# Command-line flags of Hydra itself that select which config is composed (kept for child ranks).
_CONFIG_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd")


def build(cfg: DictConfig, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` with plain Python containers, never ListConfig/DictConfig: those
    would end up in checkpoints (hyperparameters, optimizer state) that then fail to load with
    ``torch.load(weights_only=True)``."""
    return instantiate(cfg, _convert_="all", **kwargs)


def build_strategy(cfg: DictConfig) -> Any:
    """A strategy object from a config with ``_target_``, or a registry alias from ``alias``."""
    if cfg.get("_target_"):
        return build(cfg)
    alias = cfg.get("alias")
    if not alias:
        raise ValueError(f"a strategy config needs `_target_` (a class) or `alias` (a registered name); got {dict(cfg)}")
    return alias


def build_callbacks(cfg: DictConfig) -> list[pl.Callback]:
    callbacks = [build(c) for c in (cfg.get("callbacks") or {}).values()]
    sim = build(cfg.sim)
    if sim.active:
        callbacks.append(sim)
    return callbacks


def build_module(cfg: DictConfig) -> ClassifierModule:
    scheduler = cfg.get("scheduler")
    return ClassifierModule(
        net=build(cfg.model),
        optimizer=build(cfg.optimizer),
        scheduler=None if scheduler is None else build(scheduler),
    )


def check_resources(cfg: DictConfig, trainer: pl.Trainer) -> None:
    """Refuse what this machine cannot run, before any process is started."""
    cores = os.cpu_count() or 1
    if isinstance(trainer.accelerator, CPUAccelerator) and trainer.num_devices > cores and not cfg.allow_cpu_oversubscription:
        raise ValueError(
            f"trainer.devices={trainer.num_devices} asks for {trainer.num_devices} CPU processes, but this machine has "
            f"{cores} CPU cores, so they would fight over the cores. Use trainer.devices={cores} or fewer, or add "
            "allow_cpu_oversubscription=true if you mean it (for example to test distributed code)."
        )
    for callback in trainer.callbacks:
        if isinstance(callback, HeterogeneitySimulator):
            callback.check_world_size(trainer.world_size)
            callback.check_strategy(trainer.strategy)


def spread_processes_over_gpus(cfg: DictConfig, gpus: int) -> None:
    """Refuse ``trainer=gpu`` on a machine without CUDA. ``trainer.devices=N`` on a machine with fewer GPUs:
    N processes on the ``gpus`` GPUs, when the
    strategy can run several processes on one device (``strategy.processes_per_device``); Lightning
    refuses more devices than GPUs otherwise. A count that does not divide evenly is refused."""
    devices, accelerator = cfg.trainer.get("devices"), str(cfg.trainer.get("accelerator", "auto"))
    if gpus < 1 and accelerator in ("gpu", "cuda"):
        raise ValueError(
            f"trainer.accelerator={accelerator} (trainer=gpu) but this machine has no CUDA device that torch "
            f"{torch.__version__} can use; set trainer=cpu (or trainer.accelerator=cpu), or install a CUDA build of torch"
        )
    if gpus < 1 or accelerator not in ("gpu", "cuda", "auto") or not isinstance(devices, int) or devices <= gpus:
        return
    if "processes_per_device" not in cfg.strategy:
        return  # Lightning's own error names the devices this machine has
    if devices % gpus:
        raise ValueError(
            f"trainer.devices={devices} processes cannot be spread evenly over this machine's {gpus} GPUs; use a "
            f"multiple of {gpus}, or set strategy.processes_per_device with trainer.devices<={gpus}"
        )
    with read_write(cfg), open_dict(cfg):
        cfg.trainer.devices = gpus
        cfg.strategy.processes_per_device = devices // gpus
    log.info("trainer.devices=%d on %d GPU(s): %d processes per GPU (strategy.processes_per_device=%d)",
             devices, gpus, devices // gpus, devices // gpus)


def set_cpu_threads(cfg: DictConfig, trainer: pl.Trainer) -> None:
    """Give each CPU process its share of the cores (``cpu_threads_per_process``; ``auto``: cores /
    processes on this machine), so that N processes do not run N x cores threads on the cores."""
    threads = cfg.get("cpu_threads_per_process", "auto")
    if threads in (None, "none") or not isinstance(trainer.accelerator, CPUAccelerator):
        return
    if threads == "auto":
        threads = max(1, (os.cpu_count() or 1) // max(1, trainer.num_devices))
    torch.set_num_threads(int(threads))


def _selected_config_flags(argv: list[str]) -> list[str]:
    """The ``--config-name``-style flags (with their values) from a command line."""
    kept: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in _CONFIG_FLAGS:
            kept += [arg, next(args, "")]
        elif arg.split("=", 1)[0] in _CONFIG_FLAGS:
            kept.append(arg)
    return kept


@contextmanager
def child_ranks_rerun_this_job() -> Iterator[None]:
    """Make Lightning's subprocess launcher start the other ranks on *this* job of a sweep.

    Lightning starts ranks 1..N-1 by rerunning ``sys.argv`` with ``hydra.run.dir`` set to the
    run directory. In a multirun, ``sys.argv`` holds the whole sweep (``-m lr=0.1,0.2``) and
    ``hydra.run.dir`` is not the job's folder, so each child would start a sweep of its own in the
    wrong place (lightning-hydra-template issue 393). For the duration of the job, ``sys.argv`` is
    replaced by this job's own overrides and the run directory by the job's output folder.
    """
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        yield
        return
    hydra_cfg = HydraConfig.get()
    saved_argv, saved_dir = sys.argv, hydra_cfg.run.dir
    sys.argv = [saved_argv[0], *_selected_config_flags(saved_argv[1:]), *hydra_cfg.overrides.task]
    with read_write(hydra_cfg.run):
        hydra_cfg.run.dir = hydra_cfg.runtime.output_dir
    try:
        yield
    finally:
        sys.argv = saved_argv
        with read_write(hydra_cfg.run):
            hydra_cfg.run.dir = saved_dir


@contextmanager
def job_scope() -> Iterator[None]:
    """Leave no process group or launcher environment behind for the next job of a sweep."""
    saved_env = dict(os.environ)
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved_env)


def final_metrics(trainer: pl.Trainer, prefix: str = "") -> dict[str, float]:
    """The trainer's callback metrics as floats, without the ``_step``/``_epoch`` copies of a metric."""
    metrics = trainer.callback_metrics
    return {
        name: float(value)
        for name, value in metrics.items()
        if name.startswith(prefix) and not (name.endswith(("_step", "_epoch")) and name.rsplit("_", 1)[0] in metrics)
    }


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit, then test, the configured run; return its final metrics (rank 0 also reports them)."""
    with job_scope():
        pl.seed_everything(cfg.seed, workers=True)
        spread_processes_over_gpus(cfg, torch.cuda.device_count() if torch.cuda.is_available() else 0)
        datamodule = build(cfg.data)
        module = build_module(cfg)
        loggers = [build(c) for c in (cfg.get("logger") or {}).values()]
        trainer: pl.Trainer = build(
            cfg.trainer, strategy=build_strategy(cfg.strategy), callbacks=build_callbacks(cfg), logger=loggers or False
        )
        check_resources(cfg, trainer)
        set_cpu_threads(cfg, trainer)
        for logger in trainer.loggers:
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        with child_ranks_rerun_this_job():
            metrics, best = {}, ""
            if cfg.get("fit", True):
                trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
                metrics = final_metrics(trainer)
                best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
            elif not cfg.get("test", True):
                raise ValueError("fit=false and test=false leave nothing to do")
            if cfg.get("test", True):
                # Without fitting, test the weights of ckpt_path (an inference-only strategy, e.g. partitioned_inference).
                ckpt = best or (None if cfg.get("fit", True) else cfg.get("ckpt_path"))
                trainer.test(module, datamodule=datamodule, ckpt_path=ckpt, verbose=False)
                metrics.update(final_metrics(trainer, prefix="test/"))
        if trainer.is_global_zero:
            report(metrics, Path(cfg.paths.output_dir), best)
        return metrics


def report(metrics: Mapping[str, float], output_dir: Path, best_checkpoint: str) -> None:
    """Log the final metrics and where the outputs are, and write them to ``metrics.json``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "metrics.json").write_text(json.dumps(dict(sorted(metrics.items())), indent=2) + "\n")
    width = max((len(name) for name in metrics), default=0)
    lines = [f"  {name:<{width}}  {value:.4f}" for name, value in sorted(metrics.items())]
    log.info("final metrics:\n%s", "\n".join(lines))
    if best_checkpoint:
        log.info("best checkpoint: %s", best_checkpoint)
    log.info("outputs: %s", output_dir)


@hydra.main(version_base="1.3", config_path="pkg://lightning_hybrid.configs", config_name="train")
def _hydra_train(cfg: DictConfig) -> float | None:
    metrics = train(cfg)
    # A sweeper (e.g. Optuna) optimizes the returned value.
    return metrics.get("test/acc", metrics.get("val/acc"))


def data_command(argv: list[str]) -> None:
    """``lightning-hybrid data synth-adni --out DIR --subjects N``: write synthetic data sets;
    ``lightning-hybrid data pack --root MNIST_DIR --out STORE``: MNIST as a shard store;
    ``lightning-hybrid data augment-mnist --root MNIST_DIR --out STORE --samples N``: MNIST's training
    digits expanded with elastic and affine distortions to N samples, as a shard store (cNeural)."""
    import argparse

    from lightning_hybrid.data.synth_adni import write_synthetic_adni

    parser = argparse.ArgumentParser(prog="lightning-hybrid data", description="Write data sets.")
    commands = parser.add_subparsers(dest="command", required=True)
    synth = commands.add_parser("synth-adni", help="synthetic ADNI-like NIfTI volumes and their CSV")
    synth.add_argument("--out", required=True, help="folder to write images/ and adni.csv into")
    synth.add_argument("--subjects", type=int, default=40)
    synth.add_argument("--shape", type=int, nargs=3, default=(64, 76, 64), metavar=("D", "H", "W"))
    synth.add_argument("--seed", type=int, default=0)
    pack = commands.add_parser("pack", help="MNIST's IDX files as a shard store (a folder or an fsspec URL)")
    pack.add_argument("--root", required=True, help="folder with MNIST's four .gz files")
    pack.add_argument("--out", required=True, help="store folder or URL (s3://..., hdfs://..., memory://...)")
    pack.add_argument("--split", choices=("train", "test"), default="train")
    pack.add_argument("--shard-size", type=int, default=10000, help="samples per shard")
    augment = commands.add_parser("augment-mnist", help="MNIST's training digits expanded with elastic and affine "
                                  "distortions, as a shard store (cNeural's 0.5M-2M samples)")
    augment.add_argument("--root", required=True, help="folder with MNIST's four .gz files")
    augment.add_argument("--out", required=True, help="store folder or URL (s3://..., hdfs://..., memory://...)")
    augment.add_argument("--samples", type=int, default=500_000, help="samples to write in all (default 500000)")
    augment.add_argument("--shard-size", type=int, default=50_000, help="samples per shard (default 50000)")
    augment.add_argument("--seed", type=int, default=0, help="seed of the order and of every distortion")
    augment.add_argument("--include-originals", action=argparse.BooleanOptionalAction, default=True,
                         help="write the 60,000 undistorted digits first (default: yes)")
    for command in (pack, augment):
        command.add_argument("--no-verify-md5", dest="verify_md5", action="store_false",
                             help="skip the md5 check of the files (for other data sets in MNIST's format)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def read_mnist(split: str):
        from lightning_hybrid.data.idx import read_idx
        from lightning_hybrid.data.mnist import MNIST_FILES, find_mnist_folder

        folder = find_mnist_folder(args.root)
        if folder is None:
            raise SystemExit(f"{args.root} does not hold MNIST's four files ({', '.join(MNIST_FILES)})")
        prefix = "train" if split == "train" else "t10k"
        return tuple(read_idx(folder / n, MNIST_FILES[n] if args.verify_md5 else None)
                     for n in (f"{prefix}-images-idx3-ubyte.gz", f"{prefix}-labels-idx1-ubyte.gz"))

    if args.command == "pack":
        from lightning_hybrid.data.shards import pack as pack_store

        images, labels = read_mnist(args.split)
        store = pack_store(images[:, None], labels.astype("int64"), args.out, args.shard_size)
        log.info("%d samples in %d shards: %s", store.num_samples, store.num_shards, args.out)
        return
    if args.command == "augment-mnist":
        import time

        from lightning_hybrid.data.augment import augment_mnist

        if args.samples < 1 or args.shard_size < 1:
            raise SystemExit(f"--samples and --shard-size must be >= 1, got {args.samples} and {args.shard_size}")
        images, labels = read_mnist("train")
        start = time.perf_counter()
        store = augment_mnist(images, labels, args.samples, args.out, shard_size=args.shard_size, seed=args.seed,
                              include_originals=args.include_originals)
        elapsed = time.perf_counter() - start
        log.info("%d samples in %d shards in %.1f s (%.0f samples/s): %s", store.num_samples, store.num_shards,
                 elapsed, store.num_samples / max(elapsed, 1e-9), args.out)
        return
    csv_path = write_synthetic_adni(args.out, subjects=args.subjects, shape=tuple(args.shape), seed=args.seed)
    log.info("CSV: %s", csv_path)


def explain_command(argv: list[str]) -> None:
    from lightning_hybrid.explain import explain_command as run

    run(argv)


def plan_command(argv: list[str]) -> None:
    from lightning_hybrid.placement.command import plan_command as run

    run(argv)


#: ``lightning-hybrid <name> ...`` runs these instead of training.
SUBCOMMANDS = {"data": data_command, "explain": explain_command, "plan": plan_command}


def main() -> None:
    """Console entry point of ``lightning-hybrid``: a subcommand, or training (Hydra overrides)."""
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        SUBCOMMANDS[sys.argv[1]](sys.argv[2:])
        return
    _hydra_train()


if __name__ == "__main__":
    main()
