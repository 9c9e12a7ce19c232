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

``RunFolder`` runs both checks as a Hydra callback (after ``ragen2.config.SettingsCheck``, the config's own
checks), before Hydra opens the run's log (a folder that cannot be
written is one line rather than Hydra's traceback): for a single run on the run folder, for ``--multirun`` on
the sweep folder and the job folders already in it. ``ragen2.train`` checks the run folder again for every job
and for runs started from Python.

A program that passed its checks claims its folder (``claim``) for as long as it runs: a lock file
(``.ragen2.lock``) that names its holder, then Hydra's record of the job (``.hydra/config.yaml``,
``hydra.yaml``, ``overrides.yaml``: conf/hydra/default.yaml sets ``hydra.output_subdir=null`` so that Hydra
does not write them before the checks, and a refused run leaves an earlier run's record as it was). A
second program claiming a held folder is refused in one line naming the holder. The holder is the SLURM job
where there is one (a requeued job takes its own lock back), and its host and process (a lock whose process
has ended on this host is stale, taken over with a warning); only rank 0 of a job claims (its other ranks
share rank 0's lock).
"""

from __future__ import annotations

import csv
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from ragen2.errors import ConfigError, exit_one_line
from ragen2.lifecycle.resume import (
    AUTO,
    HPC,
    LAST,
    checkpoint_dir,
    hpc_checkpoint,
    last_checkpoints,
    restartable_job,
)
from ragen2.log import log
from ragen2.outputs import METRICS, unwritable, write_atomic


def run_folders(cfg: DictConfig) -> list[tuple[str, str]]:
    """The folders a training run writes, by the key that sets each: the run folder, the checkpoint folder and
    each logger's ``save_dir``."""
    folders = [("run_dir", str(cfg.run_dir))]
    if (cfg.get("callbacks") or {}).get("checkpoint") is not None:
        folders.append(("callbacks.checkpoint.dirpath", str(checkpoint_dir(cfg))))
    for name, node in (cfg.get("logger") or {}).items():
        if isinstance(node, DictConfig) and node.get("save_dir") is not None:
            folders.append((f"logger.{name}.save_dir", str(node.save_dir)))
    return folders


def logger_metrics(cfg: DictConfig) -> list[tuple[str, Path]]:
    """(key, file) of each CSV logger's metrics file outside the run folder that a rerun would write again (a
    fixed ``version``; with none, Lightning makes a new ``version_<n>`` folder each time)."""
    run_dir = Path(str(cfg.run_dir)).expanduser().absolute()
    found = []
    for name, node in (cfg.get("logger") or {}).items():
        if not isinstance(node, DictConfig) or not str(node.get("_target_", "")).endswith("CSVLogger"):
            continue
        version = node.get("version")
        if version is None:
            continue
        folder = Path(str(node.save_dir)).expanduser().absolute() / str(
            node.get("name", "lightning_logs") or ""
        )
        metrics = (
            folder / (f"version_{version}" if isinstance(version, int) else str(version)) / "metrics.csv"
        )
        if run_dir not in metrics.parents:
            found.append((f"logger.{name}.save_dir", metrics))
    return found


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


def metrics_rows(metrics: Path) -> str | None:
    """``<file> with N rows`` for a metrics file that holds rows, else None."""
    if not metrics.is_file():
        return None
    with metrics.open(newline="") as f:
        rows = sum(1 for _ in csv.DictReader(f))
    return f"{metrics} with {rows} row{'s' * (rows != 1)}" if rows else None


def held_run(run_dir: Path, checkpoints: Path) -> str | None:
    """What of a run ``run_dir`` holds (its metrics rows, its checkpoints), or None for a fresh folder."""
    rows = metrics_rows(run_dir / METRICS)
    held = [rows.removeprefix(f"{run_dir}/")] if rows else []
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
    if continues(value, run_dir, checkpoints, in_place):
        return
    named = "null" if value is None else value
    for key, metrics in logger_metrics(cfg):
        rows = metrics_rows(metrics)
        if rows:
            raise ConfigError(
                f"{key}={OmegaConf.select(cfg, key)} holds a run's metrics ({rows}), and ckpt_path={named} does not "
                f"continue this run: the logger would write over them. Fix: {key}=${{run_dir}} (the default), or a "
                "folder of its own"
            )
    if held is None:
        return
    how = "does not continue it" if value is None or str(value) in (AUTO, LAST, HPC) else "is another run's"
    raise ConfigError(
        f"run_dir={run_dir} already holds a run ({held}), and ckpt_path={named} {how}: a new run there would "
        "write over its metrics. Fix: a new folder for a new run (hydra.run.dir=<folder>; --multirun: "
        "hydra.sweep.dir=<folder>), or ckpt_path=last to continue this one"
    )


def job_config(config: DictConfig, run_dir: Path) -> DictConfig:
    """``config`` (a Hydra callback's, with its ``hydra`` node) as a job in ``run_dir`` sees it (its
    ``run_dir``, for the programs that have one)."""
    job = OmegaConf.masked_copy(config, [str(k) for k in config if k != "hydra"])
    if "run_dir" in config:
        with open_dict(job):
            job.run_dir = str(run_dir)
    return job


@contextmanager
def as_job(config: DictConfig, run_dir: Path) -> Iterator[DictConfig]:
    """``job_config``, with ``${hydra:runtime.output_dir}`` resolving to ``run_dir`` while it is read: Hydra
    sets the job's runtime only once the job starts, after the callbacks' ``on_run_start``."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import read_write

    whole = config.copy()
    with read_write(whole.hydra), open_dict(whole.hydra):
        whole.hydra.runtime.output_dir = str(run_dir)
    held = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(whole)
    try:
        yield job_config(config, run_dir)
    finally:
        HydraConfig.instance().cfg = held


class OutputFolder(Callback):
    """Hydra callback (conf/hydra/default.yaml, every program): the folder Hydra is about to create and write
    must be writable, one line rather than Hydra's traceback."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        key = (
            "run_dir" if "run_dir" in config else "hydra.run.dir"
        )  # the key the program's config names it by
        folder = Path(str(config.hydra.run.dir)).absolute()
        one_line(config, lambda: check_writable([(key, folder)]))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir)).absolute()
        one_line(config, lambda: check_writable([("hydra.sweep.dir", sweep)]))


