"""Where the Hydra config tree lives, composing it from Python, and checks that span config groups.

Each consumer gets one validated object for its node (``algo`` -> ``AlgoConfig``, ``rollout`` ->
``RolloutConfig``, ``filter`` -> ``GroupFilter``, …), built by ``settings``, which refuses a key the
object does not have, says where a moved key went, and refuses a value of the wrong type against the
field's annotation (a float for an int, text for a number, a number for a bool). ``check_overrides`` does
the same for command-line overrides before Hydra sees them; ``validate`` checks the composed config before
anything is built (moved keys, the run's own keys, the device count, the checkpoint folder) and
``check_batch`` what spans two objects (the mini-batch against the batch).

On the command line a ``ConfigError`` is one line, ``ragen2-train: <key>=<value> … Fix: …``, not a
traceback (``one_line_errors``; ``HYDRA_FULL_ERROR=1`` gives the traceback). Under ``--multirun`` a failed
job does not stop the others of its batch: ``JobErrors`` logs each job's error as it fails, and Hydra
raises the first once the batch is done, printed as its message alone (a ``ConfigError`` is one of Hydra's
compact errors).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.metadata
import inspect
import math
import os
import re
import sys
import tempfile
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hydra.errors import CompactHydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ragen2.log import log

# ${ragen2.tokens:a,b}: a token count as the floored product (Dr.GRPO's constant = tokens per turn × turns,
# DAPO's overlong buffer = a fraction of the per-turn limit)
OmegaConf.register_new_resolver("ragen2.tokens", lambda *xs: math.floor(math.prod(xs)), replace=True)
# ${ragen2.cap:value,cap}: value capped at cap, or value itself when cap is null (an env's own turn
# limit under max_turns_cap)
OmegaConf.register_new_resolver(
    "ragen2.cap", lambda value, cap: value if cap is None else min(value, cap), replace=True
)

# ${ragen2.is_set:${algo.critic}}: whether a node is set (DDP looks for unused parameters only with a critic)
OmegaConf.register_new_resolver("ragen2.is_set", lambda node: node is not None, replace=True)
# ${ragen2.val_batches:${val.every_n_iterations}}: Lightning's limit_val_batches, 0 (its "no validation", which
# it checks before the epoch interval) when val.every_n_iterations=0
OmegaConf.register_new_resolver("ragen2.val_batches", lambda every: 1.0 if every else 0, replace=True)

CONF_DIR = Path(os.environ.get("RAGEN2_CONF", Path(__file__).resolve().parents[2] / "conf"))

#: keys that moved: old -> (new, why)
MOVED: dict[str, tuple[str, str]] = {
    "filter.loss_scaling": ("algo.loss_scaling", "it scales the update, not the selection"),
    "filter.max_empty_iterations": ("algo.max_empty_iterations", "the update counts empty batches"),
    "algo.critic_optim": ("algo.critic", "the critic holds its own lr, weight_decay and grad_clip"),
    "algo.vf_coef": ("algo.critic.vf_coef", "the critic weighs its own loss"),
    "algo.value_clip": ("algo.critic.value_clip", "the critic clips its own loss"),
    "algo.critic_warmup_iterations": ("algo.critic.warmup_iterations", "the critic owns its warm-up"),
}
#: command-line keys that now only point at another key (data.sampling: ${algo.sampling})
REDIRECTED: dict[str, tuple[str, str]] = {
    "data.sampling": ("algo.sampling", "DAPO's dynamic sampling is part of the algorithm"),
    "data.shaping": ("algo.shaping", "DAPO's overlong shaping is part of the algorithm"),
}
RESPELLED: dict[str, str] = {
    "+algo/critic": "algo/critic=<name> without '+' (every algo has a critic default: null, value_head for ppo)",
    "+algo/kl_reward": "algo/kl_reward=<name> without '+' (every algo has a kl_reward default: null)",
}

T = TypeVar("T")
R = TypeVar("R")


class ConfigError(ValueError, CompactHydraException):
    """A config value that cannot work, named with its key, its value and the fix.

    Hydra prints a compact exception as its message alone (no traceback unless ``HYDRA_FULL_ERROR=1``)."""


def _moved(key: str, table: Mapping[str, tuple[str, str]] = MOVED) -> str | None:
    """Where ``key`` lives now, with the reason, or None if it did not move."""
    for old, (new, why) in table.items():
        if key == old or key.startswith(old + "."):
            return f"{key} has moved: set {new + key[len(old) :]} instead ({why})"
    return None


def check_overrides(overrides: Iterable[str]) -> None:
    """Refuse command-line overrides of keys that moved, naming the new place (Hydra would only say
    the key is not in the config)."""
    for override in overrides:
        spelled = override.split("=", 1)[0]
        if spelled in RESPELLED:
            raise ConfigError(f"{override!r}: use {RESPELLED[spelled]}")
        key = spelled.lstrip("~+")
        moved = _moved(key) or _moved(key, REDIRECTED)
        if moved is not None:
            raise ConfigError(f"{override!r}: {moved}")


def version_line(prog: str) -> str:
    """What ``<prog> --version`` prints: the program and the installed ragen2's version."""
    return f"{prog} (ragen2) {importlib.metadata.version('ragen2')}"


