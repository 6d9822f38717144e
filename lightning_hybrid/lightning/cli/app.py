# Generated from lightning_hybrid/cli/app.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The training app of `lightning-hybrid`: a run composed of model x data x strategy x trainer.

    lightning-hybrid                                   # LeNet-5 on MNIST, one process
    lightning-hybrid strategy=ddp trainer.devices=2    # two processes, synchronous DDP
    lightning-hybrid -m optimizer.lr=0.01,0.05,0.1     # a sweep, one run folder per job
    lightning-hybrid --help                            # every config group and option

It trains, tests, and reports the final metrics and where the run's outputs are (also written to
``metrics.json`` in the run folder). The configs are in the repository's ``configs/`` folder,
shipped inside the package as ``lightning_hybrid.configs``. Here: :func:`train` and what it builds
from the config (model, data, strategy, callbacks), the checks of this machine's resources, CPU
threads and processes per GPU, the report of the final metrics, and the ``${logical_workers:...}``
config resolver. Hydra's decorator around :func:`train` is in ``lightning_hybrid/cli/__init__.py``
(Hydra names the job, and its log file ``cli.log``, after the module that holds it).
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

import lightning.pytorch as pl
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_hybrid.lightning import namespace
from lightning_hybrid.lightning.classifier import ClassifierModule
from lightning_hybrid.lightning.callbacks import ContinueCSVLog, HeterogeneitySimulator, MemoryBudget, ProgressLog, TransferWeights
from lightning_hybrid.cli.checks import check_checkpoint_readable, check_model_fits_data, check_optimizer
from lightning_hybrid.deprecation import warn_renamed_options
from lightning_hybrid.cli.relaunch import child_ranks_rerun_this_job, in_multirun
from lightning_hybrid.cli.resume import compared_config, record_end, record_start, resolve_ckpt_path
from lightning_hybrid.lightning.cli.slurm import submitit_task_as_rank, task_threads  # also registers ${lh_slurm:...}
from lightning_hybrid.lightning.preemption import Preemption, Stop
from lightning_hybrid.lightning.strategies.checkpoint_io import AtomicCheckpointIO
from lightning_hybrid.strategies.capabilities import capabilities_of
from lightning_hybrid.transfer import transfer_checkpoint
from lightning_hybrid.lightning.watchdog import StallWatchdog

log = logging.getLogger("lightning_hybrid")


def _logical_workers(quota: Any) -> int:
    """``${logical_workers:QUOTA}`` in configs: cNeural's k = min(cores, memory / quota) on this machine."""
    from lightning_hybrid.data.shards import logical_workers
    from lightning_hybrid.devices import parse_size

    return logical_workers(parse_size(quota))


OmegaConf.register_new_resolver("logical_workers", _logical_workers, replace=True)


