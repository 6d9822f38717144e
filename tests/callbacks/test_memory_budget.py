"""What training a whole model needs on a rank (``placement/memory.py``), and the memory budget that refuses a
data-parallel run over it before training (``callbacks/memory_budget.py``, ``memory_budget=`` on the command line)."""

from __future__ import annotations

import json

import pytest
import pytorch_lightning as pl
import torch

from conftest import run_cli
from lightning_hybrid import ClassifierModule
from lightning_hybrid.callbacks import MemoryBudget, MemoryBudgetExceeded
from lightning_hybrid.data.synthetic_mnist import SyntheticMNISTDataModule
from lightning_hybrid.models import MLP, LeNet5, ResAttNet3D
from lightning_hybrid.placement.memory import optimizer_slots, training_memory


def test_the_need_is_parameters_gradients_optimizer_state_buckets_and_the_batch_s_activations():
    net = LeNet5()
    param_bytes = sum(p.numel() * 4 for p in net.parameters())
    need = training_memory(net, (1, 28, 28), batch_size=64, optimizer_slots=2)
    assert need.gradients == need.buckets == param_bytes and need.optimizer_state == 2 * param_bytes
    assert need.parameters == param_bytes + sum(b.numel() * 4 for b in net.buffers())
    assert need.total == pytest.approx(need.parameters + need.gradients + need.optimizer_state + need.buckets
                                       + need.activations + need.transient)
    # activations grow with the batch, in proportion; a single sample is measured on two (BatchNorm) and halved
    assert training_memory(net, (1, 28, 28), 128, 2).activations == pytest.approx(2 * need.activations)
    assert training_memory(net, (1, 28, 28), 1, 2).activations == pytest.approx(need.activations / 64)
    assert training_memory(net, (1, 28, 28), 64, 2, buckets=False).buckets == 0
    assert "activations of a batch of 64" in need.describe() and need.describe().startswith("parameters ")


def test_checkpointed_blocks_keep_their_inputs_and_recompute_one_block_at_a_time():
    net = ResAttNet3D(depth=18, base_channels=8)
    plain = training_memory(net, (1, 32, 32, 32), 4, 1)
    checkpointed = training_memory(net, (1, 32, 32, 32), 4, 1, checkpointed=True)
    assert checkpointed.activations < plain.activations / 3  # block inputs only
    assert plain.transient < checkpointed.transient < plain.activations  # one block's activations at a time
    assert checkpointed.total < plain.total and checkpointed.parameters == plain.parameters
    assert net.stem[0].weight.device.type == "cpu"  # measured on a meta copy: the model is untouched


def test_optimizer_slots_count_the_state_tensors_a_parameter():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert [optimizer_slots(o) for o in (torch.optim.SGD(params, lr=0.1), torch.optim.SGD(params, lr=0.1, momentum=0.9),
                                         torch.optim.Adam(params), torch.optim.AdamW(params))] == [0, 1, 2, 2]


def _trainer(budget: str) -> tuple[pl.Trainer, ClassifierModule, SyntheticMNISTDataModule]:
    module = ClassifierModule(MLP(hidden=(512,)), optimizer=lambda p: torch.optim.Adam(p, lr=1e-3))
    data = SyntheticMNISTDataModule(num_train=64, num_val=16, num_test=16, batch_size=32)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, callbacks=[MemoryBudget(budget)])
    return trainer, module, data


def test_a_run_over_its_budget_is_refused_before_training_naming_what_it_needs():
    trainer, module, data = _trainer("1MiB")
    with pytest.raises(MemoryBudgetExceeded, match=r"needs about \d+ MiB a rank to train MLP \(parameters .* over the memory budget of 1 MiB") as refused:
        trainer.fit(module, data)
    assert "model.checkpoint_blocks=true" in str(refused.value) and "strategy=hybrid" in str(refused.value)
    assert trainer.global_step == 0
    trainer, module, data = _trainer("1GiB")
    trainer.fit(module, data)
    assert trainer.global_step == 2