def command_line(prog: str, hydra_main: Callable[[], None]) -> None:
    """An entry point: ``--version`` answers with ragen2's version (Hydra would give its own), moved keys on
    the command line are refused with a one-line error, then Hydra runs."""
    if "--version" in sys.argv[1:]:
        print(version_line(prog))
        sys.exit(0)
    try:
        check_overrides(sys.argv[1:])
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


def exit_one_line(prog: str, err: ConfigError) -> typing.NoReturn:
    """End the process with ``<prog>: <err>`` on stderr and status 1 (``HYDRA_FULL_ERROR=1``: raise ``err``)."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise err
    sys.exit(f"{prog}: {err}")


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


# ---- types against the dataclasses' annotations -------------------------------------------------------
_TYPE_NAMES: dict[type, str] = {bool: "true or false", int: "an integer", float: "a number", str: "text"}


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` may stand for a ``hint``: exact for bool, int, float (an int too), str, their unions
    and containers; any other type (a class, a Protocol, a callable) is the constructor's to check."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return (value is None and type(None) in args) or any(
            _fits(value, a) for a in args if a is not type(None)
        )
    if origin in (tuple, list, Sequence):
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            return False
        items = args if origin is tuple and Ellipsis not in args else args[:1] * len(value)
        return all(_fits(v, a) for v, a in zip(value, items, strict=False))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping)
    return True


def _expected(hint: Any) -> str:
    """``hint`` in words (only called for a hint ``_fits`` checks)."""
    if hint in _TYPE_NAMES:
        return _TYPE_NAMES[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        words = [_expected(a) for a in args if a is not type(None)]
        return " or ".join(words + (["null"] if type(None) in args else []))
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return "a mapping of key: value"
    items = [a for a in args if a is not Ellipsis]
    plural = (
        {bool: "bools", int: "integers", float: "numbers", str: "strings"}.get(items[0]) if items else None
    )
    if plural is None or len(set(items)) > 1:
        return "a list"
    return (
        f"a list of {len(items)} {plural}"
        if origin is tuple and Ellipsis not in args
        else f"a list of {plural}"
    )


def shown(value: Any) -> str:
    """A value as it is written on the command line (``true``, ``null``, ``'text'``, ``2.5``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return f"[{', '.join(shown(v) for v in value)}]"
    return repr(value) if isinstance(value, str) else str(value)


def _kind(value: Any) -> str:
    """What ``value`` is, in words."""
    kinds = ((bool, "a bool"), (int, "an integer"), (float, "a float"), (str, "text"), (Mapping, "a mapping"))
    if value is None:
        return "null"
    for cls, word in kinds:  # bool before int: a bool is an int to isinstance
        if isinstance(value, cls):
            return word
    return "a list" if isinstance(value, Sequence) else f"a {type(value).__name__}"


def _finite(value: Any) -> bool:
    """Whether every number in ``value`` (a number, or a list of them) is finite; a mapping is a node of its
    own, checked where it is."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return all(_finite(v) for v in value)
    return True


def _fix(key: str, value: Any, hint: Any, example: Any) -> str:
    """The fix a type error names: the integers beside a float, else ``example``, else the type in words."""
    if hint is int and isinstance(value, float) and math.isfinite(value):
        low, high = math.floor(value), math.ceil(value)
        return f"{key}={low}" if low == high else f"{key}={low} or {key}={high}"
    if example is not None and _fits(example, hint) and _finite(example):
        return f"{key}={shown(example)}"
    return f"{key}=<{_expected(hint)}>"


def check_type(key: str, value: Any, hint: Any, example: Any = None) -> None:
    """Refuse ``value`` for the config key ``key`` unless it fits ``hint`` and every number in it is finite
    (no setting takes nan or ±inf: comparisons such as ``lr > 0`` let them through); the fix shows
    ``example``."""
    if not _fits(value, hint):
        raise ConfigError(
            f"{key}={shown(value)} is {_kind(value)}, not {_expected(hint)}. Fix: {_fix(key, value, hint, example)}"
        )
    if not _finite(value):
        problem = (
            "is not a finite number" if isinstance(value, float) else "holds a number that is not finite"
        )
        raise ConfigError(
            f"{key}={shown(value)} {problem} (no setting takes nan or inf). Fix: {_fix(key, value, hint, example)}"
        )


def unknown_key(key: str, value: Any, known: Iterable[str], where: str = "a setting") -> ConfigError:
    """The error for ``key=value`` that names nothing ``known`` (the last part of ``key`` against the names
    beside it): the close name as the fix when there is one (a misspelling), else the names there are."""
    parent, _, name = key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    names = list(known)
    close = difflib.get_close_matches(name, names, n=1)
    fix = (
        f"{prefix}{close[0]}={shown(value)}"
        if close
        else f"one of {', '.join(names)}"
        if names
        else f"remove {key} (it takes none)"
    )
    return ConfigError(f"{key}={shown(value)} is not {where}. Fix: {fix}")


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[Any, Any]]:
    """Each field of the dataclass ``cls``: its resolved annotation and its default (None when it has none)."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: (hints[f.name], None if f.default is dataclasses.MISSING else f.default)
        for f in dataclasses.fields(cls)
    }


