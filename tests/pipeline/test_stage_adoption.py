"""A rank adopting its pipeline stage (lightning_hybrid.pipeline.stage_adoption), without a Trainer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hybrid.pipeline.materialize import RecordRandomState, is_freed
from lightning_hybrid.pipeline.stage_adoption import adopt_stage, drop_optimizer_state, free_other_stages, meta_outside_blocks


def three_blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5), nn.Linear(5, 2))


def stepped_sgd(model: nn.Module) -> torch.optim.SGD:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    return optimizer


def test_free_other_stages_frees_exactly_the_blocks_outside_the_stage_and_returns_their_parameters():
    model = three_blocks()
    kept = [p.detach().clone() for p in model[1].parameters()]
    others = [p for i in (0, 2) for p in model[i].parameters()]
    freed = free_other_stages(list(model), range(1, 2))
    assert [id(p) for p in freed] == [id(p) for p in others]  # the same objects, for the optimizer's state
    assert all(p.is_meta for p in freed)
    assert is_freed(model[0]) and is_freed(model[2]) and not is_freed(model[1])
    assert all(torch.equal(a, b) for a, b in zip(model[1].parameters(), kept))


def test_drop_optimizer_state_forgets_only_the_given_parameters():
    model = three_blocks()
    optimizer = stepped_sgd(model)
    assert len(optimizer.state) == 6
    dropped = list(model[0].parameters())
    drop_optimizer_state([optimizer], dropped)
    assert all(p not in optimizer.state for p in dropped)
    assert all("momentum_buffer" in optimizer.state[p] for i in (1, 2) for p in model[i].parameters())
    drop_optimizer_state([optimizer], dropped)  # again: nothing left to drop, no error


class WithOutside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("offset", torch.zeros(1))


def test_meta_outside_blocks_names_meta_tensors_no_block_holds():
    model = WithOutside()
    assert meta_outside_blocks(model, model.blocks) == []
    with torch.device("meta"):
        meta = WithOutside()
    assert meta_outside_blocks(meta, meta.blocks) == ["scale", "offset"]  # the blocks' own meta tensors are not named
    assert meta_outside_blocks(meta, []) == ["scale", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
                                            "blocks.1.bias", "offset"]


def test_adopt_stage_of_a_whole_model_frees_the_others_and_their_optimizer_state():
    model = three_blocks()
    optimizer = stepped_sgd(model)
    kept = {name: t.detach().clone() for name, t in model[2].named_parameters()}
    adopt_stage(list(model), ["a", "b", "c"], [range(0, 2), range(2, 3)], range(2, 3), [optimizer])
    assert is_freed(model[0]) and is_freed(model[1]) and not is_freed(model[2])
    assert set(optimizer.state) == set(model[2].parameters())
    assert all(torch.equal(t, kept[name]) for name, t in model[2].named_parameters())


def test_adopt_stage_of_a_meta_model_materialises_the_values_one_process_draws():
    torch.manual_seed(3)
    whole = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5), nn.Linear(5, 2))
    torch.manual_seed(3)
    with RecordRandomState() as recorded, torch.device("meta"):
        meta = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 5), nn.Linear(5, 2))
    with torch.inference_mode():  # the first batch may be a sanity check's
        adopt_stage(list(meta), ["a", "b", "c"], [range(0, 1), range(1, 3)], range(1, 3), states=recorded.states)
    assert is_freed(meta[0]) and not is_freed(meta[1]) and not is_freed(meta[2])
    for index in (1, 2):
        for mine, reference in zip(meta[index].parameters(), whole[index].parameters()):
            assert not mine.is_inference()
            assert torch.equal(mine, reference)


def test_adopt_stage_refuses_a_parameter_tied_across_stages():
    shared = nn.Linear(4, 4)
    blocks = [shared, nn.Sequential(nn.ReLU(), shared)]
    with pytest.raises(ValueError, match="tied weights"):
        adopt_stage(blocks, ["first", "second"], [range(0, 1), range(1, 2)], range(0, 1))
    assert not is_freed(blocks[1])  # refused before anything was freed
