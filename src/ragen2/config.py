"""The Hydra config tree: where it lives, its resolvers, composing it from Python, and the checks that span it.

Each consumer gets one validated object for its node (``algo`` -> ``AlgoConfig``, ``rollout`` ->
``RolloutConfig``, ``filter`` -> ``GroupFilter``, …), built by ``ragen2.settings.settings``. Here,
``validate`` (also ``SettingsCheck``, a Hydra callback, before Hydra makes a single run's folder) checks the
composed config before anything is built (the run's own keys, the device count, the folders the run writes,
the nodes as their consumers build them, the mini-batch against the batch, the types of what each
``_target_`` is given), and ``compose`` gives the config a program would run with.
The programs' front door is ``ragen2.cli``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from ragen2 import CONF_DIR, user_conf_dirs
from ragen2.errors import ConfigError
from ragen2.lifecycle.folder import as_job, check_writable, one_line, run_folders
from ragen2.log import log
from ragen2.settings import (
    check_overrides,
    check_target_types,
    check_type,
    settings,
    shown,
    unknown_key,
)

if TYPE_CHECKING:
    from ragen2.data.rollout_config import EnvConfig, RolloutConfig
    from ragen2.models.loading import ModelConfig
    from ragen2.models.placement import Placement

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


def user_conf() -> list[str]:
    """The folders of the user's own configs (``RAGEN2_CONF=<folder>[:<folder>…]``), as Hydra search-path
    entries: each program's primary config puts them on ``hydra.searchpath``, after ragen2's own tree, so
    ``env=<name>`` also finds ``<folder>/env/<name>.yaml``. A folder that is not there is refused."""
    folders = user_conf_dirs()
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(
                f"RAGEN2_CONF={os.environ['RAGEN2_CONF']}: {folder} is not a folder. Fix: RAGEN2_CONF=<the "
                "folder holding your config groups, e.g. <folder>/env/<name>.yaml>, or unset RAGEN2_CONF"
            )
    return [f"file://{folder}" for folder in folders]


def organism_folder(which: str = "") -> str:
    """``${ragen2.organism:}``: the organism model's folder, built under ``$RAGEN2_CACHE`` on first use;
    ``${ragen2.organism:warm}``: its warm start, shipped with ragen2 (``ragen2.organism``)."""
    from ragen2.organism import folder, warm_start

    if which not in ("", "warm"):
        raise ConfigError(
            f"${{ragen2.organism:{which}}} names no organism model. Fix: ${{ragen2.organism:}} (the random "
            "model) or ${ragen2.organism:warm} (its warm start)"
        )
    return warm_start() if which == "warm" else folder()


# ${ragen2.organism:}: conf/model/organism.yaml's model.name_or_path (the builder renders through the agent,
# which the models layer beneath it cannot import)
OmegaConf.register_new_resolver("ragen2.organism", organism_folder, replace=True)

# ${ragen2.user_conf:}: hydra.searchpath of each primary config (train.yaml, eval.yaml, diagnose.yaml)
OmegaConf.register_new_resolver("ragen2.user_conf", user_conf, replace=True)


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


@dataclass(frozen=True)
class Checked:
    """The nodes ``validate`` built to check them, handed to the DataModule and the module (``handed``) so
    that each is built once: ``env``, ``model``, ``rollout``, ``val`` (settings), ``algo`` (with its
    estimators and critic) and ``filter``."""

    nodes: Mapping[str, Any]

    def handed(self, node: DictConfig) -> Any:
        """``node`` (``data``, ``module``) built with the checked objects in place of its keys that interpolate
        a checked node (``filter: ${filter}``); Hydra builds the rest. Each object goes to the built partial,
        not to ``instantiate``, which would turn a dataclass back into config."""
        raw = OmegaConf.to_container(node, resolve=False)  # interpolations as written: "${filter}"
        assert isinstance(raw, dict)
        given = {
            str(key): self.nodes[name]
            for key, value in raw.items()
            if (name := _whole(value)) is not None and name in self.nodes
        }
        return build(node, _partial_=True, **dict.fromkeys(given))(**given)


def _whole(value: Any) -> str | None:
    """The node a value interpolates whole (``${filter}``: ``filter``), or None."""
    if isinstance(value, str) and value.startswith("${") and value.endswith("}") and value.count("$") == 1:
        return value[2:-1]
    return None


def validate(cfg: DictConfig) -> Checked:
    """Checks before anything is built: the run's own keys, the sampling temperature, the ranks, the
    precision, the folders the run writes, the types of what each ``_target_`` is given; the nodes it built
    to check them (``Checked``)."""
    _check_nodes(cfg)
    check_top_level(cfg)
    _check_run_keys(cfg)
    _check_temperature(cfg)
    _check_ranks(cfg)
    _check_precision(cfg)
    _check_master_weights(cfg)
    check_writable(run_folders(cfg))
    nodes = _check_built_nodes(cfg)
    check_target_types(cfg)  # it imports the targets' modules
    return Checked({**nodes, **_check_built_targets(cfg)})


class SettingsCheck(Callback):
    """Hydra callback (each program's primary config; conf/train.yaml's before ``RunFolder``): the program's
    checks (``check``: ``validate`` for ragen2-train, ``ragen2.eval.check`` …) on a single run's config before
    Hydra makes the run folder, so that a refused setting leaves no folder behind. The program runs them again
    (a config composed in Python meets the same checks). Under ``--multirun`` each job checks its own
    (``ragen2.train.run``): a refused job is on file for ``ragen2-aggregate``, the others run."""

    def __init__(self, check: str = "ragen2.config.validate") -> None:
        self.check = check

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import get_method

        check = get_method(self.check)
        with as_job(config, Path(str(config.hydra.run.dir)).absolute()) as job:
            one_line(config, lambda: check(job))


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
    max_epochs = OmegaConf.select(cfg, "trainer.max_epochs", default=None)
    if max_epochs is not None and max_epochs != cfg.iterations:
        length = max_epochs if isinstance(max_epochs, int) and max_epochs >= 1 else cfg.iterations
        raise ConfigError(
            f"trainer.max_epochs={shown(max_epochs)}: a run's length is set by iterations (one RL iteration per "
            f"Lightning epoch; trainer.max_epochs follows it). Fix: iterations={length}"
        )
    for name, node in (cfg.get("logger") or {}).items():
        target = str(node.get("_target_", "")) if isinstance(node, DictConfig) else ""
        if target.endswith("MLFlowLogger") and importlib.util.find_spec("mlflow") is None:
            from ragen2.loggers import mlflow_missing  # Lightning's loggers load only where a run has one

            raise ConfigError(mlflow_missing(f"logger.{name}"))
        if isinstance(node, DictConfig) and "flush_logs_every_n_steps" in node:
            key, every = f"logger.{name}.flush_logs_every_n_steps", node.flush_logs_every_n_steps
            check_type(key, every, int, 1)
            if every < 1:
                raise ConfigError(
                    f"{key}={every} must be ≥ 1 (the logger writes its rows to disk every N iterations). "
                    f"Fix: {key}=1"
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


@contextlib.contextmanager
def _naming_its_key() -> Iterator[None]:
    """A constructor's ValueError (a check that names its key: ``env.max_turns=0 …``) as a ``ConfigError``,
    one line, as ``build`` passes it on."""
    try:
        yield
    except ValueError as err:
        raise (err if isinstance(err, ConfigError) else ConfigError(str(err))) from None


@dataclass(frozen=True)
class Played:
    """What ``ragen2-eval`` and ``ragen2-diagnose`` run (``played``): the program's config with a checkpoint's
    saved settings under the command line's, and the nodes built from it."""

    cfg: DictConfig
    model: ModelConfig
    place: Placement
    env: EnvConfig | None = None  # None where the program does not sample (a rollouts file is diagnosed)
    rollout: RolloutConfig | None = None


