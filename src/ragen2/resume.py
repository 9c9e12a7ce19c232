"""Which checkpoint a run starts from (``ckpt_path``), and who requeues a SLURM job.

``ckpt_path`` takes four kinds of value, resolved once at start-up, before any model loads:

- ``auto`` (the default): inside a job that can be restarted, that is a SLURM job or a job of the
  submitit launchers (``SLURM_JOB_ID`` or ``SUBMITIT_EXECUTOR`` set), the run folder's newest
  ``checkpoints/last*.ckpt`` when there is one, else a fresh start. A requeued job re-runs the same
  Hydra job in the same run folder, so it continues from the last finished iteration. Anywhere else,
  a fresh start: a local ``ragen2-train`` never picks up a checkpoint it was not given.
- ``null``: a fresh start, everywhere.
- ``last`` / ``hpc``: Lightning's own (the newest ``last*.ckpt`` of the checkpoint callbacks, fresh with
  a warning when none; Lightning's SLURM checkpoint).
- a path: that checkpoint; a local file that does not exist is a ``ConfigError`` at start-up.

Requeueing belongs to submitit (``conf/hydra/launcher/slurm.yaml``, ``slurm/README.md``): its USR2
handler calls the launcher's ``checkpoint()``, which resubmits the same Hydra job, then requeues.
``requeue_plugins`` puts one step in front of that handler: the loggers write out what they hold
(``scontrol requeue`` kills every process of the job at once, wandb's service among them).
It also hands Lightning a ``SLURMEnvironment(auto_requeue=False)`` so that Lightning's own
USR1 handler (save ``hpc_ckpt_*.ckpt`` from inside a signal handler, ``scontrol requeue``) is never
installed and a job is never requeued twice.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from omegaconf import DictConfig

from ragen2.config import ConfigError
from ragen2.log import log

AUTO = "auto"
LIGHTNING_VALUES = ("last", "hpc")  # passed on to Lightning as they are


def restartable_job(environ: Mapping[str, str] = os.environ) -> bool:
    """True inside a SLURM job or a submitit job: the kinds of process that are requeued in place."""
    return bool(environ.get("SLURM_JOB_ID") or environ.get("SUBMITIT_EXECUTOR"))


def last_checkpoint(folder: str | Path) -> Path | None:
    """The newest ``last*.ckpt`` in ``folder`` (``last.ckpt``, or Lightning's ``last-v1.ckpt`` when a fresh
    run was started in a folder that already held one), or None."""
    candidates = [p for p in Path(folder).glob("last*.ckpt") if p.is_file()]
    return max(candidates, key=lambda p: p.stat().st_mtime) if candidates else None


def checkpoint_dir(cfg: DictConfig) -> Path:
    """Where the run's ``LastCheckpoint`` writes: ``callbacks.checkpoint.dirpath``, else ``<run_dir>/checkpoints``."""
    node = (cfg.get("callbacks") or {}).get("checkpoint")
    if node is not None and node.get("dirpath"):
        return Path(str(node.dirpath))
    return Path(str(cfg.run_dir)) / "checkpoints"


def resolve_ckpt_path(
    value: Any, checkpoints: str | Path, environ: Mapping[str, str] = os.environ
) -> str | None:
    """What ``trainer.fit(ckpt_path=…)`` gets for the config value ``ckpt_path=value``."""
    if value is None:
        return None
    value = str(value)
    if value == AUTO:
        if not restartable_job(environ):
            return None
        found = last_checkpoint(checkpoints)
        restart = (
            f" (SLURM restart {environ['SLURM_RESTART_COUNT']})" if "SLURM_RESTART_COUNT" in environ else ""
        )
        if found is None:
            log.info("ckpt_path=auto: no checkpoint in %s, starting fresh%s", checkpoints, restart)
            return None
        log.info("ckpt_path=auto: resuming from %s%s", found, restart)
        return str(found)
    if value in LIGHTNING_VALUES or "://" in value:  # remote paths are Lightning's (fsspec) to check
        return value
    if not Path(value).is_file():
        raise ConfigError(
            f"ckpt_path={value}: no such checkpoint file. Fix: give an existing last.ckpt "
            f"(outputs/<run>/checkpoints/last.ckpt), ckpt_path={AUTO} (resume a requeued SLURM job from its "
            "own run folder), ckpt_path=last, or ckpt_path=null for a fresh start"
        )
    return value


def run_ckpt_path(cfg: DictConfig) -> str | None:
    """``resolve_ckpt_path`` for a composed training config."""
    return resolve_ckpt_path(cfg.get("ckpt_path"), checkpoint_dir(cfg))


def requeue_plugins() -> list[Any]:
    """Requeue handling for this process; returns the trainer's plugins.

    In a submitit job, the loggers are saved before submitit's requeue signal handler runs. Under SLURM,
    Lightning's SLURM environment with its auto-requeue off (submitit requeues); no plugin elsewhere, nor in
    interactive allocations, where Lightning does not use SLURM either."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if os.environ.get("SUBMITIT_EXECUTOR"):
        _save_loggers_before_requeue()
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def _save_loggers_before_requeue() -> None:
    """Chains ``save_before_requeue`` in front of submitit's handler of its requeue signal (USR2 unless
    ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise), which submitit installed before starting the job."""
    from ragen2.loggers import save_before_requeue

    signum = signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]
    submitit_handler = signal.getsignal(signum)
    if not callable(submitit_handler) or getattr(submitit_handler, "saves_loggers", False):
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread

    def handler(sig: int, frame: FrameType | None) -> None:
        save_before_requeue()
        submitit_handler(sig, frame)

    handler.saves_loggers = True  # type: ignore[attr-defined]
    signal.signal(signum, handler)