def build(cfg: DictConfig, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` with plain Python containers, never ListConfig/DictConfig: those
    would end up in checkpoints (hyperparameters, optimizer state) that then fail to load with
    ``torch.load(weights_only=True)``. In the ``lightning`` flavour (the command where only ``lightning`` is
    installed), the configs' targets name its classes (``lightning.pytorch.*``, ``lightning_hybrid.lightning.*``)."""
    if __name__.startswith(namespace.MIRROR) and isinstance(cfg, DictConfig):
        with read_write(cfg), open_dict(cfg):
            _translate_targets(cfg)
    return instantiate(cfg, _convert_="all", **kwargs)


def _translate_targets(node: Any) -> None:
    if isinstance(node, DictConfig):
        for key in node:
            if key == "_target_" and isinstance(node[key], str):
                node[key] = namespace.lightning_name(node[key])
            else:
                _translate_targets(node._get_node(key))
    elif isinstance(node, ListConfig):
        for item in node:
            _translate_targets(item)


def build_strategy(cfg: DictConfig) -> Any:
    """A strategy object from a config with ``_target_``, or a registry alias from ``alias``."""
    if cfg.get("_target_"):
        return build(cfg)
    alias = cfg.get("alias")
    if not alias:
        raise ValueError(f"a strategy config needs `_target_` (a class) or `alias` (a registered name); got {dict(cfg)}")
    return alias


def resolve_fork_ranks(cfg: DictConfig) -> None:
    """``strategy.fork_ranks: auto`` (the suite's strategies' default on the command line) forks the other ranks
    of this machine at fit, sparing each a second import of torch and Lightning (about 6 s of CPU a rank),
    where the ranks run on the CPU (the strategy decides: a forked process cannot use a CUDA context). In a
    sweep it is ``false``: a sweep's ranks must rerun only their own job."""
    if cfg.strategy.get("fork_ranks") == "auto" and in_multirun():
        with read_write(cfg), open_dict(cfg.strategy):
            cfg.strategy.fork_ranks = False


def progress_as_lines(cfg: DictConfig, stream: Any = None) -> bool:
    """Whether training progress is logged as occasional lines instead of a progress bar."""
    mode = cfg.get("progress", "auto")
    if mode not in ("auto", "bar", "log"):
        raise ValueError(f"progress={mode!r}: choose progress=auto, progress=bar or progress=log")
    if not cfg.trainer.get("enable_progress_bar", True):
        return False
    stream = stream if stream is not None else sys.stderr
    return mode == "log" or (mode == "auto" and not stream.isatty())


#: What ``monitor: auto`` means for a datamodule that does not say (``datamodule.monitor``).
DEFAULT_MONITOR = ("val/acc", "max")


def build_callbacks(cfg: DictConfig, datamodule: Any = None) -> list[pl.Callback]:
    """The configured callbacks; ``monitor: auto`` becomes the datamodule's metric (``datamodule.monitor``:
    ADNI's ``val/bacc``), or ``val/acc``; ``mode: auto`` its direction (a loss: min, anything else: max)."""
    monitor, mode = getattr(datamodule, "monitor", DEFAULT_MONITOR)
    callbacks = []
    for c in (cfg.get("callbacks") or {}).values():
        chosen = {}
        if c.get("monitor") == "auto":
            chosen["monitor"] = monitor
        if c.get("mode") == "auto":
            named = chosen.get("monitor", c.get("monitor"))
            chosen["mode"] = mode if named == monitor else "min" if "loss" in str(named) else "max"
        callbacks.append(build(c, **chosen))
    sim = build(cfg.sim)
    if sim.active:
        callbacks.append(sim)
    if progress_as_lines(cfg):
        callbacks.append(ProgressLog(every_s=float(cfg.get("progress_every_s", 30))))
    if cfg.get("watchdog_s") is not None:
        callbacks.append(StallWatchdog(timeout_s=float(cfg.watchdog_s), setting=f"watchdog_s={cfg.watchdog_s}"))
    if cfg.get("transfer_path"):
        callbacks.append(TransferWeights(str(transfer_checkpoint(cfg.transfer_path))))  # a bad path fails here
    if cfg.get("memory_budget") is not None:
        callbacks.append(MemoryBudget(cfg.memory_budget))
    callbacks.append(ContinueCSVLog())
    return callbacks


def chosen(group: str) -> str:
    """The option of a config group the command chose (``model`` -> ``lenet5``), for messages."""
    return str(HydraConfig.get().runtime.choices.get(group, group)) if HydraConfig.initialized() else group


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


def warn_cpu_bf16_conv3d(trainer: pl.Trainer, module: torch.nn.Module) -> None:
    """bf16 on CPU with 3D convolutions: torch's oneDNN kernels give wrong Conv3d weight gradients on small
    feature maps (measured with torch 2.13: 1e35 where fp32 gives 17 at 2 x 2 x 2 voxels), so training
    turns to NaN. Say so before it happens; fp32 (trainer.precision=32-true) is right on CPU."""
    if (isinstance(trainer.accelerator, CPUAccelerator) and "bf16" in str(trainer.precision)
            and any(isinstance(m, torch.nn.Conv3d) for m in module.modules())):
        log.warning("trainer.precision=%s on CPU with a 3D convolutional model: torch's CPU bf16 Conv3d gradients are "
                    "wrong on small feature maps and training may turn to NaN; use trainer.precision=32-true on CPU "
                    "(bf16 is for GPUs)", trainer.precision)


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
    if threads == "auto" and (in_task := task_threads(cfg, trainer.global_rank)) is not None:
        # A SLURM task: its --cpus-per-task, kept (OMP_NUM_THREADS) when Lightning's launcher would
        # divide them by trainer.devices.
        os.environ["OMP_NUM_THREADS"] = str(in_task)
        threads = in_task
    elif threads == "auto":
        threads = max(1, (os.cpu_count() or 1) // max(1, trainer.num_devices))
    torch.set_num_threads(int(threads))


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
        submitit_task_as_rank()  # a task of hydra/launcher=slurm_local: one rank, as under SLURM
        ckpt_path = resolve_ckpt_path(cfg)  # first: resuming an interrupted run writes on in its folder
        # The run's record holds the configuration as given, the one a rerun's is compared with: before
        # this machine's GPU count turns trainer.devices into processes per GPU.
        as_given = compared_config(cfg)
        pl.seed_everything(cfg.seed, workers=True)
        spread_processes_over_gpus(cfg, torch.cuda.device_count() if torch.cuda.is_available() else 0)
        if HydraConfig.initialized():
            warn_renamed_options(HydraConfig.get().runtime.choices)
        datamodule = build(cfg.data)
        check_optimizer(cfg, build)
        module = build_module(cfg)
        check_model_fits_data(chosen("model"), chosen("data"), module.net, datamodule)
        loggers = [build(c) for c in (cfg.get("logger") or {}).values()]
        resolve_fork_ranks(cfg)
        if cfg.strategy.get("fork_ranks") is True and in_multirun():
            raise ValueError(
                "strategy.fork_ranks=true cannot be used in a multirun (-m): a forked rank would go on with the sweep's "
                "next job. Drop the override (each rank then reruns only its job) or run the jobs one at a time."
            )
        strategy = build_strategy(cfg.strategy)
        # The suite's strategies save atomically; Lightning's own (ddp, single) get the same plugin.
        own_io = getattr(strategy, "_checkpoint_io", None) is not None
        preemption = Preemption(dirpath=Path(cfg.paths.output_dir) / "checkpoints",
                                requeue_signal=cfg.get("requeue_signal") or None)
        trainer: pl.Trainer = build(
            cfg.trainer, strategy=strategy, callbacks=[*build_callbacks(cfg, datamodule), preemption],
            logger=loggers or False, plugins=[] if own_io else [AtomicCheckpointIO()],
            **({"enable_progress_bar": False} if progress_as_lines(cfg) else {}),
        )
        check_resources(cfg, trainer)
        for budget in (c for c in trainer.callbacks if isinstance(c, MemoryBudget) and cfg.get("fit", True)):
            budget.check(trainer.strategy, module, datamodule)  # before any rank starts: one message
        warn_cpu_bf16_conv3d(trainer, module)
        set_cpu_threads(cfg, trainer)
        for logger in trainer.loggers:
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        fitting = cfg.get("fit", True)
        if fitting and trainer.is_global_zero:
            record_start(cfg, as_given)
        preemption.arm()  # a signal from here on, set-up included, is one orderly stop
        try:
            with child_ranks_rerun_this_job():
                metrics, best = fit_and_test(cfg, trainer, module, datamodule, ckpt_path)
        except SIGTERMException:
            stop = preemption.stop or Stop(signal=preemption.received or "SIGTERM", strategy=type(trainer.strategy).__name__)
            end_stopped_run(cfg, trainer, stop, fitting, preemption.ranks_started)
        except BaseException as error:
            if fitting and trainer.is_global_zero:
                record_end(cfg, "failed", error=f"{type(error).__name__}: {error}"[:500])
            raise
        finally:
            preemption.disarm()
        if trainer.is_global_zero:
            report(metrics, Path(cfg.paths.output_dir), best)
        return metrics


def fit_and_test(cfg: DictConfig, trainer: pl.Trainer, module: pl.LightningModule, datamodule: Any,
                 ckpt_path: str | None) -> tuple[dict[str, float], str]:
    """Fit (resuming from ``ckpt_path``), then test with the best checkpoint; the metrics and its path."""
    metrics, best = {}, ""
    check_checkpoint_readable(ckpt_path)
    if cfg.get("fit", True):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
        metrics = final_metrics(trainer)
        server_load = capabilities_of(trainer.strategy).server_load  # a parameter-server strategy's, rank 0
        if server_load is not None:
            metrics.update(server_load.as_metrics())
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if trainer.is_global_zero:
            record_end(cfg, "finished", best_checkpoint=best)
    elif not cfg.get("test", True):
        raise ValueError("fit=false and test=false leave nothing to do")
    if cfg.get("test", True):
        # Without fitting, test the weights of ckpt_path (an inference-only strategy, e.g. partitioned_inference).
        ckpt = best or (None if cfg.get("fit", True) else ckpt_path)
        trainer.test(module, datamodule=datamodule, ckpt_path=ckpt, verbose=False)
        metrics.update(final_metrics(trainer, prefix="test/"))
    return metrics, best


#: Seconds the command's process waits for the ranks it started to end after a stop.
RANKS_END_S = 8.0


def end_stopped_run(cfg: DictConfig, trainer: pl.Trainer, stop: Stop, fitting: bool, ranks: list[Any]) -> None:
    """A run stopped by a signal: wait for the ``ranks`` this process started, record the stop, say in
    one line (rank 0) what stopped it and where it resumes, and exit with 128 + the signal's number."""
    for proc in ranks or getattr(trainer.strategy.launcher, "procs", None) or []:
        try:
            proc.wait(timeout=RANKS_END_S)
        except Exception:
            proc.kill()
    if trainer.is_global_zero:
        if fitting and trainer.state.fn == "fit":
            record_end(cfg, "interrupted", stopped_by=stop.signal, epoch=stop.epoch,
                       checkpoint=None if stop.checkpoint is None else str(stop.checkpoint))
            log.warning(stop.summary())
        else:
            done = "the fit had finished and its checkpoints are complete; " if fitting else ""
            log.warning("stopped by %s while %sing: %srun the same command again to %s", stop.signal,
                        trainer.state.fn.value.rstrip("e"), done, trainer.state.fn.value)
    sys.stdout.flush()
    raise SystemExit(stop.exit_code)


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