def settings(cls: type[T], node: object, key: str) -> T:
    """``cls(**node)`` for the config node at ``key`` (a mapping, an already built ``cls``, or None for all
    defaults), refusing keys ``cls`` does not have and values whose type does not fit the field's annotation.

    The error names ``key.<name>`` with its value, where a moved key went, the keys ``cls`` knows, or the
    type the field takes; a node that is not a mapping is named with its value.
    """
    if isinstance(node, cls):
        return node
    fields = _field_types(cls)
    if node is not None and not isinstance(node, Mapping):
        raise ConfigError(
            f"{key}={shown(node)} is {_kind(node)}, not a mapping of settings. Fix: a mapping with any of "
            f"{', '.join(fields)}"
        )
    values: dict[str, Any] = dict(node or {})
    for name, value in values.items():
        if name in fields:
            check_type(f"{key}.{name}", value, *fields[name])
            continue
        moved = _moved(f"{key}.{name}")
        raise ConfigError(moved) if moved else unknown_key(f"{key}.{name}", value, fields)
    return cls(**values)


def check_batch(mini_batch_size: int, groups: int, group_size: int) -> None:
    """The mini-batch must fit the iteration's batch (checked once both nodes are valid on their own)."""
    batch = groups * group_size
    if mini_batch_size > batch:
        raise ConfigError(
            f"algo.mini_batch_size={mini_batch_size} exceeds the batch of rollout.groups × "
            f"rollout.group_size = {batch} episodes, so no optimizer step would see a full mini-batch. "
            f"Fix: algo.mini_batch_size ≤ {batch}, or more rollouts."
        )


