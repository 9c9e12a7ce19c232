"""last.ckpt after every iteration, written so that no kill or crash leaves a run without a checkpoint that loads.

- **Durable writes.** While ``LastCheckpoint`` is on, the trainer saves through ``DurableCheckpointIO``:
  the file is written beside its destination (``.last.ckpt.<pid>.tmp``), flushed and fsynced; the previous
  save becomes ``last.1.ckpt`` (``keep=2``; ``keep=3`` adds ``last.2.ckpt``, …); the new file is renamed into
  place (``os.replace``, atomic within a folder) and the folder fsynced. A kill at any moment leaves the
  previous files whole, a half-written temporary file that nothing reads (the next save removes it), or, in
  the instant between the two renames, ``last.1.ckpt`` alone. Lightning's own save staged the file in
  ``$TMPDIR`` and, where that is another filesystem (a node-local /tmp, a shared run folder), copied it over
  ``last.ckpt``: a kill mid-copy left it truncated. ``ckpt_path=auto``/``last`` (``ragen2.lifecycle.resume``) take the
  newest ``last*.ckpt`` that loads.
- **A full disk** (``ENOSPC``, a quota, a file-size limit): the temporary file is removed, the previous saves
  stay as they were, and the run stops with ``DiskFullError``, one line naming the folder, the space the save
  needs and the space free (torch alone reports a failed write as "unexpected pos …").
- **Finite weights only.** Before each save every trained parameter is checked (under FSDP2 each rank
  checks its own shard), with one all-reduce: non-finite weights raise ``NonFiniteWeightsError`` on every
  rank instead of replacing the last finite checkpoint.
- **SIGTERM** (``scancel``, a preemption without submitit's USR2): the signal only sets a flag; the
  iteration in progress runs to its end, is saved (due or not), the loggers write out what they hold, and
  the process exits with status 143 (128 + SIGTERM), so that neither submitit nor a shell takes the run for
  finished. The ranks agree on stopping with one all-reduce per iteration. A signal that arrives before the
  first iteration's update is Lightning's to handle (its handler is in place until training starts).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import IO, Any, cast

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch.distributed.tensor import DTensor

from ragen2.distributed import Ranks
from ragen2.errors import ConfigError
from ragen2.lifecycle.resume import last_checkpoints, rotated
from ragen2.log import log
from ragen2.outputs import replacing

STOPPED_BY_SIGTERM = 128 + signal.SIGTERM  # the shell's status for a process ended by SIGTERM


#: a write that failed for want of room: a full disk, a full quota, the process's file-size limit
NO_ROOM = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file-size limit (ulimit -f) is reached",
}


class NonFiniteWeightsError(RuntimeError):
    """A trained parameter holds NaN or ±inf at a save: the checkpoint on disk is kept, the run stops."""


class DiskFullError(ConfigError):
    """A checkpoint that did not fit where it is written: the earlier saves are kept, the run stops."""


class _Sink:
    """The file ``torch.save`` writes through, keeping the error of a failed write (torch reports one as a
    bare "unexpected pos" RuntimeError): an OSError, or what a signal handler raised mid-write (submitit's
    USR2 handler exits with SystemExit once it has requeued the job)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except BaseException as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.file.flush()


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.0f} MB" if size >= 1e6 else f"{size:,} bytes"


def write_checkpoint(checkpoint: dict[str, Any], path: Path, target: Path) -> None:
    """``torch.save`` to ``path``, flushed and fsynced, on its way to ``target``. A write that fails for want of
    room raises ``DiskFullError`` naming the folder, what the save needs (the size of the save it replaces)
    and what is free. Removing ``path`` after a failure is the caller's."""
    try:
        with path.open("wb") as f:
            sink = _Sink(f)
            try:
                torch.save(checkpoint, cast(IO[bytes], sink))  # torch calls only write and flush
            except RuntimeError:
                if sink.error is None:
                    raise
                raise sink.error from None
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:  # closing the file can fail the same way, and then replaces the first error
        if err.errno not in NO_ROOM:
            raise
        folder = target.parent
        needs = (
            f"the checkpoint needs about {_megabytes(target.stat().st_size)}, " if target.is_file() else ""
        )
        raise DiskFullError(
            f"callbacks.checkpoint.dirpath={folder}: {NO_ROOM[err.errno]} ({err.strerror}): {needs}"
            f"{_megabytes(shutil.disk_usage(folder).free)} is free. {target.name} was not written; the "
            "checkpoints already there are kept. Fix: free space there (or raise the limit), or "
            "callbacks.checkpoint.dirpath=<a folder with room> (callbacks.checkpoint.keep=1 halves the space "
            "taken), then resume with ckpt_path=last (the newest checkpoint there that loads)"
        ) from None


