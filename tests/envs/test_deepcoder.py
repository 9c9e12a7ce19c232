"""DeepCoder env: contract, built-in problems (every reference passes in the sandbox), loader, grading."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ragen2_envs
from gymnasium.utils.env_checker import check_env
from ragen2_envs.deepcoder.env import DeepCoderEnv
from ragen2_envs.deepcoder.grader import extract_code, outputs_match, values_match
from ragen2_envs.deepcoder.loader import load_problems, split_from_path
from ragen2_envs.deepcoder.problems import BUILTIN_PROBLEMS
from ragen2_envs.deepcoder.sandbox import isolation_status

ENV_ID = "ragen2/DeepCoder-v0"
pytestmark = pytest.mark.skipif(not isolation_status().available, reason=isolation_status().reason)


def _make(**kwargs: object) -> DeepCoderEnv:
    return ragen2_envs.make(ENV_ID, **kwargs)  # type: ignore[return-value]


def _at(env: DeepCoderEnv, problem_id: str) -> None:
    env.reset(seed=0, options={"index": [p.id for p in env.problems].index(problem_id)})


def test_check_env_passes() -> None:
    check_env(_make(), skip_render_check=False)


def test_same_seed_same_problem_and_seeds_cover_the_set() -> None:
    env = _make()
    first = [env.reset(seed=s)[0] for s in range(20)]
    assert first == [env.reset(seed=s)[0] for s in range(20)]
    assert len(set(first)) > 5


def test_builtin_set_is_large_and_varied() -> None:
    assert len(BUILTIN_PROBLEMS) >= 30
    assert all(len(p.tests) >= 3 and p.reference for p in BUILTIN_PROBLEMS)
    assert len({p.id for p in BUILTIN_PROBLEMS}) == len(BUILTIN_PROBLEMS)
    assert {p.split for p in BUILTIN_PROBLEMS} == {"train", "test"}
    assert len(_make().problems) + len(_make(split="test").problems) == len(BUILTIN_PROBLEMS)


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_reference_solution_gets_full_reward(split: str) -> None:
    def solve(index: int) -> tuple[str, float, bool, dict]:
        env = _make(split=split)
        env.reset(seed=0, options={"index": index})
        _, reward, terminated, truncated, info = env.step(env.oracle_action() or "")
        return env.problem.id, reward, terminated and not truncated, info

    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(solve, range(len(_make(split=split).problems))))
    failed = [
        (pid, info.get("feedback")) for pid, reward, done, info in outcomes if reward != 1.0 or not done
    ]
    assert failed == []
    assert all(info["success"] and info["passed"] == info["total"] for *_, info in outcomes)


def test_wrong_stdio_solution_gets_the_fraction_it_earns() -> None:
    env = _make()
    _at(env, "factorial")
    # tests n = 0, 5, 20 expect 1, 120, 2432902008176640000; max(1, n) prints 1, 5, 20: 1 of 3 passes
    _, reward, terminated, _, info = env.step("```python\nprint(max(1, int(input())))\n```")
    assert reward == pytest.approx(1 / 3)
    assert (info["passed"], info["total"], info["success"], terminated) == (1, 3, False, True)


def test_wrong_call_solution_gets_the_fraction_it_earns() -> None:
    env = _make()
    _at(env, "is-prime")
    # n % 2 == 1 on 7, 1, 97, 100: True, True, True, False vs True, False, True, False: 3 of 4
    _, reward, _, _, info = env.step("def is_prime(n):\n    print('noise')\n    return n % 2 == 1")
    assert reward == pytest.approx(3 / 4) and (info["passed"], info["total"]) == (3, 4)


def test_retries_show_feedback_and_reward_the_improvement() -> None:
    env = _make(max_attempts=2)
    _at(env, "factorial")
    obs, reward, terminated, _, info = env.step("print(max(1, int(input())))")
    assert (reward, terminated) == (pytest.approx(1 / 3), False)
    assert "Test 2: wrong answer" in obs and "Attempts left: 1" in obs
    _, reward, terminated, _, info = env.step(env.oracle_action() or "")
    # the episode return is the best fraction reached: 1/3 + 2/3 = 1
    assert (reward, terminated, info["success"]) == (pytest.approx(2 / 3), True, True)


def test_timeout_scores_zero_with_a_clear_verdict() -> None:
    env = _make(timeout_s=0.5, max_tests=1, max_attempts=2)
    _at(env, "sum-two")
    obs, reward, _, _, info = env.step("while True:\n    pass")
    assert reward == 0.0 and info["total"] == 1 and "time limit exceeded" in obs


@pytest.mark.parametrize(
    "action",
    [
        "",
        "   ",
        "hello world",
        "def f(:",
        "ünïcödé ✓ 漢字",
        "```python\n```",
        "x\x00y",
        "(" * 5000,
        "a" * 70_000,
        "```python\nreturn ))\n```",
    ],
)
def test_unparseable_actions_are_invalid_and_change_nothing(action: str) -> None:
    env = _make()
    obs, _ = env.reset(seed=1)
    obs2, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated, info["action_is_valid"]) == (0.0, False, False, False)
    assert obs2 == obs and env.attempts == 0


def test_valid_but_crashing_code_runs_and_scores_zero() -> None:
    env = _make(max_tests=1)
    _at(env, "sum-two")
    _, reward, terminated, _, info = env.step("import os\nprint(os.environ)\nraise SystemExit(3)")
    assert (reward, terminated, info["action_is_valid"], info["success"]) == (0.0, True, True, False)


def test_extract_code_prefers_the_last_python_fence() -> None:
    text = "Idea.\n```\nbare\n```\n```python\nfirst\n```\ntext\n```py\nsecond = 1\n```"
    assert extract_code(text) == "second = 1"
    assert extract_code("```\nonly_bare()\n```") == "only_bare()"
    assert extract_code("print(1)") == "print(1)"


def test_output_comparison() -> None:
    assert outputs_match("1 2\n3  \n\n", "1 2\n3")
    assert outputs_match("0.3333333", "0.33333333")  # differs by 3.3e-8 < 1e-6
    assert not outputs_match("0.33", "0.3333")
    assert not outputs_match("YES", "yes")
    assert values_match([1, 2.0000000001], [1, 2]) and not values_match(True, 1)
    assert values_match({"a": [0.5]}, {"a": [0.5]}) and not values_match([1], [1, 2])


def test_loader_reads_taco_and_livecodebench_rows(tmp_path: Path) -> None:
    taco_stdio = {
        "question": "Print a+b.",
        "input_output": json.dumps(
            {"inputs": ["1 2\n", "3 4\n", "5 6\n"], "outputs": ["3\n", "7\n", "11\n"]}
        ),
        "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)"]),
    }
    taco_call = {
        "question": "double(x)",
        "input_output": json.dumps(
            {"fn_name": "double", "inputs": [[1], [2], [5]], "outputs": [[2], [4], [10]]}
        ),
        "solutions": ["def double(x):\n    return 2 * x"],
    }
    lcb = {
        "question_content": "Sum the list.",
        "starter_code": "class Solution:\n    def total(self, nums: list[int]) -> int:",
        "public_test_cases": json.dumps([{"input": "[1, 2]", "output": "3", "testtype": "functional"}]),
        "private_test_cases": json.dumps([{"input": "[]", "output": "0", "testtype": "functional"}]),
        "metadata": json.dumps({"func_name": "total"}),
        "question_id": "lcb-1",
        "canonical_solution": "class Solution:\n    def total(self, nums):\n        return sum(nums)",
    }
    path = tmp_path / "coding_train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (taco_stdio, taco_call, lcb)))
    problems = load_problems(path)
    assert [p.fn_name for p in problems] == [None, "double", "total"]
    assert problems[2].id == "lcb-1" and "Starter code" in problems[2].statement
    assert [t.input for t in problems[2].tests] == ["[[1, 2]]", "[[]]"]
    env = _make(data_path=str(path))
    for i in range(3):
        env.reset(seed=0, options={"index": i})
        _, reward, _, _, info = env.step(env.oracle_action() or "")
        assert reward == 1.0, info


def test_loader_never_serves_test_data_as_train(tmp_path: Path) -> None:
    row = {"problem": "p", "tests": [{"input": "1\n", "output": "1"}]}
    test_file = tmp_path / "lcb_test.jsonl"
    test_file.write_text(json.dumps(row))
    with pytest.raises(ValueError, match="holds no 'train' problems \\(it holds: test\\)"):
        load_problems(test_file)
    assert len(load_problems(test_file, split="test")) == 1
    unlabeled = tmp_path / "data" / "problems.jsonl"
    unlabeled.parent.mkdir()
    unlabeled.write_text(json.dumps(row))
    with pytest.raises(ValueError, match="cannot tell whether it is train or test"):
        load_problems(unlabeled)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(
        json.dumps([{**row, "split": "train"}, {**row, "split": "test"}, {**row, "split": "test"}])
    )
    assert (len(load_problems(mixed)), len(load_problems(mixed, split="test"))) == (1, 2)
    assert split_from_path(Path("/data/deepcoder/train/part-0.parquet")) == "train"


def test_bad_knobs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="split='dev'"):
        _make(split="dev")
    with pytest.raises(ValueError, match="max_attempts=0"):
        _make(max_attempts=0)
    with pytest.raises(FileNotFoundError, match="data_path="):
        _make(data_path="/nonexistent/train.jsonl")


def test_importing_the_env_pulls_in_no_torch() -> None:
    code = "import sys, ragen2_envs.deepcoder.env; sys.exit(int(any(m in sys.modules for m in ('torch', 'lightning', 'transformers'))))"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_running_unisolated_warns_once_per_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from ragen2_envs.deepcoder import sandbox

    def probe_again() -> None:  # the probes are cached per process; this test changes what they find
        sandbox.isolation_status.cache_clear()
        sandbox.probe.cache_clear()

    monkeypatch.setenv("PATH", str(tmp_path))  # neither bwrap nor unshare
    probe_again()
    sandbox._warn_unisolated.cache_clear()
    try:
        envs = [_make(allow_unisolated=True) for _ in range(2)]
    finally:
        monkeypatch.undo()
        probe_again()
    assert [env.isolated for env in envs] == [False, False]
    warnings = [r for r in caplog.records if "WITHOUT isolation" in r.getMessage()]
    assert len(warnings) == 1, caplog.text


def test_no_sandbox_and_no_interpreter_are_one_line_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the env needs and does not find here is a ConfigError from EnvConfig.make (one line at start-up),
    not a traceback: no sandbox (allow_unisolated=false), an interpreter that is no Python."""
    from ragen2_envs.deepcoder import sandbox

    from ragen2.data.rollout_config import EnvConfig
    from ragen2.errors import ConfigError

    nothing = sandbox.Isolation(False, "bubblewrap: not installed; unshare: not root", None)
    with monkeypatch.context() as patch:
        patch.setattr(sandbox, "isolation_status", lambda: nothing)
        with pytest.raises(
            ConfigError, match=r"^env\.kwargs of ragen2/DeepCoder-v0: cannot sandbox untrusted code "
        ):
            EnvConfig(id="ragen2/DeepCoder-v0").make()
    with pytest.raises(ConfigError, match=r"python=/bin/false does not run as a Python interpreter"):
        EnvConfig(id="ragen2/DeepCoder-v0", kwargs={"python": "/bin/false"}).make()
