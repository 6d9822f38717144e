"""What a datamodule says of its samples before its set-up: one sample's shape and one step's batch."""

from __future__ import annotations

from typing import Any


def sample_shape(datamodule: Any) -> tuple[int, ...] | None:
    """The shape of one sample of ``datamodule`` where it says so before its set-up (None: it does not).

    Example::

        >>> from types import SimpleNamespace
        >>> sample_shape(SimpleNamespace(input_shape=[1, 28, 28])), sample_shape(None)
        ((1, 28, 28), None)
    """
    shape = getattr(datamodule, "input_shape", None)
    if shape is None and getattr(datamodule, "view", None) is not None:  # ADNI: one channel of the view's volume
        shape = (1, *datamodule.view.shape)
    return tuple(int(s) for s in shape) if shape is not None else None


def batch_size_of(datamodule: Any) -> int | None:
    """The samples of one step on one rank (``batch_size``, or the hyperparameter), or None.

    Example::

        >>> from types import SimpleNamespace
        >>> batch_size_of(SimpleNamespace(batch_size=4)), batch_size_of(SimpleNamespace(hparams={"batch_size": 8}))
        (4, 8)
    """
    batch = getattr(datamodule, "batch_size", None) or (getattr(datamodule, "hparams", None) or {}).get("batch_size")
    return int(batch) if batch else None
