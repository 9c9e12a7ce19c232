"""Warm-start demonstrations: the env's solver plays its episodes through the agent loop itself.

A ``Demonstrator`` (``ragen2.rollout.scripted``) answers each turn with the solver's reasoning and moves
(``env.oracle_reasoning``, ``env.oracle_action``) in the reply format ``demos.reply``, and the episode
runner of training (``RolloutConfig.runner``) renders the prompts, appends the turns and parses the replies.
So a demonstration is, token for token, the episode the agent loop records when a model writes those
replies, and its loss mask (``collate_episodes``) covers what RL trains: every turn's reply, nothing else.

What would make a warm start teach something the loop never produces is refused in one line, before a
model loads:

- an env whose solver does not explain its moves (``check_solver``);
- a reply the agent does not read back, whole, as the solver's actions: a format its parser rejects, or a
  reply the sampler's stop string or ``rollout.max_new_tokens`` would cut (``demonstrate``);
- an empty set: no episode in which the solver had a move for every turn (``demonstrate``);
- a tokenizer that renders other ids once saved and loaded back, so the RL run that loads the warm
  start's folder would see other prompts than the ones trained on (``first_difference`` finds them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import ragen2_envs
from ragen2_envs.base import TextEnv

from ragen2 import CONF_DIR, user_conf_dirs
from ragen2.agent.episode import Episode
from ragen2.agent.parsing import ACTION_SEP
from ragen2.agent.runner import EpisodeRunner
from ragen2.data.rollout_config import EnvConfig
from ragen2.errors import ConfigError
from ragen2.rollout.scripted import Demonstrator

#: demonstrations' instance seeds start here: above training's, DAPO's later rounds' and the held-out ones
DEMO_SEED_OFFSET = 3_000_000_019
DEFAULT_REPLY = "{reasoning}</think><answer>{oracle}</answer>"


@dataclass(frozen=True)
class DemoConfig:
    """``demos.*``: the warm start's demonstrations, rolled out by the env's solver through the agent loop."""

    episodes: int = 384
    """Demonstration episodes, one per instance seed (``demo_seeds``: no training or held-out instance)."""
    reply: str = DEFAULT_REPLY
    """Each turn's reply after the forced ``<think>``: ``{reasoning}`` and ``{oracle}`` (the solver's actions
    joined by ``||``) are filled in."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ConfigError(
                f"demos.episodes={self.episodes} leaves the demonstration set empty. Fix: demos.episodes=384"
            )


def demo_seeds(seed: int, n: int) -> list[int]:
    """The ``n`` demonstration instance seeds of a warm start seeded ``seed``."""
    return [DEMO_SEED_OFFSET + seed * 10_007 + i for i in range(n)]


def _explains(env_id: str) -> bool:
    """Whether the env's class says why its solver's moves fit (overrides ``oracle_reasoning``); False for
    an id that does not load here (a package not installed)."""
    try:
        cls = ragen2_envs.env_class(env_id)
    except (ImportError, LookupError):
        return False
    return cls.oracle_reasoning is not TextEnv.oracle_reasoning


def demonstrable_envs() -> list[str]:
    """The ``env`` group's choices, ragen2's and the user's own (``RAGEN2_CONF``), whose env has a solver
    that explains its moves."""
    from omegaconf import OmegaConf

    folders = [CONF_DIR, *user_conf_dirs()]
    ids = {
        p.stem: OmegaConf.select(OmegaConf.load(p), "id") for f in folders for p in (f / "env").glob("*.yaml")
    }
    return sorted(name for name, env_id in ids.items() if isinstance(env_id, str) and _explains(env_id))


#: demonstration instances ``check_solver`` tries: an env may have instances with no move (TwoHop's impossible)
SOLVER_PROBES = 16


def _has_move(instance: TextEnv, seed: int) -> bool:
    """Whether the solver has a move and its reasoning for the instance ``seed``."""
    instance.reset(seed=seed)
    action = instance.oracle_action()
    return action is not None and instance.oracle_reasoning([action]) is not None


def check_solver(env: EnvConfig, seed: int = 0) -> None:
    """Refuse an env whose solver has no move with its reasoning in any of the first ``SOLVER_PROBES``
    demonstration instances."""
    instance = env.make()
    if not any(_has_move(instance, s) for s in demo_seeds(seed, SOLVER_PROBES)):
        choices = ", ".join(f"env={name}" for name in demonstrable_envs())
        raise ConfigError(
            f"env.id={env.id} has no solver that explains its moves (env.oracle_action and "
            f"env.oracle_reasoning), so there is nothing to demonstrate. Fix: one of {choices}"
        )


