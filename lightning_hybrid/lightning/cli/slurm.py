# Generated from lightning_hybrid/cli/slurm.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""SLURM jobs through submitit: what a run asks SLURM for, and each submitit task as one Lightning rank.

    pip install 'lightning-hybrid[slurm]'                       # hydra-submitit-launcher
    lightning-hybrid -m hydra/launcher=slurm strategy=ssp_delay trainer=gpu trainer.devices=4 trainer.num_nodes=2
    lightning-hybrid -m hydra/launcher=slurm_local strategy=ssp_delay trainer.devices=2   # the same tasks, on this machine

``hydra/launcher=slurm`` (``configs/hydra/launcher/slurm.yaml``) submits each job of the sweep with
``sbatch``; its ``srun`` starts one task per Lightning rank, and Lightning's ``SLURMEnvironment`` reads
each task's rank from the ``SLURM_*`` variables (no process starts another). The numbers it asks for
come from :func:`slurm_resources`, through the ``${lh_slurm:KEY}`` resolver registered when this
module is imported (``lightning_hybrid.lightning.cli`` imports it before Hydra composes):

* ``nodes``: ``trainer.num_nodes``;
* ``tasks_per_node``: the ranks on each node, ``trainer.devices`` x ``strategy.processes_per_device``
  (for ``strategy=hybrid``, ``pipeline_stages x data_parallel`` ranks in all, checked here);
* ``gpus_per_node``: ``trainer.devices`` with ``trainer.accelerator`` ``gpu``/``cuda``, else 0
  (``auto`` asks for none: use ``trainer=gpu`` on a GPU partition);
* ``cpus_per_task``: a rank's cores (its torch threads, ``cpu_threads_per_process``, plus its
  DataLoader workers, ``data.num_workers``) plus, for a parameter-server strategy (``ssp``,
  ``cneural``), one core per server process: the servers run beside global rank 0, in its task,
  and SLURM gives every task the same ``--cpus-per-task``, so every task asks for them.

``hydra/launcher=slurm_local`` lays the job out the same way but runs it with submitit's
``LocalExecutor``: one process per task on this machine, without any ``SLURM_*`` variable.
:func:`submitit_task_as_rank` (called by ``train`` first thing) then gives each task the variables of
a ``torchrun`` rank, so that Lightning's ``TorchElasticEnvironment`` takes the task as one rank.
:func:`task_threads` keeps a SLURM task's torch threads within its ``--cpus-per-task``.

The launcher's numbers are resolved once, when the sweep is launched, from the command line's
values: a sweep over ``trainer.devices`` or ``trainer.num_nodes`` (``trainer.devices=2,4``) would
give every job the first job's layout, so sweep those in separate commands.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

#: torch threads of a rank with ``cpu_threads_per_process=auto`` (its cores on a cluster node, where
#: "this machine's cores / processes" would count the whole node): CPU ranks compute with them, a
#: GPU rank's threads only feed its GPU.
AUTO_THREADS = {"cpu": 4, "gpu": 2}

#: ``data.num_workers=auto`` (data=adni): 2 workers, or up to 8 when they augment (``augment.where=workers``).
AUTO_LOADER_WORKERS, AUTO_AUGMENTING_LOADER_WORKERS = 2, 8

#: ``strategy.servers=auto`` reserves one core per server for at most this many servers: one below
#: ``2 x AUTO_MIN_PARAMS_PER_SHARD`` parameters, else two (the fewest that ``auto`` starts for a large
#: model on a host without free cores). ``strategy.servers=N`` reserves, and starts, exactly N.
AUTO_SERVERS_RESERVED = 2

#: Torch ``start_method``s that start the ranks inside one process (one task): not one task per rank.
_IN_PROCESS_START_METHODS = ("spawn", "fork", "forkserver")


def _accelerator(cfg: Any) -> str:
    accelerator = str(cfg.trainer.get("accelerator", "auto")).lower()
    return "gpu" if accelerator in ("gpu", "cuda") else "cpu"


def _count(value: Any, name: str) -> int:
    """A positive count from a config value: an int, a digit string, or a list of device ids."""
    if isinstance(value, (list, tuple)) or OmegaConf.is_list(value):
        value = len(value)
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name}={value!r}: a SLURM job needs a number of them to ask for; set {name} to a positive number "
            "(e.g. trainer.devices=4)"
        )
    return value


