"""The pipeline algorithm without Lightning: schedules on paper, and a real two-process pipeline over gloo."""

from __future__ import annotations

import tempfile
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from lightning_hybrid.models import LeNet5
from lightning_hybrid.pipeline import Mesh, PipelineParallel
from lightning_hybrid.pipeline.schedules import SCHEDULES, Action, Kind, check, forward_only, gpipe, one_f_one_b
from lightning_hybrid.pipeline.stage_executor import StageProfile, describe_stage_times, stage_time_metrics


def lists(schedule, stages, micro):
    return [schedule(s, stages, micro) for s in range(stages)]


@pytest.mark.parametrize("stages", [1, 2, 3, 5])
@pytest.mark.parametrize("micro", [1, 2, 4, 7])
def test_every_schedule_runs_to_the_end(stages, micro):
    for schedule in SCHEDULES.values():
        check(lists(schedule, stages, micro), micro)
    check(lists(forward_only, stages, micro), micro, train=False)


def test_one_f_one_b_keeps_at_most_stages_minus_position_activations():
    for stage, actions in enumerate(lists(one_f_one_b, 4, 8)):
        in_flight, most = 0, 0
        for action in actions:
            in_flight += 1 if action.kind == Kind.FORWARD else -1
            most = max(most, in_flight)
        assert most == 4 - stage
    assert [a.kind for a in gpipe(0, 4, 8)][:8] == [Kind.FORWARD] * 8  # GPipe: every forward before any backward


def test_a_deadlocking_order_is_caught():
    bad = [[Action(Kind.FORWARD, 0), Action(Kind.BACKWARD, 0)], [Action(Kind.BACKWARD, 0), Action(Kind.FORWARD, 0)]]
    with pytest.raises(ValueError, match="deadlocks"):
        check(bad, 1)
    with pytest.raises(ValueError, match="not 0..1 in order"):
        check([[Action(Kind.FORWARD, 1), Action(Kind.FORWARD, 0)]], 2, train=False)


def test_mesh_layout_and_stage_ranks():
    mesh = Mesh(stages=2, replicas=2, order=(1, 0))
    assert mesh.stage_ranks(0) == [1, 0] and mesh.stage_ranks(1) == [3, 2]
    assert [mesh.stage_of(r) for r in range(4)] == [1, 0, 1, 0]


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(12, 1, 28, 28, generator=g), torch.randint(0, 10, (12,), generator=g)


def _net():
    torch.manual_seed(1)
    return LeNet5()