class RunFolder(Callback):
    """Hydra callback (conf/train.yaml): the run folder's checks before Hydra writes into it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from ragen2.lifecycle.checkpoint_fit import check_iterations_left  # torch: not imported for --help

        job = job_config(config, Path(str(config.hydra.run.dir)).absolute())
        one_line(
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
                check_run_folder(job_config(config, folder), restartable)

        one_line(config, check)


def one_line(config: DictConfig, check: Callable[[], object]) -> None:
    """Run ``check``; its ``ConfigError`` ends the program with one line, before Hydra writes anything."""
    try:
        check()
    except ConfigError as err:
        exit_one_line(str(OmegaConf.select(config, "hydra.help.app_name", default=sys.argv[0])), err)


#: the file in a folder that says which program holds it
LOCK = ".ragen2.lock"
#: the environment variables that give a process's rank in its job, as Lightning reads them
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")


@dataclass(frozen=True)
class Holder:
    """Who holds a folder: the program, its SLURM job (if any), host and process, and since when."""

    program: str
    host: str
    pid: int
    job: str | None = None
    since: str = ""

    @classmethod
    def here(cls, program: str, environ: Mapping[str, str] = os.environ) -> Holder:
        return cls(
            program,
            socket.gethostname(),
            os.getpid(),
            environ.get("SLURM_JOB_ID"),
            time.strftime("%Y-%m-%d %H:%M:%S"),
        )

    def __str__(self) -> str:
        job = f"SLURM job {self.job}, " if self.job else ""
        return f"{self.program} ({job}host {self.host}, pid {self.pid}, since {self.since})"

    def ended(self) -> bool:
        """Whether this holder's process is known to have ended (known only on its own host)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # another account's live process
            return False
        return False

    def gives_way_to(self, other: Holder) -> bool:
        """Whether ``other`` may take this holder's lock: the same SLURM job (requeued), the same process, or
        this holder's process has ended."""
        same_job = self.job is not None and self.job == other.job
        return same_job or (self.host, self.pid) == (other.host, other.pid) or self.ended()


