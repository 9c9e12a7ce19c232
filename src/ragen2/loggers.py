"""Loggers that keep a run's history when the run restarts in its own folder (a requeued SLURM job).

A resumed run logs again from the first iteration after its checkpoint; whatever the interrupted attempt
logged from that iteration on belongs to work that was thrown away. The rule for every logger here: **the
first step a (re)started logger writes is where the run resumed; history at or after it is stale.**

- ``CSVLogger``: Lightning's CSVLogger deletes ``metrics.csv`` when its folder is not empty, and rewrites
  it in place whenever a column appears. This one keeps the file (and its columns), before its first write
  drops the rows whose step is at or after the first step it is about to write, so each iteration appears
  exactly once, and replaces the file only by writing beside it and renaming. A new run never starts over
  another run's rows: ``ragen2.lifecycle.folder`` refuses a folder that holds a run unless ``ckpt_path``
  continues it.
- ``TensorBoardLogger``: a restart writes a new events file beside the old ones; this one marks its
  first step with a ``SessionLog.START`` event, TensorBoard's own restart marker (the event
  ``SummaryWriter(purge_step=…)`` writes), which hides older events at or after that step.
- ``wandb_logger``: Lightning's WandbLogger with a run id derived from the run folder (Lightning already
  passes ``resume="allow"``), so every attempt of a run continues one wandb run, and with
  ``offline=False`` online whatever ``WANDB_MODE`` the process holds; offline, each attempt
  writes its own ``offline-run-<time>-<id>`` folder and ``wandb sync`` appends them to that one run.
  A row the interrupted attempt logged after its last checkpoint stays in its file (wandb cannot
  rewind offline); plotted against ``trainer/global_step`` that iteration shows twice.
- ``MLFlowLogger`` (``logger=mlflow``, the ``mlflow`` extra): Lightning's MLFlowLogger, by default on a
  local file store under the run folder (offline). The MLflow run id is kept in a file of the run folder,
  so every attempt of a run continues one MLflow run; its first write drops, in a local file store, the
  values logged at or after its first step (MLflow has no call that removes logged values; on a server or a
  database store they stay, as in wandb). MLflow 3 refuses a file store unless
  ``MLFLOW_ALLOW_FILE_STORE`` is true: the logger sets it for its process unless it is set already.
- ``save_before_requeue``: submitit's USR2 handler requeues the job, and SLURM kills every process of it at
  once; a step put in front of that handler (``ragen2.lifecycle.resume.requeue_plugins``) first has each logger write
  out what it holds.

Steps are Lightning's ``_batches_that_stepped``, one per RL iteration here, restored from the checkpoint.
The subclasses keep Lightning's class names, and a callback that looks for Lightning's CSV logger
(curves.png) finds this one.
"""

from __future__ import annotations

import csv
import hashlib
import importlib
import importlib.util
import os
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch import loggers as pl_loggers
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from ragen2.errors import ConfigError
from ragen2.log import log
from ragen2.outputs import write_atomic

# the loggers of this process, for save_before_requeue (a requeued job is killed right after the signal)
_LIVE: weakref.WeakSet[Logger] = weakref.WeakSet()


def mlflow_missing(key: str) -> str:
    """The one line for an MLflow logger (``key``) without the mlflow package."""
    return (
        f"{key} logs to MLflow, which is not installed. Fix: pip install 'ragen2[mlflow]' "
        "(from a checkout: pip install -e '.[mlflow]'), or logger=default"
    )


def rows_before(rows: Sequence[Mapping[str, str]], step: int) -> list[Mapping[str, str]]:
    """The CSV rows logged before ``step`` (rows without a step are kept)."""
    return [r for r in rows if not r.get("step") or float(r["step"]) < step]