def _strategy_class(strategy: Any) -> type | None:
    target = strategy.get("_target_") if strategy is not None else None
    if not target:
        return None
    from hydra.utils import get_class

    return get_class(str(target))


def ranks_per_node(cfg: Any) -> int:
    """The Lightning ranks on each node: ``trainer.devices x strategy.processes_per_device``."""
    strategy = cfg.get("strategy") or {}
    per_device = strategy.get("processes_per_device", 1) or 1
    return _count(cfg.trainer.get("devices", 1), "trainer.devices") * _count(per_device, "strategy.processes_per_device")


def _parameter_count(model_cfg: Any) -> int:
    """The parameters of the configured model, built on the meta device (no memory, no data)."""
    import torch
    from hydra.utils import instantiate

    with torch.device("meta"):
        net = instantiate(model_cfg, _convert_="all")
    return sum(p.numel() for p in net.parameters())


def server_processes(cfg: Any) -> int:
    """The parameter-server processes the strategy starts beside global rank 0 (0 for the others).

    ``servers: N``: N. ``servers: auto``: 1 with ``on_worker_failure=continue`` or below
    ``2 x AUTO_MIN_PARAMS_PER_SHARD`` parameters (the model counted on the meta device), else
    :data:`AUTO_SERVERS_RESERVED`."""
    from lightning_hybrid.lightning.strategies.parameter_server import ParameterServerStrategy

    strategy = cfg.get("strategy")
    cls = _strategy_class(strategy)
    if cls is None or not issubclass(cls, ParameterServerStrategy):
        return 0
    servers = strategy.get("servers", "auto")
    if servers != "auto":
        return _count(servers, "strategy.servers")
    if strategy.get("on_worker_failure", "stop") == "continue":
        return 1
    from lightning_hybrid.parameter_server.sharding import AUTO_MIN_PARAMS_PER_SHARD

    by_size = _parameter_count(cfg.model) // AUTO_MIN_PARAMS_PER_SHARD
    return max(1, min(by_size, AUTO_SERVERS_RESERVED))


def loader_workers(cfg: Any) -> int:
    """``data.num_workers``, with ``auto`` as data=adni decides it on a node."""
    data = cfg.get("data") or {}
    workers = data.get("num_workers", 0)
    if workers != "auto":
        return int(workers or 0)
    augment = data.get("augment")
    augmenting = hasattr(augment, "get") and augment.get("where", "device") == "workers"
    return AUTO_AUGMENTING_LOADER_WORKERS if augmenting else AUTO_LOADER_WORKERS


def rank_threads(cfg: Any) -> int:
    """A rank's torch threads: ``cpu_threads_per_process``, or :data:`AUTO_THREADS` with ``auto``/null."""
    threads = cfg.get("cpu_threads_per_process", "auto")
    if threads in (None, "auto", "none"):
        return AUTO_THREADS[_accelerator(cfg)]
    return _count(threads, "cpu_threads_per_process")


def _check_one_task_per_rank(cfg: Any) -> None:
    strategy = cfg.get("strategy") or {}
    if strategy.get("start_method") in _IN_PROCESS_START_METHODS:
        raise ValueError(
            f"strategy.start_method={strategy.get('start_method')} starts the ranks from one process, but a SLURM "
            "job runs one task per rank: use strategy=ddp (start_method=popen) with hydra/launcher=slurm"
        )
    if strategy.get("fork_ranks") is True:  # auto: SLURM starts every rank, nothing is forked
        raise ValueError(
            "strategy.fork_ranks=true forks ranks from one process, but a SLURM job runs one task per rank (and "
            "is a multirun): drop the override with hydra/launcher=slurm"
        )
    from lightning_hybrid.lightning.strategies.hybrid import HybridParallelStrategy

    cls = _strategy_class(strategy)
    if cls is not None and issubclass(cls, HybridParallelStrategy):
        stages, replicas = int(strategy.get("pipeline_stages", 1)), int(strategy.get("data_parallel", 1))
        ranks = ranks_per_node(cfg) * _count(cfg.trainer.get("num_nodes", 1), "trainer.num_nodes")
        if stages * replicas != ranks:
            raise ValueError(
                f"strategy=hybrid needs pipeline_stages x data_parallel = {stages} x {replicas} = {stages * replicas} "
                f"ranks, but trainer.devices x trainer.num_nodes gives {ranks}: set trainer.devices to "
                f"{stages * replicas} // trainer.num_nodes"
            )


