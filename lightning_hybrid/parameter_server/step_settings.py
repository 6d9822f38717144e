"""What a server step takes from the pushes besides their gradients: the hyperparameters of every parameter
group and the gradient clip (the worker's scheduler and Lightning's clipping, as DDP would apply them).

Each push brings its worker's values (:mod:`~lightning_hybrid.parameter_server.hyperparameters`: every number
of each group, or, in the protocol's first form, each group's learning rate) and its step's clip, if any
(:mod:`~lightning_hybrid.parameter_server.average_clip`). :class:`StepSettings` keeps the newest push's, and
before each optimizer step sets them on the server's groups, corrects SGD's momentum for the asynchrony
(:meth:`~lightning_hybrid.parameter_server.update_rule.UpdateRule.momentum`, applied to the momentum the worker
sent, the scheduled one; the optimizer's momentum at ``Init`` while pushes bring learning rates only) and
clips the step's averaged gradient. With staleness 0 the newest push is the round's last, and every worker of
the round sends the same values (the same schedule at the same step); with staleness > 0 it is the push that
completed the step, as a parameter server applies the pushing worker's learning rate.

Example::

    >>> import torch
    >>> from lightning_hybrid.parameter_server.hyperparameters import GroupLayout
    >>> from lightning_hybrid.parameter_server.update_rule import UpdateRule
    >>> p = torch.nn.Parameter(torch.zeros(2)); p.grad = torch.tensor([3.0, 4.0])
    >>> server = torch.optim.SGD([p], lr=1.0, momentum=0.9)
    >>> settings = StepSettings(server, [p], UpdateRule())
    >>> worker = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5, momentum=0.5)
    >>> layout = GroupLayout.of(worker.param_groups)
    >>> settings.pushed(0, layout.values(worker.param_groups).tolist() + [1.0, 0.0, 2.0], layout.fingerprint, clip=True)
    >>> settings.before_step(None, step=0); server.param_groups[0]["momentum"], p.grad
    (0.5, tensor([0.6000, 0.8000]))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lightning_hybrid.comm.clipping import Clip
from lightning_hybrid.parameter_server.average_clip import CLIP_NUMBERS, ShardNorms, clip_average, clip_from
from lightning_hybrid.parameter_server.hyperparameters import LEARNING_RATES, GroupLayout
from lightning_hybrid.parameter_server.protocol import Push
from lightning_hybrid.parameter_server.update_rule import UpdateRule

class StepSettings:
    """The server's hyperparameters and clip for its next step (see the module doc), for ``optimizer`` over
    ``params`` (their ``.grad`` the step's gradient); ``norms``: with several shards, the others' norms."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], rule: UpdateRule,
                 norms: ShardNorms | None = None) -> None:
        self.optimizer, self.params, self.rule, self.norms = optimizer, list(params), rule, norms
        self.layout = GroupLayout.of(optimizer.param_groups)
        self._configured = self._momenta()  # before the asynchrony's correction: Init's, or the newest push's
        self._values: list[float] | None = None
        self._kind = LEARNING_RATES
        #: The newest push's clip (None: it clipped nothing).
        self.clip: Clip | None = None

    def _momenta(self) -> list[float | None]:
        return [group.get("momentum") if isinstance(group.get("momentum"), (int, float)) else None
                for group in self.optimizer.param_groups]

    def received(self, worker: int, request: Push, payload) -> None:
        """The float64 values of ``worker``'s push ``request``, next in its ``payload``, become the newest."""
        numbers = payload.take(torch.float64, request.hyperparameters + CLIP_NUMBERS * request.clip).tolist()
        self.pushed(worker, numbers, request.layout, bool(request.clip))

    def pushed(self, worker: int, numbers: Sequence[float], layout: int, clip: bool) -> None:
        """A push's float64 values (its ``layout``'s, then, with ``clip``, the clip's) become the newest; a
        RuntimeError when they do not fit the server's optimizer."""
        count = len(numbers) - (CLIP_NUMBERS if clip else 0)
        groups = len(self.optimizer.param_groups)
        if layout == LEARNING_RATES and count != groups:
            raise RuntimeError(f"worker {worker} pushed {count} learning rates; the server's optimizer has {groups} "
                               "param groups")
        if layout != LEARNING_RATES and (layout != self.layout.fingerprint or count != self.layout.size):
            raise RuntimeError(
                f"worker {worker} pushed {count} hyperparameter values of another layout than the optimizer worker 0 "
                f"sent ({self.layout.size} values: {self.layout.keys}): every worker's configure_optimizers must "
                "give the same param groups with the same keys"
            )
        self._values, self._kind = list(numbers[:count]), layout
        self.clip = clip_from(numbers[count:]) if clip else None

    def before_step(self, stepped: torch.Tensor | None, step: int) -> None:
        """Set the newest hyperparameters on the optimizer's groups (the momentum corrected), and clip the
        gradient of the tensors ``stepped`` says had one (None: all) in server step ``step`` (0 the first)."""
        groups = self.optimizer.param_groups
        if self._values is not None and self._kind == LEARNING_RATES:
            for group, lr in zip(groups, self._values):
                group["lr"] = lr
        elif self._values is not None:
            self.layout.apply(groups, self._values)
            self._configured = self._momenta()  # the worker's momentum: the correction starts from it
        for group, configured in zip(groups, self._configured):
            if configured is not None:  # SGD-style momentum, corrected for the asynchrony's own
                group["momentum"] = self.rule.momentum(configured)
        if self.clip is not None:
            clip_average(self.clip, [p.grad for p in self.params], stepped, self.norms, step)

    def stop(self) -> None:
        """The run stops: no shard waits for this one's part of a norm any more."""
        if self.norms is not None:
            self.norms.stop()
