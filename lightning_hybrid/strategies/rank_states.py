"""Checkpoints of ranks that differ between sync points: every rank's own weights, optimizer state and
algorithm state, gathered into rank 0's file.

Under local SGD each rank trains its own copy for a round, and under delayed gradient averaging each
rank's weights hold its last ``delay`` gradients of its own: a checkpoint written between sync points
(a stop, ``every_n_train_steps``) that held rank 0's state alone would resume every rank as rank 0,
not as the run was. :class:`RankStates` (a mixin before the strategy class) writes, when the
strategy says its ranks differ now (:meth:`RankStates.ranks_differ`), each rank's own part beside the
part every rank shares, and a run resumed from it gives each rank its own again (with as many ranks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from lightning_hybrid.comm.collectives import gather_object


class RankStates:
    """Mixin for a Lightning strategy (see the module docstring). Subclasses name :attr:`rank_states_key`
    and implement :meth:`ranks_differ`, :meth:`shared_state` and :meth:`own_state`; after a resume,
    :attr:`restored` holds ``{"shared": ..., "own": ...}`` (this rank's), for their setup."""

    #: Where a checkpoint keeps the ranks' states.
    rank_states_key: ClassVar[str]
    #: What the checkpoint being resumed from held for this rank (None: nothing of its own).
    restored: dict[str, Any] | None = None

    def ranks_differ(self) -> bool:
        """Whether the ranks hold different states now (the same answer on every rank)."""
        raise NotImplementedError

    def shared_state(self) -> Any:
        """The algorithm's state every rank holds alike (None: none)."""
        return None

    def own_state(self) -> Any:
        """This rank's own algorithm state, besides its weights and optimizer state (None: none)."""
        return None

    def keeps_own_model(self) -> bool:
        """A run resumed from a checkpoint written between sync points starts from each rank's own weights."""
        return self.restored is not None

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Every rank calls this; where the ranks differ, each one's state is gathered to rank 0 (alone: the
        other ranks hold only their own) for its file."""
        if self.ranks_differ():
            own = ({k: v.detach().cpu() for k, v in self.lightning_module.state_dict().items()},
                   self.optimizers[0].state_dict(), self.own_state())
            ranks = gather_object(own, dst=0)
            if ranks is not None:
                checkpoint = {**checkpoint, self.rank_states_key: {"shared": self.shared_state(), "ranks": ranks}}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        saved = checkpoint.pop(self.rank_states_key, None)
        self.restored = None
        if saved is not None:
            if len(saved["ranks"]) != self.world_size:
                raise ValueError(f"the checkpoint {checkpoint_path} was written by {len(saved['ranks'])} ranks between sync "
                                 f"points; this run has {self.world_size}: {type(self).__name__} resumes it only with as many "
                                 "(each rank takes its own weights and optimizer state), or from an epoch-end checkpoint")
            weights, optimizer, own = saved["ranks"][self.global_rank]
            self.restored = {"shared": saved["shared"], "own": own, "weights": weights, "optimizer": optimizer}
        return checkpoint

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        if self.restored is not None:
            checkpoint = {**checkpoint, "state_dict": self.restored["weights"]}
        super().load_model_state_dict(checkpoint, strict=strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        if self.restored is not None:
            checkpoint = {**checkpoint, "optimizer_states": [self.restored["optimizer"]]}
        super().load_optimizer_state_dict(checkpoint)