def slurm_resources(cfg: DictConfig | Mapping[str, Any]) -> dict[str, int]:
    """What one job of ``cfg`` asks SLURM for: ``nodes``, ``tasks_per_node`` (one per rank),
    ``gpus_per_node`` and ``cpus_per_task`` (a rank's threads and loader workers, plus one core per
    parameter-server process: those run in global rank 0's task, and every task gets as many)."""
    if not OmegaConf.is_config(cfg):
        cfg = OmegaConf.create(dict(cfg))
    _check_one_task_per_rank(cfg)
    tasks = ranks_per_node(cfg)
    gpu = _accelerator(cfg) == "gpu"
    return {
        "nodes": _count(cfg.trainer.get("num_nodes", 1), "trainer.num_nodes"),
        "tasks_per_node": tasks,
        "gpus_per_node": _count(cfg.trainer.get("devices", 1), "trainer.devices") if gpu else 0,
        "cpus_per_task": rank_threads(cfg) + loader_workers(cfg) + server_processes(cfg),
    }


def _lh_slurm(key: str, *, _root_: DictConfig) -> int:
    """``${lh_slurm:KEY}`` in configs: ``slurm_resources(<the whole config>)[KEY]``."""
    resources = slurm_resources(_root_)
    if key not in resources:
        raise ValueError(f"${{lh_slurm:{key}}}: choose one of {', '.join(resources)}")
    return resources[key]


OmegaConf.register_new_resolver("lh_slurm", _lh_slurm, replace=True)


def task_threads(cfg: Any, global_rank: int) -> int | None:
    """In a SLURM task with ``--cpus-per-task`` and ``cpu_threads_per_process=auto``: the torch threads
    of this rank, its task's cores less its loader workers and (global rank 0) the servers' cores;
    None elsewhere (the machine's cores are shared by the ranks on it, as without SLURM)."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if not cpus or "SLURM_NTASKS" not in os.environ or cfg.get("cpu_threads_per_process", "auto") != "auto":
        return None
    servers = server_processes(cfg) if global_rank == 0 else 0
    return max(1, int(cpus) - loader_workers(cfg) - servers)


#: The torchrun variables :func:`submitit_task_as_rank` sets.
TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
                      "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def main_port(job_id: str) -> int:
    """The rendezvous port of a submitit job, the same in every task: 15000-24999, from the job id."""
    return 15000 + zlib.crc32(job_id.encode()) % 10000


def submitit_task_as_rank() -> bool:
    """In a task of a submitit job of several tasks that no launcher has made a rank (no ``SLURM_*``,
    no ``torchrun`` variables: submitit's ``LocalExecutor``), set the variables ``torchrun`` gives its
    ranks, so that Lightning's ``TorchElasticEnvironment`` takes this task as one rank and starts no
    process of its own; the port is derived from the job id, so every task agrees on it. Returns
    whether it set them."""
    executor = os.environ.get("SUBMITIT_EXECUTOR")
    if not executor:
        return False
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if SLURMEnvironment.detect() or TorchElasticEnvironment.detect():
        return False
    import submitit

    job = submitit.JobEnvironment()
    if job.num_tasks < 2:
        return False
    hosts = list(job.hostnames)
    os.environ.update(
        MASTER_ADDR="127.0.0.1" if job.num_nodes == 1 else hosts[0],
        MASTER_PORT=str(main_port(job.job_id)),
        RANK=str(job.global_rank),
        LOCAL_RANK=str(job.local_rank),
        WORLD_SIZE=str(job.num_tasks),
        GROUP_RANK=str(job.node),
        NODE_RANK=str(job.node),
        LOCAL_WORLD_SIZE=str(job.num_tasks // job.num_nodes),
        TORCHELASTIC_RUN_ID=f"submitit-{executor}-{job.job_id}",
    )
    return True
