"""Parameters without a gradient are not stepped by the parameter server, as under DDP.

The masks and the step without processes first; then real server processes (one, or two shards) fed
pushes in which some tensors had no gradient, against a one-process optimizer fed the mean of the
pushes; then a user's script whose first layer is frozen, under SSPStrategy(staleness=0) and cNeural.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import run_train_script
from lightning_hybrid import ClassifierModule
from lightning_hybrid.comm.flat import flatten_in_place
from lightning_hybrid.models import MLP
from lightning_hybrid.parameter_server.client import ParameterServerClient
from lightning_hybrid.parameter_server.gradient_mask import PushedTensors, has_gradient, stepping_only
from lightning_hybrid.parameter_server.update_rule import RoundSum, UpdateRule
from lightning_hybrid.strategies.gradient_sum import gradient_sum
from parameter_servers import sharded_servers


def test_a_step_has_a_gradient_for_the_tensors_any_of_its_pushes_had_one_for():
    pushed = PushedTensors()
    pushed.add(torch.tensor([True, False, False]))
    pushed.add(torch.tensor([False, False, True]))
    assert pushed.take().tolist() == [True, False, True]
    assert pushed.take() is None, "taken: reset (no push is no mask)"
    pushed.add(torch.tensor([False, False, False]))
    pushed.add(None)  # a push without a mask: every tensor had a gradient
    assert pushed.take() is None
    pushed.add(torch.tensor([True, True]))
    assert pushed.take() is None, "every tensor had one: no mask"

    rule = UpdateRule(pushes_per_update=2)
    rule.add(torch.ones(2), staleness=0, has_gradient=torch.tensor([True, False]))
    assert rule.add(torch.ones(2), staleness=1, has_gradient=torch.tensor([False, False]))
    rule.take_average()
    assert rule.stepped.tolist() == [True, False]
    rule.add(torch.ones(2), staleness=0)
    rule.take_average()
    assert rule.stepped is None

    round_ = RoundSum(torch.zeros(2))
    out = torch.empty(2)
    assert not round_.take_average(out), "an empty round is no step"
    round_.add(torch.tensor([2.0, 0.0]), weight=1, has_gradient=torch.tensor([True, False]))
    round_.add(torch.tensor([4.0, 0.0]), weight=3, has_gradient=torch.tensor([True, False]))
    assert round_.take_average(out) and out.tolist() == [1.5, 0.0] and round_.stepped.tolist() == [True, False]


def test_stepping_only_leaves_the_others_to_the_optimizer_and_gives_their_views_back():
    params = [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))]
    _, flat_grads = flatten_in_place(params)
    views = [p.grad for p in params]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.1)
    for _ in range(2):
        with stepping_only(params, torch.tensor([True, False])):
            assert params[1].grad is None
            optimizer.step()
    assert params[1].tolist() == [1.0, 1.0, 1.0] and params[0][0] < 1.0  # weight decay moved the one stepped
    assert all(p.grad is v for p, v in zip(params, views)), "the server's gradient views are back"
    assert params[1] not in optimizer.state or not optimizer.state[params[1]]
    with stepping_only(params, None):
        assert all(p.grad is v for p, v in zip(params, views))


def test_a_push_carries_a_mask_only_when_some_tensor_had_no_gradient():
    """The common case (every parameter has a gradient) sends what it sent before: no mask, no extra payload."""
    client = ParameterServerClient(None, 0)
    sent = []
    client.mailbox.send = lambda request, dst, payloads, bulk=None: sent.append((request, list(payloads)))
    client.send_push(torch.zeros(3), [0.1], torch.empty(3), has_gradient=torch.tensor([True, True]))
    client.send_push(torch.zeros(3), [0.1], torch.empty(3))
    assert [(r.tensors, len(p)) for r, p in sent] == [(0, 1), (0, 1)]
    sent.clear()
    client.send_push(torch.zeros(3), [0.1], torch.empty(3), has_gradient=torch.tensor([True, False]))
    (request, payloads), = sent
    assert request.tensors == 2 and payloads[1].dtype == torch.uint8 and payloads[1].tolist() == [1, 0]


def test_a_lost_workers_share_sums_no_gradient_for_a_frozen_layer():
    """cNeural's adopter computes a lost worker's share outside Lightning's loop: a frozen layer there
    (requires_grad=False, still the optimizer's) has zeros in the sum and no gradient, not an error."""
    torch.manual_seed(0)
    module = ClassifierModule(MLP(activation="relu"))
    module.net.hidden0.requires_grad_(False)
    params = list(module.parameters())
    batches = [(torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))) for _ in range(2)]
    total, samples, has = gradient_sum(module, params, batches)
    assert samples == 8 and has.tolist() == [False, False, True, True]
    frozen = sum(p.numel() for p in params[:2])
    assert total[:frozen].abs().max() == 0 and total[frozen:].abs().max() > 0


