"""env=openenv: an OpenEnv server's environment through OpenEnv's own client (openenv-core 0.3.0), against real
servers this file starts on localhost: ragen2's FrozenLake served through openenv-core
(``ragen2_envs.openenv.server``; the wheel ships no example env).

The shared contract (tests/envs/test_all_envs.py) on the adapter, a group's byte-identical prompts, success as a
flag apart from the return, a server that stops answering or dies mid-episode (the episode ends, counted, and the
run goes on), a URL where no server answers and a missing package (one line at start-up each), and one real
training iteration whose episodes succeed and whose reasoning the MI pass scores."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import gymnasium
import pytest
import ragen2_envs
from helpers import ToolSolver

from envs.adapted import ADAPTED, hide, train_one_iteration
from envs.adapter_checks import ENV_CONTRACT, check_config_contract, collect
from ragen2.agent import AgentConfig, EpisodeRunner
from ragen2.agent.tools import Toolbox
from ragen2.config import compose
from ragen2.data.record import RolloutStats
from ragen2.data.rollout_config import EnvConfig
from ragen2.errors import ConfigError
from ragen2.rollout import SamplingParams
from ragen2.train import run

ADAPTER = ADAPTED["openenv"]
ENV_ID = ADAPTER.env_id
# the adapter bound to this file's server (gymnasium's spec kwargs), for the checks that make an env by id alone
SERVED_ID = "ragen2/OpenEnvServedFrozenLake-v0"
pytestmark = ADAPTER.needed()

ORACLE = "I follow the path.</think><answer>{oracle}</answer>"
WRONG = "Into the wall.</think><answer>Sideways</answer>"  # well-formed for ragen2; FrozenLake refuses it
UNCLOSED = "I keep thinking and never close the tag"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str, server: subprocess.Popen | None = None, log: Path | None = None) -> str:
    """``url`` once its server answers its /health (within a minute)."""
    import httpx

    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1.0).raise_for_status()
            return url
        except httpx.HTTPError:
            if (server is not None and server.poll() is not None) or time.monotonic() > deadline:
                said = log.read_text() if log is not None else ""
                pytest.fail(f"the OpenEnv server at {url} did not start:\n{said}")
            time.sleep(0.1)


@contextlib.contextmanager
def _served(env_id: str, env_kwargs: dict, tools: bool = False) -> Iterator[str]:
    """A real OpenEnv server of ``env_id`` (its tools over MCP with ``tools``) on a thread of this process."""
    import uvicorn
    from ragen2_envs.openenv.server import app

    port = _free_port()
    served = app(env_id, env_kwargs, tools=tools)
    server = uvicorn.Server(uvicorn.Config(served, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, name="openenv-test-server", daemon=True)
    thread.start()
    yield _healthy(f"http://127.0.0.1:{port}")
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A server of deterministic FrozenLake (every move happens as meant), and SERVED_ID bound to it."""
    with _served("ragen2/FrozenLake-v0", {"success_rate": 1.0}) as url:
        gymnasium.register(
            id=SERVED_ID,
            entry_point="ragen2_envs.openenv.env:OpenEnvEnv",
            kwargs={"base_url": url},
            disable_env_checker=True,
        )
        yield url
        gymnasium.registry.pop(SERVED_ID, None)


@pytest.fixture(scope="module")
def tool_url() -> Iterator[str]:
    """An OpenEnv MCP environment: SearchQA's tools (search, and finish, which moves the env) served over MCP."""
    with _served("ragen2/SearchQA-v0", {}, tools=True) as url:
        yield url


