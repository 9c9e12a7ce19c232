"""Which checkpoint a run starts from (``ckpt_path``), and who requeues a SLURM job.

``ckpt_path`` takes these values, resolved once at start-up, before any model loads:

- ``auto`` (the default): inside a job that can be restarted, that is a SLURM job or a job of the
  submitit launchers (``SLURM_JOB_ID`` or ``SUBMITIT_EXECUTOR`` set), the run folder's newest
  ``checkpoints/last*.ckpt`` that loads, else a fresh start. A requeued job re-runs the same Hydra job in
  the same run folder, so it continues from the last finished iteration. Anywhere else, a fresh start: a
  local ``ragen2-train`` never picks up a checkpoint it was not given.
- ``last``: the same newest loadable ``last*.ckpt``, anywhere (fresh, with a warning, when there is none).
- ``null``: a fresh start, everywhere.
- ``hpc``: Lightning's SLURM checkpoint, the newest ``hpc_ckpt_<n>.ckpt`` in the trainer's root folder (the
  run folder), as Lightning picks it; none there is a ``ConfigError`` (ragen2 leaves Lightning's requeue
  handler, the one that writes them, off).
- a local path: that checkpoint; a file that does not exist or does not load is a ``ConfigError``.
  Remote paths (``s3://``, ``https://``, …) are refused: copy the file to local disk first.

"Loads" means ``torch.load(weights_only=True, mmap=True)`` reads it (milliseconds for a multi-GB file: the
tensors are mapped, not read) and it holds a ``state_dict``. ``LastCheckpoint`` keeps the save before
``last.ckpt`` as ``last.1.ckpt`` (``callbacks.checkpoint.keep``): when the newest file is truncated or
garbage, ``auto``/``last`` warn, naming both files, and resume from the older one; when no file loads
they stop with an error rather than start afresh over the run's history. The training resume itself is
weights-only too (``ragen2.train`` passes ``weights_only=True``; under ``LastCheckpoint`` every load goes
through ``ragen2.models.checkpoint.read_checkpoint``): a checkpoint can hold no code that runs on load.

Requeueing belongs to submitit (``conf/hydra/launcher/slurm.yaml``, ``slurm/README.md``): its USR2
handler calls the launcher's ``checkpoint()``, which resubmits the same Hydra job, then requeues.
``requeue_plugins`` puts one step in front of that handler: the loggers write out what they hold
(``scontrol requeue`` kills every process of the job at once, wandb's service among them).
It also hands Lightning a ``SLURMEnvironment(auto_requeue=False)`` so that Lightning's own
USR1 handler (save ``hpc_ckpt_*.ckpt`` from inside a signal handler, ``scontrol requeue``) is never
installed and a job is never requeued twice. A SIGTERM (``scancel``, a preemption without USR2) is
``LastCheckpoint``'s: it saves the iteration in progress at its end and exits with status 143.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ragen2.errors import ConfigError
from ragen2.log import log

AUTO = "auto"
LAST = "last"
HPC = "hpc"  # passed on to Lightning as it is


def restartable_job(environ: Mapping[str, str] = os.environ) -> bool:
    """True inside a SLURM job or a submitit job: the kinds of process that are requeued in place."""
    return bool(environ.get("SLURM_JOB_ID") or environ.get("SUBMITIT_EXECUTOR"))


def rotated(path: Path, n: int) -> Path:
    """The ``n``-th save before ``path``, kept beside it (``last.ckpt`` → ``last.1.ckpt``); ``path`` for 0."""
    return path if n == 0 else path.with_name(f"{path.stem}.{n}{path.suffix}")


def _age(path: Path) -> int:
    match = re.fullmatch(r".+\.(\d+)\.ckpt", path.name)
    return int(match.group(1)) if match else 0


def last_checkpoints(folder: str | Path) -> list[Path]:
    """The ``last*.ckpt`` files in ``folder``, newest first: ``last.ckpt`` and the saves kept before it
    (``last.1.ckpt``, …), and Lightning's ``last-v1.ckpt`` when a fresh run was started in a folder that
    already held one. Equal times go to the newer name (``last.ckpt`` before ``last.1.ckpt``)."""
    found = [p for p in Path(folder).glob("last*.ckpt") if p.is_file()]
    return sorted(found, key=lambda p: (-p.stat().st_mtime_ns, _age(p)))


def last_checkpoint(folder: str | Path, key: str = f"ckpt_path={AUTO}") -> Path | None:
    """The newest ``last*.ckpt`` in ``folder`` that loads (weights-only), with a warning naming the newer
    files passed over; None when there is no such file at all; a ``ConfigError`` when none of them loads."""
    from ragen2.models.checkpoint import CheckpointError, read_checkpoint

    unreadable: list[str] = []
    for path in last_checkpoints(folder):
        try:
            read_checkpoint(path, key=key)
        except CheckpointError as err:
            unreadable.append(str(err).split(". Fix:")[0])
            continue
        if unreadable:
            log.warning("%s; resuming from the older %s instead", "; ".join(unreadable), path)
        return path
    if unreadable:
        raise ConfigError(
            f"{'; '.join(unreadable)}: no checkpoint in {folder} loads. Fix: ckpt_path=<an intact checkpoint>, "
            "or ckpt_path=null to start afresh"
        )
    return None


def hpc_checkpoint(folder: str | Path) -> Path | None:
    """The ``hpc_ckpt_<n>.ckpt`` of the highest ``n`` in ``folder``, the one Lightning resumes from, or None."""
    numbered = [
        (int(m.group(1)), p) for p in Path(folder).glob("hpc_ckpt_*.ckpt") if (m := _HPC.fullmatch(p.name))
    ]
    return max(numbered)[1] if numbered else None


_HPC = re.compile(r"hpc_ckpt_(\d+)\.ckpt")


def checkpoint_dir(cfg: DictConfig) -> Path:
    """Where the run's ``LastCheckpoint`` writes: ``callbacks.checkpoint.dirpath``, else ``<run_dir>/checkpoints``."""
    node = (cfg.get("callbacks") or {}).get("checkpoint")
    if node is not None and node.get("dirpath"):
        return Path(str(node.dirpath))
    return Path(str(cfg.run_dir)) / "checkpoints"


