"""Countdown: safe parsing, solver, solvable generator, data loader and hand-derived rewards."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from helpers import env_conf
from omegaconf import OmegaConf
from ragen2_envs.countdown.env import CountdownEnv
from ragen2_envs.countdown.expression import MAX_EXPRESSION_CHARS, Expression, parse_expression
from ragen2_envs.countdown.generator import generate_instance
from ragen2_envs.countdown.solver import solve


def make(**kwargs: object) -> CountdownEnv:
    env = ragen2_envs.make("ragen2/Countdown-v0", **kwargs)
    assert isinstance(env, CountdownEnv)
    return env


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def ten_from_342(tmp_path: Path) -> CountdownEnv:
    """One-row data file: target 10 from [3, 4, 2] (3 * 4 - 2 = 10)."""
    env = make(data_path=str(write_jsonl(tmp_path / "one.jsonl", [{"target": 10, "nums": [3, 4, 2]}])))
    env.reset(seed=0)
    return env


# ---- parsing ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "numbers", "value"),
    [
        ("3*4-2", (3, 4, 2), Fraction(10)),
        ("3 × 4 − 2", (3, 4, 2), Fraction(10)),  # glyphs are the same operators
        ("(3+4)÷2", (3, 4, 2), Fraction(7, 2)),  # exact: 7/2, not 3.5 or 3
        ("-3 + 4", (3, 4), Fraction(1)),  # unary minus, as the reference's own example uses
        ("3/4*8", (3, 4, 8), Fraction(6)),  # 3/4 * 8 = 24/4 = 6 exactly
        ("((5))", (5,), Fraction(5)),
        ("5/(2-2)", (5, 2, 2), None),  # well-formed, no value
    ],
)
def test_parse_expression_values(text: str, numbers: tuple[int, ...], value: Fraction | None) -> None:
    assert parse_expression(text) == Expression(numbers=numbers, value=value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "3*4-2 = 10",  # an equation, not an expression (the reference's eval fails on it too)
        "3*4-2=10",
        "2**3",
        "7//2",
        "3 4",
        "3+",
        "3.5+1",
        "1_000",
        "07+1",  # Python refuses leading zeros
        "abs(3)",
        "three",
        "True",
        "3x4",
        "(3)(4)",
        "[3]",
        "3;4",
        "(" * 150 + "1" + ")" * 150,
        "1+" * 100 + "1",  # over MAX_EXPRESSION_CHARS
    ],
)
def test_parse_expression_rejects(text: str) -> None:
    assert parse_expression(text) is None


def test_length_bound_is_the_only_reason_for_a_long_sum() -> None:
    fits = "+".join(["1"] * ((MAX_EXPRESSION_CHARS + 1) // 2))  # 2k - 1 chars <= bound
    assert len(fits) <= MAX_EXPRESSION_CHARS
    parsed = parse_expression(fits)
    assert parsed is not None and parsed.value == len(parsed.numbers)
    assert parse_expression(fits + "+1") is None


# ---- solver and generator ---------------------------------------------------------------------
def test_solver_finds_a_checked_solution() -> None:
    for numbers, target in [([3, 5, 2], 4), ([44, 19, 35], 98), ([1, 2, 3, 4], 24), ([3, 3, 8, 8], 24)]:
        solution = solve(numbers, target)
        assert solution is not None
        parsed = parse_expression(solution)
        assert parsed is not None and parsed.value == target
        assert sorted(parsed.numbers) == sorted(numbers)


def test_solver_reports_impossible() -> None:
    assert solve([1, 1, 1], 100) is None  # at most (1+1)*(1+1)... with three ones: max 3
    assert solve([3, 4], 12, ops="+-") is None  # 3+4, 3-4, 4-3 only
    assert solve([3, 4], 7, ops="+-") == "3 + 4"
    assert solve([5], 5) == "5"
    with pytest.raises(ValueError, match="ops"):
        solve([1, 2], 3, ops="^")


def test_generator_instances_are_solvable_and_in_range() -> None:
    rng = np.random.default_rng(0)
    for _ in range(100):
        instance = generate_instance(rng)
        assert 3 <= len(instance.numbers) <= 4
        assert all(1 <= n <= 99 for n in instance.numbers)
        assert 1 <= instance.target <= 100
        parsed = parse_expression(instance.witness)
        assert parsed is not None and parsed.value == instance.target
        assert sorted(parsed.numbers) == sorted(instance.numbers)


def test_generator_respects_ops() -> None:
    rng = np.random.default_rng(1)
    for _ in range(30):
        witness = generate_instance(rng, ops="+-").witness
        assert "*" not in witness and "/" not in witness


# ---- the environment ----------------------------------------------------------------------------
def test_check_env_passes() -> None:
    check_env(make())


def test_observation_and_determinism() -> None:
    env = make()
    obs, info = env.reset(seed=3)
    assert obs == f"Target: {info['target']}\nNumbers: [{', '.join(map(str, info['numbers']))}]"
    for sample in range(3):
        again = make().reset(seed=3, options={"sample": sample})[0]
        assert again == obs
    assert len({make().reset(seed=s)[0] for s in range(20)}) == 20
    trajectories = []
    for _ in range(2):
        env.reset(seed=3)
        trajectories.append([env.step(a) for a in ("1+", "1+2", "5")])
    assert trajectories[0] == trajectories[1]


def test_hand_derived_rewards(ten_from_342: CountdownEnv) -> None:
    env = ten_from_342
    cases = [
        # (action, reward, success): target 10 from [3, 4, 2]
        ("3*4-2", 1.0, True),  # 12 - 2 = 10, each number once
        ("(4 - 2) × 3 + 4 - 4", 0.0, False),  # = 10 but uses 4 three times
        ("4*3 - 2", 1.0, True),  # order does not matter
        ("3+4+2", 0.1, False),  # 9: right numbers, wrong value
        ("3/(2-2)*4", 0.0, False),  # uses [3, 2, 2, 4], not [3, 4, 2]
        ("3*4", 0.0, False),  # 2 missing
        ("3*4-2-2", 0.0, False),  # 2 twice
        ("-3*4+2", 0.1, False),  # -10: unary minus is fine, value is not
    ]
    for action, reward, success in cases:
        env.reset(seed=0)
        _, got, terminated, truncated, info = env.step(action)
        assert (got, info["success"], info["action_is_valid"]) == (reward, success, True), action
        assert terminated and not truncated


def test_division_by_zero_with_the_right_numbers_is_format_score(tmp_path: Path) -> None:
    # [2, 2, 5] -> 5/(2-2) uses each number once and has no value: 0.1, like the reference's eval error
    env = make(data_path=str(write_jsonl(tmp_path / "z.jsonl", [{"target": 1, "nums": [2, 2, 5]}])))
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("5/(2-2)")
    assert (reward, terminated, info["value"], info["uses_all_numbers"]) == (0.1, True, None, True)


def test_reward_knobs(tmp_path: Path) -> None:
    data = str(write_jsonl(tmp_path / "k.jsonl", [{"target": 10, "nums": [3, 4, 2]}]))
    env = make(data_path=data, score=2.0, format_score=0.5)
    env.reset(seed=0)
    assert env.step("3*4-2")[1] == 2.0
    env.reset(seed=0)
    assert env.step("3+4+2")[1] == 0.5


def test_equation_is_invalid_and_changes_nothing(ten_from_342: CountdownEnv) -> None:
    env = ten_from_342
    obs0 = env.render_state()
    obs, reward, terminated, truncated, info = env.step("3*4-2 = 10")
    assert (obs, reward, terminated, truncated, info["action_is_valid"]) == (obs0, 0.0, False, False, False)
    assert env.step("3*4-2")[1] == 1.0  # the episode went on
    _, reward, terminated, _, info = env.step("3*4-2")  # after the end: nothing more to earn
    assert (reward, terminated, info["action_is_valid"]) == (0.0, True, False)


def test_oracle_action_succeeds_on_generated_instances() -> None:
    env = make()
    for seed in range(40):
        env.reset(seed=seed)
        action = env.oracle_action()
        assert action is not None
        _, reward, terminated, _, info = env.step(action)
        assert (reward, terminated, info["success"]) == (1.0, True, True)
        assert env.oracle_action() is None


def test_fuzzed_actions_never_raise_and_letters_are_invalid() -> None:
    env = make()
    obs0, _ = env.reset(seed=9)
    rng = np.random.default_rng(0)
    printable = [chr(c) for c in range(32, 127)]
    arithmetic = list("0123456789+-*/() ")
    numbers = env.instance.numbers
    near_misses = [
        "+".join(map(str, numbers)) + f" = {env.instance.target}",
        "*".join(map(str, numbers)) + ";",
        " x ".join(map(str, numbers)),
        "+".join(map(str, numbers)) + ")",
        "(" + "+".join(map(str, numbers)),
        "**".join(map(str, numbers)),
        "//".join(map(str, numbers)),
        f"{numbers[0]}.0+" + "+".join(map(str, numbers[1:])),
        "sum(" + ",".join(map(str, numbers)) + ")",
        "<answer>" + "+".join(map(str, numbers)) + "</answer>",
    ]
    actions = list(near_misses)
    while len(actions) < 1000:
        kind = len(actions) % 5
        if kind == 0:
            actions.append("".join(rng.choice(printable, size=int(rng.integers(0, 30)))))
        elif kind == 1:
            actions.append(
                "".join(chr(int(c)) for c in rng.integers(1, 0x2FFFF, size=int(rng.integers(1, 20))))
            )
        elif kind == 2:  # arithmetic-looking: some parse, most do not
            actions.append("".join(rng.choice(arithmetic, size=int(rng.integers(1, 15)))))
        elif kind == 3:
            actions.append(" \t\n"[len(actions) % 3] * int(rng.integers(0, 4)))
        else:
            actions.append("1+" * int(rng.integers(200, 30_000)) + "1")
    seen_valid = 0
    for action in actions:
        obs, reward, terminated, truncated, info = env.step(action)
        if not info["action_is_valid"]:
            assert (obs, reward, terminated, truncated) == (obs0, 0.0, False, False)
            continue
        seen_valid += 1
        assert terminated and reward in (0.0, 0.1, 1.0)
        assert set(action.strip()) <= set(arithmetic + list("×÷−\t\n")), action
        env.reset(seed=9)  # a valid answer ends the episode; start it again
    for action in near_misses:
        env.reset(seed=9)
        assert not env.step(action)[4]["action_is_valid"], action
    assert 0 < seen_valid < 200  # the arithmetic fuzz does reach the evaluator


# ---- data files ---------------------------------------------------------------------------------
def test_loaders_read_jsonl_json_and_parquet(tmp_path: Path) -> None:
    rows = [{"target": 10, "nums": [3, 4, 2]}]
    (tmp_path / "d.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    for name in ("d.json", "d.parquet"):
        env = make(data_path=str(tmp_path / name))
        obs, _ = env.reset(seed=1)
        assert obs == "Target: 10\nNumbers: [3, 4, 2]"
        assert env.oracle_action() is not None


def test_unsolvable_rows_are_skipped(tmp_path: Path) -> None:
    rows = [{"target": 1000, "nums": [1, 1, 1]}, {"target": 10, "nums": [3, 4, 2]}]
    env = make(data_path=str(write_jsonl(tmp_path / "mixed.jsonl", rows)))
    for seed in range(10):
        assert env.reset(seed=seed)[1]["target"] == 10
    only_bad = write_jsonl(tmp_path / "bad.jsonl", rows[:1])
    with pytest.raises(RuntimeError, match="no solvable row"):
        make(data_path=str(only_bad)).reset(seed=0)


def test_bad_data_and_knobs_raise_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data_path"):
        CountdownEnv(data_path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="row 1"):
        CountdownEnv(
            data_path=str(write_jsonl(tmp_path / "r.jsonl", [{"target": 1, "nums": [1]}, {"nums": [2]}]))
        )
    with pytest.raises(ValueError, match="unknown file type"):
        (tmp_path / "d.csv").write_text("target,nums\n")
        CountdownEnv(data_path=str(tmp_path / "d.csv"))
    with pytest.raises(ValueError, match="min_numbers"):
        CountdownEnv(min_numbers=5, max_numbers=4)
    with pytest.raises(ValueError, match="ops"):
        CountdownEnv(ops="+^")


def test_conf_matches_the_class() -> None:
    conf = OmegaConf.to_container(env_conf("countdown"), resolve=True)
    assert isinstance(conf, dict)
    assert conf["id"] == "ragen2/Countdown-v0"
    assert conf["max_turns"] == CountdownEnv.default_max_turns == 1
    assert conf["max_actions_per_turn"] == CountdownEnv.default_max_actions_per_turn == 1
    env = make(**conf["kwargs"])
    assert (env.score, env.format_score, env.data) == (1.0, 0.1, None)
