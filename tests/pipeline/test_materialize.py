"""A model built on the meta device (``configure_model()``) and materialised stage by stage gets the values
``__init__`` gives it: its layers' ``reset_parameters()`` replayed in order, then its ``init_weights(block)``
hook (3D-ResAttNet's Kaiming initialisation); tied parameters refused across stages and kept tied
within one; initialisation in ``__init__`` without the hook warned about, by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_hybrid.models.resattnet3d import ResAttNet3D
from lightning_hybrid.pipeline.materialize import (
    NoteInitialisation, RecordRandomState, check_ties, init_weights_hook, is_freed, materialize, tied_parameters,
)


def on_meta(build):
    torch.manual_seed(0)
    with RecordRandomState() as recorded, NoteInitialisation() as noted, torch.device("meta"):
        model = build()
    return model, recorded.states, noted


def small_resattnet():
    return ResAttNet3D(depth=18, base_channels=4, attention_stages=(2, 3))


@pytest.mark.parametrize("keep", [range(0, 2), range(3, 6), range(7, 12)])  # the first, a middle and the last stage
def test_a_stage_of_resattnet_equals_init_with_its_init_weights_hook(keep):
    torch.manual_seed(0)
    whole = small_resattnet()
    model, states, noted = on_meta(small_resattnet)
    blocks = list(model.children())
    assert len(blocks) == 12 and keep.stop <= len(blocks)
    materialize(blocks, keep, "cpu", states, init_weights=model.init_weights)
    for index, (block, expected) in enumerate(zip(blocks, whole.children())):
        if index not in keep:
            assert is_freed(block)
            continue
        for (name, value), want in zip(block.state_dict().items(), expected.state_dict().values()):
            torch.testing.assert_close(value, want, rtol=0, atol=0, msg=f"block {index}: {name}")
    assert noted.warn_unreplayed(model, hooked=True) == []  # ResAttNet3D initialises in init_weights only


def test_without_the_hook_the_convolutions_get_reset_parameters_values():
    torch.manual_seed(0)
    whole = small_resattnet()
    model, states, _ = on_meta(small_resattnet)
    blocks = list(model.children())
    materialize(blocks, range(0, 2), "cpu", states)
    assert not torch.equal(blocks[0][0].weight, whole[0][0].weight)  # the stem's convolution: Kaiming-uniform, not normal


class OwnInit(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        nn.init.orthogonal_(self[0].weight)


def test_initialisation_in_init_without_the_hook_is_warned_about_by_name():
    model, _, noted = on_meta(OwnInit)
    with pytest.warns(UserWarning, match=r"OwnInit initialises 0\.weight \(orthogonal_\) in __init__, outside "
                                         r"reset_parameters\(\).*init_weights\(block\)"):
        assert noted.warn_unreplayed(model, hooked=False) == ["0.weight (orthogonal_)"]


class Tied(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self[2].weight = self[0].weight


def test_ties_across_stages_are_refused_naming_them_and_kept_within_a_stage():
    torch.manual_seed(0)
    whole = Tied()
    model, states, _ = on_meta(Tied)
    blocks, names = list(model.children()), ["embed", "act", "unembed"]
    assert tied_parameters(blocks) == [[(0, "weight"), (2, "weight")]]
    with pytest.raises(ValueError, match=r"embed\.weight \(stage 0\) and unembed\.weight \(stage 1\) are one tensor"):
        check_ties(blocks, [range(0, 2), range(2, 3)], names)
    check_ties(blocks, [range(0, 3)], names)
    materialize(blocks, range(0, 3), "cpu", states)
    assert blocks[2].weight is blocks[0].weight, "to_empty unties; materialize ties them again"
    for value, want in zip(model.state_dict().values(), whole.state_dict().values()):
        torch.testing.assert_close(value, want, rtol=0, atol=0)


def test_the_hook_is_found_on_the_blocks_or_the_module_and_must_take_a_block():
    class Whole(nn.Module):
        def init_weights(self, buffer_device=None):  # torchtitan's whole-model signature
            pass

    model = small_resattnet()
    assert init_weights_hook(nn.Sequential(), model) == model.init_weights
    assert init_weights_hook(nn.Sequential(), nn.Linear(1, 1)) is None
    with pytest.raises(TypeError, match=r"Whole.init_weights\(buffer_device=None\) takes no `block`"):
        init_weights_hook(Whole(), model)