def resolve_ckpt_path(
    value: Any, checkpoints: str | Path, environ: Mapping[str, str] = os.environ, root: str | Path = "."
) -> str | None:
    """What ``trainer.fit(ckpt_path=…)`` gets for the config value ``ckpt_path=value`` (``root``: the trainer's
    root folder, where Lightning's ``hpc_ckpt_<n>.ckpt`` are)."""
    if value is None:
        return None
    value = str(value)
    if "://" in value:
        raise ConfigError(
            f"ckpt_path={value}: remote checkpoints are not loaded (a checkpoint is verified and loaded "
            "weights-only from a local file). Fix: copy it to local disk and pass that path"
        )
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
    if value == LAST:
        found = last_checkpoint(checkpoints, f"ckpt_path={LAST}")
        if found is None:
            log.warning("ckpt_path=last: no checkpoint in %s, starting fresh", checkpoints)
            return None
        return str(found)
    if value == HPC:
        found = hpc_checkpoint(root)
        if found is None:
            slurm = "in this SLURM job" if environ.get("SLURM_JOB_ID") else "and this is no SLURM job"
            raise ConfigError(
                f"ckpt_path={HPC}: there is no hpc_ckpt_<n>.ckpt in {root} {slurm} (Lightning writes them from "
                "its own SLURM requeue handler, which ragen2 leaves to submitit). Fix: ckpt_path=last (the run "
                "folder's newest last*.ckpt), ckpt_path=<a checkpoint file>, or ckpt_path=auto in a requeued job"
            )
        value = str(found)
    elif not Path(value).is_file():
        raise ConfigError(
            f"ckpt_path={value}: no such checkpoint file. Fix: give an existing last.ckpt "
            f"(outputs/<run>/checkpoints/last.ckpt), ckpt_path={AUTO} (resume a requeued SLURM job from its "
            f"own run folder), ckpt_path={LAST}, or ckpt_path=null for a fresh start"
        )
    from ragen2.models.checkpoint import read_checkpoint

    read_checkpoint(value, key="ckpt_path")  # a file that does not load fails here, in one line
    return value