def build(node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate``, with a constructor's ValueError (a bad value, whose message names its
    key) raised as a ``ConfigError`` of its own rather than wrapped in Hydra's InstantiationException."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        while isinstance(cause, InstantiationException):
            cause = cause.__cause__
        if not isinstance(cause, ValueError):
            raise
        raise (cause if isinstance(cause, ConfigError) else ConfigError(str(cause))) from None


def validate(cfg: DictConfig) -> None:
    """Checks before anything is built: keys that moved, the run's own keys, the sampling temperature, the
    ranks, the precision, the folders the run writes, the types of what each ``_target_`` is given."""
    for old in MOVED:
        parent, _, leaf = old.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig) and leaf in node:
            raise ConfigError(f"{_moved(old)} (a config file sets {old})")
    _check_nodes(cfg)
    check_top_level(cfg)
    _check_run_keys(cfg)
    _check_temperature(cfg)
    _check_ranks(cfg)
    _check_precision(cfg)
    _check_master_weights(cfg)
    check_writable(run_folders(cfg))
    _check_env_and_model(cfg)
    check_target_types(cfg)  # last: it imports the targets' modules


#: nodes that hold settings; an override can replace one with a value (``algo.optim=0.1``)
_NODES = ("env", "algo", "algo.optim", "model", "rollout", "filter", "val", "trainer")


def _check_nodes(cfg: DictConfig) -> None:
    """Each node of settings is a mapping, before any check reads a key inside one."""
    for key in _NODES:
        node = OmegaConf.select(cfg, key, default=None)
        if node is not None and not isinstance(node, DictConfig):
            raise ConfigError(
                f"{key}={node!r} is not a mapping of settings. Fix: set one of its keys "
                f"({key}.<name>=value), or choose a config of the group ({key.replace('.', '/')}=<name>)"
            )


_GLOBAL_PACKAGE = "# @package _global_"


@functools.cache
def top_level_keys(config_name: str = "train") -> tuple[str, ...]:
    """The keys a composed ``config_name`` holds at its top: its primary file's own keys and its config
    groups, except groups whose options all write elsewhere (``experiment``, ``debug``: ``_global_``)."""
    primary = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{config_name}.yaml"))
    assert isinstance(primary, dict)
    groups = [next(iter(d)) for d in primary.get("defaults", []) if isinstance(d, dict)]
    placed = [
        g
        for g in groups
        if any(not f.read_text().startswith(_GLOBAL_PACKAGE) for f in (CONF_DIR / g).glob("*.yaml"))
    ]
    return tuple(k for k in [*primary, *placed] if k not in ("defaults", "hydra"))


def check_top_level(cfg: DictConfig, config_name: str = "train") -> None:
    """A key added at the top (``+lr=1e-5``, ``+seeed=1``) is read by nothing: refused, with the key meant
    (``config_name``: the program's config, ``ragen2-<config_name>``)."""
    known = top_level_keys(config_name)
    for key in cfg:
        if key not in known:
            raw = cfg._get_node(key)
            value = raw._value() if raw is not None else None
            raise unknown_key(str(key), value, known, f"a key of ragen2-{config_name}'s config")


#: the largest seed numpy (and so Lightning's seed_everything) takes: 2**32 - 1
MAX_SEED = 2**32 - 1


def _check_run_keys(cfg: DictConfig) -> None:
    """The top-level keys, named as the user sets them (Lightning would name ``max_epochs``, the env
    ``env.max_turns``)."""
    check_type("iterations", cfg.iterations, int, 2)
    if cfg.iterations < 1:
        raise ConfigError(
            f"iterations={cfg.iterations} must be ≥ 1 (one RL iteration per Lightning epoch). Fix: iterations=2"
        )
    check_seed_and_cap(cfg)


