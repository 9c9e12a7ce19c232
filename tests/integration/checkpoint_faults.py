"""Faults for the checkpoint tests, added to a real run as callbacks (``+callbacks.fault._target_=…``).

- ``PoisonWeights``: after iteration ``iteration``'s update, one weight of one rank's policy becomes NaN
  (under FSDP2, an element of that rank's own shard), as a diverged update would leave it.
- ``Sigterm``: SIGTERM to one rank's process during iteration ``iteration``, as ``scancel`` or a
  preemption sends it (to every task; one rank alone is the harder case: the others must learn of it).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.distributed.tensor import DTensor


class PoisonWeights(Callback):
    def __init__(self, iteration: int, rank: int = 0) -> None:
        self.iteration = iteration
        self.rank = rank

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.current_epoch != self.iteration or trainer.global_rank != self.rank:
            return
        weight = pl_module.policy.get_input_embeddings().weight
        local = weight.to_local() if isinstance(weight, DTensor) else weight
        with torch.no_grad():
            local.view(-1)[0] = float("nan")


class Sigterm(Callback):
    def __init__(self, iteration: int, rank: int = 0) -> None:
        self.iteration = iteration
        self.rank = rank

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.current_epoch == self.iteration and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal.SIGTERM)