class _ResumingWriter(ExperimentWriter):
    """``metrics.csv`` kept across restarts: its columns are read back, stale rows dropped on first save."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self._resumed = False
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                # fsspec's open is unannotated: its inferred type holds the binary file of "rb" as well
                self.metrics_keys = sorted(next(csv.reader(f), []))  # pyright: ignore[reportArgumentType]

    def _check_log_dir_exists(self) -> None:
        """Lightning deletes an existing metrics.csv here; a restarted run keeps its history."""

    def save(self) -> None:
        if self.metrics and not self._resumed:
            self._resumed = True
            if self._fs.isfile(self.metrics_file_path):
                self._drop_from(min(int(m["step"]) for m in self.metrics))
        super().save()

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        with self._fs.open(self.metrics_file_path, "r", newline="") as f:
            reader = csv.DictReader(f)  # pyright: ignore[reportArgumentType]  # a text file: as above
            return list(reader.fieldnames or []), list(reader)

    def _drop_from(self, step: int) -> None:
        header, rows = self._read()
        kept = rows_before(rows, step)
        if len(kept) < len(rows):
            self._write(header, kept)

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        """Lightning rewrites the file in place when a column appears (a kill mid-write would cut it)."""
        self._write(fieldnames, self._read()[1])

    def _write(self, header: list[str], rows: Sequence[Mapping[str, str]]) -> None:
        """The file replaced by ``rows``: written beside and renamed, so a job killed mid-write keeps the
        history it was rewriting."""
        tmp = self.metrics_file_path + ".tmp"
        with self._fs.open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)
        self._fs.mv(tmp, self.metrics_file_path)


class CSVLogger(pl_loggers.CSVLogger):
    """Lightning's CSVLogger, appending to ``metrics.csv`` across restarts without repeating a step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _LIVE.add(self)

    @property
    @rank_zero_experiment
    def experiment(self) -> _ResumingWriter:
        if not isinstance(self._experiment, _ResumingWriter):  # None until the first use
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ResumingWriter(log_dir=self.log_dir)
        return self._experiment


class TensorBoardLogger(pl_loggers.TensorBoardLogger):
    """Lightning's TensorBoardLogger, marking where a restarted run resumed (``SessionLog.START``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._marked = False
        _LIVE.add(self)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self._marked and step is not None:
            self._marked = True
            self._mark_start(step)
        super().log_metrics(metrics, step)

    def _mark_start(self, step: int) -> None:
        writer = self.experiment
        # the protos of the writer's own package: tensorboardX's (optional; Lightning uses it only without
        # tensorboard) or tensorboard's; protobuf builds their classes at import time, untyped either way
        package = (
            "tensorboardX.proto"
            if type(writer).__module__.startswith("tensorboardX")
            else "tensorboard.compat.proto"
        )
        events = importlib.import_module(f"{package}.event_pb2")
        start = events.SessionLog(status=events.SessionLog.START)
        writer._get_file_writer().add_event(events.Event(step=step, session_log=start))


def wandb_run_id(run_dir: str | os.PathLike[str]) -> str:
    """A wandb run id that every attempt of one run folder shares: a hash of its absolute path."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def wandb_logger(save_dir: str, id: str | None = None, offline: bool = False, **kwargs: Any) -> WandbLogger:
    """Lightning's WandbLogger whose run id is ``wandb_run_id(save_dir)`` unless ``id`` is given.

    ``offline=False`` streams: wandb is told ``mode="online"``, which beats a ``WANDB_MODE`` in the
    environment (Lightning itself sets ``WANDB_MODE=dryrun`` for an offline logger, for the whole process).
    ``mode`` in ``kwargs`` (``+logger.wandb.mode=disabled``) still decides."""
    if not offline:
        kwargs.setdefault("mode", "online")
    logger = WandbLogger(save_dir=save_dir, id=id or wandb_run_id(save_dir), offline=offline, **kwargs)
    _LIVE.add(logger)
    return logger


def local_store(tracking_uri: str) -> Path | None:
    """The folder of an MLflow file store named ``file:<path>``, or None for any other store."""
    parsed = urlparse(tracking_uri)
    return Path(url2pathname(parsed.path)) if parsed.scheme == "file" else None


def values_before(lines: Sequence[str], step: int) -> list[str]:
    """The lines of an MLflow file store's metric file (``<time> <value> [<step> …]``) logged before
    ``step``; a line without a step is step 0, as MLflow reads it."""
    fields = [line.split() for line in lines]
    return [line for line, f in zip(lines, fields) if f and (int(f[2]) if len(f) > 2 else 0) < step]


