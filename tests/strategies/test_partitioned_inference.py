"""MoDNN partitioned inference (paper 001): plans, halos and accounting in one process; predictions
on real processes equal single-device predictions."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from conftest import SUPPORT, run_script
from lightning_hybrid import ClassifierModule, PartitionedInferenceStrategy
from lightning_hybrid.models import VGG16, LeNet5, ResAttNet3D
from lightning_hybrid.partition import block_sparse_matrix
from lightning_hybrid.partition.spatial_executor import plan_traffic, simulate
from lightning_hybrid.partition.network import plan_partition
from lightning_hybrid.partition.proportional import proportional_split
from lightning_hybrid.partition.spatial import PartitionError, grid_shape, plan_network

SCRIPT = SUPPORT / "partition_script.py"


def small_vgg(size: int = 32) -> nn.Module:
    torch.manual_seed(0)
    net = VGG16(num_classes=10, input_size=size, width=1 / 16, fc_width=32, batch_norm=True)
    for module in net.modules():  # BatchNorm statistics that are not the identity
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return net.eval()


def resattnet(gamma: float = 0.5) -> nn.Module:
    torch.manual_seed(0)
    net = ResAttNet3D(depth=18, base_channels=4, num_classes=2)
    with torch.no_grad():
        for module in net.modules():
            if hasattr(module, "gamma"):
                module.gamma.fill_(gamma)
    return net.eval()


def lenet() -> nn.Module:
    torch.manual_seed(0)
    return LeNet5().eval()


CASES = [
    ("lenet", lenet, (1, 28, 28), [1, 2], "bodp"),
    ("lenet", lenet, (1, 28, 28), [3, 1, 2], "bodp"),
    ("lenet", lenet, (1, 28, 28), [1, 1, 1, 1], "grid2d"),
    ("vgg", small_vgg, (3, 32, 32), [1, 2, 3], "bodp"),
    ("vgg", small_vgg, (3, 32, 32), [1, 1, 1, 1], "grid2d"),
    ("resattnet", resattnet, (1, 32, 24, 24), [1, 2], "bodp"),
    ("resattnet", resattnet, (1, 24, 32, 24), [2, 1, 1, 2], "grid2d"),
]


@pytest.mark.parametrize("name, make, shape, abilities, scheme", CASES, ids=[f"{c[0]}-{c[4]}-{len(c[3])}" for c in CASES])
def test_partitioned_outputs_equal_the_whole_network(name, make, shape, abilities, scheme):
    net = make()
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(1))
    plan = plan_partition(net, shape, abilities, conv_partition=scheme, fc_partition="mscc_fgcp")
    with torch.no_grad():
        torch.testing.assert_close(simulate(plan, x), net(x), rtol=1e-5, atol=1e-5)
    kinds = {s.kind for s in plan.steps}
    assert {"window", "pointwise"} <= kinds or "block" in kinds  # the convolutional part really is split


def test_bodp_splits_the_longest_axis_in_proportion_to_abilities():
    plan = plan_network(lenet(), (1, 28, 28), [1, 3])
    assert plan.axes == (1,) and [b.ranges for b in plan.steps[0].out_boxes] == [((0, 7),), ((7, 28),)]
    conv = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1)).eval()
    assert plan_network(conv, (1, 20, 28), [1, 1]).axes == (2,)  # the width is longer: split the width
    assert proportional_split(10, [1, 1, 2]) == [(0, 3), (3, 5), (5, 10)]  # largest remainders, ties to the first
    assert grid_shape(4) == (2, 2) and grid_shape(6) == (3, 2) and grid_shape(3) == (3, 1)


@pytest.mark.parametrize("height, width, kernel, channels, workers", [
    (24, 16, 3, 4, 2), (16, 24, 5, 3, 2), (20, 20, 3, 2, 3), (30, 12, 7, 2, 3),
])
def test_halo_bytes_per_boundary_follow_the_formula(height, width, kernel, channels, workers):
    """Stride-1 'same' convolutions: each boundary carries min(H, W) x C x (F - 1) x element size."""
    net = nn.Sequential(nn.Conv2d(channels, channels, kernel, padding=kernel // 2), nn.ReLU(),
                        nn.Conv2d(channels, channels, kernel, padding=kernel // 2)).eval()
    plan = plan_partition(net, (channels, height, width), list(range(1, workers + 1)), fc_partition="owner")
    second_conv = plan_traffic(plan, batch=1, element_size=4)[2]
    boundaries = workers - 1
    assert second_conv.total_bytes == boundaries * min(height, width) * channels * (kernel - 1) * 4
    with torch.no_grad():
        x = torch.randn(2, channels, height, width)
        torch.testing.assert_close(simulate(plan, x), net(x))


def test_halo_of_a_3d_volume_is_a_slab_of_the_other_two_axes():
    net = nn.Sequential(nn.Conv3d(2, 2, 3, padding=1), nn.Conv3d(2, 2, 3, padding=1)).eval()
    plan = plan_partition(net, (2, 20, 12, 10), [1, 2], fc_partition="owner")
    assert plan.spatial.axes == (1,)
    assert plan_traffic(plan, batch=1)[1].total_bytes == 12 * 10 * 2 * (3 - 1) * 4


def test_bodp_has_at_most_two_peers_per_worker_and_the_grid_more():
    net = small_vgg(64)
    for scheme, bound in (("bodp", 2), ("grid2d", 3)):
        plan = plan_partition(net, (3, 64, 64), [1, 1, 1, 1], conv_partition=scheme)
        exchanges = [t for t, s in zip(plan_traffic(plan), plan.steps) if s.kind != "owner" and None not in s.in_boxes]
        most = max(len(peers) for t in exchanges for peers in t.peers)
        assert most == bound  # a 2 x 2 grid talks to edge and corner neighbours


def test_mscc_fgcp_sends_fewer_bytes_than_rows_on_a_block_sparse_layer():
    weight = torch.as_tensor(block_sparse_matrix(400, 600, blocks=3, sparsity=0.9, outlier_fraction=0.1, seed=0), dtype=torch.float32)
    net = nn.Sequential(nn.Conv2d(1, 1, 3, padding=1), nn.Flatten(), nn.Linear(600, 400)).eval()
    with torch.no_grad():
        net[2].weight.copy_(weight)
    x = torch.randn(4, 1, 20, 30)
    traffic = {}
    for method in ("rows", "mscc_fgcp"):
        plan = plan_partition(net, (1, 20, 30), [1, 1, 1, 2], fc_partition=method)
        with torch.no_grad():
            torch.testing.assert_close(simulate(plan, x), net(x), rtol=1e-5, atol=1e-5)
        traffic[method] = plan_traffic(plan, batch=1)[-1]
        assert traffic[method].kind == f"fc:{plan.fc[2].method}"
    assert traffic["mscc_fgcp"].total_bytes < 0.8 * traffic["rows"].total_bytes
    assert all(peers <= {0} for peers in traffic["mscc_fgcp"].peers[1:])  # workers talk to the group owner only


def test_dense_fc_layers_fall_back_to_rows_and_say_so():
    plan = plan_partition(lenet(), (1, 28, 28), [1, 2], fc_partition="mscc_fgcp")
    assert plan.fc and all(fc.method == "rows" for fc in plan.fc.values())
    assert all("split by rows" in note for note in plan.fc_notes.values())


def test_layers_that_are_not_spatially_local_run_on_the_owner_and_say_which():
    net = resattnet(gamma=0.5)
    plan = plan_network(net, (1, 32, 24, 24), [1, 2])
    attention = [s for s in plan.steps if s.name.startswith("attention")]
    assert attention and all(s.kind == "owner" for s in attention)
    assert "ResidualSelfAttention3d is not spatially local" in attention[0].note and "group owner" in attention[0].note
    # A small tail that cannot be split any more runs on the owner too, and the plan says why.
    tail = plan_network(lenet(), (1, 28, 28), [1, 2, 3])
    assert any("smaller than the halo" in s.note for s in tail.steps)


def test_bad_input_is_refused_with_what_to_change():
    with pytest.raises(ValueError, match="positive finite"):
        PartitionedInferenceStrategy(abilities=[1.0, -1.0])
    with pytest.raises(ValueError, match="unknown conv_partition"):
        PartitionedInferenceStrategy(conv_partition="rows")
    with pytest.raises(PartitionError, match="too small for 4 workers"):
        plan_network(nn.Sequential(nn.Conv2d(1, 1, 7, padding=3)).eval(), (1, 8, 8), [1, 1, 1, 1])
    with pytest.raises(PartitionError, match="training mode"):
        plan_network(LeNet5(), (1, 28, 28), [1, 1])
    module = ClassifierModule(LeNet5(), optimizer=torch.optim.SGD)
    loader = DataLoader(TensorDataset(torch.zeros(2, 1, 28, 28)), batch_size=2)
    trainer = pl.Trainer(accelerator="cpu", devices=2, logger=False, strategy=PartitionedInferenceStrategy(abilities=[1, 2, 3]))
    with pytest.raises(ValueError, match="3 abilities for 2 workers"):
        trainer.predict(module, dataloaders=loader)  # refused before the second process starts
    trainer = pl.Trainer(accelerator="cpu", devices=2, logger=False, strategy="partitioned_inference", max_epochs=1)
    with pytest.raises(ValueError, match="inference only"):
        trainer.fit(module, train_dataloaders=loader)
    from lightning_hybrid.models import MLP

    trainer = pl.Trainer(accelerator="cpu", devices=2, logger=False, strategy="partitioned_inference")
    with pytest.raises(ValueError, match=r"convolution and pooling layers.*has none.*strategy='ddp'"):
        trainer.predict(ClassifierModule(MLP()), dataloaders=loader)  # before the second process starts


# ---------------------------------------------------------------------- real processes
@pytest.mark.multiprocess
@pytest.mark.parametrize("abilities, conv, fc, models, plain", [
    ("1,2,3", "bodp", "mscc_fgcp", ["lenet", "vgg", "resattnet"], False),
    ("2,1", "grid2d", "rows", ["lenet", "vgg"], True),  # plain LightningModules: no protocol, no loss
])
def test_every_rank_predicts_what_one_device_does(tmp_path, abilities, conv, fc, models, plain):
    run_script(SCRIPT, tmp_path, "--models", *models, "--abilities", abilities, "--conv", conv, "--fc", fc,
               *(["--plain"] if plain else []))
    workers = len(abilities.split(","))
    for name in models:
        for rank in range(workers):
            saved = torch.load(tmp_path / f"{name}_rank{rank}.pt", weights_only=False)
            torch.testing.assert_close(saved["logits"], saved["reference"], rtol=1e-5, atol=1e-5)
        # What travelled is what the plan says (5 samples in batches of 2, 2, 1).
        traffic = saved["traffic"]
        assert traffic and sum(t.total_bytes for t in traffic) > 0
        assert all(len(t.bytes_sent) == workers for t in traffic)
    lenet_traffic = torch.load(tmp_path / "lenet_rank0.pt", weights_only=False)["traffic"]
    plan = plan_partition(lenet(), (1, 28, 28), [float(a) for a in abilities.split(",")], conv, fc)
    expected = plan_traffic(plan, batch=5)
    assert [t.bytes_sent for t in lenet_traffic] == [t.bytes_sent for t in expected[: len(lenet_traffic)]]
