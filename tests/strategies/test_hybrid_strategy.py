"""HybridParallelStrategy on CPU processes (gloo): pipeline stages x data-parallel replicas give the
loss, gradients, parameters and predictions of single-device training; checkpoints are full."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from lightning_hybrid import ClassifierModule, HybridParallelStrategy
from lightning_hybrid.models import LeNet5
from lightning_hybrid.pipeline import StageModule
from lightning_hybrid.placement import Device, InfeasiblePlacementError

from conftest import SUPPORT, run_script
from hybrid_reference import assert_state_equal, reference_steps
from hybrid_script import make_data, make_module

SCRIPT = SUPPORT / "hybrid_script.py"
pytestmark = pytest.mark.multiprocess


def run(out: Path, *args: str) -> None:
    run_script(SCRIPT, out, *args)


def first_step(out: Path, ranks: int) -> tuple[list[float], dict[str, list[torch.Tensor]]]:
    losses, grads = [], {}
    for rank in range(ranks):
        record = torch.load(out / f"step0_rank{rank}.pt")
        losses.append(record["loss"])
        for name, grad in record["grads"].items():
            grads.setdefault(name, []).append(grad)
    return losses, grads


def test_two_stages_give_the_loss_gradients_and_predictions_of_one_device(tmp_path):
    # speeds probed; rank 0's stage compute simulated 3x slower (its first-stage input then needs a gradient)
    run(tmp_path, "--stages", "2", "--dp", "1", "--samples", "32", "--batch", "32", "--speeds", "probe",
        "--slowdown", "3,1")
    loss, grads, _ = reference_steps(32, 1)
    losses, got = first_step(tmp_path, 2)
    assert losses == pytest.approx([loss, loss], abs=1e-6)
    assert sorted(got) == sorted(grads)  # every parameter has its gradient on exactly one stage
    for name, pieces in got.items():
        assert len(pieces) == 1
        torch.testing.assert_close(pieces[0], grads[name], atol=1e-6, rtol=1e-5)
    result = torch.load(tmp_path / "result.pt")
    assert [s["device"] for s in result["placement"]["stages"]] in ([0, 1], [1, 0])
    plain = ClassifierModule.load_from_checkpoint(result["last"], net=LeNet5(), weights_only=True)
    x, _ = make_data(32).tensors
    torch.testing.assert_close(result["predictions"], plain(x).argmax(1))
    assert_state_equal(plain, result["state"])  # strategy.full_state_dict(): every stage's weights after fit


def test_auto_micro_batches_are_the_count_predicted_fastest_and_train_as_one_device(tmp_path):
    # the default: rank 0 places the model for 2, 4 and 8 micro-batches of the batch of 32 (its divisors from the
    # stages to 4 x the stages), each on its blocks timed at that micro-batch, and every rank uses the count chosen
    run(tmp_path, "--stages", "2", "--samples", "32", "--batch", "32", "--micro", "auto", "--speeds", "1,2")
    result = torch.load(tmp_path / "result.pt")
    predicted = result["notes"]["predicted_step_s"]
    assert sorted(predicted) == [2, 4, 8]
    assert result["micro_batches"] == min(predicted, key=predicted.get)
    assert result["notes"]["block_cost"] == "time"
    loss, grads, _ = reference_steps(32, 1)
    losses, got = first_step(tmp_path, 2)
    assert losses == pytest.approx([loss, loss], abs=1e-6)
    for name, pieces in got.items():
        torch.testing.assert_close(pieces[0], grads[name], atol=1e-6, rtol=1e-5)


def test_two_stages_by_two_replicas_train_as_one_device_and_save_full_checkpoints(tmp_path):
    # each replica's batch is half of the 64 samples, so every step is a full-batch step; no sanity check, so the
    # stages come to be in the first training step, before the replicas' all-reduce of them
    run(tmp_path, "--stages", "2", "--dp", "2", "--samples", "64", "--batch", "32", "--epochs", "3",
        "--momentum", "0.9", "--placement", "3,4", "--schedule", "GPipe", "--no-sanity-check")
    loss, grads, reference = reference_steps(64, 3, momentum=0.9)
    losses, got = first_step(tmp_path, 4)
    assert sum(losses) / 4 == pytest.approx(loss, abs=1e-6)  # replicas' halves average to the full batch
    for name, pieces in got.items():
        assert len(pieces) == 2  # one per replica, averaged: equal
        for piece in pieces:
            torch.testing.assert_close(piece, grads[name], atol=1e-6, rtol=1e-5)
    result = torch.load(tmp_path / "result.pt")
    checkpoint = torch.load(result["last"], weights_only=True)
    plain = ClassifierModule(LeNet5())
    plain.load_state_dict(checkpoint["state_dict"])
    assert_state_equal(reference, checkpoint["state_dict"])
    momentum = checkpoint["optimizer_states"][0]["state"]
    assert len(momentum) == len(list(reference.parameters()))  # both stages' momentum buffers are saved


def test_resume_clipping_accumulation_and_delayed_sync(tmp_path):
    # 2 epochs, then resume to 3: equals 3 uninterrupted full-batch steps (momentum state round-trips)
    run(tmp_path / "a", "--stages", "2", "--dp", "2", "--samples", "64", "--batch", "32", "--epochs", "2",
        "--momentum", "0.9", "--sync", "delayed", "--no-sanity-check")
    run(tmp_path / "b", "--stages", "2", "--dp", "2", "--samples", "64", "--batch", "32", "--epochs", "3",
        "--momentum", "0.9", "--sync", "delayed", "--resume", str(tmp_path / "a" / "ckpt" / "last.ckpt"))
    _, _, reference = reference_steps(64, 3, momentum=0.9)
    assert_state_equal(reference, torch.load(tmp_path / "b" / "result.pt")["state"])
    # accumulation over 2 batches of 16 and clipping by the norm of the whole model's gradient
    run(tmp_path / "c", "--stages", "2", "--samples", "32", "--batch", "16", "--accumulate", "2", "--clip", "0.05")
    _, _, reference = reference_steps(32, 1, clip=0.05)
    assert_state_equal(reference, torch.load(tmp_path / "c" / "result.pt")["state"])


def test_checkpoints_every_n_steps_hold_the_whole_model_of_that_step(tmp_path):
    # gradient_sync="sync": every step ends with the same parameters on every rank, a point to save at
    run(tmp_path, "--stages", "2", "--samples", "32", "--batch", "32", "--epochs", "3", "--every-n-steps", "2")
    assert sorted(p.name for p in (tmp_path / "steps").iterdir()) == ["step=2.ckpt"]
    _, _, reference = reference_steps(32, 2)
    saved = torch.load(tmp_path / "steps" / "step=2.ckpt", weights_only=False)["state_dict"]
    assert_state_equal(reference, saved)


def test_a_plain_lightning_module_is_pipelined_at_its_sequential(tmp_path):
    """No pipeline_blocks() or pipeline_loss(): the strategy splits the module's nn.Sequential and
    trains with its loss attribute; 2 epochs of full-batch steps equal one device's."""
    run(tmp_path, "--plain", "--stages", "2", "--samples", "32", "--batch", "32", "--epochs", "2", "--placement", "3,4")
    _, _, reference = reference_steps(32, 2)
    state = torch.load(tmp_path / "result.pt")["state"]
    assert_state_equal(reference, {k.replace("model.", "net.", 1): v for k, v in state.items()})