def check_seed_and_cap(cfg: DictConfig) -> None:
    """``seed`` and ``max_turns_cap``, the top-level keys every program that rolls out shares."""
    check_type("seed", cfg.seed, int, 0)
    if not 0 <= cfg.seed <= MAX_SEED:
        raise ConfigError(
            f"seed={cfg.seed} is outside 0 … {MAX_SEED}, the seeds numpy takes (Lightning seeds it with the "
            "run's seed). Fix: seed=0"
        )
    cap = cfg.get("max_turns_cap")
    check_type("max_turns_cap", cap, int | None, 3)
    if cap is not None and cap < 1:
        raise ConfigError(
            f"max_turns_cap={cap} must be ≥ 1 turn, or null for each env's own turn limit. "
            "Fix: max_turns_cap=3, or max_turns_cap=null"
        )


#: keys of a ``_target_`` node that are Hydra's, not the target's
_HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
_INTERPOLATION = re.compile(r"\$\{([\w.]+)\}")


def check_target_types(cfg: DictConfig) -> None:
    """What a config node hands its ``_target_`` callable, before anything is built: a key the callable does
    not take (``+trainer.max_epoch=3``) is refused with the argument meant, and for ragen2's own targets (a
    filter, a sampler, a callback, an estimator) each value against its annotation. A value that only
    reaches its target through an interpolation is named where it is set
    (``module.temperature: ${rollout.temperature}`` -> ``rollout.temperature``)."""
    for path, node in _target_nodes(cfg, ""):
        target = str(node._target_)
        signature = _parameters(target)
        if signature is None:  # not importable here: its constructor checks alone
            continue
        hints, defaults, takes_any = signature
        for name in node:
            if name in _HYDRA_KEYS:
                continue
            child = node._get_node(name)
            assert child is not None  # name is one of the node's own keys
            raw = child._value()
            if name not in defaults and not takes_any:
                raise unknown_key(f"{path}{name}", raw, defaults, f"an argument of {target}")
            if not target.startswith("ragen2.") or name not in hints:
                continue
            source = _INTERPOLATION.fullmatch(raw) if isinstance(raw, str) else None
            value = node[name]
            if isinstance(value, DictConfig):  # an object of its own: its node is checked where it is
                continue
            if not isinstance(value, str | int | float | bool | None):
                value = OmegaConf.to_container(value, resolve=True)
            example = defaults[name] if defaults[name] is not inspect.Parameter.empty else None
            check_type(source.group(1) if source else f"{path}{name}", value, hints[name], example)


def _target_nodes(node: DictConfig, path: str) -> Iterable[tuple[str, DictConfig]]:
    """Every node under ``node`` that names a ``_target_``, with its dotted path (and a trailing dot);
    interpolated nodes (``data.filter: ${filter}``) are visited where they are defined."""
    if isinstance(node.get("_target_"), str):
        yield path, node
    for key in node:
        child = node._get_node(key)
        assert child is not None  # key is one of the node's own keys
        if (path == "" and key == "hydra") or child._is_interpolation():
            continue
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            yield from _target_nodes(child, f"{path}{key}.")


def _passes_on(cls: type) -> bool:
    """Whether ``cls`` has no ``__init__`` of its own, or one that only passes ``(*args, **kwargs)`` on."""
    init = vars(cls).get("__init__")
    if init is None:
        return True
    rest = list(inspect.signature(init).parameters.values())[1:]
    return all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in rest)


