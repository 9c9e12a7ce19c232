"""Saves ``last.ckpt`` at every epoch until killed; launched by test_checkpoint_io.py to kill it mid-save, or
to fill its "disk" after the first save.

python tests/unit/checkpoint_writer.py <checkpoint folder> <epochs> [<file-size limit from epoch 1, bytes>]
"""

from __future__ import annotations

import resource
import sys

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from ragen2.lifecycle.checkpoint import LastCheckpoint

WEIGHT_BYTES = 16_000_000 * 4  # the frozen float32 weights below: every checkpoint is larger than this


class Weighty(BoringModel):
    """Lightning's BoringModel with 64 MB more weights: a save lasts long enough to be caught in the middle."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = torch.nn.Parameter(torch.randn(WEIGHT_BYTES // 4), requires_grad=False)


class FileSizeLimit(Callback):
    """From epoch 1 on, no file may grow past ``limit`` bytes (RLIMIT_FSIZE). Python ignores SIGXFSZ, so a longer
    write fails with EFBIG, as one on a full disk fails with ENOSPC."""

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:
            resource.setrlimit(
                resource.RLIMIT_FSIZE, (self.limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
            )


def one_batch_trainer(epochs: int, checkpoint: LastCheckpoint, *callbacks: Callback) -> L.Trainer:
    """One batch per epoch, one save per epoch, nothing else written."""
    return L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        limit_train_batches=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[checkpoint, *callbacks],
    )


if __name__ == "__main__":
    folder, epochs, *limit = sys.argv[1:]
    limits = [FileSizeLimit(int(limit[0]))] if limit else []
    one_batch_trainer(int(epochs), LastCheckpoint(dirpath=folder), *limits).fit(Weighty())
