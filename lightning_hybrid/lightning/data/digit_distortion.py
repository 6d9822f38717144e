# Generated from lightning_hybrid/data/digit_distortion.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""Distortions of digit images (elastic and affine), and MNIST expanded with them into a shard store.

cNeural (paper 002) trains on MNIST expanded to 0.5 M - 2 M samples by distorting the 60,000
training digits. A :class:`Distortion` is one random affine map (rotation, scaling of each axis,
horizontal shear, about the image centre) composed with an elastic distortion (Simard, Steinkraus
and Platt 2003: a random displacement field, uniform in [-1, 1] per pixel and axis, smoothed by a
Gaussian of ``sigma`` pixels and scaled by ``alpha``). Every image of a batch gets its own draw, and
the whole batch is resampled at once: one ``gaussian_filter`` over the stack of fields (sigma
``(0, s, s)``, so images never mix) and one bilinear ``map_coordinates`` over the ``(B, H, W)`` stack
with coordinates ``(3, B, H, W)`` (the batch coordinate is exact, so again images never mix; this is
why the interpolation is bilinear: a spline of order 2 or more would blend neighbouring images).
Pixels that come from outside the image are 0 (background). numpy and scipy only.

Example::

    >>> import numpy as np
    >>> digits = np.zeros((2, 28, 28), np.uint8)
    >>> digits[:, 6:22, 12:16] = 255                      # two "1"s
    >>> out = distort(digits, seed=0)
    >>> out.shape, out.dtype, bool((out != digits).any())
    ((2, 28, 28), dtype('uint8'), True)
    >>> bool((distort(digits, seed=0, distortion=Distortion.none()) == digits).all())
    True
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy import ndimage

from lightning_hybrid.lightning.data.shards import ShardStore, ShardWriter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Distortion:
    """The ranges random distortions are drawn from; the defaults are the usual ones for MNIST.

    Args:
        alpha: scale of the elastic displacement field, in pixels (0 turns the elastic part off).
        sigma: standard deviation, in pixels, of the Gaussian that smooths the field (smaller is
            more turbulent, larger is closer to an affine map).
        rotation: largest rotation, in degrees; drawn uniformly in ``[-rotation, rotation]``.
        scale: range of the scale factor, drawn uniformly and independently for the horizontal and
            the vertical axis (so it also changes the aspect ratio); ``(1, 1)`` keeps the size.
        shear: largest horizontal shear angle, in radians (0.3 rad is about 17 degrees, a slanted
            handwriting); drawn uniformly in ``[-shear, shear]``.

    The defaults (alpha 36, sigma 6: Ciresan et al. 2010's smooth elastic fields; rotation +-10
    degrees, scale 0.9-1.1, shear +-0.2 rad) keep digits readable: on real MNIST a distorted image
    correlates 0.69 with its source on average (pixel-wise), and a 1-nearest-neighbour classifier
    fitted on 10,000 originals labels 84 % of distorted held-out digits correctly (95 % of the
    undistorted ones). Simard et al.'s alpha 34, sigma 4 with rotation 15, scale 0.85-1.15 and
    shear 0.3 is much stronger (correlation 0.55, 1-NN 69 %; some 9s turn into 7s).
    """

    alpha: float = 36.0
    sigma: float = 6.0
    rotation: float = 10.0
    scale: tuple[float, float] = (0.9, 1.1)
    shear: float = 0.2

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if not 0 <= self.rotation <= 180:
            raise ValueError(f"rotation must be in [0, 180] degrees, got {self.rotation}")
        low, high = self.scale
        if not 0 < low <= high:
            raise ValueError(f"scale must be a range (low, high) with 0 < low <= high, got {self.scale}")
        if not 0 <= self.shear < math.pi / 2:
            raise ValueError(f"shear must be in [0, pi/2) radians, got {self.shear}")
        object.__setattr__(self, "scale", (float(low), float(high)))

    @classmethod
    def none(cls) -> Distortion:
        """No distortion at all: images come back unchanged."""
        return cls(alpha=0.0, rotation=0.0, scale=(1.0, 1.0), shear=0.0)

    @property
    def is_affine_identity(self) -> bool:
        return self.rotation == 0 and self.scale == (1.0, 1.0) and self.shear == 0