class MLFlowLogger(pl_loggers.MLFlowLogger):
    """Lightning's MLFlowLogger, continuing one MLflow run across the restarts of its run folder.

    ``run_id_file`` holds the run's id once the run is created; a restart continues that run (marked
    running again) rather than creating another. An id the store does not hold (the store was moved or
    deleted) starts a new run, with a warning. ``tracking_uri=None`` is the file store in ``save_dir``."""

    def __init__(
        self,
        run_id_file: str,
        save_dir: str = "./mlruns",
        tracking_uri: str | None = None,
        run_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if importlib.util.find_spec("mlflow") is None:
            raise ConfigError(mlflow_missing(type(self).__name__))
        save_dir = str(Path(save_dir).expanduser().absolute())
        uri = tracking_uri or f"file:{save_dir}"
        if local_store(uri) is not None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._run_id_file = Path(run_id_file).expanduser().absolute()
        self._stored = (
            self._run_id_file.read_text().strip() if run_id is None and self._run_id_file.is_file() else None
        )
        super().__init__(save_dir=save_dir, tracking_uri=uri, run_id=run_id or self._stored, **kwargs)
        self._continued = False
        self._resumed = False
        _LIVE.add(self)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if not self._initialized:
            self._continue_run()
        client = super().experiment
        if self._run_id is not None and self._run_id != self._stored:  # kept for the next attempt
            self._run_id_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self._run_id_file, self._run_id + "\n")
            self._stored = self._run_id
        return client

    def _continue_run(self) -> None:
        """The run this folder holds (or the given ``run_id``), marked running again, if the store holds it."""
        from mlflow.entities import RunStatus
        from mlflow.exceptions import MlflowException

        if self._run_id is not None:
            try:
                run = self._mlflow_client.get_run(self._run_id)
            except MlflowException:
                if self._run_id != self._stored:  # an id given by hand: the store must hold it
                    raise
                log.warning(
                    "MLflow run %s (from %s) is not in %s: starting a new MLflow run",
                    self._run_id,
                    self._run_id_file,
                    self._tracking_uri,
                )
                self._run_id = None
            else:
                self._continued = True
                if run.info.status != RunStatus.to_string(RunStatus.RUNNING):
                    self._mlflow_client.update_run(self._run_id, status="RUNNING")

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if not self._resumed and step is not None:
            self._resumed = True
            self._drop_from(step)
        # MLflow refuses "@" in a name (Lightning would drop it, with a warning each time): retrieval_acc@4
        # is logged as retrieval_acc_at_4
        super().log_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()}, step)

    def _drop_from(self, step: int) -> None:
        """Remove the values this run logged at or after ``step`` (a local file store's metric files)."""
        run_id = self.run_id  # creates or continues the run
        if not self._continued or run_id is None:
            return
        store = local_store(self._tracking_uri)
        if store is None:
            log.warning(
                "MLflow run %s keeps what it logged from step %d on before this restart: %s is not a local "
                "file store, whose values this logger can remove",
                run_id,
                step,
                self._tracking_uri,
            )
            return
        folder = store / str(self.experiment_id) / run_id / "metrics"
        for path in sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []:
            lines = path.read_text().splitlines(keepends=True)
            kept = values_before(lines, step)
            if len(kept) == len(lines):
                continue
            if kept:
                write_atomic(path, "".join(kept))
            else:  # MLflow reads an empty metric file as malformed
                path.unlink()


def save_before_requeue() -> None:
    """Put on disk what this process's loggers still hold: called from the USR2 handler just before
    ``scontrol requeue``, which kills the job's processes, wandb's service among them (its unflushed
    records, the last iterations of an offline run, would be lost). The wandb run is marked preempting and
    finished; the requeued job continues it under the same id."""
    for logger in list(_LIVE):
        try:
            if isinstance(logger, WandbLogger):
                run = logger._experiment
                if run is not None:
                    run.mark_preempting()
                    run.finish()
            else:
                logger.save()
        except Exception as err:  # a logger that cannot flush must not stop the requeue
            log.warning("could not save %s before the requeue: %s", type(logger).__name__, err)


def finish(loggers: list[Any]) -> None:
    """Close each wandb run once training ends: its service writes the last records now, not in an exit
    hook that SLURM may cut short (it ends the job's other processes when the main one exits)."""
    for logger in loggers:
        if isinstance(logger, WandbLogger) and logger._experiment is not None:
            logger._experiment.finish()
