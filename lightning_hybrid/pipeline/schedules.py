"""Pipeline schedules as lists of typed actions, one list per stage.

A training step splits the batch into ``m`` micro-batches; stage ``s`` of ``n`` runs a forward
(``F``) and a backward (``B``) of each. A schedule is the order in which each stage runs them;
what travels between stages follows from the action and the stage's position (a forward on a stage
after the first receives its input from the stage before and, unless it is the last stage, sends
its output on; a backward receives the output's gradient from the stage after and, unless it is
the first stage, sends its input's gradient back), so the lists hold computation only, as
``torch.distributed.pipelining`` writes ``F0 F1 B0 ...``:

* :func:`gpipe` (Huang et al. 2019): every forward, then every backward; ``m`` activations in
  flight per stage.
* :func:`one_f_one_b` (PipeDream-Flush, Narayanan et al. 2019): stage ``s`` runs ``n - s - 1``
  forwards to fill the pipeline, then alternates one forward and one backward, then drains; at most
  ``n - s`` activations in flight.
* :func:`forward_only`: inference.

:func:`check` runs a schedule on paper (blocking receives, sends that never block) and raises if
it could deadlock or leaves work undone, so a new schedule can be tested without processes.

Example::

    >>> " ".join(map(str, one_f_one_b(stage=0, stages=2, micro_batches=3)))
    'F0 F1 B0 F2 B1 B2'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    FORWARD = "F"
    BACKWARD = "B"


@dataclass(frozen=True)
class Action:
    """Run ``kind`` on micro-batch ``micro_batch``."""

    kind: Kind
    micro_batch: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.micro_batch}"


def _forwards(micro_batches: range) -> list[Action]:
    return [Action(Kind.FORWARD, i) for i in micro_batches]


def _backwards(micro_batches: range) -> list[Action]:
    return [Action(Kind.BACKWARD, i) for i in micro_batches]


def forward_only(stage: int, stages: int, micro_batches: int) -> list[Action]:
    return _forwards(range(micro_batches))


def gpipe(stage: int, stages: int, micro_batches: int) -> list[Action]:
    return _forwards(range(micro_batches)) + _backwards(range(micro_batches))


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[Action]:
    warmup = min(stages - stage - 1, micro_batches)
    actions = _forwards(range(warmup))
    for i in range(micro_batches - warmup):  # steady state: one forward, one backward
        actions += [Action(Kind.FORWARD, warmup + i), Action(Kind.BACKWARD, i)]
    return actions + _backwards(range(micro_batches - warmup, micro_batches))


Schedule = Callable[[int, int, int], list[Action]]
#: Training schedules by name.
SCHEDULES: dict[str, Schedule] = {"GPipe": gpipe, "1F1B": one_f_one_b}


def check(lists: Sequence[Sequence[Action]], micro_batches: int, train: bool = True) -> None:
    """Raise a ValueError unless the stages' action lists run to the end without deadlock, each
    stage doing every forward (and, with ``train``, every backward) exactly once, in micro-batch
    order per kind, a backward never before its forward."""
    stages = len(lists)
    for s, actions in enumerate(lists):
        for kind in (Kind.FORWARD, *((Kind.BACKWARD,) if train else ())):
            order = [a.micro_batch for a in actions if a.kind == kind]
            if order != list(range(micro_batches)):
                raise ValueError(f"stage {s}: {kind.value} runs micro-batches {order}, not 0..{micro_batches - 1} in order")
        if not train and any(a.kind == Kind.BACKWARD for a in actions):
            raise ValueError(f"stage {s}: a backward in a forward-only schedule")
    done: set[tuple[int, Kind, int]] = set()
    position = [0] * stages

    def ready(s: int, action: Action) -> bool:
        i = action.micro_batch
        if action.kind == Kind.FORWARD:
            return s == 0 or (s - 1, Kind.FORWARD, i) in done
        return (s, Kind.FORWARD, i) in done and (s == stages - 1 or (s + 1, Kind.BACKWARD, i) in done)

    while any(position[s] < len(lists[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while position[s] < len(lists[s]) and ready(s, lists[s][position[s]]):
                action = lists[s][position[s]]
                done.add((s, action.kind, action.micro_batch))
                position[s] += 1
                progressed = True
        if not progressed:
            waiting = {s: str(lists[s][position[s]]) for s in range(stages) if position[s] < len(lists[s])}
            raise ValueError(f"the schedule deadlocks: stages wait at {waiting}")
