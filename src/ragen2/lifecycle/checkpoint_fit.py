"""Whether a checkpoint can continue as the run that resumes it is configured, checked before the loop starts.

A checkpoint records the env, rollout, filter and model settings and the seed its run trained with (``RolloutDataModule`` and
``ragen2`` entries, ``ragen2.models.checkpoint.saved_settings``), the algorithm's name, its weights and its
optimizer's state. Against the composed config:

- refused, one line each, what cannot continue: another env id (the policy learned one env), weights of
  another shape than the configured model's (a different model), a critic the algorithm does not have or
  lacks (``algo=ppo`` on a GRPO checkpoint, and the reverse), another seed (the resumed run draws from the
  checkpoint's random state: it would be the saved seed's run under another name);
- warned, one line each, what continues but differs: every other env, rollout, filter and model setting (the run
  goes on with the new value), the algorithm's name, and the optimizer's learning rate, weight decay and
  gradient clip, which the resumed optimizer keeps from the checkpoint (Lightning restores its state and
  its schedule: the new values do not take effect).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from ragen2.errors import ConfigError
from ragen2.lifecycle.resume import AUTO, run_ckpt_path
from ragen2.log import log
from ragen2.models.checkpoint import POLICY_PREFIX, another_model, read_checkpoint
from ragen2.models.loading import skeleton
from ragen2.models.lora import LoRAConfig
from ragen2.modules.run_state import KEY
from ragen2.settings import shown

CRITIC_PREFIX = "critic."
#: the optimizer group settings a resumed optimizer keeps: config key under a group's node -> group key
_GROUP_KEYS = {"lr": "initial_lr", "weight_decay": "weight_decay", "grad_clip": "max_norm"}


def check_resume(cfg: DictConfig, ckpt_path: str) -> None:
    """Refuse a checkpoint the configured run cannot continue from; warn on each setting that differs
    (``ckpt_path``: as ``ragen2.lifecycle.resume`` resolved it, a file that loads with finite weights)."""
    state = read_checkpoint(ckpt_path, key="ckpt_path", finite=False)  # mapped: no weight is read here
    where = f"ckpt_path={ckpt_path}"
    data, run = state.get("RolloutDataModule") or {}, state.get(KEY) or {}
    env = _plain(cfg.env)
    saved_env = data.get("env") or {}
    if saved_env and saved_env.get("id") != env["id"]:
        raise ConfigError(
            f"{where} continues a run on env.id={saved_env.get('id')}, and this run sets env.id={env['id']}: the "
            f"policy and its run state belong to the env it trained on. Fix: the checkpoint's env "
            f"(env.id={saved_env.get('id')}), or ckpt_path=null in a new run folder to start afresh on {env['id']}"
        )
    _check_iterations(cfg, state, where)
    if data.get("seed") not in (None, cfg.seed):
        raise ConfigError(
            f"{where} continues a run of seed={data['seed']}, and this run sets seed={cfg.seed}: a resumed run "
            f"draws from the checkpoint's random state, so it would be a seed-{data['seed']} run recorded as "
            f"seed {cfg.seed}. Fix: seed={data['seed']} to continue it, or ckpt_path=null in a new run folder"
        )
    _check_critic(cfg, state["state_dict"], where, run.get("algo"))
    _check_shapes(cfg.model, state["state_dict"], where, (run.get("model") or {}))
    rollout = {k: v for k, v in _plain(cfg.rollout).items() if k != "sampler"}
    changed = [
        *_differences("env", saved_env, env),
        *_differences("rollout", data.get("rollout") or {}, rollout),
        *_differences("filter", data.get("filter") or {}, _plain(cfg.data.filter)),
        *_differences("model", run.get("model") or {}, _plain(cfg.model)),
    ]
    for key, saved, value in changed:
        log.warning(
            "%s: %s=%s here, %s in the checkpoint's run; continuing with %s",
            where,
            key,
            shown(value),
            shown(saved),
            shown(value),
        )
    if run.get("algo") not in (None, cfg.algo.name):
        log.warning("%s: algo=%s here, %s in the checkpoint's run", where, cfg.algo.name, run["algo"])
    for key, saved, value in _optimizer_differences(cfg, state.get("optimizer_states") or []):
        log.warning(
            "%s: %s=%s here, %s in the checkpoint; the resumed optimizer keeps %s (its state and schedule are "
            "restored). Fix: ckpt_path=null in a new run folder to train with %s",
            where,
            key,
            shown(value),
            shown(saved),
            shown(saved),
            shown(value),
        )


def iterations_done(state: Mapping[str, Any]) -> int | None:
    """The iterations a checkpoint's run has trained (Lightning's count of epochs run); None when unsaved."""
    progress = ((state.get("loops") or {}).get("fit_loop") or {}).get("epoch_progress") or {}
    return (progress.get("total") or {}).get("processed")


def check_iterations_left(cfg: DictConfig) -> None:
    """``_check_iterations`` for the checkpoint ``ckpt_path`` names, if any: run by the run folder's Hydra
    callback, so that a resume with nothing left to train writes nothing (not even Hydra's ``.hydra/``)."""
    ckpt_path = run_ckpt_path(cfg)
    if ckpt_path is not None:
        state = read_checkpoint(ckpt_path, key="ckpt_path", finite=False)  # mapped: no weight is read
        _check_iterations(cfg, state, f"ckpt_path={ckpt_path}")


def _check_iterations(cfg: DictConfig, state: Mapping[str, Any], where: str) -> None:
    """Refuse a resume that would train nothing (Lightning would end at once, silently). A requeued job
    (``ckpt_path=auto``) whose run had just finished is let through: it ends as the run did."""
    done = iterations_done(state)
    requeued_at_end = cfg.get("ckpt_path") == AUTO and done == cfg.iterations
    if done is not None and done >= cfg.iterations and not requeued_at_end:
        raise ConfigError(
            f"{where} with iterations={cfg.iterations}: the run already has {done} iterations, so nothing would "
            f"run. Fix: iterations=N with N > {done} to continue, or a new run folder"
        )


def _plain(node: Any) -> dict[str, Any]:
    """A config node's values, resolved, as a plain dict."""
    container = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    return {str(k): v for k, v in (container or {}).items()} if isinstance(container, Mapping) else {}


def _leaves(values: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}.{key}")
        else:
            yield f"{prefix}.{key}", list(value) if isinstance(value, tuple) else value


def _differences(node: str, saved: Mapping[str, Any], now: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved value, value now) for each setting under ``node`` that both hold and that differs."""
    before, after = dict(_leaves(saved, node)), dict(_leaves(now, node))
    return [(k, before[k], after[k]) for k in after if k in before and before[k] != after[k]]


NO_CRITIC, VALUE_HEAD, OWN_TRUNK = "no critic", "a value head", "a critic with its own trunk"


def _held_critic(weights: Mapping[str, Any]) -> str:
    """The critic a state dict holds: none, a value head on the policy's trunk, or a trunk of its own."""
    parts = {k[len(CRITIC_PREFIX) :].split(".")[0] for k in weights if k.startswith(CRITIC_PREFIX)}
    return OWN_TRUNK if "trunk" in parts else VALUE_HEAD if parts else NO_CRITIC


def _check_critic(cfg: DictConfig, weights: Mapping[str, Any], where: str, saved_algo: str | None) -> None:
    critic = cfg.algo.get("critic")
    wanted = NO_CRITIC if critic is None else VALUE_HEAD if critic.get("trunk") is None else OWN_TRUNK
    held = _held_critic(weights)
    if held != wanted:
        trained = f" (its run: algo={saved_algo})" if saved_algo else ""
        raise ConfigError(
            f"{where} holds {held}{trained}, and algo={cfg.algo.name} trains {wanted}: the weights and the "
            "optimizer state cannot continue as another layout. Fix: "
            + (f"algo={saved_algo}" if saved_algo else f"an algo with {held}")
            + ", or ckpt_path=null in a new run folder"
        )


def _check_shapes(
    model_cfg: DictConfig, weights: Mapping[str, Any], where: str, saved_model: Mapping[str, Any]
) -> None:
    """The checkpoint's policy weights against the configured model's, built on the meta device (shapes, no
    memory, no weights read), with its LoRA adapters when it has them: a checkpoint holds no frozen
    parameter, so under LoRA it holds the adapters only."""
    name_or_path = str(model_cfg.name_or_path)
    model = skeleton(name_or_path)
    if model_cfg.get("lora") is not None:
        model = LoRAConfig(**_plain(model_cfg.lora)).attach(model, f"model.name_or_path={name_or_path!r}")
    frozen = {k for k, p in model.named_parameters() if not p.requires_grad}
    expected = {POLICY_PREFIX + k: tuple(v.shape) for k, v in model.state_dict().items() if k not in frozen}
    held = {k: tuple(v.shape) for k, v in weights.items() if k.startswith(POLICY_PREFIX)}
    tied = {POLICY_PREFIX + k for k in getattr(model, "_tied_weights_keys", None) or ()}
    problems = [
        *(
            f"{k}: {list(held[k])} there, {list(s)} here"
            for k, s in expected.items()
            if k in held and held[k] != s
        ),
        *(f"{k} is not in the model" for k in held if k not in expected),
        *(f"{k} is missing" for k in expected if k not in held and k not in tied),
    ]
    if problems:
        raise another_model(
            where, name_or_path, problems, saved_model, ", or ckpt_path=null in a new run folder"
        )


def _optimizer_differences(cfg: DictConfig, optimizers: list[Any]) -> list[tuple[str, Any, Any]]:
    """(key, saved, configured) for each optimizer group setting the checkpoint's optimizer keeps."""
    groups = {g.get("name"): g for g in (optimizers[0].get("param_groups", []) if optimizers else [])}
    nodes = {"policy": ("algo.optim", cfg.algo.optim), "critic": ("algo.critic", cfg.algo.get("critic"))}
    found = []
    for name, (path, node) in nodes.items():
        if node is None or name not in groups:
            continue
        for key, group_key in _GROUP_KEYS.items():
            saved, value = groups[name].get(group_key), node.get(key)
            if saved is not None and value is not None and float(saved) != float(value):
                found.append((f"{path}.{key}", saved, value))
    return found