def test_resattnet3d_is_pipelined_exactly(tmp_path):
    # one micro-batch: BatchNorm then normalises over the same samples as on one device
    run(tmp_path, "--model", "resattnet", "--stages", "2", "--samples", "4", "--batch", "4", "--micro", "1",
        "--placement", "uniform", "--schedule", "GPipe")
    loss, grads, _ = reference_steps(4, 1, model="resattnet")
    losses, got = first_step(tmp_path, 2)
    assert losses == pytest.approx([loss, loss], abs=1e-5)
    assert sorted(got) == sorted(grads)
    for name, pieces in got.items():
        # relative to the tensor's largest gradient: one device with 1 or 2 threads differs by 6e-5 already
        scale = grads[name].abs().max().item()
        assert (pieces[0] - grads[name]).abs().max().item() <= 1e-3 * scale + 1e-7, name


def test_bf16_mixed_precision(tmp_path):
    run(tmp_path, "--stages", "2", "--samples", "32", "--batch", "32", "--precision", "bf16-mixed")
    loss, _, _ = reference_steps(32, 1)
    losses, grads = first_step(tmp_path, 2)
    assert losses == pytest.approx([loss, loss], rel=2e-2)  # the forward ran in bfloat16
    assert all(g[0].dtype == torch.float32 and torch.isfinite(g[0]).all() for g in grads.values())


