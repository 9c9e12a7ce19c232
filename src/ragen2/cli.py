"""The programs' front door: ``--version``, the refusals of a bad command line in one line, and Hydra.

``hydra_program(prog, config_name, task)`` is a whole Hydra program (``ragen2-train``, ``ragen2-eval``,
``ragen2-diagnose``): ``<prog> --version`` answers with ragen2's version, a key that only points at
another is refused on the command line before Hydra composes (``command_line``), ``task`` runs on the config
composed from ``<config_name>.yaml`` of ragen2's config tree (``ragen2.CONF_DIR``, and any folder on
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
from pathlib import Path
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
        try:
            task(cfg)
        except (
            Exception
        ):  # a job that fails before its record is written (a refused setting) is still on file
            from ragen2.lifecycle.folder import write_hydra_record

            write_hydra_record(cfg, fresh_only=True)
            raise

    return functools.partial(command_line, prog, run_task, config_name)


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

    overrides = list(HydraConfig.get().overrides.task)
    for (
        added
    ) in ADDED:  # chosen for the user (a checkpoint's env), not by them: its saved settings still apply
        if added in overrides:
            overrides.remove(added)
    return overrides


#: overrides ``command_line`` put in front of the user's (``checkpoint_env``)
ADDED: list[str] = []


def job_overrides() -> list[str]:
    """``task_overrides`` in a Hydra job or its settings check (``ragen2.config.SettingsCheck``); none for a
    config composed in Python."""
    from hydra.core.hydra_config import HydraConfig

    return task_overrides() if HydraConfig.initialized() else []


def checkpoint_env(args: Sequence[str], config_name: str) -> str | None:
    """``env=<option>`` for the env a ``checkpoint=`` argument's run trained on, for a program that takes one
    (eval, diagnose) and a command line that chooses no env: the program composes that env's config, so
    ``env.kwargs.*`` overrides are checked against the env the checkpoint plays (its saved settings still
    replace the option's values). None where that cannot be told; the program's own checks then speak."""
    from omegaconf import OmegaConf

    given = {a.split("=", 1)[0].lstrip("+~"): a.split("=", 1)[1] for a in args if "=" in a}
    if "checkpoint" not in OmegaConf.load(CONF_DIR / f"{config_name}.yaml") or "env" in given:
        return None
    path = Path(given.get("checkpoint", "")).expanduser()
    if not path.is_file():
        return None
    from ragen2.models.checkpoint import read_checkpoint

    try:
        state = read_checkpoint(path, key="checkpoint", finite=False)  # mapped: no weight is read
    except ValueError:  # a bad file: the program refuses it in one line
        return None
    env_id = ((state.get("RolloutDataModule") or {}).get("env") or {}).get("id")
    options = [
        f.stem
        for f in sorted((CONF_DIR / "env").glob("*.yaml"))
        if OmegaConf.select(OmegaConf.load(f), "id") == env_id
    ]
    return f"env={options[0]}" if env_id and options else None


def version_line(prog: str) -> str:
    """What ``<prog> --version`` prints: the program and the installed ragen2's version."""
    return f"{prog} (ragen2) {importlib.metadata.version('ragen2')}"


def command_line(prog: str, hydra_main: Callable[[], None], config_name: str | None = None) -> None:
    """An entry point: ``--version`` answers with ragen2's version (Hydra would give its own), keys that only
    point at another on the command line, a ``RAGEN2_CONF`` folder that is not there and (for a single run of
    ``config_name``) overrides Hydra cannot compose are refused with a one-line error, then Hydra runs."""
    args = sys.argv[1:]
    if "--version" in args:
        print(version_line(prog))
        sys.exit(0)
    try:
        check_overrides(args)
        user_conf()
        if config_name is not None and (env := checkpoint_env(args, config_name)) is not None:
            ADDED.append(env)
            args = sys.argv[1:] = [env, *args]
        if config_name is not None and not any(a.startswith("-") for a in args):  # flags: Hydra's own
            check_composes(args, config_name)
    except ConfigError as err:
        sys.exit(f"{prog}: {err}")
    hydra_main()


def check_composes(overrides: Sequence[str], config_name: str) -> None:
    """Compose ``config_name`` with ``overrides`` as Hydra is about to: an error of composition (an option a
    group does not have, a key that is not there, ``+`` on one that is, a sweep without ``--multirun``) is a
    ``ConfigError`` of one line with the fix."""
    from hydra.errors import HydraException

    from ragen2.config import compose

    try:
        compose(overrides, config_name)
    except HydraException as err:
        raise composition_error(err, overrides, config_name) from None


def composition_error(err: Exception, overrides: Sequence[str], config_name: str) -> ConfigError:
    """Hydra's several-line composition error as one line naming the override and the fix."""
    import difflib
    import re

    from hydra.errors import MissingConfigException

    text = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
    if isinstance(err, MissingConfigException) and err.options:
        found = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
        group, option = found.groups() if found else ("<group>", "<option>")
        return ConfigError(
            f"{group}={option} is not a config of {group}. Fix: {group}=<one of {', '.join(sorted(err.options))}>"
        )
    given = {o.split("=", 1)[0].lstrip("+~"): o for o in overrides}
    if (found := re.search(r"Could not override '([^']+)'", text)) and found.group(1) in given:
        key = found.group(1)
        value = given[key].split("=", 1)[-1]
        keys = _leaf_keys(config_name)
        top = key.split(".")[0]
        close = difflib.get_close_matches(
            key.rpartition(".")[2], [k.rpartition(".")[2] for k in keys if k.startswith(f"{top}.")], n=1
        )
        meant = [k for k in keys if k.startswith(f"{top}.") and close and k.endswith(f".{close[0]}")][:1]
        fix = f"{meant[0]}={value}, or " if meant else ""
        return ConfigError(f"{key}={value} is not a key of the config. Fix: {fix}+{key}={value} to add one")
    if found := re.search(r"An item is already at '([^']+)'", text):
        key = found.group(1)
        value = given.get(key, "=<value>").split("=", 1)[-1]
        return ConfigError(f"+{key}={value} adds a key that is already there. Fix: {key}={value}")
    if found := re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", text):
        key, value = found.groups()
        return ConfigError(
            f"{key}={value} holds several values. Fix: --multirun {key}={value} to sweep them, or {key}=[{value}] "
            "for a list"
        )
    return ConfigError(text)


@functools.cache
def _leaf_keys(config_name: str) -> tuple[str, ...]:
    """Every leaf key of ``config_name`` as composed with no override (dotted)."""
    from omegaconf import OmegaConf

    from ragen2.config import compose

    def leaves(node: object, prefix: str) -> list[str]:
        if isinstance(node, dict):
            return [k for key, value in node.items() for k in leaves(value, f"{prefix}{key}.")]
        return [prefix.rstrip(".")]

    cfg = OmegaConf.to_container(compose([], config_name), resolve=False)
    return tuple(leaves(cfg, ""))


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
