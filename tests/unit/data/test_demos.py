"""Warm-start demonstrations: the solver's turns through the agent loop, read back by the agent's parser as
the solver's actions; prompts as the agent renders them; the loss mask on the replies; every refusal."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from helpers import env_conf
from omegaconf import OmegaConf
from ragen2_envs.frozenlake import FrozenLakeEnv

from ragen2.agent import ChatRenderer, parse_turn
from ragen2.agent.runner import AgentConfig, EpisodeRunner, system_prompt, user_message
from ragen2.data import DemoConfig, EnvConfig, RolloutConfig, collate_episodes, demonstrate
from ragen2.data.demos import DEFAULT_REPLY, check_solver, demo_seeds, demonstrable_envs, first_difference
from ragen2.data.evaluation import heldout_seeds
from ragen2.errors import ConfigError
from ragen2.rollout.base import SamplingParams
from ragen2.rollout.scripted import Demonstrator, ScriptedSampler

DEMONSTRABLE = ["frozenlake", "sokoban", "countdown", "bandit"]


def _env(name: str, **kwargs: Any) -> EnvConfig:
    node = OmegaConf.to_container(env_conf(name), resolve=True)
    assert isinstance(node, dict)
    node["kwargs"] = {**node["kwargs"], **kwargs}
    return EnvConfig(**node)  # type: ignore[arg-type]


def _runner(env: EnvConfig, tokenizer: Any, max_new_tokens: int = 64) -> EpisodeRunner:
    return RolloutConfig(sampler=ScriptedSampler, max_new_tokens=max_new_tokens).runner(env, tokenizer)


def test_the_envs_with_a_solver_that_explains_its_moves() -> None:
    assert demonstrable_envs() == ["bandit", "countdown", "frozenlake", "sokoban", "sokoban_8x8", "twohop"]


def test_a_users_env_with_such_a_solver_is_suggested_too(
    outside_envs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the outside package declares outside/Guess-v0 in its entry points, its conf folder names it env=guess
    monkeypatch.setenv("RAGEN2_CONF", str(outside_envs[1]))
    assert demonstrable_envs() == [
        "bandit",
        "countdown",
        "frozenlake",
        "guess",
        "sokoban",
        "sokoban_8x8",
        "twohop",
    ]


def test_demonstration_seeds_are_no_training_or_held_out_instance() -> None:
    seeds = demo_seeds(0, 1000)
    assert min(seeds) > max(heldout_seeds(9, 10_000)) and len(set(seeds)) == 1000


@pytest.mark.parametrize("name", DEMONSTRABLE)
def test_every_turn_reads_back_as_the_solvers_move_in_the_replayed_env(name: str, tokenizer) -> None:
    env = _env(name)
    runner = _runner(env, tokenizer)
    episodes = demonstrate(runner, DemoConfig(episodes=6), seed=0)
    assert len(episodes) == 6
    for ep in episodes:
        # replayed on a fresh env: each parsed action is the solver's move in the state it is played in
        replay = env.make()
        replay.reset(seed=ep.seed, options={"sample": 0})
        for turn in ep.turns:
            parsed = parse_turn(tokenizer.decode(turn.sampled_ids), env.max_actions_per_turn, ("<|im_end|>",))
            assert parsed.format_ok and parsed.actions, turn.text
            assert parsed.think == replay.oracle_reasoning(parsed.actions)
            for action in parsed.actions:
                assert action == replay.oracle_action()
                replay.step(action)
            assert turn.penalty == 0.0 and turn.finish_reason == "stop"
    if name in ("countdown", "bandit"):  # one turn each: the solver's answer succeeds
        assert all(ep.success for ep in episodes)


def test_prompts_are_the_agents_rendering_and_the_loss_is_on_the_replies_only(tokenizer) -> None:
    env = _env("frozenlake", size=3)
    runner = _runner(env, tokenizer, max_new_tokens=48)
    episodes = demonstrate(runner, DemoConfig(episodes=8), seed=1)
    ep = max(episodes, key=lambda e: len(e.turns))
    assert len(ep.turns) >= 2  # a multi-turn demonstration among them
    agent = AgentConfig(max_turns=env.max_turns, max_actions_per_turn=env.max_actions_per_turn)
    replay = env.make()
    obs, _ = replay.reset(seed=ep.seed, options={"sample": 0})
    renderer = ChatRenderer(tokenizer, system_prompt(replay.instructions, agent, 48))
    budget = env.max_turns * env.max_actions_per_turn
    prompt = renderer.first_prompt(user_message(1, obs, budget, agent, 48, replay.example_action()))
    for n, turn in enumerate(ep.turns, start=1):
        assert turn.prompt_ids == prompt, f"turn {n}"
        for action in turn.actions:
            obs, *_ = replay.step(action)
        budget -= len(turn.actions)
        user = user_message(n + 1, obs, budget, agent, 48, replay.example_action())
        prompt = renderer.next_prompt(turn.prompt_ids, turn.sampled_ids, [{"role": "user", "content": user}])
    batch = collate_episodes(episodes, 1, tokenizer.pad_token_id)
    for row, episode in enumerate(episodes):
        replies = batch.input_ids[row][batch.loss_mask[row].bool()].tolist()
        assert replies == [i for t in episode.turns for i in t.sampled_ids]
        assert tokenizer.decode(replies) == "".join(t.text for t in episode.turns)
        assert batch.loss_mask[row].sum() < batch.attention_mask[row].sum() / 3  # prompts dominate


def test_an_env_without_a_solver_that_explains_its_moves_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"^env\.id=ragen2/MetaMathQA-v0 has no solver that explains .*Fix: "
    ):
        check_solver(_env("metamathqa"))
    check_solver(_env("frozenlake"))


@pytest.mark.parametrize(
    ("reply", "max_new_tokens", "message"),
    [
        # no </think>: the agent does not read the reply as reasoning + answer
        (
            "{reasoning}<answer>{oracle}</answer>",
            64,
            r"demos\.reply=.* as \[\] \(format ok: False\), not as the solver's",
        ),
        # the answer is not the solver's move
        ("{reasoning}</think><answer>Up</answer>", 64, r"not as the solver's"),
        # text after the stop string: the sampler would stop before it
        ("{reasoning}</think><answer>{oracle}</answer> Done.", 64, r"would stop the reply at its first stop"),
        (DEFAULT_REPLY, 12, r"^rollout\.max_new_tokens=12 cuts the demonstrated reply of \d+ tokens .*Fix"),
    ],
)
def test_a_turn_format_the_loop_does_not_read_back_is_refused(
    reply: str, max_new_tokens: int, message: str, tokenizer
) -> None:
    runner = _runner(_env("frozenlake", size=3), tokenizer, max_new_tokens)
    with pytest.raises(ConfigError, match=message):
        demonstrate(runner, DemoConfig(episodes=2, reply=reply))


class _ExplainsTheFirstMoveOnly(FrozenLakeEnv):
    """A solver that has no reasoning once the player has moved: no episode is the solver's throughout."""

    def oracle_reasoning(self, actions: Any) -> str | None:
        return super().oracle_reasoning(actions) if self.num_env_steps == 0 else None