# ---------------------------------------------------------------------- bad input, before processes start
def fit_refused(strategy: HybridParallelStrategy, module: pl.LightningModule, devices: int = 2) -> None:
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module, DataLoader(make_data(8), batch_size=8))


def test_bad_input_is_refused_before_processes_start():
    module = make_module(0.1, 0.0)
    with pytest.raises(ValueError, match=r"pipeline_stages=2 x data_parallel=2 = 4 processes, but the Trainer runs 2"):
        fit_refused(HybridParallelStrategy(pipeline_stages=2, data_parallel=2), module)
    with pytest.raises(ValueError, match="only 7 blocks"):
        fit_refused(HybridParallelStrategy(pipeline_stages=8, micro_batches=8), module, devices=8)

    class NoBlocks(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 2)

    with pytest.raises(TypeError, match="implement pipeline_blocks"):
        fit_refused(HybridParallelStrategy(), NoBlocks())

    class NoLoss(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = LeNet5()

    with pytest.raises(TypeError, match=r"needs a loss.*pipeline_loss\(output, target\).*self.loss_fn"):
        fit_refused(HybridParallelStrategy(), NoLoss())
    tiny = HybridParallelStrategy(devices=[{"speed": 1, "memory": "64KiB"}, {"speed": 1, "memory": "64KiB"}],
                                  input_shape=[1, 28, 28])
    with pytest.raises(InfeasiblePlacementError, match="MiB"):
        fit_refused(tiny, module)
    with pytest.raises(ValueError, match="devices describes 3 devices but pipeline_stages=2"):
        HybridParallelStrategy(devices=[1, 2, 3])
    with pytest.raises(ValueError, match="placement must be one of"):
        HybridParallelStrategy(placement="random")
    with pytest.raises(ValueError, match="1F1B' needs at least as many micro-batches as stages"):
        HybridParallelStrategy(pipeline_stages=4, micro_batches=2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        HybridParallelStrategy(schedule="zigzag")


class _ProbeWithTrainingStep(pl.LightningModule):
    """A plain module (an nn.Sequential and a loss attribute) whose training_step logs."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(self, batch, batch_idx):
        loss = self.loss_fn(self.net(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss


def test_a_training_step_the_pipeline_never_calls_is_warned_about():
    strategy = HybridParallelStrategy(devices=[1.0, 1.0])
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
    with pytest.warns(UserWarning, match=r"training_step is not called.*on_pipeline_step"):
        strategy.check_trainer(trainer, _ProbeWithTrainingStep())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        strategy.check_trainer(trainer, make_module(0.1, 0.0))  # ClassifierModule logs in on_pipeline_step


def test_a_module_an_earlier_fit_left_holding_one_stage_is_refused_before_processes_start():
    from lightning_hybrid.pipeline.materialize import free

    strategy = HybridParallelStrategy(devices=[1.0, 1.0])
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False)
    module = _ProbeWithTrainingStep()
    module.on_pipeline_step = lambda *args: None
    strategy.check_trainer(trainer, module)  # a whole module, never pipelined
    free(module.net[3])  # what an earlier pipelined fit leaves on a rank holding the first stage
    module._pipelined = True
    with pytest.raises(ValueError, match=r"pipelined by an earlier Trainer in this process.*Fit a new module"):
        strategy.check_trainer(trainer, module)


def test_step_checkpoints_are_refused_with_delayed_gradient_sync():
    strategy = HybridParallelStrategy(gradient_sync="delayed")
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, logger=False,
                         callbacks=[pl.callbacks.ModelCheckpoint(every_n_train_steps=2)])
    with pytest.raises(ValueError, match=r"gradient_sync='delayed' saves checkpoints at its sync points only"):
        strategy.check_trainer(trainer, make_module(0.1, 0.0))


def test_the_placement_planned_from_a_validation_batch_is_the_training_one():
    # The pipeline is planned on the first batch it sees: a sanity check's or trainer.validate's
    # comes under Lightning's inference mode, and profiling still measures forward and backward (by FLOPs here:
    # timed blocks would make two plans differ by the timings' noise).
    strategy = HybridParallelStrategy(devices=[1.0, 1.0], placement_options={"block_cost": "flops"})
    module = _ProbeWithTrainingStep()
    devices = [Device("a", speed=1e9, memory=1e12), Device("b", speed=1e9, memory=1e12)]
    x = torch.randn(4, 1, 4, 4)
    training = strategy._plan(module, x, devices)
    with torch.inference_mode():
        validating = strategy._plan(module, x.clone(), devices)
    assert validating.boundaries == training.boundaries and validating.bottleneck == pytest.approx(training.bottleneck)


def test_registered_alias():
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="hybrid", logger=False)
    assert isinstance(trainer.strategy, HybridParallelStrategy)


def test_stage_module_slowdown_stretches_forward_and_backward():
    torch.manual_seed(0)
    blocks = [(f"l{i}", nn.Linear(512, 512)) for i in range(4)]
    x = torch.randn(1024, 512)
    plain, slow = StageModule(blocks, 0, 4), StageModule(blocks, 0, 4, slowdown=3.0)
    slow(x).sum().backward()  # warm-up
    slow._clock.slept = 0.0
    start = time.perf_counter()
    slow(x).sum().backward()
    elapsed = time.perf_counter() - start
    # forward and backward each sleep twice what they measured: 3x the compute in all
    assert 1.3 < slow.slept_s / (elapsed - slow.slept_s) <= 2.0 + 1e-6, (slow.slept_s, elapsed)
    torch.testing.assert_close(slow(x), plain(x))
    # as the first stage (its input needs no gradient) it computes none: the first block gets no input gradient
    seen = []
    blocks[0][1].register_full_backward_hook(lambda module, grad_input, grad_output: seen.append(grad_input[0]))
    slow(x).sum().backward()
    assert seen == [None]
    # a later stage's input needs its gradient, and gets it, stretched as well
    later = x.detach().requires_grad_(True)
    slow._clock.slept = 0.0
    slow(later).sum().backward()
    assert later.grad is not None and seen[-1] is not None and slow.slept_s > 0

def test_given_speeds_are_relative_to_the_probed_flops():
    strategy = HybridParallelStrategy(devices=[1.0, {"speed": 2.0, "bandwidth": "10MB/s"}])
    strategy.parallel_devices = [torch.device("cpu")] * 2
    first, second = strategy._devices()  # given: relative speeds made FLOP/s, no collective
    assert first.speed > 1e7  # FLOP/s of this machine, not "1"
    assert second.speed == pytest.approx(2 * first.speed, rel=0.5) and second.bandwidth == 1e7