def played(cfg: DictConfig, overrides: Sequence[str], samples: bool = True) -> Played:
    """``cfg`` with ``checkpoint``'s saved env, rollout and model settings under ``overrides`` (the command
    line's; the file read mapped, no weight read) and its nodes built: the model, the device and, if the
    program ``samples``, the env and the rollout. A value that cannot work is refused here, in the program's
    settings check, before a model loads or Hydra makes the run folder."""
    from ragen2.data.rollout_config import EnvConfig, RolloutConfig
    from ragen2.models.checkpoint import read_checkpoint, saved_settings
    from ragen2.models.loading import ModelConfig
    from ragen2.models.placement import Placement

    if cfg.checkpoint:
        state = read_checkpoint(cfg.checkpoint, key="checkpoint", finite=False)
        cfg = with_saved_settings(cfg, saved_settings(state, str(cfg.checkpoint)), overrides)
    with _naming_its_key():
        model = settings(ModelConfig, OmegaConf.to_container(cfg.model, resolve=True), "model")
        place = settings(Placement, OmegaConf.to_container(cfg.trainer, resolve=True), "trainer")
        if not samples:
            return Played(cfg, model, place)
        env = settings(EnvConfig, OmegaConf.to_container(cfg.env, resolve=True), "env")
        rollout = settings(RolloutConfig, build(cfg.rollout, _convert_="all"), "rollout")
    return Played(cfg, model, place, env, rollout)


