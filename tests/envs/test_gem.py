"""env=gem: GEM's games as multi-turn ragen2 environments (gem-llm 0.1.0, installed without its dependencies).

The shared contracts run on it in tests/envs/test_adapted.py; here: a group's byte-identical prompts, GEM's
global generators kept apart from the process's, success with the oracle over several turns and not on a
truncated game that still pays, unparseable moves, an id GEM does not have, and one real training iteration
whose episodes succeed and whose reasoning the MI pass scores."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import ragen2_envs

from envs.adapted import ADAPTED, hide, train_one_iteration
from envs.adapter_checks import collect
from ragen2.config import compose
from ragen2.train import run

ADAPTER = ADAPTED["gem"]
ENV_ID = ADAPTER.env_id
pytestmark = ADAPTER.needed()

ORACLE = "I guess the number.</think><answer>{oracle}</answer>"
UNPARSED = "A direction.</think><answer>Left</answer>"  # well-formed for ragen2; GEM reads no number in it
UNCLOSED = "I keep thinking and never close the tag"


def _collect(tokenizer, responses: list[str], seeds: list[int], group_size: int, **env_kw):
    return collect(ADAPTER, tokenizer, responses, seeds, group_size, max_turns=3, **env_kw)


@pytest.mark.parametrize("gem_id", ["game:GuessTheNumber-v0-easy", "game:Mastermind-v0-easy"])
def test_a_group_sees_one_prompt_byte_for_byte(tokenizer, gem_id: str) -> None:
    replies = [ORACLE, UNPARSED, UNCLOSED]
    episodes = _collect(tokenizer, replies, seeds=[3, 8], group_size=4, gem_id=gem_id)
    first = {(ep.group, ep.sample): ep.turns[0].prompt_ids for ep in episodes}
    for group in (0, 1):
        assert all(first[group, k] == first[group, 0] for k in range(4))
    assert first[0, 0] != first[1, 0]  # another seed, another game
    again = _collect(tokenizer, [UNPARSED], seeds=[3], group_size=1, gem_id=gem_id)
    assert again[0].turns[0].prompt_ids == first[0, 0]


def test_gem_draws_never_move_the_process_generators() -> None:
    random.seed(5)
    np.random.seed(5)
    expected = random.random(), np.random.random()
    random.seed(5)
    np.random.seed(5)
    env = ragen2_envs.make(ENV_ID, gem_id="game:Game2048-v0-easy")  # GEM's constructors reset, unseeded
    env.reset(seed=1)  # GEM reseeds both globals here
    env.step("left")  # and draws a new tile
    assert (random.random(), np.random.random()) == expected


def test_a_rollouts_noise_comes_from_its_sample_index() -> None:
    def boards(sample: int) -> list[str]:
        env = ragen2_envs.make(ENV_ID, gem_id="game:Game2048-v0-easy")
        shown = [env.reset(seed=2, options={"sample": sample})[0]]
        return shown + [env.step(move)[0] for move in ("left", "up", "right", "down")]

    zero = boards(0)
    assert boards(0) == zero  # the same rollout again: the same new tiles
    other = boards(1)
    assert other[0] == zero[0] and other[1:] != zero[1:]  # one instance, another rollout's tiles


def test_the_oracle_wins_over_turns_and_a_truncated_game_that_pays_is_no_success() -> None:
    env = ragen2_envs.make(ENV_ID)
    env.reset(seed=0)
    secret = env.oracle_action()
    wrong = [g for g in "12345" if g != secret]
    obs, reward, terminated, _, info = env.step(wrong[0])
    assert "the target number is" in obs and (reward, terminated, info["success"]) == (0.0, False, False)
    _, reward, terminated, truncated, info = env.step(secret)
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    # GuessTheNumber-easy allows 4 guesses and pays a truncated game by its last guess's distance
    env.reset(seed=0)
    for guess in wrong[:3]:
        assert not env.step(guess)[2]
    _, reward, terminated, truncated, info = env.step(wrong[3])
    assert terminated and truncated and reward > 0 and not info["success"]


def test_an_unparseable_move_changes_nothing(tokenizer) -> None:
    env = ragen2_envs.make(ENV_ID)
    shown, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("Left")  # GEM would end the game with -0.1
    assert (obs, reward, terminated, truncated, info["action_is_valid"]) == (shown, 0.0, False, False, False)
    assert env.game.turn_count == 0
    assert env.step(env.oracle_action())[4]["success"]  # the game goes on
    # through the agent: each such turn is penalised and counted, the episode runs to its turn limit
    (episode,) = _collect(tokenizer, [UNPARSED], seeds=[0], group_size=1)
    assert [t.penalty for t in episode.turns] == [-0.1] * 3 and not episode.success
    assert episode.end_reason == "max_turns" and all(t.actions_valid == [False] for t in episode.turns)
    (episode,) = _collect(tokenizer, [UNCLOSED], seeds=[0], group_size=1)
    assert not episode.turns[0].format_ok and not episode.success


def test_an_id_gem_does_not_have_is_one_line_at_start_up(tmp_path: Path) -> None:
    cfg = compose(
        ["model=tiny", "env=gem", "env.kwargs.gem_id=game:GuessTheNumbr-v0-easy"], run_dir=str(tmp_path)
    )
    with pytest.raises(ValueError) as caught:
        run(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "env.kwargs.gem_id='game:GuessTheNumbr-v0-easy' is not a GEM environment (did you mean "
        "game:GuessTheNumber-v0-easy?"
    )
    assert message.endswith("Fix: env.kwargs.gem_id='game:GuessTheNumber-v0-easy'")
    # an id GEM has whose game downloads its word list at first use
    with pytest.raises(
        ValueError, match=r"^gem_id='game:Wordle-v0-easy' .*does not start here .*offline games: "
    ):
        ragen2_envs.make(ENV_ID, gem_id="game:Wordle-v0-easy")


def test_without_the_package_the_start_up_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide(monkeypatch, ADAPTER)
    with pytest.raises(ValueError) as caught:
        run(compose(["model=tiny", "env=gem"], run_dir=str(tmp_path)))
    assert str(caught.value) == (
        f"env.id={ENV_ID!r} adapts the gem package, which does not import here (No module named 'gem'). "
        "Fix: pip install --no-deps gem-llm==0.1.0"
    )


def test_one_training_iteration_succeeds_and_the_mi_pass_scores_its_reasoning(tmp_path: Path) -> None:
    metrics = train_one_iteration(ADAPTER.conf, tmp_path / "run")
    assert metrics["rollout/success"] > 0 and metrics["rollout/return"] > 0
    assert metrics["rollout/turns"] > 1  # some episodes took more than one guess
    assert metrics["train/optimizer_steps"] >= 1
    assert metrics["diag/first_turn/valid_rows"] >= 2 and "diag/first_turn/mi_est" in metrics
