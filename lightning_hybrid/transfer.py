"""Transfer learning as ClinicaDL does it (``clinicadl train ... --transfer_path``): a run starts from the
weights another run trained (pMCI vs sMCI from the AD vs CN model), not from a random initialisation.

* :func:`transfer_checkpoint`: the checkpoint a ``transfer_path`` names: a ``.ckpt`` file, or a run
  folder of ``lightning-hybrid`` (its ``run.yaml`` records the best checkpoint; else its newest).
* :func:`load_transferred`: copies a checkpoint's tensors into a module, by name. Every parameter and
  buffer the module holds must be in the checkpoint with the same shape (else refused, naming them);
  the checkpoint may hold more (a pipeline stage builds only its part of the model), and tensors on
  the meta device (another stage's, in a pipeline stage) are left as they are.

Only weights travel: the optimizer, the scheduler, the epoch and the callbacks' state start afresh
(resuming a run is ``ckpt_path``'s business). Plain torch: no Lightning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from lightning_hybrid import run_folder


def transfer_checkpoint(path: str | Path) -> Path:
    """The checkpoint file ``path`` names (a file, or a run folder: its recorded best checkpoint, else
    its newest). Raises ``FileNotFoundError`` saying what was looked for."""
    path = Path(path).expanduser()
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"transfer_path={path}: no such file or folder (give a .ckpt file or the run "
                                f"folder of the run to start from)")
    record = run_folder.read_record(path) or {}
    best = record.get("best_checkpoint")
    if best and Path(best).is_file():
        return Path(best)
    newest = run_folder.newest_checkpoint(path)
    if newest is None:
        raise FileNotFoundError(f"transfer_path={path}: the folder holds no checkpoint (its {run_folder.RECORD} "
                                f"names no best checkpoint and checkpoints/ has no .ckpt file)")
    return newest


def read_state_dict(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model weights of a Lightning checkpoint (its ``state_dict``) or of a plain saved state dict."""
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)  # tensors and plain values only
    state = saved.get("state_dict", saved) if isinstance(saved, Mapping) else None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{checkpoint}: neither a Lightning checkpoint nor a state dict of tensors")
    return dict(state)


def load_transferred(module: nn.Module, state: Mapping[str, torch.Tensor], source: str = "the checkpoint") -> int:
    """Copies ``state``'s tensors into ``module``'s parameters and buffers of the same names (those it
    holds: not on the meta device); returns how many were copied. Raises ``ValueError`` naming the module's tensors that ``state`` lacks or
    holds in another shape (another architecture, another number of classes)."""
    own = module.state_dict()
    missing = [name for name in own if name not in state]
    mismatched = [f"{name} {tuple(state[name].shape)} vs {tuple(t.shape)}" for name, t in own.items()
                  if name in state and state[name].shape != t.shape]
    if missing or mismatched:
        problems = []
        if missing:
            problems.append(f"{len(missing)} tensors of the model are not in it ({', '.join(missing[:5])}"
                            f"{', ...' if len(missing) > 5 else ''})")
        if mismatched:
            problems.append(f"{len(mismatched)} have another shape ({'; '.join(mismatched[:5])}"
                            f"{'; ...' if len(mismatched) > 5 else ''})")
        raise ValueError(f"cannot start from {source}: {' and '.join(problems)}; transfer needs the same "
                         f"model (model=..., its width and the number of classes) as the run that saved it")
    held = {name: tensor for name, tensor in own.items() if not tensor.is_meta}  # meta: another stage's
    with torch.no_grad():
        for name, tensor in held.items():
            tensor.copy_(state[name].to(device=tensor.device, dtype=tensor.dtype))
    return len(held)
