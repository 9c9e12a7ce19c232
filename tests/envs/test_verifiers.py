"""env=verifiers: verifiers 0.4.0's environments (installed without its pins) as ragen2 environments.

What ran, offline: ragen2's two example environments (``ragen2-arithmetic``: a single-turn taskset played by
verifiers' ``SingleAgentEnv``; ``ragen2-guess``: a multi-turn ``Env`` that answers each guess through
``agent.interaction``), verifiers' own ``best-of-n`` Env and, as an outside package would ship them, a taskset
and Envs written to a folder on sys.path by this file. The shared contracts run on the adapter in
tests/envs/test_adapted.py; here: a group's byte-identical prompts, the rubric as the return with success a flag apart from it, a
multi-turn episode through the project's runner, what an environment may return or do (an empty or huge
prompt, a non-finite reward, an error, a hang, a second rollout asking the policy), a taskset that is not
installed and a missing package (one line at start-up each), and one real training iteration whose episodes
succeed and whose reasoning the MI pass scores."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import ragen2_envs

from envs.adapted import ADAPTED, hide, train_one_iteration
from envs.adapter_checks import collect
from ragen2.agent import AgentConfig, EpisodeRunner
from ragen2.agent.timeout import EnvTimeout, call_with_timeout
from ragen2.agent.tools import Toolbox
from ragen2.config import compose
from ragen2.data.record import RolloutStats
from ragen2.errors import ConfigError
from ragen2.rollout import SamplingParams
from ragen2.rollout.scripted import ScriptedSampler
from ragen2.train import run

ADAPTER = ADAPTED["verifiers"]
ENV_ID = ADAPTER.env_id
pytestmark = ADAPTER.needed()

ORACLE = "I work it out.</think><answer>{oracle}</answer>"
WRONG = "A guess.</think><answer>1000</answer>"
WORDS = "Some words.</think><answer>not a number</answer>"
UNCLOSED = "I keep thinking and never close the tag"

# an outside package's verifiers plugins, each a module named by its id (verifiers imports a plugin by its id)
OUTSIDE = {
    "echo_words": """
import verifiers.v1 as vf

class EchoData(vf.TaskData):
    answer: str
    score: float

class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def echoed(self, task: EchoData, trace: vf.Trace) -> float:
        return task.score if trace.last_reply == task.answer else 0.0

class EchoConfig(vf.TasksetConfig):
    prompt: str = "Say {answer}."
    score: float = 1.0

class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self):
        for word in ("apple", "pear", "plum"):
            prompt = self.config.prompt.format(answer=word)
            yield EchoTask(EchoData(prompt=prompt, answer=word, score=self.config.score), self.config.task)

__all__ = ["EchoTaskset"]
""",
    "echo_misbehaves": """
import asyncio
import verifiers.v1 as vf

class MisbehavesConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()
    then: str = "raise"

class MisbehavesEnv(vf.Env[MisbehavesConfig]):
    async def run(self, task, agents):
        await agents.agent.run(task)
        if self.config.then == "hang":
            await asyncio.sleep(3600)
        raise RuntimeError("the env's own bug")

__all__ = ["MisbehavesEnv"]
""",
    "echo_broken": """
import verifiers.v1 as vf

class BrokenConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()

class BrokenEnv(vf.Env[BrokenConfig]):
    async def run(self, task, agents):
        raise RuntimeError("broken before asking")

__all__ = ["BrokenEnv"]
""",
}


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """OUTSIDE's modules on sys.path, as installed packages."""
    folder = tmp_path_factory.mktemp("outside")
    for name, source in OUTSIDE.items():
        (folder / f"{name}.py").write_text(source)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        yield
    for name in OUTSIDE:
        sys.modules.pop(name, None)


@pytest.fixture
def problems() -> Iterator[dict]:
    """The adapter's count of verifiers' problems, from zero."""
    from ragen2_envs.verifiers.env import problems

    before = dict(problems)
    problems.clear()
    yield problems
    problems.clear()
    problems.update(before)


def _collect(tokenizer, responses: list[str], seeds: list[int], group_size: int, **env_kw):
    return collect(ADAPTER, tokenizer, responses, seeds, group_size, max_turns=4, **env_kw)


