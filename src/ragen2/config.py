"""Where the Hydra config tree lives, composing it from Python, and checks that span config groups.

Each consumer gets one validated object for its node (``algo`` -> ``AlgoConfig``, ``rollout`` ->
``RolloutConfig``, ``filter`` -> ``GroupFilter``, …), built by ``settings``, which refuses a key the
object does not have and says where a moved key went. ``check_overrides`` does the same for
command-line overrides before Hydra sees them; ``validate`` checks the composed config before anything
is built (moved keys, the device count) and ``check_batch`` what spans two objects (the mini-batch
against the batch).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

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


class ConfigError(ValueError):
    """A config value that cannot work, named with its key, its value and the fix."""


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


def command_line(prog: str, hydra_main: Callable[[], None]) -> None:
    """An entry point: refuse moved keys on the command line with a one-line error, then run Hydra."""
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as err:
        sys.exit(f"{prog}: {err}")
    hydra_main()


def settings(cls: type[T], node: Mapping[str, Any] | T | None, key: str) -> T:
    """``cls(**node)`` for the config node at ``key``, refusing keys ``cls`` does not have.

    The error names ``key.<name>``, where a moved key went, and the keys ``cls`` knows.
    """
    if isinstance(node, cls):
        return node
    values = dict(node or {})
    known = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for name in values:
        if name in known:
            continue
        moved = _moved(f"{key}.{name}")
        raise ConfigError(
            moved or f"{key}.{name}={values[name]!r} is not a setting. Fix: one of {', '.join(known)}"
        )
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
    """Checks before anything is built: keys that moved, the run length, the ranks."""
    for old in MOVED:
        parent, _, leaf = old.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if isinstance(node, DictConfig) and leaf in node:
            raise ConfigError(f"{_moved(old)} (a config file sets {old})")
    if int(cfg.iterations) < 1:
        raise ConfigError(f"iterations={cfg.iterations} must be ≥ 1 (one RL iteration per Lightning epoch)")
    _check_ranks(cfg)
    _check_precision(cfg)
    _check_master_weights(cfg)


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
    dtype, lr = str(cfg.model.get("dtype", "float32")), float(cfg.algo.optim.lr)
    if dtype not in _SIGNIFICANT_BITS:
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
    groups = int(cfg.rollout.groups)
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
