"""Gradient clipping of the server's averaged gradient, as DDP clips the average of the ranks' gradients.

A worker does not clip its own gradient: it records how Lightning would have clipped it (``gradient_clip_val``
and its algorithm, or a module's ``configure_gradient_clipping`` calling ``clip_gradients``: a
:class:`~lightning_hybrid.comm.clipping.Clip`) and sends that with its push (:func:`clip_numbers`, three
float64 values). The server clips the gradient it steps with (a staleness-0 round's average, a cNeural pass's
mean over every sample, the update rule's average of its pushes), over the parameter tensors with a gradient
in that step, just before the optimizer steps (:func:`clip_average`).

With several server shards (:mod:`~lightning_hybrid.parameter_server.sharding`) each holds a slice of the
gradient, and a norm clip needs the norm of the whole. The shards never talk to each other over the side
channel; each step's part of the norm (the sum of ``|g|^p`` of the shard's slice, or its largest ``|g|``
for ``p = inf``) goes through the run's rendezvous store (:class:`ShardNorms`), where each shard reads the
others' parts of the same step and clips its slice with the coefficient of the whole: the same step as one
server's, to float rounding. Every shard takes the same steps (the same pushes at staleness 0; step ``t``
on every shard with staleness > 0, each averaging the pushes it holds then), so each step's parts meet.
A value clip is element by element: every shard clips its own slice.

Example::

    >>> import torch
    >>> grads = [torch.tensor([3.0, 4.0]), torch.tensor([0.0])]
    >>> clip_average(clip_from(clip_numbers(Clip(1.0)).tolist()), grads, torch.tensor([True, False]))
    >>> grads[0]
    tensor([0.6000, 0.8000])
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from lightning_hybrid.comm.clipping import ALGORITHMS, Clip

#: The float64 values a clip travels as: its value, its algorithm (an index of ``ALGORITHMS``), its norm type.
CLIP_NUMBERS = 3


def clip_numbers(clip: Clip) -> torch.Tensor:
    """``clip`` as the float64 values that follow a push's hyperparameters."""
    return torch.tensor([clip.value, float(ALGORITHMS.index(clip.algorithm)), clip.norm_type], dtype=torch.float64)


def clip_from(values: Sequence[float]) -> Clip:
    """The clip :func:`clip_numbers` made ``values`` of."""
    value, algorithm, norm_type = values
    return Clip(value, ALGORITHMS[int(algorithm)], norm_type)


class ShardNorms:
    """Each server shard's part of a step's gradient norm, on the run's store (see the module doc): shard
    ``shard`` of ``shards`` posts its part of step ``t`` under ``prefix`` and reads the others'. ``store``:
    a client of the run's rendezvous store; a wait longer than ``timeout_s`` is an error, and one ends early
    (the others' parts counted as 0) once a shard has said that the run stops (:meth:`stop`)."""

    def __init__(self, store, shard: int, shards: int, prefix: str = "", timeout_s: float = 300.0) -> None:
        self._store, self.shard, self.shards = store, shard, shards
        self._prefix, self.timeout_s = f"{prefix}clip_norms/", timeout_s

    def _key(self, step: int, shard: int) -> str:
        return f"{self._prefix}{step}/{shard}"

    def others(self, step: int, part: float, norm_type: float) -> float:
        """Post this shard's ``part`` of step ``step``; the norm of the other shards' slices together."""
        self._store.set(self._key(step, self.shard), repr(part))
        keys = [self._key(step, s) for s in range(self.shards) if s != self.shard]
        if not self._wait(keys, step):
            return 0.0
        parts = [float(self._store.get(key)) for key in keys]
        if step > 0:  # every shard has read this shard's part of the step before: it waited for this one's
            self._store.delete_key(self._key(step - 1, self.shard))
        if math.isinf(norm_type):
            return max(parts)
        return sum(parts) ** (1.0 / norm_type)

    def _wait(self, keys: list[str], step: int) -> bool:
        """Whether ``keys`` were all posted (False: the run stops); polled (a store wait that times out
        logs a warning of its own), at once, then at most every millisecond."""
        deadline, pause = time.monotonic() + self.timeout_s, 0.0
        while not self._store.check(keys):
            if self._store.check([f"{self._prefix}stopped"]):
                return False
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"parameter server shard {self.shard} waited {self.timeout_s:.0f} s for the other shards' part of the "
                    f"gradient norm of step {step} (to clip it): a shard died or stalled; see the other processes' errors"
                )
            time.sleep(pause)
            pause = min(1e-3, pause + 5e-5)
        return True

    def stop(self) -> None:
        """The run stops (a worker's signal): no shard waits for another's part any more."""
        self._store.set(f"{self._prefix}stopped", "1")


def _part(grads: Sequence[torch.Tensor], norm_type: float) -> float:
    """This shard's part of the whole gradient's ``norm_type`` norm (see the module doc)."""
    norms = [torch.linalg.vector_norm(g, norm_type) for g in grads if g.numel()]
    if not norms:
        return 0.0
    if math.isinf(norm_type):
        return float(torch.stack(norms).max())
    return float(torch.stack(norms).double().pow(norm_type).sum())


def clip_average(clip: Clip, grads: Sequence[torch.Tensor], stepped: torch.Tensor | None = None,
                 norms: ShardNorms | None = None, step: int = 0) -> None:
    """Clip the gradients ``grads`` (a step's averaged gradient, one tensor per parameter, in place) as
    ``clip`` says, over the tensors ``stepped`` says had a gradient in the step (None: all); with
    ``norms``, a norm clip takes the norm over every shard's slice of step ``step``."""
    chosen = list(grads) if stepped is None else [g for g, has in zip(grads, stepped.tolist()) if has]
    if norms is not None and clip.algorithm == "norm":
        others = norms.others(step, _part(chosen, clip.norm_type), clip.norm_type)
        # The other shards' norm as one more "tensor": Clip's total over it and ours is the whole gradient's.
        chosen.append(torch.tensor([others], dtype=torch.float32, device=chosen[0].device if chosen else "cpu"))
    clip.apply(chosen)
