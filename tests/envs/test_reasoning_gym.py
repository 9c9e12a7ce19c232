"""env=reasoning_gym: reasoning-gym's tasks as single-turn environments (the extra ``reasoning-gym``).

The shared contracts run on it in tests/envs/test_adapted.py; here: a group's byte-identical prompts, the task's
scorer as the reward with success a flag apart from it, bad answers and bad format, a task name that does not
exist, and one real training iteration whose episodes succeed and whose reasoning the MI pass scores."""

from __future__ import annotations

from pathlib import Path

import pytest
import ragen2_envs

from envs.adapted import ADAPTED, hide, train_one_iteration
from envs.adapter_checks import collect
from ragen2.config import compose
from ragen2.train import run

ADAPTER = ADAPTED["reasoning_gym"]
ENV_ID = ADAPTER.env_id
pytestmark = ADAPTER.needed()

ORACLE = "I add the numbers up.</think><answer>{oracle}</answer>"
WRONG = "A guess.</think><answer>not the answer</answer>"
UNCLOSED = "I keep thinking and never close the tag"
REPLIES = [ORACLE, WRONG, UNCLOSED]


def _collect(tokenizer, responses: list[str], seeds: list[int], group_size: int, **env_kw):
    return collect(ADAPTER, tokenizer, responses, seeds, group_size, max_turns=1, **env_kw)


@pytest.mark.parametrize("task", ["basic_arithmetic", "leg_counting"])
def test_a_group_sees_one_prompt_byte_for_byte(tokenizer, task: str) -> None:
    episodes = _collect(tokenizer, REPLIES, seeds=[3, 8], group_size=4, task=task)
    first = {(ep.group, ep.sample): ep.turns[0].prompt_ids for ep in episodes}
    for group in (0, 1):
        assert all(first[group, k] == first[group, 0] for k in range(4))
    assert first[0, 0] != first[1, 0]  # another seed, another question
    # and across processes' worth of fresh envs: the same seed makes the same question
    again = _collect(tokenizer, [WRONG], seeds=[3], group_size=1, task=task)
    assert again[0].turns[0].prompt_ids == first[0, 0]


def test_the_oracle_answer_succeeds_and_bad_answers_do_not(tokenizer) -> None:
    # the scripted sampler picks among its replies at random: one reply each
    right, wrong, unclosed = (_collect(tokenizer, [reply], seeds=[5], group_size=1)[0] for reply in REPLIES)
    assert right.success and right.turns[0].reward == 1.0 and right.turns[0].format_ok
    assert right.turns[0].infos[0]["score"] == 1.0
    assert not wrong.success and wrong.turns[0].reward == 0.0 and wrong.turns[0].format_ok
    # no closed </think>: a format failure, counted and penalised; the env is never asked
    assert not unclosed.success and not unclosed.turns[0].format_ok
    assert unclosed.turns[0].penalty == -0.1 and unclosed.turns[0].infos == []


def test_success_is_a_flag_apart_from_the_shaped_return() -> None:
    # spell_backward grades a near miss with partial credit: "noremopy" for "noremopyh" (7/9 by its scorer)
    strict = ragen2_envs.make(ENV_ID, task="spell_backward")
    strict.reset(seed=0)
    answer = strict.oracle_action()
    assert answer is not None
    _, reward, terminated, _, info = strict.step(answer[:-1])
    assert terminated and 0.5 < reward < 1.0 and not info["success"]
    lenient = ragen2_envs.make(ENV_ID, task="spell_backward", success_threshold=0.5)
    lenient.reset(seed=0)
    _, same, _, _, info = lenient.step(answer[:-1])
    assert same == reward and info["success"]


def test_what_the_scorer_cannot_take_scores_zero_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    env = ragen2_envs.make(ENV_ID, max_answer_chars=10)
    env.reset(seed=0)
    assert env.step("")[4]["action_is_valid"] is False  # a blank answer changes nothing
    _, reward, terminated, _, info = env.step("1" * 11)  # too long: unread
    assert (reward, terminated, info["scorer_error"]) == (0.0, True, False)

    def raises(answer: str, entry: dict) -> float:
        raise RecursionError("a parser on model text")

    env = ragen2_envs.make(ENV_ID)
    monkeypatch.setattr(env.dataset, "score_answer", raises)
    env.reset(seed=0)
    _, reward, _, _, info = env.step("((((")
    assert (reward, info["scorer_error"], info["success"]) == (0.0, True, False)
    monkeypatch.setattr(env.dataset, "score_answer", lambda answer, entry: float("nan"))
    env.reset(seed=0)
    assert env.step("1")[1:2] == (0.0,)


def test_every_character_a_task_prints_is_in_the_observation_space() -> None:
    # emoji_mystery hides text in emoji variation selectors; propositional_logic prints ∧ ∨ ¬ →
    for task in ("emoji_mystery", "propositional_logic"):
        env = ragen2_envs.make(ENV_ID, task=task)
        obs, _ = env.reset(seed=1)
        assert obs in env.observation_space and not obs.isascii()


def test_a_task_that_does_not_exist_is_one_line_at_start_up(tmp_path: Path) -> None:
    cfg = compose(
        ["model=tiny", "env=reasoning_gym", "env.kwargs.task=basic_arithmetc"], run_dir=str(tmp_path)
    )
    with pytest.raises(ValueError) as caught:
        run(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("env.kwargs.task='basic_arithmetc' is not a reasoning-gym task (did you mean ")
    assert "leg_counting" in message and message.endswith("Fix: env.kwargs.task='basic_arithmetic'")
    with pytest.raises(ValueError, match=r"^task='leg_counting' refuses task_config=\{\"bogus\": 1\}"):
        ragen2_envs.make(ENV_ID, task="leg_counting", task_config={"bogus": 1})


def test_without_the_package_the_start_up_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide(monkeypatch, ADAPTER)
    with pytest.raises(ValueError) as caught:
        run(compose(["model=tiny", "env=reasoning_gym"], run_dir=str(tmp_path)))
    assert str(caught.value) == (
        f"env.id={ENV_ID!r} adapts the reasoning_gym package, which does not import here (No module named 'reasoning_gym'). "
        "Fix: pip install 'ragen2[reasoning-gym]' (reasoning-gym==0.1.25)"
    )


def test_one_training_iteration_succeeds_and_the_mi_pass_scores_its_reasoning(tmp_path: Path) -> None:
    metrics = train_one_iteration(ADAPTER.conf, tmp_path / "run")
    assert metrics["rollout/success"] > 0 and metrics["rollout/return"] > 0
    assert metrics["train/optimizer_steps"] >= 1
    assert metrics["diag/first_turn/valid_rows"] >= 2 and "diag/first_turn/mi_est" in metrics