def test_an_empty_demonstration_set_is_refused(tokenizer) -> None:
    with pytest.raises(ConfigError, match=r"^demos\.episodes=0 leaves the demonstration set empty\. Fix"):
        DemoConfig(episodes=0)
    runner = EpisodeRunner(
        lambda: _ExplainsTheFirstMoveOnly(size=4, success_rate=1.0),
        tokenizer,
        AgentConfig(max_turns=3, max_actions_per_turn=1),
        SamplingParams(max_new_tokens=64),
    )
    # a warm-start seed whose maps all need more than one move, so more than one turn
    seed = next(
        s
        for s in range(100)
        if all(runner.env_factory().reset(seed=i)[1]["optimal_length"] > 1 for i in demo_seeds(s, 4))
    )
    with pytest.raises(ConfigError, match=r"demos\.episodes=4 gave an empty demonstration set"):
        demonstrate(runner, DemoConfig(episodes=4), seed)


def test_a_tokenizer_that_renders_other_ids_is_found(tokenizer) -> None:
    env = _env("frozenlake", size=3)
    episodes = demonstrate(_runner(env, tokenizer), DemoConfig(episodes=3), seed=0)
    assert (
        first_difference(episodes, _runner(env, copy.deepcopy(tokenizer)), DemoConfig(episodes=3), 0) is None
    )
    # a template that ends each message with a blank line: the ids part right after the system message
    other = copy.deepcopy(tokenizer)
    other.chat_template = tokenizer.chat_template.replace("'<|im_end|>' + '\n'", "'<|im_end|>' + '\n\n'")
    assert other.chat_template != tokenizer.chat_template
    seed, at = first_difference(episodes, _runner(env, other), DemoConfig(episodes=3), 0) or (None, None)
    end_of_system = episodes[0].token_ids.index(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert (seed, at) == (episodes[0].seed, end_of_system + 1)


def test_a_prompt_without_a_plan_is_answered_with_eos(tokenizer) -> None:
    from ragen2.rollout.base import PromptMeta

    demonstrator = Demonstrator(tokenizer, DEFAULT_REPLY)
    meta = [PromptMeta(oracle="Left", reasoning="Go left."), PromptMeta(oracle="Left"), PromptMeta()]
    out = demonstrator.generate([[1], [2], [3]], SamplingParams(max_new_tokens=64), 0, meta)
    assert tokenizer.decode(out[0].ids) == "Go left.</think><answer>Left</answer>"
    assert out[0].finish_reason == "stop"
    assert [s.ids for s in out[1:]] == [[tokenizer.eos_token_id]] * 2
    assert demonstrator.demonstrated[(3,)].reply is None


def test_length_batches_cover_every_episode_once_per_pass_with_little_padding() -> None:
    from ragen2.data.demo_datamodule import LengthBatches

    lengths = [300 + 150 * (i % 3) + i % 7 for i in range(50)]  # one, two and three turns' worth
    sampler = LengthBatches(lengths, batch_size=4, seed=0, window=4)
    first, second = list(sampler), list(sampler)
    assert len(first) == len(sampler) == 13  # windows of 16 rows: 4 + 4 + 4 batches, then one of the last 2
    for batches in (first, second):
        assert sorted(i for b in batches for i in b) == list(range(50))
        assert all(len(b) == 4 for b in batches if len(b) != 2)
    assert first != second  # each pass draws new batches
    assert first == list(LengthBatches(lengths, batch_size=4, seed=0, window=4))  # from the seed
    # padding: a batch's widest row against its rows, far below what batches in random order pad
    padded = sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in first)
    unsorted = [list(range(s, min(s + 4, 50))) for s in range(0, 50, 4)]
    assert padded < 0.5 * sum(
        max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in unsorted
    )