def _two_stages(rank: int, init_file: str, out: str, schedule: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    net = _net()
    blocks = list(net.named_children())
    mesh = Mesh(stages=2, replicas=1, order=(1, 0))  # rank 1 runs the first stage
    groups = mesh.groups(rank)
    pipeline = PipelineParallel(blocks, [(0, 3), (3, len(blocks))], mesh, rank, groups.pipeline, torch.device("cpu"),
                                message_group=groups.messages)
    x, y = _data()
    loss, output = pipeline.train_step(x, y, F.cross_entropy, schedule=schedule, micro_batches=3)
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    profile = pipeline.executor.profile.as_dict()
    predicted = pipeline.forward(x, micro_batches=4)
    pipeline.gather_model()
    torch.save({"loss": loss, "output": output, "grads": grads, "predicted": predicted,
                "norm": pipeline.clip_grad_norm_(1e9), "profile": profile,
                "profile_after_forward": pipeline.executor.profile.as_dict()}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_two_stage_pipeline_equals_one_device(tmp_path, schedule):
    mp.start_processes(_two_stages, args=(tempfile.mktemp(dir=tmp_path), str(tmp_path), schedule), nprocs=2,
                       join=True, start_method="forkserver")
    net = _net()
    x, y = _data()
    output = net(x)
    loss = F.cross_entropy(output, y)
    loss.backward()
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    got: dict[str, torch.Tensor] = {}
    for r in results:
        torch.testing.assert_close(r["loss"], loss.detach(), atol=1e-6, rtol=1e-5)  # every rank has the loss
        torch.testing.assert_close(r["output"], output.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(r["predicted"], output.detach(), atol=1e-5, rtol=1e-5)
        assert not set(got) & set(r["grads"])  # each parameter's gradient lives on exactly one stage
        got.update(r["grads"])
    for name, p in net.named_parameters():
        torch.testing.assert_close(got[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in net.parameters())).item()
    assert results[0]["norm"] == pytest.approx(norm, rel=1e-5) == results[1]["norm"]
    for r in results:  # where each stage's time went in the training step (evaluation leaves it alone)
        assert r["profile"]["steps"] == 1 and r["profile"]["compute_s"] > 0 and r["profile"]["wait_s"] > 0, r["profile"]
        assert r["profile_after_forward"] == r["profile"]
    metrics = stage_time_metrics([r["profile"] for r in results])
    assert metrics["pipeline/rank1_compute_ms"] == pytest.approx(1000 * results[1]["profile"]["compute_s"])
    assert describe_stage_times([r["profile"] for r in results]).startswith("rank 0: compute ")


def test_stage_time_metrics_are_per_step_and_skip_ranks_without_steps():
    times = [{"compute_s": 3.0, "wait_s": 1.0, "send_s": 0.5, "steps": 10}, None,
             {"compute_s": 0.0, "wait_s": 0.0, "send_s": 0.0, "steps": 0}]
    metrics = stage_time_metrics(times)
    assert metrics == {"pipeline/rank0_compute_ms": 300.0, "pipeline/rank0_wait_ms": 100.0, "pipeline/rank0_send_ms": 50.0}
    assert describe_stage_times(times) == "rank 0: compute 300, wait 100, send 50"
    profile = StageProfile(compute_s=1.0, steps=2)
    with profile.timing("wait_s"):
        pass
    assert profile.wait_s > 0
    profile.reset()
    assert profile.as_dict() == {"compute_s": 0.0, "wait_s": 0.0, "send_s": 0.0, "steps": 0.0}


# ---------------------------------------------------------------------- the module protocol
class _Plain(torch.nn.Module):
    """A plain module (as a LightningModule would be): its model in one nn.Sequential attribute."""

    def __init__(self, with_loss: bool = True, stray: bool = False) -> None:
        super().__init__()
        self.model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
        if with_loss:
            self.loss_fn = torch.nn.CrossEntropyLoss()
        if stray:
            self.head = torch.nn.Linear(2, 2)  # parameters outside the sequence: no automatic split

    def forward(self, x):
        return self.model(x)


def test_a_plain_module_is_split_at_its_sequential_and_trained_with_its_loss_attribute():
    from lightning_hybrid.pipeline import pipeline_blocks, pipeline_loss

    module = _Plain()
    assert pipeline_blocks(module) is module.model
    assert pipeline_loss(module) is module.loss_fn
    with pytest.raises(TypeError, match=r"needs a loss.*self.loss_fn"):
        pipeline_loss(_Plain(with_loss=False))
    with pytest.raises(TypeError, match=r"no pipeline_blocks\(\) and no nn.Sequential holding all of its parameters"):
        pipeline_blocks(_Plain(stray=True))


def test_the_protocol_wins_over_a_found_sequential():
    from lightning_hybrid import ClassifierModule
    from lightning_hybrid.pipeline import pipeline_blocks, pipeline_loss

    module = ClassifierModule(LeNet5())
    assert pipeline_blocks(module) is module.pipeline_blocks()
    assert pipeline_loss(module) == module.pipeline_loss


def _stage_checkpoint(rank: int, init_file: str, out: str) -> None:
    """Rank 0 holds block 0, rank 1 block 1 (the other's on the meta device); rank 0 gathers."""
    from lightning_hybrid.pipeline.materialize import free
    from lightning_hybrid.pipeline.stage_checkpoint import block_holders, gather_optimizer_state, gather_state_dict, own_part

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    net[1].running_mean.fill_(float(rank + 1))  # the holder's values must win
    free(net[1 - rank])  # the other stage's block, as a stage-only rank holds it
    holders = block_holders(list(net), [range(0, 1), range(1, 2)], lambda stage: stage)
    full = gather_state_dict(net, holders, rank, 0, None, torch.device("cpu"))
    optimizer = torch.optim.Adam([p for p in net.parameters() if not p.is_meta])
    sum(p.sum() for p in net.parameters() if not p.is_meta).backward()
    optimizer.step()
    params = list(net.parameters())  # the optimizer's order over the whole model: index = position here
    position = {id(p): i for i, p in enumerate(params)}
    state = {"state": {position[id(p)]: s for p, s in optimizer.state.items()}, "param_groups": []}
    gathered = gather_optimizer_state(state, params, holders, rank, 0, None)
    loaded = own_part(dict.fromkeys(net.state_dict()), net.state_dict(keep_vars=True))
    own = sorted(k for k, v in loaded.items() if v is None)  # the rest: this rank's own meta tensors
    whole = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).state_dict()
    with warnings.catch_warnings(record=True) as caught:  # a stage-only rank loads a whole model's checkpoint
        warnings.simplefilter("always")
        net.load_state_dict(own_part(whole, net.state_dict(keep_vars=True)))
    torch.save({"full": full, "optimizer": gathered, "own": own, "warnings": [str(w.message) for w in caught]},
               f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.multiprocess
def test_a_stage_only_model_is_gathered_on_one_rank_tensor_by_tensor(tmp_path):
    mp.start_processes(_stage_checkpoint, args=(tempfile.mktemp(dir=tmp_path), str(tmp_path)), nprocs=2,
                       join=True, start_method="forkserver")
    first, second = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).state_dict()
    assert set(first["full"]) == set(reference) and second["full"] == {}
    torch.testing.assert_close(first["full"]["0.weight"], reference["0.weight"])
    torch.testing.assert_close(first["full"]["1.weight"], reference["1.weight"])
    assert first["full"]["1.running_mean"].eq(2.0).all(), "block 1's buffers come from rank 1, which holds them"
    assert sorted(first["optimizer"]["state"]) == [0, 1, 2, 3], "every parameter's Adam state reaches rank 0"
    assert sorted(second["optimizer"]["state"]) == [2, 3], "rank 1 keeps its own"
    assert first["own"] == ["0.bias", "0.weight"] and second["own"] == sorted(["1.weight", "1.bias", "1.running_mean",
                                                                                "1.running_var", "1.num_batches_tracked"])
    assert first["warnings"] == second["warnings"] == []  # no "copying ... to a meta parameter" for BatchNorm's count


def test_micro_batches_of_one_sample_that_batchnorm_refuses_say_how_to_split_instead(tmp_path):
    """A batch of 4 in 4 micro-batches gives BatchNorm one value per channel: the error names the fix (torch's
    own message says only that it expected more); in 2 micro-batches the same batch trains."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        blocks = [("flatten", torch.nn.Flatten()), ("linear", torch.nn.Linear(4, 3)), ("norm", torch.nn.BatchNorm1d(3))]
        mesh = Mesh(stages=1, replicas=1)
        groups = mesh.groups(0)
        pipeline = PipelineParallel(blocks, [(0, 3)], mesh, 0, groups.pipeline, torch.device("cpu"),
                                    message_group=groups.messages)
        x, y = torch.randn(4, 1, 2, 2), torch.randint(0, 3, (4,))
        with pytest.raises(ValueError, match=r"a batch of 4 split into 4 micro-batches of 1 sample each .*"
                                             r"\(strategy.micro_batches=2\) or raise the batch size \(data.batch_size=8\)"):
            pipeline.train_step(x, y, F.cross_entropy, schedule="GPipe", micro_batches=4)
        loss, _ = pipeline.train_step(x, y, F.cross_entropy, schedule="GPipe", micro_batches=2)
        assert torch.isfinite(loss)
    finally:
        dist.destroy_process_group()