def _collect(runner: EpisodeRunner, demos: DemoConfig, seed: int) -> tuple[list[Episode], Demonstrator]:
    demonstrator = Demonstrator(runner.tokenizer, demos.reply)
    seeds = demo_seeds(seed, demos.episodes)
    return runner.collect(demonstrator, seeds, 1, sample_seed=seed, desc="demonstrations"), demonstrator


def demonstrate(runner: EpisodeRunner, demos: DemoConfig, seed: int = 0) -> list[Episode]:
    """The demonstration episodes: every turn the solver's, read back by the agent as the solver's actions.

    Episodes in which the solver had no move for some turn are left out (the rest of the set is still
    the solver's play); a reply the agent reads back otherwise is a ``ConfigError``, as is an empty set.
    """
    episodes, demonstrator = _collect(runner, demos, seed)
    kept = [ep for ep in episodes if _check_turns(ep, demonstrator, runner)]
    if not kept:
        raise ConfigError(
            f"demos.episodes={demos.episodes} gave an empty demonstration set: in none of the episodes on "
            f"{runner.env_id} did the solver have a move for every turn. Fix: more "
            "demos.episodes, or an env whose solver solves its instances"
        )
    return kept


def _check_turns(ep: Episode, demonstrator: Demonstrator, runner: EpisodeRunner) -> bool:
    """Whether every turn of ``ep`` is the solver's; raises when the agent reads a reply back otherwise."""
    for n, turn in enumerate(ep.turns, start=1):
        planned = demonstrator.demonstrated.get(tuple(turn.prompt_ids))
        if planned is None or planned.oracle is None or planned.reply is None:
            return False
        where = f"seed {ep.seed}, turn {n}"
        # ids, not text: a word-level tokenizer's decoded text spaces its words, whatever the reply's spacing
        if turn.sampled_ids != runner.tokenizer.encode(planned.reply, add_special_tokens=False):
            limit = runner.params.max_new_tokens
            if turn.finish_reason == "length":
                size = _tokens(runner, planned.reply)
                longest = max(_tokens(runner, d.reply) for d in demonstrator.demonstrated.values() if d.reply)
                raise ConfigError(
                    f"rollout.max_new_tokens={limit} cuts the demonstrated reply of {size} tokens ({where}): "
                    f"the loop would never sample it whole. Fix: rollout.max_new_tokens={longest} (the longest "
                    "reply; in the RL run too: the prompt states the limit), or a shorter demos.reply"
                )
            raise ConfigError(
                f"demos.reply={demonstrator.reply!r}: the loop would stop the reply at its first stop string "
                f"or EOS, after {turn.text!r} ({where}), not at its end. Fix: end demos.reply with its one "
                f"</answer>, e.g. demos.reply='{DEFAULT_REPLY}'"
            )
        planned_actions = [a.strip() for a in planned.oracle.split(ACTION_SEP)]
        if not turn.format_ok or turn.actions != planned_actions or not all(turn.actions_valid):
            raise ConfigError(
                f"demos.reply={demonstrator.reply!r}: the agent reads the reply {turn.text!r} ({where}) as "
                f"{turn.actions} (format ok: {turn.format_ok}), not as the solver's {planned_actions}. Fix: "
                f"reasoning, then </think>, then <answer>{{oracle}}</answer>, e.g. demos.reply='{DEFAULT_REPLY}'"
            )
    return True


def _tokens(runner: EpisodeRunner, text: str) -> int:
    return len(runner.tokenizer.encode(text, add_special_tokens=False))


def first_difference(
    episodes: Sequence[Episode], runner: EpisodeRunner, demos: DemoConfig, seed: int
) -> tuple[int, int] | None:
    """(seed, token index) where ``episodes`` rolled out again through ``runner`` (another tokenizer, e.g.
    the one saved with the warm start and loaded back) first differ in their ids; None when they do not."""
    again = {(ep.seed, ep.sample): ep for ep in _collect(runner, demos, seed)[0]}
    for ep in episodes:
        ids, other = ep.token_ids, again[(ep.seed, ep.sample)].token_ids
        if ids != other:
            at = next((i for i, (a, b) in enumerate(zip(ids, other)) if a != b), min(len(ids), len(other)))
            return ep.seed, at
    return None


def reply_tokens(episodes: Sequence[Episode]) -> int:
    """The tokens a warm start trains on: every turn's reply."""
    return sum(len(t.sampled_ids) for ep in episodes for t in ep.turns)


def describe(episode: Episode) -> str:
    """One demonstration as text, each turn's observation and reply (for the warm start's log)."""
    turns = [f"turn {n}: {t.observation!r} -> {t.text!r}" for n, t in enumerate(episode.turns, start=1)]
    return f"seed {episode.seed} ({len(episode.token_ids)} tokens): " + "; ".join(turns)
