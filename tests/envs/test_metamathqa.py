"""MetaMathQA: answer normalisation, generator answers, hashing split, loader and attempt rewards."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from helpers import env_conf
from omegaconf import OmegaConf
from ragen2_envs.metamathqa.answers import answers_match, normalize_answer, parse_number
from ragen2_envs.metamathqa.data import extract_final_answer, load_problems
from ragen2_envs.metamathqa.env import MAX_ANSWER_CHARS, MetaMathQAEnv
from ragen2_envs.metamathqa.generator import NAMES, TEMPLATES, format_answer, generate_problem
from ragen2_envs.metamathqa.split import split_of


def make(**kwargs: object) -> MetaMathQAEnv:
    env = ragen2_envs.make("ragen2/MetaMathQA-v0", **kwargs)
    assert isinstance(env, MetaMathQAEnv)
    return env


# ---- answers ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("  42 ", "42"),
        ("The answer is: 1,000", "1000"),
        ("\\boxed{\\dfrac{3}{4}}", "3/4"),
        ("\\tfrac{1}{2}", "1/2"),
        ("\\frac12", "1/2"),
        ("\\frac{\\sqrt{3}}{2}", "(\\sqrt{3})/2"),
        ("$12.50", "12.50"),
        ("\\$5", "5"),
        ("12 apples.", "12"),
        ("5 km/h", "5"),
        ("x = 5", "5"),
        ("75\\%", "75"),
        ("90^\\circ", "90"),
        ("\\text{(A)}", "(a)"),
        ("\\left( 1, 2 \\right)", "( 1, 2 )"),
        ("−5", "-5"),
        ("2x", "2x"),  # no space: an expression, not 2 with a unit
        ("\\boxed{1} then \\boxed{2}", "2"),  # the last box
        ("\\boxed{\\frac{1}{\\boxed{2}}}", "1/(\\boxed{2})"),  # the outermost box's content
        ("", ""),
    ],
)
def test_normalize_answer(text: str, normal: str) -> None:
    assert normalize_answer(text) == normal


@pytest.mark.parametrize(
    ("prediction", "gold", "same"),
    [
        ("0.75", "\\frac{3}{4}", True),
        ("3/4", ".750", True),
        ("\\boxed{37.5}", "37.5", True),
        ("75/2", "37.5", True),
        ("12 dollars", "$12", True),
        ("1,234,567", "1234567", True),
        ("75%", "75", True),
        ("-0.5", "-1/2", True),
        ("(1, 2)", "(1,2)", True),  # the reference's rule: equal without whitespace
        ("B", "b", True),
        ("0.75", "75%", False),  # % is dropped, not divided out: 0.75 != 75
        ("0.33", "1/3", False),  # exact comparison
        ("2x", "2", False),
        ("12", "12.5", False),
        ("", "", False),
        ("   ", "0", False),
        ("1/0", "1/0", True),  # the same string, though it is no number
        ("1/0", "2/0", False),
    ],
)
def test_answers_match(prediction: str, gold: str, same: bool) -> None:
    assert answers_match(prediction, gold) is same
    assert answers_match(gold, prediction) is same


def test_parse_number() -> None:
    assert parse_number("37.5") == Fraction(75, 2)
    assert parse_number("(-3)/(4)") == Fraction(-3, 4)
    assert parse_number("3/0") is None
    assert parse_number("1e5") is None
    assert parse_number("3 1/2") is None  # a mixed number is not 31/2
    assert parse_number("3 / 4") == Fraction(3, 4)


def test_extract_final_answer() -> None:
    assert extract_final_answer("6 * 3 = 18.\nThe answer is: 18") == "18"
    assert (
        extract_final_answer("The answer is: 2\nlater... The answer is: \\frac{1}{2}  \n") == "\\frac{1}{2}"
    )
    assert extract_final_answer("no final line") is None
    assert extract_final_answer("The answer is:   ") is None


# ---- generator ----------------------------------------------------------------------------------
HAND_ANSWERS = {
    "collect": ({"a": 20, "b": 10, "c": 5}, Fraction(25)),  # 20 + 10 - 5
    "rows": ({"rows": 3, "per_row": 4}, Fraction(12)),  # 3 * 4
    "travel": ({"speed": 60, "hours": 3}, Fraction(180)),  # 60 * 3
    "filling": ({"rate": 5, "total": 35}, Fraction(7)),  # 35 / 5
    "change": ({"qty": 4, "price": 3, "bill": 20}, Fraction(8)),  # 20 - 4 * 3
    "wage": ({"wage": 10, "hours": 8, "days": 5}, Fraction(400)),  # 10 * 8 * 5
    "class_walkers": ({"num": 3, "den": 4, "total": 28}, Fraction(7)),  # 28 - 28 * 3/4 = 28 - 21
    "pizza": ({"a": 1, "b": 3, "c": 1, "d": 4}, Fraction(5, 12)),  # 1 - 4/12 - 3/12
    "discount": ({"price": 75, "pct": 50}, Fraction(75, 2)),  # 75 * (100 - 50) / 100 = 37.5
    "percent_of": ({"total": 80, "pct": 25}, Fraction(20)),  # 80 * 25 / 100
    "cookies": ({"batches": 3, "per_batch": 12, "eaten": 6, "box": 5}, Fraction(6)),  # (36 - 6) / 5
    "savings": ({"weekly": 10, "saved": 20, "cost": 70}, Fraction(5)),  # (70 - 20) / 10
    "average": ({"x": 80, "y": 90, "z": 85}, Fraction(85)),  # 255 / 3
}


def test_every_template_has_a_hand_checked_answer() -> None:
    assert set(HAND_ANSWERS) == set(TEMPLATES)
    assert {t.topic for t in TEMPLATES.values()} == {
        "arithmetic", "rates", "money", "fractions", "percentages", "multi-step",
    }  # fmt: skip
    for name, (params, answer) in HAND_ANSWERS.items():
        template = TEMPLATES[name]
        assert template.answer(params) == answer, name
        words = {slot: options[0] for slot, options in template.words.items()}
        question = template.text.format(name=NAMES[0], **words, **params)
        assert all(str(value) in question for value in params.values()), question


def test_sampled_problems_have_clean_answers() -> None:
    rng = np.random.default_rng(0)
    for name, template in TEMPLATES.items():
        for _ in range(50):
            params = template.sample(rng)
            if params is None:
                continue
            answer = template.answer(params)
            assert answer > 0, (name, params)
            if name not in ("pizza", "discount"):
                assert answer.denominator == 1, (name, params)


@pytest.mark.parametrize(
    ("value", "as_fraction", "text"),
    [
        (Fraction(12), False, "12"),
        (Fraction(75, 2), False, "37.5"),
        (Fraction(1, 8), False, "0.125"),
        (Fraction(1, 3), False, "1/3"),
        (Fraction(1, 2), True, "1/2"),
        (Fraction(-3, 4), False, "-0.75"),
    ],
)
def test_format_answer(value: Fraction, as_fraction: bool, text: str) -> None:
    assert format_answer(value, as_fraction) == text


def test_split_is_by_template_and_numbers() -> None:
    # 20,000 keys at test_fraction 0.1: sd of the share = sqrt(0.09 / 20000) ~ 0.0021
    share = np.mean([split_of(f"k{i}", 0.1) == "test" for i in range(20_000)])
    assert abs(share - 0.1) < 0.01
    rng = np.random.default_rng(0)
    train = [generate_problem(rng, "train", 0.2) for _ in range(300)]
    test = [generate_problem(rng, "test", 0.2) for _ in range(300)]
    assert all(split_of(p.key, 0.2) == "train" for p in train)
    assert all(split_of(p.key, 0.2) == "test" for p in test)
    assert not {p.key for p in train} & {p.key for p in test}
    assert {p.template for p in test} == set(TEMPLATES)  # every template in both splits


# ---- the environment ----------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["train", "test"])
def test_check_env_passes(split: str) -> None:
    check_env(make(split=split))


def test_determinism() -> None:
    obs, info = make().reset(seed=21)
    for sample in range(3):
        assert make().reset(seed=21, options={"sample": sample}) == (obs, info)
    env = make()
    trajectories = []
    for _ in range(2):
        env.reset(seed=21)
        trajectories.append([env.step(a) for a in ("7", "", "x", info["answer"])])
    assert trajectories[0] == trajectories[1]
    assert len({make().reset(seed=s)[0] for s in range(30)}) >= 25


def test_attempt_rewards_halve() -> None:
    env = make()
    question, info = env.reset(seed=1)
    assert question and env.oracle_action() == info["answer"]
    wrong = "-1"  # every built-in answer is positive
    obs, reward, terminated, _, step_info = env.step(wrong)
    assert (obs, reward, terminated) == ("Incorrect. Please think again. Attempts left: 4.", 0.0, False)
    assert step_info == {"action_is_valid": True, "attempt": 0, "success": False}
    assert env.step(wrong)[1:3] == (0.0, False)
    # third attempt (index 2): 1 / 2**2 = 0.25
    obs, reward, terminated, truncated, step_info = env.step(info["answer"])
    assert (obs, reward, terminated, truncated) == ("Correct!", 0.25, True, False)
    assert step_info["success"] and step_info["attempt"] == 2
    assert env.oracle_action() is None


def test_running_out_of_attempts_terminates_without_success() -> None:
    env = make(max_attempts=2)
    env.reset(seed=2)
    assert env.step("-1")[1:3] == (0.0, False)
    obs, reward, terminated, truncated, info = env.step("-2")
    assert (obs, reward, terminated, truncated, info["success"]) == (
        "Incorrect. No attempts left.", 0.0, True, False, False,
    )  # fmt: skip
    _, reward, terminated, _, info = env.step(env.problem.answer)  # too late
    assert (reward, terminated, info["action_is_valid"]) == (0.0, True, False)


def test_blank_or_huge_answers_are_invalid_and_use_no_attempt() -> None:
    env = make(max_attempts=1)
    question, info = env.reset(seed=3)
    for action in ("", "   ", "\n", "1" * (MAX_ANSWER_CHARS + 1)):
        obs, reward, terminated, truncated, step_info = env.step(action)
        assert (obs, reward, terminated, truncated) == (question, 0.0, False, False)
        assert not step_info["action_is_valid"]
    assert env.step(info["answer"])[1] == 1.0  # still the first attempt


def test_oracle_and_equivalent_forms_succeed() -> None:
    env = make()
    for seed in range(40):
        _, info = env.reset(seed=seed)
        value = parse_number(normalize_answer(info["answer"]))
        assert value is not None
        # the same number written as a LaTeX fraction in a box is still a first-attempt success
        latex = f"\\boxed{{\\frac{{{value.numerator}}}{{{value.denominator}}}}}"
        _, reward, terminated, _, step_info = env.step(latex)
        assert (reward, terminated, step_info["success"]) == (1.0, True, True), (info, latex)


def test_fuzzed_answers_never_raise() -> None:
    env = make(max_attempts=10_000)
    _, info = env.reset(seed=5)
    answer = info["answer"]
    rng = np.random.default_rng(0)
    printable = [chr(c) for c in range(32, 127)]
    near_misses = [answer + "1", "-" + answer, answer + "/2", "0." + answer, answer + "^2", answer + "!", "n"]
    actions = list(near_misses)
    while len(actions) < 1000:
        kind = len(actions) % 4
        if kind == 0:
            actions.append("".join(rng.choice(printable, size=int(rng.integers(0, 40)))))
        elif kind == 1:
            actions.append(
                "".join(chr(int(c)) for c in rng.integers(1, 0x2FFFF, size=int(rng.integers(1, 20))))
            )
        elif kind == 2:
            actions.append(" \t\n"[len(actions) % 3] * int(rng.integers(0, 4)))
        else:
            actions.append("\\boxed{" * int(rng.integers(1, 20_000)))
    for action in actions:
        _, reward, terminated, truncated, step_info = env.step(action)
        blank_or_huge = not action.strip() or len(action) > MAX_ANSWER_CHARS
        assert step_info["action_is_valid"] is not blank_or_huge, action[:40]
        assert (reward, terminated, truncated) == (0.0, False, False), action[:40]


# ---- data files ---------------------------------------------------------------------------------
def metamath_rows(count: int) -> list[dict[str, str]]:
    return [
        {
            "query": f"What is {i} + 1?",
            "response": f"{i} + 1 = {i + 1}.\nThe answer is: {i + 1}",
            "type": "GSM_AnsAug",
        }
        for i in range(count)
    ]


def test_loader_split_is_a_partition(tmp_path: Path) -> None:
    rows = [*metamath_rows(40), {"query": "No final line?", "response": "It is 3."}]
    path = tmp_path / "mm.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = load_problems(path, "train", 0.3)
    test = load_problems(path, "test", 0.3)
    assert {p.question for p in train} | {p.question for p in test} == {r["query"] for r in rows[:40]}
    assert not {p.question for p in train} & {p.question for p in test}
    assert all(split_of(p.question, 0.3) == "test" for p in test)
    env = make(data_path=str(path), split="test", test_fraction=0.3)
    for seed in range(10):
        question, info = env.reset(seed=seed)
        assert question in {p.question for p in test} and info["topic"] == "GSM_AnsAug"
        assert env.step(info["answer"])[1] == 1.0


def test_loader_reads_json_list(tmp_path: Path) -> None:
    path = tmp_path / "mm.json"
    path.write_text(json.dumps(metamath_rows(30)))
    env = make(data_path=str(path), max_attempts=1)
    question, _ = env.reset(seed=0)
    number = int(question.split()[2])  # "What is {i} + 1?" -> i
    assert env.step(str(number + 1))[1] == 1.0


def test_bad_data_and_knobs_raise_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_path"):
        MetaMathQAEnv(data_path=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"query": "q", "response": "The answer is: 1"}) + "\n" + json.dumps({"q": 1}) + "\n"
    )
    with pytest.raises(ValueError, match="row 1"):
        MetaMathQAEnv(data_path=str(bad))
    none = tmp_path / "none.jsonl"
    none.write_text(json.dumps({"query": "q", "response": "no answer"}) + "\n")
    with pytest.raises(ValueError, match="no row with a final answer"):
        MetaMathQAEnv(data_path=str(none))
    with pytest.raises(ValueError, match="split"):
        MetaMathQAEnv(split="validation")
    with pytest.raises(ValueError, match="test_fraction"):
        MetaMathQAEnv(test_fraction=0.0)
    with pytest.raises(ValueError, match="max_attempts"):
        MetaMathQAEnv(max_attempts=0)


def test_conf_matches_the_class() -> None:
    conf = OmegaConf.to_container(env_conf("metamathqa"), resolve=True)
    assert isinstance(conf, dict)
    assert conf["id"] == "ragen2/MetaMathQA-v0"
    assert conf["max_turns"] == MetaMathQAEnv.default_max_turns == 5
    assert conf["max_actions_per_turn"] == MetaMathQAEnv.default_max_actions_per_turn == 1
    env = make(**conf["kwargs"])
    assert (env.max_attempts, env.split, env.test_fraction, env.data) == (5, "train", 0.1, None)