@pytest.mark.parametrize("taskset", ["ragen2-arithmetic", "ragen2-guess"])
def test_a_group_sees_one_prompt_byte_for_byte(tokenizer, taskset: str) -> None:
    episodes = _collect(tokenizer, [ORACLE, WRONG, UNCLOSED], seeds=[3, 8], group_size=4, taskset=taskset)
    first = {(ep.group, ep.sample): ep.turns[0].prompt_ids for ep in episodes}
    for group in (0, 1):
        assert all(first[group, k] == first[group, 0] for k in range(4))
    assert first[0, 0] != first[1, 0]  # another seed, another task
    # verifiers' system prompt is the episode's: the instructions every rollout of the group sees
    assert {ep.system_prompt for ep in episodes[:4]} == {episodes[0].system_prompt}
    assert episodes[0].system_prompt.startswith(
        ragen2_envs.make(ENV_ID, taskset=taskset).tasks[0].data.system_prompt
    )
    again = _collect(tokenizer, [WRONG], seeds=[3], group_size=1, taskset=taskset)
    assert again[0].turns[0].prompt_ids == first[0, 0]


def test_the_rubric_is_the_return_and_success_a_flag_apart() -> None:
    env = ragen2_envs.make(ENV_ID)  # ragen2-arithmetic: correct (weight 1) + integer (weight 0.1)
    shown, _ = env.reset(seed=5)
    assert shown.startswith("What is ") and env.instructions.startswith("Compute the value")
    answer = env.oracle_action()
    assert env.step("") == (shown, 0.0, False, False, {"action_is_valid": False, "success": False})
    _, reward, terminated, truncated, info = env.step(answer)  # the blank answer left the request waiting
    assert (reward, terminated, truncated, info["success"]) == (pytest.approx(1.1), True, False, True)
    assert env.step(answer)[4]["action_is_valid"] is False  # the episode is over
    for reply, paid in ((str(int(answer) + 1), 0.1), ("fourteen", 0.0)):
        env.reset(seed=5)
        _, reward, terminated, _, info = env.step(reply)
        assert (reward, terminated, info["success"]) == (pytest.approx(paid), True, False)
    lenient = ragen2_envs.make(ENV_ID, success_threshold=0.1)
    lenient.reset(seed=5)
    assert lenient.step("0")[4]["success"]


def test_a_multi_turn_env_answers_each_reply_until_it_ends(tokenizer) -> None:
    env = ragen2_envs.make(ENV_ID, taskset="ragen2-guess")
    first, _ = env.reset(seed=1)
    secret = int(env.oracle_action())
    assert env.step("x")[:4] == ("Not a number. Guess again.", 0.0, False, False)
    assert env.step(str(secret - 1))[0] == "Higher. Guess again."
    _, reward, terminated, _, info = env.step(str(secret))
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    # four wrong guesses: verifiers' env ends the exchange, unpaid
    env.reset(seed=1)
    for _ in range(3):
        assert env.step(str(secret + 1))[:4] == ("Lower. Guess again.", 0.0, False, False)
    _, reward, terminated, _, info = env.step(str(secret + 1))
    assert (reward, terminated, info["success"]) == (0.0, True, False)
    # through the agent: a wrong guess, then the secret, over two turns
    (episode,) = _collect(tokenizer, [WORDS], seeds=[1], group_size=1, taskset="ragen2-guess")
    assert [t.observation for t in episode.turns][:2] == [first, "Not a number. Guess again."]
    assert len(episode.turns) == 4 and not episode.success and episode.end_reason == "terminated"
    (episode,) = _collect(tokenizer, [ORACLE], seeds=[1], group_size=1, taskset="ragen2-guess")
    assert episode.success and len(episode.turns) == 1 and episode.turns[0].reward == 1.0