def _loads(path: Path) -> bool:
    """Whether ``path`` is a whole checkpoint (its weights are not read: this writer never saves non-finite ones)."""
    from ragen2.models.checkpoint import CheckpointError, read_checkpoint

    try:
        read_checkpoint(path, finite=False)
    except CheckpointError:
        return False
    return True


class DurableCheckpointIO(TorchCheckpointIO):
    """Local checkpoint files written atomically and durably, the previous ``keep - 1`` saves kept; read
    weights-only (``ragen2.models.checkpoint.read_checkpoint``), whatever ``weights_only`` Lightning asks for."""

    def __init__(self, keep: int = 2) -> None:
        super().__init__()
        self.keep = keep

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r})")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        for stale in target.parent.glob(f".{target.name}.*.tmp"):  # left by a process killed mid-write
            stale.unlink(missing_ok=True)
        with replacing(target) as tmp:
            write_checkpoint(checkpoint, tmp, target)
            self._rotate(target)  # only once the new save is whole: a failed write rotates nothing

    def _rotate(self, target: Path) -> None:
        """``last.ckpt`` → ``last.1.ckpt`` → … → ``last.<keep-1>.ckpt``; older ones (a larger ``keep`` before) go."""
        pattern = re.compile(rf"{re.escape(target.stem)}\.(\d+){re.escape(target.suffix)}")
        for old in target.parent.iterdir():
            match = pattern.fullmatch(old.name)
            if match and int(match.group(1)) >= self.keep:
                old.unlink(missing_ok=True)
        if self.keep > 1 and target.is_file() and not _loads(target):
            # an unreadable newest file (the one a resume fell back from) must not push out a good one
            log.warning("removing %s before saving: it cannot be loaded", target)
            target.unlink()
        for n in range(self.keep - 1, 0, -1):
            newer = rotated(target, n - 1)
            if newer.is_file():
                os.replace(newer, rotated(target, n))

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        from ragen2.models.checkpoint import read_checkpoint

        return read_checkpoint(path, key="ckpt_path", map_location=map_location)


def nonfinite_parameters(module: torch.nn.Module) -> list[str]:
    """The names of the trained parameters holding NaN or ±inf on this rank (under FSDP2: in this rank's
    shard). Frozen parameters (the reference policy) are never updated, so never checked."""
    named = [
        (name, p.to_local() if isinstance(p, DTensor) else p)
        for name, p in module.named_parameters()
        if p.requires_grad
    ]
    if not named:
        return []
    finite = torch.stack([torch.isfinite(t).all() for _, t in named]).tolist()  # one device-to-host copy
    return [name for (name, _), ok in zip(named, finite) if not ok]