def _check_built_nodes(cfg: DictConfig) -> dict[str, Any]:
    """``env`` (its options against what the env declares), ``model`` (a source that loads here) and ``val``
    (its ranges) as the objects their consumers build, before Lightning starts and before Hydra makes the run
    folder; the built nodes by key."""
    from ragen2.data.rollout_config import EnvConfig, ValConfig
    from ragen2.models.loading import ModelConfig

    nodes = {"env": EnvConfig, "model": ModelConfig, "val": ValConfig}
    built = {}
    for key, cls in nodes.items():
        with _naming_its_key():
            built[key] = settings(cls, OmegaConf.to_container(cfg[key], resolve=True), key)
    return built


def _check_built_targets(cfg: DictConfig) -> dict[str, Any]:
    """``rollout`` (its ranges, its sampler's partial) and the mini-batch against its batch; ``algo``, with the
    estimators and critic Hydra builds in it, as ``PolicyModule`` is handed it; the ``filter`` with the sampler
    it needs, as the DataModule is: their own checks, before the run folder; the built nodes by key."""
    from ragen2.data.rollout_config import RolloutConfig
    from ragen2.modules.algo_config import AlgoConfig

    rollout = settings(RolloutConfig, build(cfg.rollout, _convert_="all"), "rollout")
    mini_batch = OmegaConf.select(cfg, "algo.mini_batch_size", default=8)
    check_type("algo.mini_batch_size", mini_batch, int, 8)
    check_batch(mini_batch, rollout.groups, rollout.group_size)
    algo = settings(AlgoConfig, build(cfg.algo, _convert_="all"), "algo")
    built = build(cfg.filter)
    built.check_sampler(rollout.sampler)
    return {"rollout": rollout, "algo": algo, "filter": built}


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
    if str(trainer.get("accelerator")) in ("gpu", "cuda"):  # else Lightning's traceback when it builds
        import torch

        from ragen2.models.placement import no_cuda

        if not torch.cuda.is_available():
            raise no_cuda(trainer.accelerator)
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
    """The config ``ragen2-train`` would run with these overrides (``run_dir`` replaces Hydra's output dir),
    ``RAGEN2_CONF``'s folders and a ``hydra.searchpath=[…]`` override searched as the programs search them."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import open_dict

    check_overrides(overrides)
    user_conf()  # a folder that is not there: one line, not Hydra's composition error around it
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    if "run_dir" in cfg:  # eval and diagnose have none: one added would be refused as an unknown key
        with open_dict(cfg):
            cfg.run_dir = run_dir or "outputs/notebook"
    return cfg
