"""What a server step takes from the pushes besides their gradients, as DDP would: every hyperparameter a
scheduler changes (not only the learning rate), and the clip of the averaged gradient.

The layout of the groups' values and the clip's norm across shards without processes first; then real server
processes (one, or two shards) fed pushes whose learning rate, momentum and clip change every round, against
a one-process SGD fed the clipped mean of the pushes; then a user's script (OneCycleLR cycling the momentum at
every step, ``gradient_clip_val``) under SSPStrategy(staleness=0) and cNeural against DDP.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conftest import SUPPORT, free_port, run_script, shared_folder
from lightning_hybrid.comm.clipping import Clip
from lightning_hybrid.parameter_server.average_clip import ShardNorms, clip_average, clip_from, clip_numbers
from lightning_hybrid.parameter_server.client import ParameterServerClient
from lightning_hybrid.parameter_server.hyperparameters import GroupLayout
from lightning_hybrid.parameter_server.step_settings import StepSettings
from lightning_hybrid.parameter_server.update_rule import UpdateRule
from parameter_servers import sharded_servers

SCRIPT = SUPPORT / "schedule_clip_script.py"


def sgd(lr: float = 0.1, momentum: float = 0.9) -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=lr, momentum=momentum, weight_decay=0.1)


# ---------------------------------------------------------------------- the layout of the groups' values
def test_every_number_of_every_group_travels_and_comes_back_as_it_was():
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(1))]
    worker = torch.optim.AdamW([{"params": params[:1]}, {"params": params[1:], "lr": 1, "name": "head"}], lr=0.01)
    layout = GroupLayout.of(worker.param_groups)
    assert (0, "betas") in layout.keys and (1, "lr") in layout.keys and (1, "name") not in layout.keys
    assert (1, "foreach") not in layout.keys, "None is no number: it travels once, with the optimizer"
    worker.param_groups[0]["betas"] = (0.85, 0.99)  # OneCycleLR's cycled beta1
    worker.param_groups[1]["lr"] = 0.5  # an int the scheduler made a float
    worker.param_groups[1]["amsgrad"] = True
    values = layout.group_values(worker.param_groups)
    assert values.values.dtype == torch.float64 and values.values.numel() == layout.size
    server = torch.optim.AdamW([{"params": [torch.nn.Parameter(torch.ones(2))]},
                                {"params": [torch.nn.Parameter(torch.ones(1))], "lr": 1, "name": "head"}], lr=0.01)
    assert GroupLayout.of(server.param_groups).fingerprint == values.layout
    layout.apply(server.param_groups, values.values.tolist())
    assert server.param_groups[0]["betas"] == (0.85, 0.99) and server.param_groups[1]["lr"] == 0.5
    assert server.param_groups[1]["amsgrad"] is True and server.param_groups[1]["name"] == "head"
    assert GroupLayout.of(sgd().param_groups).fingerprint != values.layout


def test_a_value_the_server_could_not_follow_is_an_error_naming_it():
    params = [torch.nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.SGD(params, lr=torch.tensor(0.1), momentum=0.9)  # a tensor learning rate: no number
    layout = GroupLayout.of(optimizer.param_groups)
    layout.values(optimizer.param_groups)  # unchanged: fine
    optimizer.param_groups[0]["lr"].fill_(0.05)  # what a scheduler does to a tensor rate
    with pytest.raises(ValueError, match=r"param group 0's 'lr' changed from tensor\(0.1000\) to tensor\(0.0500\).*float"):
        layout.values(optimizer.param_groups)
    optimizer = sgd()
    layout = GroupLayout.of(optimizer.param_groups)
    optimizer.param_groups[0]["momentum"] = None
    with pytest.raises(ValueError, match="param group 0's 'momentum' is now None"):
        layout.values(optimizer.param_groups)
    optimizer.param_groups[0]["momentum"] = 0.9
    optimizer.param_groups[0]["swa_lr"] = 0.01
    with pytest.raises(ValueError, match="param group 0 has the keys .*'swa_lr'.*cannot follow a key added"):
        layout.values(optimizer.param_groups)
    optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
    with pytest.raises(ValueError, match="the optimizer has 2 param groups; it had 1"):
        layout.values(optimizer.param_groups)


def test_the_step_takes_the_newest_push_and_corrects_the_momentum_the_worker_sent():
    param = torch.nn.Parameter(torch.zeros(2))
    server = sgd(momentum=0.9)
    server.param_groups[0]["params"] = [param]
    rule = UpdateRule(momentum_correction="mean_delay")
    rule.mean_staleness = 1.0
    settings = StepSettings(server, [param], rule)
    settings.before_step(None, step=0)
    assert server.param_groups[0]["momentum"] == pytest.approx(rule.momentum(0.9)), "no push yet: Init's momentum"
    worker = sgd(lr=0.02, momentum=0.8)
    layout = GroupLayout.of(worker.param_groups)
    settings.pushed(0, layout.values(worker.param_groups).tolist(), layout.fingerprint, clip=False)
    settings.before_step(None, step=1)
    group = server.param_groups[0]
    assert group["lr"] == 0.02 and group["momentum"] == pytest.approx(rule.momentum(0.8)) and rule.momentum(0.8) < 0.8
    settings.pushed(1, [0.03], 0, clip=False)  # the first form: learning rates only
    settings.before_step(None, step=2)
    assert group["lr"] == 0.03 and group["momentum"] == pytest.approx(rule.momentum(0.8)), "the sent momentum stays"
    with pytest.raises(RuntimeError, match="worker 1 pushed 2 learning rates; the server's optimizer has 1 param groups"):
        settings.pushed(1, [0.03, 0.01], 0, clip=False)
    other = GroupLayout.of(torch.optim.Adam([torch.nn.Parameter(torch.ones(1))]).param_groups)
    with pytest.raises(RuntimeError, match="worker 1 pushed .* of another layout"):
        settings.pushed(1, [0.0] * other.size, other.fingerprint, clip=False)


def test_a_push_carries_the_groups_values_and_the_clip():
    client = ParameterServerClient(None, 0)
    sent = []
    client.mailbox.send = lambda request, dst, payloads, bulk=None: sent.append((request, list(payloads)))
    optimizer = sgd()
    layout = GroupLayout.of(optimizer.param_groups)
    client.send_push(torch.zeros(2), layout.group_values(optimizer.param_groups), torch.empty(2), clip=Clip(0.5, "value"))
    client.send_push(torch.zeros(2), [0.1], torch.empty(2))
    (full, (numbers,)), (lrs, (rates,)) = sent
    assert (full.hyperparameters, full.layout, full.clip) == (layout.size, layout.fingerprint, 1)
    assert clip_from(numbers[layout.size:].tolist()) == Clip(0.5, "value")
    assert (lrs.hyperparameters, lrs.layout, lrs.clip, rates.tolist()) == (1, 0, 0, [0.1])


# ---------------------------------------------------------------------- the clip's norm across shards
def test_shards_clip_their_slices_by_the_norm_of_the_whole():
    """Two shards, each half of the gradient, meet on a store: each clips its half as one clip of the whole
    would; a value clip is each element's; a shard told that the run stops waits no more."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    grads = [torch.tensor([3.0, 0.0]), torch.tensor([4.0]), torch.tensor([12.0, 0.0])]
    whole = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(whole, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(whole, 1.0)
    expected = [p.grad for p in whole]
    halves = [[g.clone() for g in grads[:2]], [grads[2].clone()]]
    norms = [ShardNorms(dist.TCPStore("127.0.0.1", port, is_master=False), s, 2, "run/", timeout_s=10) for s in (0, 1)]
    for step in range(2):
        threads = [threading.Thread(target=clip_average, args=(Clip(1.0), halves[s], None, norms[s], step)) for s in (0, 1)]
        [t.start() for t in threads]
        [t.join(timeout=10) for t in threads]
    torch.testing.assert_close(halves[0] + halves[1], expected)  # the second step: clipped already, unchanged
    assert not store.check(["run/clip_norms/0/0"]), "a step's parts are removed once every shard has read them"
    stepped = torch.tensor([False, True])
    mine = [torch.tensor([30.0, 0.0]), torch.tensor([3.0])]
    clip_average(Clip(1.0), mine, stepped)  # a tensor without a gradient in the step is left out of the norm
    torch.testing.assert_close(mine, [torch.tensor([30.0, 0.0]), torch.tensor([1.0])])
    norms[1].stop()
    assert norms[0].others(5, 1.0, 2.0) == 0.0, "the run stops: no waiting for a part that will not come"
    assert clip_from(clip_numbers(Clip(2.0, "norm", float("inf"))).tolist()) == Clip(2.0, "norm", float("inf"))


# ---------------------------------------------------------------------- real server processes
ROUNDS = 3
#: Each round's learning rate, momentum and clip, as the workers' scheduler and Lightning give them.
SCHEDULE = [(0.1, 0.9, Clip(0.5)), (0.05, 0.8, Clip(0.02, "value")), (0.2, 0.95, None)]


def make() -> tuple[list[torch.nn.Parameter], torch.optim.SGD]:
    rows = torch.randn(4, 2, generator=torch.Generator().manual_seed(7))
    params = [torch.nn.Parameter(row.clone()) for row in rows]
    return params, torch.optim.SGD(params, lr=0.3, momentum=0.5, weight_decay=0.1)


def gradients(round_: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(round_)
    return [torch.randn(8, generator=generator) * 2 for _ in (0, 1)]


#: torch's clips, as Lightning calls them on DDP's averaged gradient.
TORCH_CLIPS = {"norm": torch.nn.utils.clip_grad_norm_, "value": torch.nn.utils.clip_grad_value_}


def reference() -> torch.Tensor:
    """One process, as DDP: each round the rates of the round, the mean of the pushes clipped, one step."""
    params, optimizer = make()
    for round_, (lr, momentum, clip) in enumerate(SCHEDULE):
        mean = torch.stack(gradients(round_)).mean(dim=0)
        for p, piece in zip(params, mean.split(2)):
            p.grad = piece.clone()
        if clip is not None:
            TORCH_CLIPS[clip.algorithm](params, clip.value)
        optimizer.param_groups[0].update(lr=lr, momentum=momentum)
        optimizer.step()
    return torch.nn.utils.parameters_to_vector(params).detach()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("staleness", [0, 2])
def test_the_server_steps_at_the_pushed_hyperparameters_with_the_average_clipped(staleness, shards):
    """Each round both workers push their gradient with the round's learning rate, momentum and clip (their
    scheduler's, as under DDP every rank's is the same); the server's step takes them and clips the mean,
    as a one-process SGD fed the clipped mean. Staleness 0: each round is a step; staleness 2: each step
    averages two pushes (``pushes_per_update=2``). Two shards clip by the norm of the whole gradient."""
    rule = {"pushes_per_update": 2} if staleness else {}
    with sharded_servers(shards, staleness, False, sizes=(2, 2, 2, 2), **rule) as clients, ThreadPoolExecutor(2) as pool:
        params, optimizer = make()
        layout = GroupLayout.of(optimizer.param_groups)
        clients[0].init(optimizer)
        outs = [torch.empty(8), torch.empty(8)]
        for round_, (lr, momentum, clip) in enumerate(SCHEDULE):
            optimizer.param_groups[0].update(lr=lr, momentum=momentum)  # the workers' scheduler
            values = layout.group_values(optimizer.param_groups)
            sent = [pool.submit(client.push, grad, values, out, clip=clip)
                    for client, grad, out in zip(clients, gradients(round_), outs)]
            [future.result(timeout=30) for future in sent]
        [future.result(timeout=30) for future in [pool.submit(c.finish, out) for c, out in zip(clients, outs)]]
    expected = reference()
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------- a user's script
def _run(out: Path, *args: str) -> Path:
    run_script(SCRIPT, out, *args, timeout=120)
    return out


def _assert_ddps(run: Path, ddp: Path, name: str) -> None:
    expected = torch.load(ddp / "rank0.pt")
    for rank in (0, 1):
        final = torch.load(run / f"rank{rank}.pt")
        for key, value in expected.items():
            torch.testing.assert_close(final[key], value, rtol=0, atol=1e-6, msg=f"{name} != DDP on {key} (rank {rank})")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("servers", ["1", "2"])
def test_ssp_staleness_0_follows_a_momentum_schedule_and_clips_the_average_as_ddp(tmp_path, tmp_path_factory, servers):
    """OneCycleLR cycles SGD's learning rate and momentum at every step and the Trainer clips the gradient's
    norm to 0.5: SSPStrategy(staleness=0) ends with DDP's weights (one server, or two shards whose norm
    spans both). Before, the server stepped at its initial momentum (0.12 off DDP) and averaged the
    workers' own clipped gradients (0.006 off)."""
    setting = ("--clip", "0.5")
    ddp = shared_folder(tmp_path_factory, "schedule_clip_ddp", lambda out: _run(out, "--strategy", "ddp", *setting))
    ssp = _run(tmp_path, "--strategy", "ssp", "--servers", servers, *setting)
    _assert_ddps(ssp, ddp, f"SSP(0), {servers} server(s)")
    momentum = torch.load(ssp / "groups.pt")[0]["momentum"]
    assert 0.8 < momentum < 0.95 and momentum != 0.9, "the schedule moved the momentum"


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_cneural_clips_each_pass_mean_as_ddp_clips_an_epoch_accumulated(tmp_path, tmp_path_factory):
    """A cNeural pass is one step of full-batch descent: DDP's equivalent accumulates the whole epoch
    (4 batches a rank here) and clips that once. With the momentum scheduled per step (a step is a pass)."""
    setting = ("--clip", "0.05", "--accumulate", "4", "--epochs", "3")  # 0.5 would not bite on a pass's mean
    ddp = shared_folder(tmp_path_factory, "schedule_clip_ddp_epoch", lambda out: _run(out, "--strategy", "ddp", *setting))
    _assert_ddps(_run(tmp_path, "--strategy", "cneural", *setting), ddp, "cNeural")