@functools.cache
def _parameters(target: str) -> tuple[dict[str, Any], dict[str, Any], bool] | None:
    """The callable ``target`` names: its parameters' annotations (none where they do not resolve here),
    every parameter's default (``inspect.Parameter.empty`` without one), and whether it takes any keyword
    (``**kwargs``); None when it does not import here."""
    from hydra.utils import get_object

    try:
        obj = get_object(target)
        # a subclass that passes (*args, **kwargs) on takes what the class it extends takes
        function = (
            next((c.__init__ for c in obj.__mro__ if not _passes_on(c)), obj)
            if isinstance(obj, type)
            else obj
        )
        signature = inspect.signature(function)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(function)
    except (NameError, TypeError, AttributeError):
        hints = {}
    kinds = {p.kind for p in signature.parameters.values()}
    defaults = {
        name: p.default
        for name, p in signature.parameters.items()
        if name != "self" and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    hints = {k: v for k, v in hints.items() if k in defaults}
    return hints, defaults, inspect.Parameter.VAR_KEYWORD in kinds


def _check_env_and_model(cfg: DictConfig) -> None:
    """``env`` (its options against what the env declares) and ``model`` (a source that loads here) as the
    objects their consumers build, before Lightning starts."""
    from ragen2.data.rollout_config import EnvConfig
    from ragen2.models.loading import ModelConfig

    for key, cls in (("env", EnvConfig), ("model", ModelConfig)):
        try:
            settings(cls, OmegaConf.to_container(cfg[key], resolve=True), key)
        except ConfigError:
            raise
        except ValueError as err:  # a check that names its key (env.max_turns=0 …), as build() passes it on
            raise ConfigError(str(err)) from None


def _check_temperature(cfg: DictConfig) -> None:
    """Greedy rollouts (temperature 0) make every group's K rollouts one and the same episode: no group has
    reward variance, so the filter keeps nothing and group-relative advantages are all 0."""
    temperature = cfg.rollout.temperature
    check_type("rollout.temperature", temperature, float, 1.0)
    if temperature == 0:
        raise ConfigError(
            f"rollout.temperature=0 samples greedily: the rollout.group_size={cfg.rollout.group_size} rollouts "
            "of a group are one and the same episode, no group has reward variance, so the filter keeps none "
            "and group-relative advantages are 0 (nothing trains). Fix: rollout.temperature=1.0 (greedy "
            "success is measured by validation and ragen2-eval)"
        )


#: Lightning precisions that cast every float tensor of the batch to half precision
_HALF_BATCH = ("bf16-true", "16-true")


def _check_precision(cfg: DictConfig) -> None:
    """A ``-true`` half precision casts the rollout batch itself (rewards, the sampler's log-probs) to
    bf16/fp16 before the update sees it: the importance ratios and advantages would be rounded."""
    precision = str(cfg.trainer.get("precision", "32-true"))
    if precision in _HALF_BATCH:
        raise ConfigError(
            f"trainer.precision={precision} casts the rollout batch (rewards, sampler log-probs) and the "
            f"weights the optimizer steps to {precision.split('-')[0]}. Fix: trainer.precision="
            f"{precision.replace('true', 'mixed')} with model.dtype=float32 (fp32 weights and batch, "
            "half-precision compute)"
        )


#: significant bits of each half-precision weight dtype (the implicit leading bit included)
_SIGNIFICANT_BITS = {"bfloat16": 8, "float16": 11}


def _check_master_weights(cfg: DictConfig) -> None:
    """Half-precision weights are what the optimizer steps: a step below half a unit in the last place of a
    weight is rounded away. At lr 1e-6 (the paper's) bf16 loses the step of every weight above 5e-4."""
    dtype, lr = str(cfg.model.get("dtype", "float32")), cfg.algo.optim.lr
    check_type("algo.optim.lr", lr, float, 1e-6)
    # under LoRA the optimizer steps fp32 adapters (PEFT keeps them fp32 over a half-precision base)
    if dtype not in _SIGNIFICANT_BITS or cfg.model.get("lora") is not None:
        return
    # half a unit in the last place of |w| ∈ [2^e, 2^(e+1)) is 2^(e-bits): above 2·lr·2^bits, lr rounds to 0
    lost_above = lr * 2 ** (_SIGNIFICANT_BITS[dtype] + 1)
    log.warning(
        "model.dtype=%s: the optimizer steps %s weights, and a step of about algo.optim.lr=%g is rounded "
        "away for every weight above %.1e in magnitude (most of a transformer's). Fix: model.dtype=float32 "
        "with trainer.precision=bf16-mixed (fp32 weights and optimizer, bf16 compute)",
        dtype,
        dtype,
        lr,
        lost_above,
    )


#: strategies that train data-parallel with one global filter (conf/trainer/ddp.yaml, fsdp.yaml)
DATA_PARALLEL = (
    "lightning.pytorch.strategies.DDPStrategy",
    "lightning.pytorch.strategies.ModelParallelStrategy",
)
SHARDED = "lightning.pytorch.strategies.ModelParallelStrategy"


def _check_ranks(cfg: DictConfig) -> None:
    """The device count, the strategy and the settings that depend on them must fit together."""
    trainer = cfg.trainer
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ConfigError(
            f"trainer.devices={devices!r}: give a number of processes per node (the global group count "
            "is split among them). Fix: trainer.devices=1, or trainer=ddp trainer.devices=2"
        )
    strategy = trainer.get("strategy")
    target = strategy.get("_target_") if isinstance(strategy, DictConfig) else strategy
    world = devices * int(nodes)
    if world > 1 and target not in DATA_PARALLEL:
        raise ConfigError(
            f"trainer.devices={devices}, trainer.num_nodes={nodes} with trainer.strategy={target!r}: several "
            "ranks train only with the strategies that share one SNR filter and equal optimizer steps. "
            "Fix: trainer=ddp or trainer=fsdp (then trainer.devices=N)"
        )
    groups = cfg.rollout.groups
    check_type("rollout.groups", groups, int, 4)
    if groups % world:
        raise ConfigError(
            f"rollout.groups={groups} does not divide among {world} ranks (trainer.devices × num_nodes): "
            f"each rank rolls out an equal share. Fix: rollout.groups a multiple of {world}"
        )
    if target == SHARDED and OmegaConf.select(cfg, "algo.share_prompt_prefix", default=False):
        raise ConfigError(
            "algo.share_prompt_prefix=true with trainer=fsdp: it runs one extra decoder pass per shared "
            "prompt, a number that differs between ranks, and every pass of a sharded model is a collective. "
            "Fix: algo.share_prompt_prefix=false, or trainer=ddp"
        )


def run_folders(cfg: DictConfig) -> list[tuple[str, str]]:
    """The folders a training run writes, by the key that sets each: the run folder and the checkpoint folder."""
    from ragen2.resume import checkpoint_dir  # resume imports this module

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
        problem = _unwritable(Path(folder).expanduser().absolute())
        if problem:
            raise ConfigError(
                f"{key}={folder} cannot be written: {problem}. Fix: {key}=<a writable folder>"
                + (", or hydra.run.dir=<a writable folder>" if key == "run_dir" else "")
            )


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` could not be created and written, or None."""
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            return None
    except OSError as err:
        return f"{existing} does not take new files ({err.strerror})"


def with_saved_settings(
    cfg: DictConfig,
    saved: Mapping[str, Mapping[str, Any]],
    overrides: Sequence[str],
    replaced_by_choice: Iterable[str] = ("env", "model"),
) -> DictConfig:
    """``cfg`` with the settings a checkpoint saved (``saved``: node -> values, e.g. the run's env, model and
    rollout) in place of its own, except what the command line sets. A key it sets (``env.max_turns=5``)
    keeps the composed value; a group it chooses among ``replaced_by_choice`` (``env=sokoban``) keeps the
    whole composed node. Keys a saved node lacks stay as composed: the rollout's sampler, so
    ``rollout=<backend>`` picks the backend and the run's sampling values stay."""
    cfg = cfg.copy()
    keys = [o.split("=", 1)[0].lstrip("~+") for o in overrides]
    for node, values in saved.items():
        if node not in cfg or (node in keys and node in replaced_by_choice):
            continue
        merged = cfg[node].copy()
        for key, value in values.items():
            merged[key] = value
        for key in keys:
            if key.startswith(f"{node}."):
                OmegaConf.update(merged, key[len(node) + 1 :], OmegaConf.select(cfg, key), merge=False)
        cfg[node] = merged
    return cfg


def compose(
    overrides: Sequence[str] = (), config_name: str = "train", run_dir: str | None = None
) -> DictConfig:
    """The config ``ragen2-train`` would run with these overrides (``run_dir`` replaces Hydra's output dir)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    check_overrides(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    with open_dict(cfg):
        cfg.run_dir = run_dir or "outputs/notebook"
    return cfg
