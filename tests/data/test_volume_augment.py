"""Batched 3D augmentation on the device: per-sample flips, affine transforms and noise."""

from __future__ import annotations

import pytest
import torch

from lightning_hybrid.data.volume_augment import VolumeAugment


def volumes(n: int = 4) -> torch.Tensor:
    return torch.randn(n, 1, 10, 12, 14, generator=torch.Generator().manual_seed(0))


def test_nothing_drawn_is_the_identity():
    x = volumes()
    assert torch.equal(VolumeAugment(flip_prob=0, affine_prob=0, noise_prob=0)(x), x)


def test_flip_mirrors_the_chosen_axis_of_every_sample():
    x = volumes()
    for axis in (0, 1, 2):
        out = VolumeAugment(flip_prob=1, flip_axis=axis, affine_prob=0, noise_prob=0)(x)
        assert torch.equal(out, x.flip(2 + axis))


def test_affine_without_rotation_or_scaling_resamples_in_place():
    x = volumes()
    out = VolumeAugment(flip_prob=0, affine_prob=1, rotate=0, scale=0, noise_prob=0)(x)
    torch.testing.assert_close(out, x, atol=1e-5, rtol=0)


def test_each_sample_draws_its_own_transform_and_a_seed_repeats_them():
    x = volumes(1).expand(16, -1, -1, -1, -1).contiguous()  # 16 copies of one volume
    out = VolumeAugment(seed=3)(x)
    distinct = {tuple(v.flatten()[:50].tolist()) for v in out}
    assert len(distinct) > 4  # flips, affines and noise differ between samples
    torch.testing.assert_close(VolumeAugment(seed=3)(x), out)
    assert not torch.allclose(VolumeAugment(seed=4)(x), out)


def test_bad_settings():
    with pytest.raises(ValueError, match="probability"):
        VolumeAugment(noise_prob=1.5)
    with pytest.raises(ValueError, match="spatial axis"):
        VolumeAugment(flip_axis=3)
    with pytest.raises(ValueError, match="batch, channels"):
        VolumeAugment()(torch.zeros(2, 8, 8, 8))