class LastCheckpoint(ModelCheckpoint):
    """Writes only ``<dirpath>/last.ckpt`` (and keeps ``keep - 1`` previous saves), every
    ``every_n_iterations`` iterations, after the run's last iteration and at a SIGTERM.

    Lightning 2.6 writes ``last`` only alongside a top-k save; keeping top-k copies of a policy with its
    optimizer state costs gigabytes, so this saves ``last`` alone. It saves even after an iteration that
    made no update (the filter kept nothing): the iteration counter and empty-batch streak moved on.
    """

    def __init__(self, dirpath: str, every_n_iterations: int = 1, keep: int = 2) -> None:
        if every_n_iterations < 1:
            raise ValueError(f"callbacks.checkpoint.every_n_iterations={every_n_iterations} must be ≥ 1")
        if keep < 1:
            raise ValueError(
                f"callbacks.checkpoint.keep={keep} must be ≥ 1 (1: last.ckpt alone; 2: also the save before, "
                "the fallback when the newest cannot be read). Fix: callbacks.checkpoint.keep=2"
            )
        if "://" in str(dirpath):
            raise ValueError(
                f"callbacks.checkpoint.dirpath={dirpath}: checkpoints are written to a local or mounted folder, "
                "where a save can be made atomic and durable. Fix: a local path (copy the files elsewhere later)"
            )
        super().__init__(dirpath=dirpath, save_last=True, save_top_k=0, save_on_train_epoch_end=True)
        self.every_n_iterations = every_n_iterations
        self.keep = keep
        self._sigterm = False  # set by the handler: stop at the end of this iteration
        self._stopping = False
        self._replaced_handler: Any = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        current = trainer.strategy.checkpoint_io
        if type(current) is not TorchCheckpointIO and not isinstance(current, DurableCheckpointIO):
            raise ConfigError(
                f"trainer plugins hold a checkpoint IO of their own ({type(current).__name__}), and "
                "callbacks.checkpoint writes through DurableCheckpointIO. Fix: drop that plugin, or "
                "callbacks.checkpoint=null"
            )
        trainer.strategy.checkpoint_io = DurableCheckpointIO(self.keep)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # replaces Lightning's SIGTERM handler, which broadcasts from inside the handler and, under DDP,
        # stops at the next batch, before the iteration's update and its save
        self._sigterm = self._stopping = False
        if threading.current_thread() is threading.main_thread():
            self._replaced_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if not self._sigterm:
            log.warning("SIGTERM: finishing this iteration, then saving it and stopping")
        self._sigterm = True

    def _restore_handler(self) -> None:
        if self._replaced_handler is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._replaced_handler)
        self._replaced_handler = None

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        asked = self._sigterm or trainer.received_sigterm
        stop = Ranks.current().any(asked)  # any rank signalled
        iteration = trainer.current_epoch + 1
        # the run's last iteration is always saved: the end of training, or a stop asked by another callback
        last = trainer.should_stop or iteration == trainer.max_epochs
        if stop or last or iteration % self.every_n_iterations == 0:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        if stop:
            self._stopping = True
            trainer.should_stop = True
            if trainer.is_global_zero:
                log.warning(
                    "SIGTERM: iteration %d saved to %s; stopping with exit status %d. Continue with "
                    "ckpt_path=%s (or ckpt_path=auto when the job is requeued)",
                    trainer.current_epoch,
                    self.last_model_path,
                    STOPPED_BY_SIGTERM,
                    self.last_model_path,
                )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_handler()
        if self._stopping:
            from ragen2.loggers import save_before_requeue

            save_before_requeue()
            raise SIGTERMException(STOPPED_BY_SIGTERM)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_handler()
        if isinstance(exception, KeyboardInterrupt) and trainer.is_global_zero:  # Ctrl-C: where to go on from
            saved = self.last_model_path or next(iter(last_checkpoints(self.dirpath or "")), None)
            log.warning(
                "Ctrl-C: stopped in iteration %d, which is not saved. %s",
                trainer.current_epoch,
                f"Continue with ckpt_path={saved}"
                if saved
                else "Nothing was saved: run it again to start over",
            )

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        """Every rank: refuse non-finite weights (one all-reduce), then Lightning's save."""
        bad = nonfinite_parameters(trainer.lightning_module)
        ranks = Ranks.current()
        if ranks.any(bool(bad)):
            named = [
                f"{name} (rank {rank})" for rank, names in enumerate(ranks.gather(bad[:3])) for name in names
            ]
            raise NonFiniteWeightsError(
                f"iteration {trainer.current_epoch}: trained parameters hold NaN or inf ({', '.join(named[:3])}); "
                f"{filepath} was not written, the checkpoints already in {self.dirpath} keep the last finite "
                "weights. Fix: resume from one of them (ckpt_path=<file>) with a smaller algo.optim.lr or "
                "algo.optim.grad_clip"
            )
        super()._save_checkpoint(trainer, filepath)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Validation adds nothing to resume from; the epoch-end save covers it."""
