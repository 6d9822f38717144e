# Generated from lightning_hybrid/data/volume_augment.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Random augmentation of whole batches of 3D volumes, on whatever device the batch is on.

The ADNI datamodule's training augmentation (flips, small affine transforms, Gaussian noise: the
same family as MONAI's ``RandFlipd``, ``RandAffined`` and ``RandGaussianNoised`` it used per sample
in the loader) done as a few batched tensor operations, so that on a GPU it costs a fraction of a
training step instead of keeping DataLoader workers busy. Each sample draws its own flip, affine
transform and noise, as it would per sample.

Example::

    >>> import torch
    >>> augment = VolumeAugment(seed=0)
    >>> augment(torch.zeros(2, 1, 8, 8, 8)).shape
    torch.Size([2, 1, 8, 8, 8])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class VolumeAugment:
    """Per-sample random flip, affine transform and noise of a ``(batch, channels, D, H, W)`` tensor.

    Args:
        flip_prob: probability of mirroring a sample along ``flip_axis`` (0: the first spatial axis).
        affine_prob: probability of a random affine transform: rotation about each axis uniform in
            ``+-rotate`` radians, scale of each axis uniform in ``1 +- scale`` (trilinear, zeros outside).
        noise_prob: probability of adding Gaussian noise of standard deviation ``noise_std``.
        seed: seed of the draws (a generator on the batch's device, created at the first call).
    """

    flip_prob: float = 0.5
    flip_axis: int = 0
    affine_prob: float = 0.5
    rotate: float = 0.05
    scale: float = 0.05
    noise_prob: float = 0.2
    noise_std: float = 0.05
    seed: int = 0
    _generators: dict[str, torch.Generator] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("flip_prob", "affine_prob", "noise_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {getattr(self, name)}")
        if self.flip_axis not in (0, 1, 2):
            raise ValueError(f"flip_axis must be a spatial axis 0, 1 or 2, got {self.flip_axis}")

    def _generator(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[key]

    def _uniform(self, n: int, low: float, high: float, device: torch.device, g: torch.Generator, *shape: int) -> torch.Tensor:
        return torch.rand(n, *shape, device=device, generator=g) * (high - low) + low

    def __call__(self, volumes: torch.Tensor) -> torch.Tensor:
        if volumes.dim() != 5:
            raise ValueError(f"expected a (batch, channels, D, H, W) tensor, got shape {tuple(volumes.shape)}")
        n, device = volumes.shape[0], volumes.device
        g = self._generator(device)
        out = volumes
        flip = self._uniform(n, 0, 1, device, g) < self.flip_prob
        if flip.any():
            mask = flip.view(n, 1, 1, 1, 1)
            out = torch.where(mask, out.flip(2 + self.flip_axis), out)
        affine = self._uniform(n, 0, 1, device, g) < self.affine_prob
        angles = self._uniform(n, -self.rotate, self.rotate, device, g, 3)
        scales = self._uniform(n, 1 - self.scale, 1 + self.scale, device, g, 3)
        if affine.any():
            chosen = affine.nonzero().flatten()
            out = out.clone() if out is volumes else out
            out[chosen] = self._affine(out[chosen], angles[chosen], scales[chosen])
        noisy = self._uniform(n, 0, 1, device, g) < self.noise_prob
        if noisy.any():
            noise = torch.randn(out.shape, device=device, generator=g, dtype=out.dtype) * self.noise_std
            out = out + noise * noisy.view(n, 1, 1, 1, 1)
        return out

    @staticmethod
    def _affine(volumes: torch.Tensor, angles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        """Each sample rotated by its ``angles`` (radians about the three axes) and scaled by its
        ``scales``, about the volume's centre."""
        n, device = volumes.shape[0], volumes.device
        cos, sin = angles.cos(), angles.sin()
        one, zero = torch.ones(n, device=device), torch.zeros(n, device=device)
        rx = torch.stack([one, zero, zero, zero, cos[:, 0], -sin[:, 0], zero, sin[:, 0], cos[:, 0]], 1).view(n, 3, 3)
        ry = torch.stack([cos[:, 1], zero, sin[:, 1], zero, one, zero, -sin[:, 1], zero, cos[:, 1]], 1).view(n, 3, 3)
        rz = torch.stack([cos[:, 2], -sin[:, 2], zero, sin[:, 2], cos[:, 2], zero, zero, zero, one], 1).view(n, 3, 3)
        matrix = rz @ ry @ rx @ torch.diag_embed(1.0 / scales)  # maps output coordinates to input ones
        theta = torch.cat([matrix, torch.zeros(n, 3, 1, device=device)], dim=2)
        grid = F.affine_grid(theta, list(volumes.shape), align_corners=False)
        return F.grid_sample(volumes, grid.to(volumes.dtype), mode="bilinear", padding_mode="zeros", align_corners=False)