def run_ckpt_path(cfg: DictConfig) -> str | None:
    """``resolve_ckpt_path`` for a composed training config."""
    root = OmegaConf.select(cfg, "trainer.default_root_dir", default=None) or cfg.run_dir
    return resolve_ckpt_path(cfg.get("ckpt_path"), checkpoint_dir(cfg), root=str(root))


def requeue_plugins() -> list[Any]:
    """Requeue handling for this process; returns the trainer's plugins.

    In a submitit job, the loggers are saved before submitit's requeue signal handler runs. Under SLURM,
    Lightning's SLURM environment with its auto-requeue off (submitit requeues); no plugin elsewhere, nor in
    interactive allocations, where Lightning does not use SLURM either."""
    from lightning.fabric.plugins.environments.slurm import SLURMEnvironment

    if os.environ.get("SUBMITIT_EXECUTOR"):
        _save_loggers_before_requeue()
    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


class _SaveFirst:
    """A signal handler that runs ``save``, then the handler it was put in front of; when that one ends the
    process (``SystemExit``, as submitit's does after the requeue), the process ends, wherever the signal
    landed."""

    def __init__(self, save: Callable[[], None], then: Callable[[int, FrameType | None], Any]) -> None:
        self.save, self.then = save, then

    def __call__(self, sig: int, frame: FrameType | None) -> None:
        self.save()
        try:
            try:
                self.then(sig, frame)
            except subprocess.CalledProcessError as err:
                if not _requeue_cut(err):
                    raise
                # SLURM cancels the job's step as it requeues the job, and its SIGTERM can reach ``scontrol
                # requeue`` (a process of the step) before it returns: the job is requeued, so end it as
                # submitit ends a requeued job, not as a failure
                log.warning(
                    "%s ended by SIGTERM as SLURM requeued the job: ending it for the requeue", err.cmd
                )
                raise SystemExit(-1) from None
        except SystemExit as done:
            if not _in_finalizer(frame):
                raise
            # Python prints and drops an exception raised in a finalizer, SystemExit too: the requeued job
            # would go on beside the job that replaces it, in the same run folder, logging to a finished
            # wandb run. Its loggers are saved and it is requeued: end it here.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(done.code if isinstance(done.code, int) else 1)


def _requeue_cut(err: subprocess.CalledProcessError) -> bool:
    """Whether ``err`` is ``scontrol requeue`` killed by SIGTERM (the requeue's own cancellation of the step)."""
    cmd = err.cmd if isinstance(err.cmd, list | tuple) else str(err.cmd).split()
    return list(cmd[:2]) == ["scontrol", "requeue"] and err.returncode == -signal.SIGTERM


def _in_finalizer(frame: FrameType | None) -> bool:
    """Whether the interrupted code runs inside a ``__del__``, where an exception does not propagate."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _save_loggers_before_requeue() -> None:
    """Chains ``save_before_requeue`` in front of submitit's handler of its requeue signal (USR2 unless
    ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise), which submitit installed before starting the job."""
    from ragen2.loggers import save_before_requeue

    signum = signal.Signals["SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")]
    submitit_handler = signal.getsignal(signum)
    if not callable(submitit_handler) or isinstance(submitit_handler, _SaveFirst):
        return
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread
    signal.signal(signum, _SaveFirst(save_before_requeue, submitit_handler))