# ---------------------------------------------------------------------- real server processes
#: Four tensors of two values: ``both`` has a gradient on both workers, ``frozen`` on none, ``one`` on
#: worker 0 only, ``first`` on both in the first round only. Two shards: (both, frozen), (one, first).
SIZES = (2, 2, 2, 2)
ROUNDS = 3
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.1),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.1, weight_decay=0.1),
}


def make(optimizer: str) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
    rows = torch.randn(len(SIZES), 2, generator=torch.Generator().manual_seed(7))
    params = [torch.nn.Parameter(row.clone()) for row in rows]
    return params, OPTIMIZERS[optimizer](params)


def pushes(round_: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each worker's ``(gradient, has_gradient)`` in ``round_``: zeros where a tensor had none."""
    generator = torch.Generator().manual_seed(round_)
    result = []
    for worker in (0, 1):
        has = torch.tensor([True, False, worker == 0, round_ == 0])
        result.append((torch.randn(8, generator=generator) * has.repeat_interleave(2), has))
    return result


def reference(optimizer: str) -> torch.Tensor:
    """One process: each round a step on the mean of the pushes, a tensor without a gradient in all of
    them given none (as DDP leaves it)."""
    params, opt = make(optimizer)
    for round_ in range(ROUNDS):
        (g0, has0), (g1, has1) = pushes(round_)
        for p, piece, has in zip(params, ((g0 + g1) / 2).split(2), (has0 | has1).tolist()):
            p.grad = piece.clone() if has else None
        opt.step()
    return torch.cat([p.detach() for p in params])


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("staleness", [0, 2])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_server_steps_only_the_parameters_some_push_had_a_gradient_for(optimizer, staleness, shards):
    """Weight decay, momentum and Adam's moments leave a parameter without a gradient where it was; one with
    a gradient on one worker only moves by the average (zeros from the other). Staleness 0: each round is a
    step; staleness 2: each step averages two pushes (``pushes_per_update=2``), here one of each worker's.
    Two shards through shared memory, one through the side channel."""
    rule = {"pushes_per_update": 2} if staleness else {}
    with sharded_servers(shards, staleness, shards == 2, sizes=SIZES, **rule) as clients, ThreadPoolExecutor(2) as pool:
        params, opt = make(optimizer)
        initial = torch.cat([p.detach().clone() for p in params])
        clients[0].init(opt)
        outs = [torch.empty(8), torch.empty(8)]
        for round_ in range(ROUNDS):
            sent = [pool.submit(client.push, grad, [0.1], out, has_gradient=has)
                    for client, (grad, has), out in zip(clients, pushes(round_), outs)]
            [future.result(timeout=30) for future in sent]
        [future.result(timeout=30) for future in [pool.submit(c.finish, out) for c, out in zip(clients, outs)]]
    expected = reference(optimizer)
    for out in outs:
        assert torch.equal(out[2:4], initial[2:4]), f"the parameter no push had a gradient for moved: {out[2:4] - initial[2:4]}"
        torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)
    assert not torch.equal(outs[0][4:6], initial[4:6])


# ---------------------------------------------------------------------- a user's script
@pytest.mark.multiprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", [("ssp", "--staleness", "0"), ("cneural",)], ids=["ssp_staleness_0", "cneural"])
def test_a_frozen_layer_ends_where_it_started(tmp_path, strategy):
    """The user freezes the first layer (requires_grad_(False)) and configure_optimizers hands every
    parameter to SGD with momentum and weight decay: as under DDP, the layer ends exactly where it
    started on both workers while the others train; at staleness 0 the whole model is DDP's."""
    setting = ("--freeze-first-layer", "--momentum", "0.9", "--weight-decay", "0.1", "--epochs", "2", "--samples", "128",
               "--lr", "0.05")
    run_train_script(tmp_path / "run", "--strategy", *strategy, *setting, timeout=120)
    initial = torch.load(tmp_path / "run" / "initial.pt")
    finals = [torch.load(tmp_path / "run" / f"rank{rank}.pt") for rank in (0, 1)]
    for final in finals:
        for name in ("net.hidden0.0.weight", "net.hidden0.0.bias"):
            assert torch.equal(final[name], initial[name]), f"frozen {name} moved by {(final[name] - initial[name]).abs().max()}"
        assert not torch.equal(final["net.output.weight"], initial["net.output.weight"]), "the rest of the model trained"
    if strategy[0] == "ssp":
        run_train_script(tmp_path / "ddp", "--strategy", "ddp", *setting, timeout=120)
        ddp = torch.load(tmp_path / "ddp" / "rank0.pt")
        for name, value in ddp.items():
            torch.testing.assert_close(finals[0][name], value, rtol=1e-5, atol=1e-6, msg=f"SSP(0) != DDP on {name}")