def test_under_a_budget_ddp_is_refused_in_one_message_and_the_pipeline_trains_within_it(tmp_path):
    """An MLP whose DDP rank needs 171 MiB (SGD with momentum): under memory_budget=120MiB the command refuses
    DDP before training, in one message naming the need; the 2-stage pipeline places its stages within the
    budget and trains."""
    common = ("experiment=smoke", "model=mlp", "model.hidden=[2048,2048,2048]", "memory_budget=120MiB",
              "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=0", "test=false",
              "trainer.devices=2")
    proc = run_cli(*common, "strategy=ddp", f"hydra.run.dir={tmp_path / 'ddp'}", cwd=tmp_path, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "Traceback" not in output and output.count("error: ") == 1, output[-3000:]
    assert "DDPStrategy needs about 171 MiB a rank to train MLP (parameters 38" in output and "over the memory budget of 120 MiB (memory_budget)" in output, output[-3000:]
    run_cli(*common, "strategy=hybrid", "strategy.input_shape=[1,28,28]", f"hydra.run.dir={tmp_path / 'hybrid'}", cwd=tmp_path)
    metrics = json.loads((tmp_path / "hybrid" / "metrics.json").read_text())
    estimates = [v for k, v in metrics.items() if k.endswith("_estimate_MiB")]
    assert len(estimates) == 2 and max(estimates) <= 120, metrics


def test_a_fully_sharded_rank_holds_a_shard_of_the_state_and_the_parameters_it_gathers():
    """FSDP over 4 ranks: a quarter of the parameters, gradients and optimizer state, no buckets; a block's and the
    next one's whole parameters gathered (ZeRO-3), or the whole model's from forward to backward (ZeRO-2); the
    largest block's whole gradient as the transient; the activations of its own batch, as DDP's."""
    net = ResAttNet3D(depth=18, base_channels=8)
    blocks = [sum(p.numel() * 4 for p in block.parameters()) for block in net]
    param_bytes = sum(blocks)
    ddp = training_memory(net, (1, 32, 32, 32), 4, 2)
    zero3 = training_memory(net, (1, 32, 32, 32), 4, 2, shards=4)
    zero2 = training_memory(net, (1, 32, 32, 32), 4, 2, shards=4, reshard_after_forward=False)
    assert zero3.gradients == param_bytes / 4 and zero3.optimizer_state == param_bytes / 2 and zero3.buckets == 0
    assert zero3.gathered == sum(sorted(blocks)[-2:]) and zero2.gathered == param_bytes
    assert zero3.activations == ddp.activations and zero3.transient >= max(blocks)
    assert zero3.total < zero2.total < ddp.total
    assert "parameters (1/4)" in zero3.describe() and "gathered parameters" in zero3.describe()


def test_a_fully_sharded_run_is_checked_against_the_budget_with_its_shards():
    """MemoryBudget estimates a FullyShardedStrategy rank as a shard (refused under a budget between the sharded
    need and DDP's; DDP refused there, naming fsdp2 among the remedies)."""
    from lightning_hybrid.strategies.fsdp2 import FullyShardedStrategy

    module = ClassifierModule(MLP(hidden=(512,)), optimizer=lambda p: torch.optim.Adam(p, lr=1e-3))
    data = SyntheticMNISTDataModule(num_train=64, num_val=16, num_test=16, batch_size=32)
    ddp, sharded = MemoryBudget.estimate(module, data), MemoryBudget.estimate(module, data, shards=2)
    budget = MemoryBudget((ddp.total + sharded.total) / 2)
    budget.check(FullyShardedStrategy(parallel_devices=[torch.device("cpu")] * 2), module, data)
    with pytest.raises(MemoryBudgetExceeded, match=r"strategy=fsdp2"):
        budget.check(pl.strategies.DDPStrategy(), module, data)
