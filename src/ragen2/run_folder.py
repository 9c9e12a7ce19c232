"""The folder a run writes into: writable, and holding no other run, before anything is written there.

A folder holds a run once it holds a checkpoint (``<checkpoints>/*.ckpt``) or a metrics row
(``csv/metrics.csv``). A run starts in such a folder only to continue it, when ``ckpt_path`` says so:

- ``auto`` inside a job that is restarted in place (SLURM, submitit): the job's own earlier attempt, which
  it resumes from its newest checkpoint, or, with none saved yet, replaces;
- ``last``: the folder's newest ``last*.ckpt`` (there must be one);
- ``hpc``: an ``hpc_ckpt_<n>.ckpt`` in the folder;
- a checkpoint file inside the folder.

Anything else (a second ``ragen2-train hydra.run.dir=X``, ``ckpt_path=null``, a checkpoint of another run)
is refused, naming the folder and what it holds: the logger would otherwise write the new run's rows over
the first run's (``ragen2.loggers`` keeps the rows before the first step a restarted run logs).

``RunFolder`` runs both checks as a Hydra callback, before Hydra writes the run's ``.hydra/`` files and its
log (a refused rerun leaves the first run's record as it was, and a folder that cannot be written is one
line rather than Hydra's traceback): for a single run on the run folder, for ``--multirun`` on the sweep
folder and the job folders already in it. ``ragen2.train`` checks the run folder again for every job and
for runs started from Python.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from ragen2.errors import ConfigError, exit_one_line
from ragen2.outputs import METRICS, unwritable
from ragen2.resume import AUTO, HPC, LAST, checkpoint_dir, hpc_checkpoint, last_checkpoints, restartable_job


def run_folders(cfg: DictConfig) -> list[tuple[str, str]]:
    """The folders a training run writes, by the key that sets each: the run folder and the checkpoint folder."""
    folders = [("run_dir", str(cfg.run_dir))]
    if (cfg.get("callbacks") or {}).get("checkpoint") is not None:
        folders.append(("callbacks.checkpoint.dirpath", str(checkpoint_dir(cfg))))
    return folders


def check_writable(folders: Iterable[tuple[str, str | Path]]) -> None:
    """Each folder (key -> folder) must be creatable and writable now, not when iteration 0 ends. Nothing is
    created here: the nearest folder that exists is tried with a temporary file."""
    for key, folder in folders:
        if "://" in str(folder):  # a remote store (fsspec): Lightning's to reach
            continue
        problem = unwritable(Path(folder).expanduser().absolute())
        if problem:
            raise ConfigError(
                f"{key}={folder} cannot be written: {problem}. Fix: {key}=<a writable folder>"
                + (", or hydra.run.dir=<a writable folder>" if key == "run_dir" else "")
            )


def held_run(run_dir: Path, checkpoints: Path) -> str | None:
    """What of a run ``run_dir`` holds (its metrics rows, its checkpoints), or None for a fresh folder."""
    held = []
    metrics = run_dir / METRICS
    if metrics.is_file():
        with metrics.open(newline="") as f:
            rows = sum(1 for _ in csv.DictReader(f))
        if rows:
            held.append(f"{METRICS} with {rows} row{'s' * (rows != 1)}")
    saved = sorted(p.name for p in checkpoints.glob("*.ckpt")) if checkpoints.is_dir() else []
    if saved:
        held.append(f"{checkpoints.name}/{', '.join(saved)}")
    return "; ".join(held) or None


def continues(value: Any, run_dir: Path, checkpoints: Path, restartable: bool) -> bool:
    """Whether ``ckpt_path=value`` continues the run in ``run_dir`` (whose checkpoints are in ``checkpoints``)
    rather than starting another one there; ``restartable``: the process is a job restarted in place."""
    if value is None:
        return False
    value = str(value)
    if value == AUTO:
        return restartable
    if value == LAST:
        return bool(last_checkpoints(checkpoints))
    if value == HPC:
        return hpc_checkpoint(run_dir) is not None
    path = Path(value).expanduser().absolute()
    return any(folder.absolute() in path.parents for folder in (run_dir, checkpoints))


def check_run_folder(cfg: DictConfig, restartable: bool | None = None) -> None:
    """Refuse to start a run in a folder that holds another run, unless ``ckpt_path`` continues that run
    (``restartable``: the run is a job restarted in place; by default, whether this process is one)."""
    run_dir, checkpoints = Path(str(cfg.run_dir)).expanduser().absolute(), checkpoint_dir(cfg)
    held = held_run(run_dir, checkpoints)
    value = cfg.get("ckpt_path")
    in_place = restartable_job() if restartable is None else restartable
    if held is None or continues(value, run_dir, checkpoints, in_place):
        return
    named = "null" if value is None else value
    how = "does not continue it" if value is None or str(value) in (AUTO, LAST, HPC) else "is another run's"
    raise ConfigError(
        f"run_dir={run_dir} already holds a run ({held}), and ckpt_path={named} {how}: a new run there would "
        "write over its metrics. Fix: a new folder for a new run (hydra.run.dir=<folder>; --multirun: "
        "hydra.sweep.dir=<folder>), or ckpt_path=last to continue this one"
    )


def _job_config(config: DictConfig, run_dir: Path) -> DictConfig:
    """``config`` (a Hydra callback's, with its ``hydra`` node) as a job in ``run_dir`` sees it."""
    job = OmegaConf.masked_copy(config, [str(k) for k in config if k != "hydra"])
    with open_dict(job):
        job.run_dir = str(run_dir)
    return job


class RunFolder(Callback):
    """Hydra callback (conf/train.yaml): the run folder's checks before Hydra writes into it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from ragen2.checkpoint_fit import check_iterations_left  # torch: not imported for --help

        job = _job_config(config, Path(str(config.hydra.run.dir)).absolute())
        _one_line(
            config,
            lambda: (check_writable(run_folders(job)), check_run_folder(job), check_iterations_left(job)),
        )

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir)).absolute()
        # jobs of a submitit launcher are restarted in place (ckpt_path=auto resumes them); others are not
        restartable = "submitit" in str(OmegaConf.select(config, "hydra.launcher._target_", default=""))

        def check() -> None:
            check_writable([("hydra.sweep.dir", sweep)])
            for folder in sorted(p for p in sweep.iterdir() if p.is_dir()) if sweep.is_dir() else []:
                check_run_folder(_job_config(config, folder), restartable)

        _one_line(config, check)


def _one_line(config: DictConfig, check: Callable[[], object]) -> None:
    """Run ``check``; its ``ConfigError`` ends the program with one line, before Hydra writes anything."""
    try:
        check()
    except ConfigError as err:
        exit_one_line(str(OmegaConf.select(config, "hydra.help.app_name", default=sys.argv[0])), err)
