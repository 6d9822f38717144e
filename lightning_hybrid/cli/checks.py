"""What the command checks before training, so that an error a user can cause ends the command with one
message naming what to change, and a traceback is left for our bugs.

* :func:`check_optimizer`: the optimizer's settings, by building it over one parameter (torch's own checks:
  ``Invalid learning rate: -1`` becomes ``optimizer.lr=-1: ...``).
* :func:`check_model_fits_data`: the model run on one sample of the data's shape, on the meta device (no
  memory, no compute): a 3D network given images is refused by what each expects, before any process starts.
* :func:`check_checkpoint_readable`: a checkpoint to resume from is a whole torch archive (a truncated or
  corrupted ``last.ckpt`` is named as such, with what to do).
* :func:`user_error`: whether an exception is one a user caused (our checks' errors, raised by our code) and
  the message to print in its place.
"""

from __future__ import annotations

import re
import traceback
import zipfile
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig

from lightning_hybrid.data.clinicadl import ClinicaDLFormatError
from lightning_hybrid.data.idx import DataFileError
from lightning_hybrid.data.shapes import sample_shape
from lightning_hybrid.run_folder import ResumeRefused

#: Errors that only ever mean a user's input is wrong, wherever they are raised.
USER_ERRORS = (ResumeRefused, ClinicaDLFormatError, DataFileError)
#: Errors that mean so when our own code raised them (a check with its message); elsewhere they may be a bug.
CHECK_ERRORS = (ValueError, TypeError, FileNotFoundError, NotADirectoryError)
PACKAGE = str(Path(__file__).resolve().parents[1])


class UnreadableCheckpoint(ValueError):
    """A checkpoint file that is not a whole torch archive."""


def check_optimizer(cfg: DictConfig, build: Any) -> None:
    """Build the configured optimizer over one parameter: torch's checks of its settings, named by their key."""
    factory = build(cfg.optimizer)
    try:
        factory([torch.nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as err:
        text = str(err)
        keys = [k for k in cfg.optimizer if not str(k).startswith("_")
                and (str(k) in text or str(k).replace("_", " ") in text.lower() or (k == "lr" and "learning rate" in text))]
        named = ", ".join(f"optimizer.{k}={cfg.optimizer[k]}" for k in keys) or "optimizer"
        raise ValueError(f"{named}: {text} ({cfg.optimizer.get('_target_')}); set a value it accepts") from None


def _expects(net: torch.nn.Module) -> str:
    """What ``net`` takes, by its first layer that fixes it."""
    for module in net.modules():
        if isinstance(module, torch.nn.Conv3d):
            return f"volumes ({module.in_channels} x depth x height x width)"
        if isinstance(module, torch.nn.Conv2d):
            return f"images ({module.in_channels} x height x width)"
        if isinstance(module, torch.nn.Linear):
            return f"vectors of {module.in_features} values (or samples of that many values, flattened)"
    return "other samples"


def check_model_fits_data(model_name: str, data_name: str, net: torch.nn.Module, datamodule: Any) -> None:
    """Run ``net`` on two samples of the data's shape on the meta device; refuse, saying what each expects, if
    it cannot take them (nothing is allocated or computed; an operation the meta device lacks skips the check)."""
    shape = sample_shape(datamodule)
    if shape is None:
        return
    meta = {name: torch.empty_like(t, device="meta") for name, t in [*net.named_parameters(), *net.named_buffers()]}
    try:
        torch.func.functional_call(net, meta, (torch.empty((2, *shape), device="meta"),))
    except (NotImplementedError, AttributeError):
        return
    except (RuntimeError, ValueError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"model={model_name} takes {_expects(net)}, but data={data_name} gives samples of shape {list(shape)} "
            f"(torch: {first}); pick a model for this data, or data for this model"
        ) from None


def check_checkpoint_readable(path: str | None) -> None:
    """Refuse a checkpoint that is not a whole torch archive, naming it and what to do instead."""
    if path is None or not Path(path).is_file():
        return
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError) as err:
        damaged = str(err)
    if damaged is None:
        return
    others = sorted(str(p) for p in Path(path).parent.glob("*.ckpt") if p != Path(path))
    instead = f"resume from another checkpoint (ckpt_path={others[-1]}" + (", ..." if len(others) > 1 else "") + ") or " \
        if others else ""
    raise UnreadableCheckpoint(
        f"the checkpoint {path} is unreadable (truncated or corrupted: {damaged}); {instead}start afresh with "
        "ckpt_path=null (or move the file away)"
    )


def user_error(error: BaseException) -> str | None:
    """The one message to print for ``error`` when a user caused it (None: a bug, whose traceback is wanted)."""
    if isinstance(error, InstantiationException):  # Hydra built an object and its constructor refused its settings
        cause = error.__cause__
        if cause is None or user_error(cause) is None:
            return None
        key = re.search(r"full_key: (\S+)", str(error))
        return f"{key.group(1)}: {user_error(cause)}" if key else user_error(cause)
    if isinstance(error, USER_ERRORS):
        return str(error)
    if isinstance(error, CHECK_ERRORS):
        frames = traceback.extract_tb(error.__traceback__)
        if frames and frames[-1].filename.startswith(PACKAGE):
            return str(error)
    return None