def job_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank in its job (0 when none is set)."""
    return next((int(environ[k]) for k in RANK_VARIABLES if environ.get(k, "").isdigit()), 0)


@contextmanager
def claim(
    folders: str | Path | Iterable[str | Path], program: str, cfg: DictConfig | None = None
) -> Iterator[None]:
    """Hold each folder for the program while the block runs (rank 0 of a job; the other ranks share its
    lock), and write Hydra's record of the job once all are held (``cfg``: the job's config as composed)."""
    if job_rank() != 0:
        yield
        return
    named = [folders] if isinstance(folders, str | Path) else list(folders)
    locks = dict.fromkeys(Path(f).expanduser().absolute() / LOCK for f in named)
    with ExitStack() as held:
        for lock in locks:
            held.enter_context(holding(lock, program))
        if cfg is not None:
            write_hydra_record(cfg)
        yield


@contextmanager
def holding(lock: Path, program: str) -> Iterator[None]:
    """The lock file ``lock`` held for ``program`` (this process) while the block runs."""
    me = Holder.here(program)
    take(lock, me)
    try:
        yield
    finally:
        release(lock, me)


@contextmanager
def _locked(path: Path) -> Iterator[TextIO]:
    """``path`` open for reading and writing, under an exclusive ``flock`` (a lock file's read, decision and
    write are one step for every process on this host)."""
    with path.open("a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        yield f


def _holder(text: str) -> Holder | None:
    try:
        return Holder(**json.loads(text))
    except (ValueError, TypeError):  # empty (just created) or cut short by a crash: no one holds it
        return None


def take(path: Path, me: Holder) -> None:
    """Write ``me`` into the lock file ``path``, unless a holder that does not give way is in it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path) as f:
        held = _holder(f.read())
        if held is not None and not held.gives_way_to(me):
            raise ConfigError(
                f"{path.parent} is in use by {held}: two runs in one folder would interleave their metrics and "
                f"checkpoints. Fix: wait for it to end, or a new folder (hydra.run.dir=<folder>); if that process "
                f"is gone, delete {path}"
            )
        if held is not None and (held.host, held.pid) != (me.host, me.pid):
            why = "its process has ended" if held.job is None or held.job != me.job else "this job, requeued"
            log.warning("%s: the lock of %s is taken over (%s)", path.parent, held, why)
        try:  # (no fsync: after a crash the holder's process has ended, which frees the lock anyway)
            f.seek(0)
            f.truncate()
            f.write(json.dumps(asdict(me)))
            f.flush()
        except OSError:  # a full disk: no lock left behind
            path.unlink(missing_ok=True)
            raise


def release(path: Path, me: Holder) -> None:
    """Remove the lock file ``path`` if ``me`` still holds it."""
    if not path.is_file():
        return
    with _locked(path) as f:
        if _holder(f.read()) == me:
            path.unlink()


def write_hydra_record(cfg: DictConfig, fresh_only: bool = False) -> None:
    """Hydra's record of the running job in ``<run>/.hydra/``, as Hydra writes it, where ``hydra.output_subdir``
    is null (ragen2's default: written here, after the program's checks, rather than by Hydra before them).
    ``fresh_only``: only into a folder without one (a job that failed its checks: on file for
    ``ragen2-aggregate``, without touching an earlier run's record), and never failing."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or job_rank() != 0:  # rank 0 writes the job's record
        return
    hydra = HydraConfig.get()
    if hydra.output_subdir is not None:  # Hydra wrote it itself
        return
    folder = Path(hydra.runtime.output_dir) / ".hydra"
    if fresh_only and (folder.exists() or (folder.parent / LOCK).exists()):  # another run's, or one held
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, node in (
            ("config.yaml", cfg),
            ("hydra.yaml", HydraConfig.instance().cfg),
            ("overrides.yaml", hydra.overrides.task),
        ):
            write_atomic(folder / name, OmegaConf.to_yaml(node))
    except OSError:
        if not fresh_only:
            raise