def _check_images(images: np.ndarray) -> np.ndarray:
    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"images must have shape (N, H, W), got {images.shape}")
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 pixels (0-255, like MNIST's), got dtype {images.dtype}")
    return images


def _affine_matrices(draws: np.ndarray, d: Distortion) -> np.ndarray:
    """Per-image (B, 2, 2) maps from output to source coordinates, in (x, y) order, from (B, 4) uniforms."""
    angle = np.deg2rad(d.rotation) * (2 * draws[:, 0] - 1)
    low, high = d.scale
    sx, sy = low + (high - low) * draws[:, 1], low + (high - low) * draws[:, 2]
    shear = np.tan(d.shear * (2 * draws[:, 3] - 1))
    cos, sin, one, zero = np.cos(angle), np.sin(angle), np.ones_like(angle), np.zeros_like(angle)
    rotate = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    slant = np.stack([np.stack([one, shear], -1), np.stack([zero, one], -1)], -2)
    stretch = np.stack([np.stack([sx, zero], -1), np.stack([zero, sy], -1)], -2)
    forward = rotate @ slant @ stretch  # what happens to the digit; sampling needs the inverse
    return np.linalg.inv(forward)


def _distort(images: np.ndarray, d: Distortion, affine_rng: np.random.Generator,
             field_rng: np.random.Generator) -> np.ndarray:
    """Distort a checked (B, H, W) uint8 batch. Each image consumes a fixed count of draws from each
    generator, in order, so results do not depend on how a stream of images is cut into batches."""
    b, h, w = images.shape
    if b == 0:
        return images.copy()
    rows, cols = np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64)
    cy, cx = (h - 1) / 2, (w - 1) / 2
    coords = np.empty((3, b, h, w))
    coords[0] = np.arange(b, dtype=np.float64)[:, None, None]
    if d.is_affine_identity:
        coords[1] = rows[None, :, None]
        coords[2] = cols[None, None, :]
    else:
        m = _affine_matrices(affine_rng.random((b, 4)), d)
        u, v = (cols - cx)[None, None, :], (rows - cy)[None, :, None]  # output x, y about the centre
        coords[2] = m[:, 0, 0, None, None] * u + m[:, 0, 1, None, None] * v + cx
        coords[1] = m[:, 1, 0, None, None] * u + m[:, 1, 1, None, None] * v + cy
    if d.alpha > 0:
        noise = field_rng.random((b, 2, h, w), dtype=np.float32)
        noise = np.ascontiguousarray(noise.transpose(1, 0, 2, 3)).reshape(2 * b, h, w)
        noise = noise * 2 - 1
        fields = ndimage.gaussian_filter(noise, sigma=(0, d.sigma, d.sigma), mode="constant", cval=0.0)
        fields = fields.reshape(2, b, h, w)
        coords[2] += d.alpha * fields[0]
        coords[1] += d.alpha * fields[1]
    out = ndimage.map_coordinates(images.astype(np.float32), coords, order=1, mode="grid-constant", cval=0.0,
                                  prefilter=False, output=np.float32)
    np.rint(out, out=out)
    np.clip(out, 0, 255, out=out)
    return out.astype(np.uint8)


def distort(images: np.ndarray, seed: int | np.random.Generator | None = None,
            distortion: Distortion | None = None) -> np.ndarray:
    """Randomly distorted copies of ``images`` (uint8, (N, H, W)): uint8, the same shape and order.

    ``seed`` (an int or a numpy Generator) makes the draws reproducible; ``distortion`` gives the
    ranges (default :class:`Distortion()`). See the module docstring for an example.
    """
    images = _check_images(images)
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    return _distort(images, distortion or Distortion(), rng, rng)


