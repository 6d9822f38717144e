"""Activation checkpointing of a network's blocks (lightning_hybrid.models.checkpointing): the same
outputs, gradients and BatchNorm statistics as without it, with a fraction of the bytes kept for
backward; in a pipeline stage too, and from the command line (``model.checkpoint_blocks=true``)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conftest import run_cli
from lightning_hybrid.models import VGG16, LeNet5, ResAttNet3D
from lightning_hybrid.pipeline.stage import StageModule

NETWORKS = {
    "lenet5": (lambda: LeNet5(), (4, 1, 28, 28)),
    "resattnet3d": (lambda: ResAttNet3D(depth=18, base_channels=8), (4, 1, 32, 32, 32)),  # BatchNorm, dropout
    "vgg16_bn": (lambda: VGG16(num_classes=10, input_size=32, width=1 / 16, fc_width=64, batch_norm=True), (4, 3, 32, 32)),
}


def saved_bytes(net: nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd keeps for backward outside the checkpointed blocks (what a step holds at its peak)."""
    kept = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(x).sum()
    return sum(kept)


def one_step(net: nn.Module, x: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(seed)  # the same dropout draws
    out = net(x)
    nn.functional.cross_entropy(out, torch.arange(len(x)) % out.shape[1]).backward()
    return out.detach(), [p.grad.clone() for p in net.parameters()], [b.clone() for b in net.buffers()]


@pytest.mark.parametrize("name", list(NETWORKS))
def test_a_checkpointed_step_is_the_plain_step_with_less_kept(name):
    build, shape = NETWORKS[name]
    torch.manual_seed(0)
    plain = build().train()
    checkpointed = copy.deepcopy(plain)
    checkpointed.checkpoint_blocks = True
    x = torch.randn(shape)
    out, grads, buffers = one_step(plain, x)
    out_c, grads_c, buffers_c = one_step(checkpointed, x)
    torch.testing.assert_close(out_c, out)
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g_c, g, rtol=1e-5, atol=1e-6)
    for b, b_c in zip(buffers, buffers_c):  # BatchNorm's running statistics and batch count: updated once
        torch.testing.assert_close(b_c, b)
    assert saved_bytes(checkpointed, x) < 0.5 * saved_bytes(plain, x)
    with torch.no_grad():  # evaluation runs plainly
        torch.testing.assert_close(checkpointed.eval()(x), plain.eval()(x))


def test_a_checkpointed_pipeline_stage_is_the_plain_stage():
    torch.manual_seed(0)
    net = ResAttNet3D(depth=18, base_channels=8).train()
    twin = copy.deepcopy(net)
    x = torch.randn(2, 1, 32, 32, 32)
    results = []
    for model, checkpointed in ((net, False), (twin, True)):
        blocks = list(model.named_children())
        stage = StageModule(blocks, 0, 4, checkpointed=checkpointed)
        assert stage.checkpointed is checkpointed
        kept = saved_bytes(stage, x)
        stage(x).sum().backward()
        results.append((kept, [p.grad.clone() for p in stage.parameters()]))
    (kept, grads), (kept_c, grads_c) = results
    assert kept_c < 0.5 * kept
    for g, g_c in zip(grads, grads_c):
        torch.testing.assert_close(g_c, g, rtol=1e-5, atol=1e-6)


def test_checkpoint_blocks_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("data=synthetic", "trainer=debug", "trainer.max_epochs=1", "trainer.limit_train_batches=4", "test=false",
                   "model.checkpoint_blocks=true", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file(), proc.stdout[-2000:]
    assert "checkpoint_blocks: true" in (run_dir / ".hydra" / "config.yaml").read_text()