def test_an_outside_packages_taskset_and_what_it_returns(outside, problems) -> None:
    env = ragen2_envs.make(ENV_ID, taskset="echo_words", oracle_key=None)
    shown, _ = env.reset(seed=0)
    word = shown.removeprefix("Say ").removesuffix(".")
    assert env.instructions == ragen2_envs.verifiers.env.GENERIC_INSTRUCTIONS  # the task has no system prompt
    assert env.oracle_action() is None and env.step(word)[1:3] == (1.0, True)
    # an empty prompt, a prompt longer than an observation holds, a rubric that pays nan
    empty = ragen2_envs.make(ENV_ID, taskset="echo_words", taskset_config={"prompt": ""})
    assert empty.reset(seed=0)[0] == "" and empty.step("x")[2]
    huge = ragen2_envs.make(ENV_ID, taskset="echo_words", taskset_config={"prompt": "{answer} " * 20_000})
    shown, info = huge.reset(seed=0)
    assert info["observation_cut"] and len(shown) == 65_536 and shown.endswith("characters cut]")
    nan = ragen2_envs.make(ENV_ID, taskset="echo_words", taskset_config={"score": float("nan")})
    shown, _ = nan.reset(seed=0)
    _, reward, terminated, _, info = nan.step(shown.removeprefix("Say ").removesuffix("."))
    assert (reward, terminated, info["reward_invalid"], info["success"]) == (0.0, True, True, False)
    assert problems == {"observation_cut": 1, "reward_invalid": 1}


def test_an_env_that_fails_or_hangs_ends_its_episode_and_the_run_goes_on(outside, problems, caplog) -> None:
    fails = ragen2_envs.make(ENV_ID, taskset="echo_words", env="echo_misbehaves")
    fails.reset(seed=0)
    _, reward, terminated, truncated, info = fails.step("apple")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "RuntimeError: the env's own bug" in info["env_error"]
    hang = {"then": "hang"}
    hangs = ragen2_envs.make(
        ENV_ID, taskset="echo_words", env="echo_misbehaves", env_config=hang, turn_timeout_s=0.5
    )
    hangs.reset(seed=0)
    _, reward, _, truncated, info = hangs.step("apple")
    assert (reward, truncated) == (0.0, True) and "turn_timeout_s=0.5 s" in info["env_error"]
    assert hangs.step("apple")[3:] == (
        True,
        {"env_error": info["env_error"], "action_is_valid": True, "success": False},
    )
    assert problems == {"episode_error": 1, "turn_timeout": 1}
    assert sum("the episode ends as a failure" in r.message for r in caplog.records) == 2
    # ragen2's own step timeout interrupts the wait: the episode is left, the env's next one runs
    slow = ragen2_envs.make(
        ENV_ID, taskset="echo_words", env="echo_misbehaves", env_config=hang, turn_timeout_s=600
    )
    slow.reset(seed=0)
    with pytest.raises(EnvTimeout):
        call_with_timeout(slow.step, 0.5, "apple")
    shown, info = slow.reset(seed=1)
    assert shown.startswith("Say ") and "env_error" not in info


def test_a_second_rollout_asking_the_policy_is_refused_and_counted(problems) -> None:
    # verifiers' own best-of-n Env: n attempts of one seat, each a rollout of its own
    for n, refused in ((1, 0), (2, 1)):
        env = ragen2_envs.make(ENV_ID, env="best-of-n", env_config={"n": n})
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(env.oracle_action())
        assert (reward, terminated, info["success"]) == (pytest.approx(1.1), True, True)  # the first, scored
        assert problems["second_seat"] == refused


class LookupSolver(ScriptedSampler):
    """ragen2-lookup through a real tool call: ``lookup`` on the key the question names, then the code the
    tool returned as the answer."""

    def generate(self, prompts, params, seed, meta=None):
        out = []
        for prompt in prompts:
            shown = self.tokenizer.decode(prompt)
            results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", shown, re.S)
            if results:
                text = f"The tool said.</think><answer>{results[-1]}</answer>"
            else:
                call = {"name": "lookup", "arguments": {"key": re.findall(r"'(\w+)'", shown)[-1]}}
                text = f"I look it up.</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"
            out += ScriptedSampler(self.tokenizer, [text + "<|im_end|>"]).generate([prompt], params, seed)
        return out


