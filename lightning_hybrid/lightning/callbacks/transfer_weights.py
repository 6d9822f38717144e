# Generated from lightning_hybrid/callbacks/transfer_weights.py by `python tools/generate_lightning_namespace.py`: edit that file, not this one.
"""The callback that loads weights from another run's checkpoint into this one's model (the reading and matching: :mod:`lightning_hybrid.transfer`)."""

from __future__ import annotations

import logging

import lightning.pytorch as pl


from lightning_hybrid.transfer import load_transferred, read_state_dict, transfer_checkpoint

#: One log for the suite's callbacks (their lines read "lightning_hybrid.lightning.callbacks").
log = logging.getLogger("lightning_hybrid.lightning.callbacks")


class TransferWeights(pl.Callback):
    """Starts fitting from another run's weights (ClinicaDL's ``--transfer_path``; the CLI's
    ``transfer_path=``): ``path`` is a ``.ckpt`` file or a run folder (its best checkpoint).

    The weights are copied when fitting starts, after the strategy has built the model (a pipeline
    stage takes its part); a run that resumes from a checkpoint (``ckpt_path``) keeps the resumed
    weights instead. See :mod:`lightning_hybrid.transfer` for what must match.

    Example::

        >>> # pl.Trainer(callbacks=[TransferWeights("outputs/multirun/ad_vs_cn/0")]).fit(module, datamodule)
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.ckpt_path:
            log.info("transfer_path=%s not applied: this run resumes from %s", self.path, trainer.ckpt_path)
            return
        checkpoint = transfer_checkpoint(self.path)
        copied = load_transferred(pl_module, read_state_dict(checkpoint), source=str(checkpoint))
        log.info("started from the weights of %s (%d tensors)", checkpoint, copied)