@pytest.fixture(scope="module", autouse=True)
def doomed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """A server of its own process for the test that stops and kills it, started with the module so that its
    start-up overlaps the other tests: (the process, its URL, its log)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    command = [
        sys.executable,
        "-m",
        "ragen2_envs.openenv.server",
        "ragen2/FrozenLake-v0",
        "--port",
        str(port),
    ]
    with log.open("w") as out:
        server = subprocess.Popen([*command, "--kwargs", '{"success_rate": 1.0}'], stdout=out, stderr=out)
    yield server, f"http://127.0.0.1:{port}", log
    server.kill()
    server.wait(10)


@pytest.mark.parametrize("check", ENV_CONTRACT, ids=lambda check: check.__name__.removeprefix("test_"))
def test_the_shared_env_contract(check, url: str) -> None:
    check(SERVED_ID)


def test_the_shared_config_contract(tokenizer, url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENENV_URL", url)  # the conf's base_url
    name = ENV_ID.rpartition(":")[2]
    ragen2_envs.env_class(ENV_ID)  # registers the id
    monkeypatch.setitem(gymnasium.registry[name].kwargs, "base_url", url)  # an env made by its id alone
    check_config_contract(ADAPTER, tokenizer)


def _collect(tokenizer, url: str, responses: list[str], seeds: list[int], group_size: int, **env_kw):
    return collect(ADAPTER, tokenizer, responses, seeds, group_size, max_turns=8, base_url=url, **env_kw)


def test_a_group_sees_one_prompt_byte_for_byte(tokenizer, url: str) -> None:
    episodes = _collect(tokenizer, url, [ORACLE, WRONG, UNCLOSED], seeds=[3, 8], group_size=4)
    first = {(ep.group, ep.sample): ep.turns[0].prompt_ids for ep in episodes}
    for group in (0, 1):
        assert all(first[group, k] == first[group, 0] for k in range(4))
    assert first[0, 0] != first[1, 0]  # another seed, another map
    again = _collect(tokenizer, url, [WRONG], seeds=[3], group_size=1)
    assert again[0].turns[0].prompt_ids == first[0, 0]
    # the system prompt is the served env's own instructions (the server's /metadata)
    assert "FrozenLake" in episodes[0].system_prompt or "frozen" in episodes[0].system_prompt.lower()


def test_the_oracle_succeeds_through_the_server_and_success_is_a_flag_apart(tokenizer, url: str) -> None:
    (won,) = _collect(tokenizer, url, [ORACLE], seeds=[5], group_size=1)
    assert won.success and won.episode_return == 1.0 and won.end_reason == "terminated"
    assert all(t.actions_valid == [True] for t in won.turns)
    (lost,) = _collect(tokenizer, url, [WRONG], seeds=[5], group_size=1)
    assert not lost.success and lost.end_reason == "max_turns"
    assert all(t.actions_valid == [False] and t.penalty == -0.1 for t in lost.turns)

    def play(**env_kw) -> dict:
        env = ragen2_envs.make(ENV_ID, base_url=url, **env_kw)
        env.reset(seed=5)
        while True:
            _, reward, terminated, truncated, info = env.step(env.oracle_action())
            if terminated or truncated:
                return {"reward": reward, **info}

    assert play()["success"]  # the server's success field
    # a server that sends no such field: success is a done episode earning success_return, apart from the reward
    assert play(success_key="won", success_return=1.0) == play()
    short = play(success_key=None, success_return=2.0)
    assert short["reward"] == 1.0 and not short["success"]


def test_a_server_that_stops_answering_or_dies_ends_the_episode_not_the_run(
    tokenizer, doomed: tuple[subprocess.Popen, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    from ragen2_envs.openenv.env import server_errors

    server, url, log = doomed
    _healthy(url, server, log)
    env = ragen2_envs.make(ENV_ID, base_url=url, message_timeout_s=1.0)
    env.reset(seed=5)
    assert env.step(env.oracle_action())[4]["action_is_valid"]
    os.kill(server.pid, signal.SIGSTOP)  # the server hangs: the connection stays, no answer comes
    with caplog.at_level(logging.ERROR, logger="ragen2_envs.openenv.env"):
        _, reward, terminated, truncated, info = env.step("Up")
    assert (reward, terminated, truncated, info["success"]) == (0.0, False, True, False)
    assert "failed mid-episode (TimeoutError" in info["env_error"] and server_errors[url] == 1
    assert "the episode ends as a failure" in caplog.records[-1].getMessage()
    os.kill(server.pid, signal.SIGCONT)
    env.reset(seed=5)  # a new session on the server, which answers again
    assert env.step(env.oracle_action())[4]["action_is_valid"]
    server.kill()  # dies mid-episode
    server.wait(10)
    _, reward, _, truncated, info = env.step("Up")
    assert truncated and reward == 0.0 and "failed mid-episode" in info["env_error"]
    assert server_errors[url] == 2
    # a reset with no server to answer: the episode ends at its first step, as no fault of the policy
    shown, info = env.reset(seed=5)
    assert "did not respond" in shown and "failed at reset" in info["env_error"]
    assert env.step("Up")[3]
    # through the runner, as training collects: every episode ends as a failure, none raises
    episodes = _collect(tokenizer, url, [ORACLE], seeds=[1, 2], group_size=2)
    assert [ep.success for ep in episodes] == [False] * 4
    assert all(ep.end_reason == "env_truncated" and ep.episode_return == 0.0 for ep in episodes)
    assert server_errors[url] == 7
    assert RolloutStats.of(episodes).env_errors == 4.0  # rollout/env_errors: each such episode, counted


def test_a_url_where_no_server_answers_is_one_line_at_start_up(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    cfg = compose(["model=tiny", "env=openenv", f"env.kwargs.base_url={dead}"], run_dir=str(tmp_path))
    with pytest.raises(ValueError) as caught:
        run(cfg)
    message = str(caught.value)
    assert "\n" not in message
    assert f"env.kwargs.base_url='{dead}' does not answer (ConnectError: " in message
    assert "Start it first (e.g. python -m ragen2_envs.openenv.server " in message and "Fix: " in message


def test_without_the_package_the_start_up_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hide(monkeypatch, ADAPTER)
    with pytest.raises(ValueError) as caught:
        run(compose(["model=tiny", "env=openenv"], run_dir=str(tmp_path)))
    assert str(caught.value) == (
        f"env.id={ENV_ID!r} adapts the openenv package, which does not import here (No module named 'openenv'). "
        "Fix: pip install --no-deps openenv-core==0.3.0 && pip install fastmcp==4.2.3"
    )


def test_one_training_iteration_succeeds_and_the_mi_pass_scores_its_reasoning(
    url: str, tmp_path: Path
) -> None:
    # 4×4 maps take up to 6 moves, one a turn
    metrics = train_one_iteration(
        ADAPTER.conf, tmp_path / "run", f"env.kwargs.base_url={url}", "env.max_turns=8"
    )
    assert metrics["rollout/success"] > 0 and metrics["rollout/return"] > 0
    assert metrics["rollout/turns"] > 1
    assert metrics["train/optimizer_steps"] >= 1
    assert metrics["diag/first_turn/valid_rows"] >= 2 and "diag/first_turn/mi_est" in metrics


def test_an_mcp_environment_runs_on_the_tools_its_server_lists(qwen_tokenizer, tool_url: str) -> None:
    """env.tools=['*']: the tools an OpenEnv MCP server lists at start-up are the policy's; each call is the
    server's call_tool on the episode's session, and finish, which moves the env, ends an episode through a
    real tool call with the reward and success the server sent."""
    from ragen2_envs.openenv.env import OpenEnvEnv

    make = partial(ragen2_envs.make, ENV_ID, base_url=tool_url)
    box = Toolbox.from_specs(["*"], OpenEnvEnv, make)
    assert [s["function"]["name"] for s in box.schemas] == ["search", "finish"]
    assert box.schemas[1]["function"]["parameters"]["required"] == ["answer"]
    agent = AgentConfig(max_turns=5, max_actions_per_turn=1)  # the solver cannot plan on a copy of a session
    runner = EpisodeRunner(
        make, qwen_tokenizer, agent, SamplingParams(max_new_tokens=96), env_id=ENV_ID, tools=box
    )
    episodes = runner.collect(ToolSolver(qwen_tokenizer), seeds=[0, 1], group_size=2, sample_seed=0)
    for ep in episodes:
        assert ep.success and ep.end_reason == "terminated" and ep.episode_return == 1.0
        searches = [c for t in ep.turns[:-1] for c in t.tool_calls]
        assert searches and all(c.content.startswith('Search results for "') for c in searches)
        assert all(c.step is not None and not c.step.ended and c.step.reward == 0.0 for c in searches)
        (last,) = ep.turns[-1].tool_calls  # one call a turn: the solver's search after it is cut
        assert last.name == "finish" and last.step.terminated and last.step.reward == 1.0
        assert "Your answer: " in last.content
    assert RolloutStats.of(episodes).tool_errors == 0.0
    env = make()
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="Unknown tool: 'browse'"):  # the server's refusal, for the policy
        env.call_tool("browse", url="x")
    env.close()


def test_tools_from_a_server_that_lists_none_are_one_line_at_start_up(url: str, tmp_path: Path) -> None:
    cfg = compose(
        ["model=tiny_qwen2", "env=openenv", f"env.kwargs.base_url={url}", "env.tools=['*']"],
        run_dir=str(tmp_path),
    )
    with pytest.raises(ConfigError) as caught:
        run(cfg)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(
        f"env.tools[0]='*': env.kwargs.base_url='{url}' does not list"
    )
    assert "Fix: point env.kwargs.base_url at an MCP environment" in message
    with pytest.raises(ConfigError, match=r"^env.tools\[0\]='\*': FrozenLakeEnv has no tools"):
        EnvConfig(id="ragen2/FrozenLake-v0", tools=["*"])