def test_a_tool_env_runs_on_the_tools_its_tasks_serve(
    outside, problems, qwen_tokenizer, tmp_path: Path
) -> None:
    """env.tools=['*'] on ragen2-lookup: the tools are those verifiers' requests offer (the task's MCP tool
    server, launched by verifiers for each rollout); each call reaches the server through ragen2's harness,
    and an episode succeeds through a real tool call and the answer it made possible."""
    from ragen2_envs.verifiers.env import VerifiersEnv
    from ragen2_envs.verifiers.lookup import CODES

    make = partial(ragen2_envs.make, ENV_ID, taskset="ragen2-lookup")
    box = Toolbox.from_specs(["*"], VerifiersEnv, make)
    assert [s["function"]["name"] for s in box.schemas] == ["lookup"]
    assert box.schemas[0]["function"]["parameters"]["required"] == ["key"]
    agent = AgentConfig(max_turns=3, max_actions_per_turn=1)
    runner = EpisodeRunner(
        make, qwen_tokenizer, agent, SamplingParams(max_new_tokens=96), env_id=ENV_ID, tools=box
    )
    episodes = runner.collect(LookupSolver(qwen_tokenizer), seeds=[0, 1], group_size=2, sample_seed=0)
    for ep in episodes:
        assert ep.success and ep.end_reason == "terminated" and ep.episode_return == 1.0
        (call,) = ep.turns[0].tool_calls
        assert call.name == "lookup" and call.content in CODES.values() and not call.error
        assert ep.turns[1].actions == [call.content] and ep.turns[1].reward == 1.0
    stats = RolloutStats.of(episodes)
    assert stats.tool_calls > 0 and stats.tool_errors == 0
    # a key the table lacks: the tool's own error, for the policy to read (a tool error, not a crash)
    env = make()
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"no entry for 'dragon'"):
        env.call_tool("lookup", key="dragon")
    env.close()
    # an env that fails before it asks the policy has no tools to offer: its error, not "no tools"
    broken = ragen2_envs.make(ENV_ID, taskset="echo_words", env="echo_broken")
    with pytest.raises(ValueError, match=r"did not get as far as offering tools .*broken before asking"):
        broken.list_tools()
    # a taskset whose tasks serve no tools, asked for them: one line before training
    cfg = compose(["model=tiny_qwen2", "env=verifiers", "env.tools=['*']"], run_dir=str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        run(cfg)
    assert "\n" not in str(caught.value) and str(caught.value).startswith(
        "env.tools[0]='*': env.kwargs.taskset='ragen2-arithmetic' offers the policy no tools"
    )


def test_a_taskset_that_is_not_installed_is_one_line_at_start_up(tmp_path: Path) -> None:
    cfg = compose(
        ["model=tiny", "env=verifiers", "env.kwargs.taskset=ragen2-arithmetc"], run_dir=str(tmp_path)
    )
    with pytest.raises(ValueError) as caught:
        run(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "env.kwargs.taskset='ragen2-arithmetc' is not a verifiers taskset installed here (did you mean "
        "ragen2-arithmetic? a taskset is a package that imports as its id: pip install it;"
    )
    assert message.endswith("Fix: env.kwargs.taskset='ragen2-arithmetic'")
    # an id that imports but is no taskset, and taskset fields it refuses: the env's constructor says which
    with pytest.raises(ValueError, match=r"^taskset='json' .*does not start here .*exports no Taskset"):
        ragen2_envs.make(ENV_ID, taskset="json")
    with pytest.raises(ValueError, match=r"^taskset='ragen2-arithmetic' .*does not start here .*size"):
        ragen2_envs.make(ENV_ID, taskset_config={"size": 0})


def test_without_the_package_the_start_up_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide(monkeypatch, ADAPTER)
    with pytest.raises(ValueError) as caught:
        run(compose(["model=tiny", "env=verifiers"], run_dir=str(tmp_path)))
    assert str(caught.value) == (
        f"env.id={ENV_ID!r} adapts the verifiers package, which does not import here (No module named "
        f"'verifiers'). Fix: {ADAPTER.install}"
    )


def test_one_training_iteration_succeeds_and_the_mi_pass_scores_its_reasoning(tmp_path: Path) -> None:
    metrics = train_one_iteration(ADAPTER.conf, tmp_path / "run", "env.kwargs.taskset=ragen2-guess")
    assert metrics["rollout/success"] > 0 and metrics["rollout/return"] > 0
    assert metrics["rollout/turns"] > 1  # some episodes took more than one guess
    assert metrics["train/optimizer_steps"] >= 1
    assert metrics["diag/first_turn/valid_rows"] >= 2 and "diag/first_turn/mi_est" in metrics
