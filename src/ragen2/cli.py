"""The programs' front door: ``--version``, the refusals of a bad command line in one line, and Hydra.

``hydra_program(prog, config_name, task)`` is a whole Hydra program (``ragen2-train``, ``ragen2-eval``,
``ragen2-diagnose``): ``<prog> --version`` answers with ragen2's version, a moved key on the command line is
refused before Hydra composes (``command_line``), ``task`` runs on the config composed from
``<config_name>.yaml`` of ragen2's config tree (``ragen2.CONF_DIR``, and any folder on
``hydra.searchpath``), ``<prog> --help`` prints that file's ``hydra.help`` text, and a ``ConfigError`` ends a
single run with one line, ``<prog>: <key>=<value> … Fix: …``, not a traceback (``one_line_errors``;
``HYDRA_FULL_ERROR=1`` gives the traceback). Under ``--multirun`` a failed job does not stop the others of
its batch: ``JobErrors`` logs each job's error as it fails, and Hydra raises the first once the batch is
done, printed as its message alone (a ``ConfigError`` is one of Hydra's compact errors).
"""

from __future__ import annotations

import argparse
import functools
import importlib.metadata
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from ragen2 import CONF_DIR
from ragen2.config import user_conf
from ragen2.errors import ConfigError, exit_one_line
from ragen2.log import log
from ragen2.settings import check_overrides

R = TypeVar("R")


def hydra_program(prog: str, config_name: str, task: Callable[[DictConfig], object]) -> Callable[[], None]:
    """The console entry point of the Hydra program ``prog``: ``task`` run on the config composed from
    ``<config_name>.yaml``, behind ``command_line`` and ``one_line_errors``. Hydra names the job, and its
    log (``<run>/<name>.log``), after the module that defines ``task``."""

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name=config_name)
    @one_line_errors(prog)
    @functools.wraps(task)
    def run_task(cfg: DictConfig) -> None:
        task(cfg)

    return functools.partial(command_line, prog, run_task)


class ProgramParser(argparse.ArgumentParser):
    """The command line of a program that is not a Hydra one (``ragen2-export``, ``ragen2-aggregate``): its
    ``--help`` reads like the Hydra programs' (what it does, ``Usage:``, ``Examples:``, then its arguments and
    ``notes``), in plain text, and ``--version`` answers as theirs does."""

    def __init__(self, prog: str, about: str, examples: Sequence[str], notes: str = "") -> None:
        super().__init__(
            prog=prog, description=about, epilog=notes, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        self.examples = list(examples)
        self.add_argument("--version", action="version", version=version_line(prog))

    def format_help(self) -> str:
        formatter = self._get_formatter()
        formatter.add_text(self.description)
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups, prefix="Usage: ")
        formatter.add_text("Examples:\n" + "\n".join(f"  {example}" for example in self.examples))
        for group in self._action_groups:
            formatter.start_section(group.title)
            formatter.add_text(group.description)
            formatter.add_arguments(group._group_actions)
            formatter.end_section()
        formatter.add_text(self.epilog)
        return formatter.format_help()


def task_overrides() -> list[str]:
    """The command line's overrides of the Hydra job running now (a checkpoint's saved settings give way to
    them)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task)


def version_line(prog: str) -> str:
    """What ``<prog> --version`` prints: the program and the installed ragen2's version."""
    return f"{prog} (ragen2) {importlib.metadata.version('ragen2')}"


def command_line(prog: str, hydra_main: Callable[[], None]) -> None:
    """An entry point: ``--version`` answers with ragen2's version (Hydra would give its own), moved keys on
    the command line and a ``RAGEN2_CONF`` folder that is not there are refused with a one-line error, then
    Hydra runs."""
    if "--version" in sys.argv[1:]:
        print(version_line(prog))
        sys.exit(0)
    try:
        check_overrides(sys.argv[1:])
        user_conf()
    except ConfigError as err:
        sys.exit(f"{prog}: {err}")
    hydra_main()


def one_line_errors(prog: str) -> Callable[[Callable[[DictConfig], R]], Callable[[DictConfig], R]]:
    """Decorates a Hydra task function: a single run's ``ConfigError`` ends the process with one line on
    stderr, ``<prog>: <key>=<value> … Fix: …`` (Hydra would add its own lines around it). Under
    ``--multirun`` it is raised on, so that Hydra records the job as failed and runs the others;
    ``HYDRA_FULL_ERROR=1`` raises it on too, for the traceback."""

    def decorate(task: Callable[[DictConfig], R]) -> Callable[[DictConfig], R]:
        @functools.wraps(task)  # Hydra names the job (and its log) after the wrapped function's module
        def run_task(cfg: DictConfig) -> R:
            from hydra.core.hydra_config import HydraConfig
            from hydra.types import RunMode

            try:
                return task(cfg)
            except ConfigError as err:
                if HydraConfig.get().mode == RunMode.MULTIRUN:
                    raise
                exit_one_line(prog, err)  # SystemExit passes Hydra's run_job, which catches Exception

        return run_task

    return decorate


class JobErrors(Callback):
    """A Hydra callback (conf/hydra/default.yaml): under ``--multirun``, each failed job's error in its own log
    and on the console as it happens. Hydra raises only the batch's first failure, once the batch is done;
    a single run's error is printed by Hydra itself."""

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        if job_return.status != JobStatus.FAILED or config.hydra.mode != RunMode.MULTIRUN:
            return
        err = job_return._return_value  # the public return_value re-raises it
        job = f"job {config.hydra.job.num} ({' '.join(job_return.overrides)})"
        if isinstance(err, ConfigError):
            log.error("%s failed: %s", job, err)
        else:
            log.error("%s failed", job, exc_info=err)