def _cycled_permutations(rng: np.random.Generator, n: int, count: int, batch: int):
    """Yield ``count`` source indices in chunks of ``batch``: a fresh random permutation of ``range(n)``
    after every ``n``, so each source is used equally often (to within one) and classes stay balanced."""
    perm, used = rng.permutation(n), 0
    while count > 0:
        chunk = []
        need = min(batch, count)
        while need > 0:
            if used == n:
                perm, used = rng.permutation(n), 0
            take = min(need, n - used)
            chunk.append(perm[used: used + take])
            used, need = used + take, need - take
        indices = np.concatenate(chunk)
        count -= len(indices)
        yield indices


def augment_mnist(images: np.ndarray, labels: np.ndarray, samples: int, out: str, shard_size: int = 50_000,
                  seed: int = 0, include_originals: bool = True, batch: int = 2048,
                  distortion: Distortion | None = None) -> ShardStore:
    """Write ``samples`` samples of MNIST expanded with distortions into the shard store ``out``.

    The store has the layout of ``lightning-hybrid data pack``: ``x`` uint8 ``(n, 1, H, W)``, ``y``
    int64. With ``include_originals`` the first samples are ``images`` themselves, in order (only the
    first ``samples`` of them when ``samples <= len(images)``); the rest are distorted copies of the
    sources taken in a random order that visits every source once before any source again. Work is
    done ``batch`` images at a time and streamed through :class:`ShardWriter`, so memory stays at a
    shard plus a batch whatever ``samples`` is. The same ``seed`` gives the same store whatever
    ``batch`` and ``shard_size`` are. Progress (samples written of the total, samples per second) is
    logged at INFO every shard.

    Args:
        images: source digits, uint8 ``(N, H, W)``.
        labels: their labels, ``(N,)``; a copy keeps its source's label.
        samples: total samples to write, >= 1.
        out: store folder or fsspec URL.
        shard_size: samples per shard.
        seed: seed of the order of sources and of every distortion.
        include_originals: write the sources themselves first.
        batch: images distorted at once (about 80 bytes of memory per pixel: 130 MB for 2048 MNIST
            digits; larger batches are not faster).
        distortion: the distortion ranges (default :class:`Distortion()`).

    Example::

        >>> import numpy as np
        >>> digits = np.zeros((3, 28, 28), np.uint8); digits[:, 6:22, 12:16] = 255
        >>> store = augment_mnist(digits, np.array([1, 1, 1]), 10, "memory://doc-augment", shard_size=4)
        >>> [s["samples"] for s in store.shards], store.manifest["x_shape"], store.load([2])[1].tolist()
        ([4, 4, 2], [1, 28, 28], [1, 1])
    """
    images = _check_images(images)
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(images):
        raise ValueError(f"labels must have shape ({len(images)},), one per image, got {labels.shape}")
    if isinstance(samples, bool) or not isinstance(samples, (int, np.integer)) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if len(images) == 0:
        raise ValueError("no source images (images has length 0)")
    distortion = distortion or Distortion()
    samples, n = int(samples), len(images)
    labels = labels.astype(np.int64)
    order_seq, affine_seq, field_seq = np.random.SeedSequence(seed).spawn(3)
    affine_rng, field_rng = np.random.default_rng(affine_seq), np.random.default_rng(field_seq)
    originals = min(n, samples) if include_originals else 0

    start = time.perf_counter()

    def progress(writer: ShardWriter) -> None:
        rate = writer.num_samples / max(time.perf_counter() - start, 1e-9)
        log.info("augment-mnist: %d/%d samples (%.0f%%), %d shards, %.0f samples/s", writer.num_samples,
                 samples, 100 * writer.num_samples / samples, len(writer.shards), rate)

    with ShardWriter(out, shard_size, on_shard=progress) as writer:
        writer.write(images[:originals, None], labels[:originals])  # a view: full shards are written uncopied
        for indices in _cycled_permutations(np.random.default_rng(order_seq), n, samples - originals, batch):
            writer.write(_distort(images[indices], distortion, affine_rng, field_rng)[:, None], labels[indices])
    return writer.store
