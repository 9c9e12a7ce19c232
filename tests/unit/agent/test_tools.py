"""Tool-calling turns (env.tools, ``ragen2.agent.tools``): the call format, every failure as a message to the
policy (never a raise), the tool-message wrapper under Qwen2.5's template, and SearchQA answered through its
retriever as a tool with the token contract intact."""

from __future__ import annotations

import json
import time
from functools import partial

import pytest
import ragen2_envs
from helpers import ToolSolver
from ragen2_envs import EnvStep
from ragen2_envs.searchqa.env import SearchQAEnv

from ragen2.agent import AgentConfig, EpisodeRunner
from ragen2.agent.episode import record_messages
from ragen2.agent.render import (
    ToolFragments,
    assistant_message,
    check_tool_template,
    tool_fragments,
    turn_one_ids,
)
from ragen2.agent.tools import Tool, Toolbox, ToolCall, check_specs, function_tool, run_call, tool_turn
from ragen2.data.batch import collate_episodes
from ragen2.data.record import RolloutStats
from ragen2.data.rollout_config import EnvConfig
from ragen2.errors import ConfigError
from ragen2.rollout import SamplingParams
from ragen2.rollout.scripted import ScriptedSampler

from .test_runner import Recorder

SEARCHQA = "ragen2/SearchQA-v0"
# the retriever as a tool ({oracle}: SearchQA's solver, ``search[<entity>]`` on the hop chain), then the answer
CALL = 'I should look it up.</think>\n<tool_call>\n{"name": "search", "arguments": {"query": "{oracle}"}}\n</tool_call><|im_end|>'
ANSWER = "I know it.</think><answer>{oracle}</answer><|im_end|>"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def fail(x: str) -> str:
    """Always raises.

    Args:
        x: Anything.
    """
    raise ValueError(f"no {x}")


def hang(x: str) -> str:
    """Never returns in time.

    Args:
        x: Anything.
    """
    time.sleep(30)
    return x


def nodoc(x: str) -> str:
    return x


TOOLS = {t.name: t for t in (function_tool(f, "test") for f in (add, fail, hang))}


def _call(body: str) -> ToolCall:
    return run_call(body, TOOLS, 0.2)


def test_a_tool_turn_is_reasoning_then_only_tool_calls() -> None:
    text = 'Sum them.</think>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n<|im_end|>'
    assert tool_turn(text, ("<|im_end|>",)) == (
        "Sum them.",
        ['{"name": "add", "arguments": {"a": 1, "b": 2}}'],
    )
    two = 'x</think><tool_call>{"name": "a"}</tool_call> <tool_call>{"name": "b"}</tool_call>'
    assert tool_turn(two) == ("x", ['{"name": "a"}', '{"name": "b"}'])
    for not_tools in (
        "x</think><answer>Up</answer>",  # an answer turn: the env acts, as in text mode
        '<tool_call>{"name": "add"}</tool_call>',  # reasoning never closed
        'x</think><tool_call>{"name": "add"}</tool_call> and more',  # text after the calls
        'x</think><tool_call>{"name": "add"}',  # a call never closed
    ):
        assert tool_turn(not_tools) is None


def test_a_call_runs_and_its_result_is_the_tool_message() -> None:
    call = _call('{"name": "add", "arguments": {"a": 2, "b": 3}}')
    assert call == ToolCall("add", {"a": 2, "b": 3}, "5") and not call.penalized
    # OpenAI's wire format: the arguments as a JSON string
    assert _call('{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}').content == "2"


@pytest.mark.parametrize(
    ("body", "error", "says"),
    [
        ('{"name": "add", "arguments": {"a": 1, "b": 2}', "json", "not valid JSON"),
        ('["add", 1, 2]', "json", "names no tool"),
        ('{"name": "mul", "arguments": {}}', "unknown_tool", "no tool 'mul'. Tools: add, fail, hang"),
        ('{"name": "add", "arguments": [1, 2]}', "arguments", "must be a JSON object"),
        ('{"name": "add", "arguments": "{a: 1}"}', "arguments", "must be a JSON object"),
        ('{"name": "add", "arguments": {"a": 1}}', "arguments", "missing required argument(s) b"),
        ('{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}', "arguments", "unknown argument 'c'"),
        ('{"name": "add", "arguments": {"a": "1", "b": 2}}', "arguments", "'a' must be integer"),
        ('{"name": "add", "arguments": {"a": true, "b": 2}}', "arguments", "'a' must be integer"),
        ('{"name": "fail", "arguments": {"x": "luck"}}', "raised", "fail raised ValueError: no luck"),
    ],
)
def test_every_bad_call_is_an_error_message_and_a_penalty(body: str, error: str, says: str) -> None:
    call = _call(body)
    assert call.error == error and says in call.content and call.content.startswith("Error:")
    assert call.penalized


def test_a_hung_tool_is_cut_at_the_step_timeout_without_a_penalty(caplog: pytest.LogCaptureFixture) -> None:
    start = time.monotonic()
    call = _call('{"name": "hang", "arguments": {"x": "y"}}')
    assert time.monotonic() - start < 5
    assert call.error == "timeout" and not call.penalized and "did not return in time" in call.content
    assert "env.step_timeout_s=0.2" in caplog.text


@pytest.mark.parametrize(
    ("specs", "match"),
    [
        (
            ["fetch"],
            r"^env.tools\[0\]='fetch' is not a tool of SearchQAEnv \(its tools: search, finish\)\. Fix:",
        ),
        (["no_such_module:f"], r"^env.tools\[0\]='no_such_module:f' does not import .* Fix: an importable"),
        ([f"{__name__}:missing"], r"does not import \(AttributeError"),
        (["mcp: "], r"^env.tools\[0\]='mcp: ' names no command\. Fix:"),
        ([""], r"is not a tool spec"),
    ],
)
def test_bad_tool_specs_are_one_line_at_start_up(specs: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_specs(specs, SearchQAEnv)
    with pytest.raises(ConfigError, match=match):
        EnvConfig(id=SEARCHQA, tools=specs)


def test_a_function_without_a_schema_and_a_name_given_twice_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"gives no tool schema .* Fix: type-hint every argument"):
        Toolbox.from_specs([f"{__name__}:nodoc"], SearchQAEnv)
    with pytest.raises(ConfigError, match=r"two tools the name add\. Fix"):
        Toolbox.from_specs([f"{__name__}:add", f"{__name__}:add"], SearchQAEnv)


def test_a_template_without_a_tool_format_is_refused(tokenizer, qwen_tokenizer) -> None:
    schemas = [TOOLS["add"].schema]
    with pytest.raises(ConfigError, match=r"its chat template has no tool format .* Fix: .*model=tiny_qwen2"):
        check_tool_template(tokenizer, schemas)  # SmolLM2's template renders content only
    check_tool_template(qwen_tokenizer, schemas)
    check_tool_template(tokenizer, None)  # text mode: nothing to check
    with pytest.raises(ConfigError, match="has no tool format"):
        EpisodeRunner(
            partial(ragen2_envs.make, SEARCHQA),
            tokenizer,
            AgentConfig(),
            SamplingParams(),
            tools=Toolbox.from_specs(["search"], SearchQAEnv),
        )


def test_qwen_tool_results_are_wrapped_as_its_template_renders_them(qwen_tokenizer) -> None:
    f = tool_fragments(qwen_tokenizer, "sys", [TOOLS["add"].schema])
    assert f == ToolFragments(
        prefix="<|im_start|>user\n<tool_response>\n",
        separator="\n</tool_response>\n<tool_response>\n",
        suffix="\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )


def _searchqa_runner(
    tokenizer,
    layout: str = "sequence",
    max_turns: int = 5,
    tools: tuple[str, ...] = ("search",),
    actions: int = 1,
) -> EpisodeRunner:
    return EpisodeRunner(
        partial(ragen2_envs.make, SEARCHQA),
        tokenizer,
        AgentConfig(max_turns=max_turns, max_actions_per_turn=actions, layout=layout),
        SamplingParams(max_new_tokens=96),
        env_id=SEARCHQA,
        tools=Toolbox.from_specs(list(tools), SearchQAEnv),
    )


def test_searchqa_succeeds_through_its_retriever_as_a_tool(qwen_tokenizer) -> None:
    """Scripted replies that call ``search`` (a real ``<tool_call>``, run against the episode's env) and then
    answer: every sampled id is trained, every tool result is prompt (masked), each prompt grows by appending
    the sampled ids and the results inside Qwen's tool wrapper, and reads as the template renders the whole
    conversation with the tools in the system prompt."""
    tok = qwen_tokenizer
    runner = _searchqa_runner(tok)
    assert runner.layout == "sequence"
    rec = Recorder(ScriptedSampler(tok, [CALL, ANSWER]))
    episodes = runner.collect(rec, seeds=[0, 1, 2], group_size=4, sample_seed=0)
    by_tools = [
        ep for ep in episodes if ep.success and all(t.tool_calls for t in ep.turns[:-1]) and len(ep.turns) > 1
    ]
    assert by_tools, "no episode succeeded through tool calls alone"
    schemas = runner.tools.schemas
    for ep in episodes:
        chat = [{"role": "system", "content": ep.system_prompt}]
        for n, turn in enumerate(ep.turns):
            # Z: the sampled reasoning before the call (a token that straddles </think> left out)
            z = turn.reasoning_ids
            assert z == turn.sampled_ids[: len(z)] and tok.decode(z) in ("I should look it up", "I know it")
            if n:
                prev = ep.turns[n - 1]
                assert turn.prompt_ids[: prev.end] == [*prev.prompt_ids, *prev.sampled_ids]  # append-only
                chat.append(assistant_message(tok, prev.sampled_ids))
                if prev.tool_calls:
                    chat += [{"role": "tool", "content": c.content} for c in prev.tool_calls]
                else:
                    chat.append({"role": "user", "content": _user_text(tok, turn.prompt_ids[prev.end :])})
            else:
                chat.append({"role": "user", "content": _user_text(tok, turn.prompt_ids)})
            assert tok.decode(turn.prompt_ids) == tok.decode(turn_one_ids(tok, chat, schemas))
        # the saved episode's conversation, as exported: the tool results are tool messages, not user ones
        assert record_messages(ep.to_record(), tok) == [
            *chat,
            assistant_message(tok, ep.turns[-1].sampled_ids),
        ]
        for turn in ep.turns:
            for call in turn.tool_calls:
                assert call.error == "" and call.content.startswith('Search results for "')
    # the loss mask covers exactly the sampled ids: the tool results are never trained on
    batch = collate_episodes(episodes, 1, tok.pad_token_id)
    for row, ep in enumerate(episodes):
        assert batch.input_ids[row][batch.loss_mask[row].bool()].tolist() == [
            i for t in ep.turns for i in t.sampled_ids
        ]
    stats = RolloutStats.of(episodes)
    calls = sum(len(t.tool_calls) for ep in episodes for t in ep.turns)
    assert stats.tool_calls == calls > 0 and stats.tool_errors == 0
    record = by_tools[0].to_record()
    assert record["turns"][0]["tool_calls"][0]["name"] == "search"


def _user_text(tok, ids: list[int]) -> str:
    """The user message's text inside ``ids`` (a turn's new prompt ids)."""
    text = tok.decode(ids)
    return text[text.rfind("<|im_start|>user\n") + len("<|im_start|>user\n") : text.rfind("<|im_end|>")]


def test_an_episode_runs_on_function_calls_alone_when_a_tool_moves_the_env(qwen_tokenizer) -> None:
    """``finish`` moves the env (its ``EnvStep``): the turn takes its reward, success and end as the text action's;
    the call after it in the same turn does not run; the saved record keeps the step's numbers."""
    tok = qwen_tokenizer
    runner = _searchqa_runner(tok, tools=("search", "finish"), actions=2)
    episodes = runner.collect(Recorder(ToolSolver(tok)), seeds=[0, 1, 2], group_size=2, sample_seed=0)
    for ep in episodes:
        assert ep.success and ep.terminated and ep.end_reason == "terminated" and ep.episode_return == 1.0
        assert all(not t.actions and t.penalty == 0.0 for t in ep.turns) and len(ep.turns) >= 2
        (last,) = ep.turns[-1].tool_calls  # the search after finish never ran
        assert last.name == "finish" and last.error == "" and ep.turns[-1].reward == 1.0
        assert all(
            c.step is None for t in ep.turns[:-1] for c in t.tool_calls
        )  # search answers, moves nothing
        assert ep.to_record()["turns"][-1]["tool_calls"][0] | {"content": ""} == {
            "name": "finish",
            "arguments": {"answer": last.arguments["answer"]},
            "content": "",
            "error": "",
            "reward": 1.0,
            "terminated": True,
            "truncated": False,
        }
    stats = RolloutStats.of(episodes)
    assert stats.success == 1.0 and stats.tool_errors == 0.0


def score(points: str) -> EnvStep:
    """A move whose reward is whatever it is given.

    Args:
        points: The reward, as text.
    """
    return EnvStep(f"scored {points}", float(points), terminated=True)


def test_a_moving_tool_with_a_bad_reward_or_an_invalid_move_goes_on(qwen_tokenizer) -> None:
    """A reward that is not finite counts as 0 and is the tool's error (no penalty); an invalid move (an empty
    answer) changes nothing, as an invalid action, and costs the turn a format penalty like one."""
    tools = {"score": function_tool(score, "test")}
    good, bad = (
        run_call(json.dumps({"name": "score", "arguments": {"points": p}}), tools, 1.0) for p in ("2", "nan")
    )
    assert good.step == EnvStep("scored 2", 2.0, terminated=True) and not good.error
    assert bad.error == "reward" and not bad.penalized and bad.step.reward == 0.0 and bad.step.ended
    empty = 'Hm.</think><tool_call>{"name": "finish", "arguments": {"answer": " "}}</tool_call><|im_end|>'
    runner = _searchqa_runner(qwen_tokenizer, max_turns=1, tools=("search", "finish"))
    for ep in runner.collect(ScriptedSampler(qwen_tokenizer, [empty]), [0], 2, 0):
        ((call,),) = [t.tool_calls for t in ep.turns]
        assert call.step is not None and not call.step.ended and call.step.info["action_is_valid"] is False
        assert ep.end_reason == "max_turns" and ep.turns[0].penalty == -0.1 and not ep.success


def test_per_turn_renders_the_same_tool_conversation(qwen_tokenizer) -> None:
    """rollout.layout=per_turn: each turn rendered anew through the template with the tools reads the same as
    the appended ids of rollout.layout=sequence."""
    tok = qwen_tokenizer
    sequence, per_turn = (
        _searchqa_runner(tok, layout).collect(ScriptedSampler(tok, [CALL, ANSWER]), [0, 2], 2, sample_seed=0)
        for layout in ("sequence", "per_turn")
    )
    for a, b in zip(sequence, per_turn, strict=True):
        assert [t.sampled_ids for t in a.turns] == [t.sampled_ids for t in b.turns]
        assert [tok.decode(t.prompt_ids) for t in a.turns] == [tok.decode(t.prompt_ids) for t in b.turns]


def test_bad_tool_turns_go_on_with_an_error_message_and_a_penalty(qwen_tokenizer) -> None:
    tok = qwen_tokenizer
    bad = 'Oops.</think>\n<tool_call>\n{"name": "search", "arguments": {"query": }}\n</tool_call><|im_end|>'
    unknown = 'Hm.</think><tool_call>{"name": "browse", "arguments": {"url": "x"}}</tool_call><|im_end|>'
    episodes = _searchqa_runner(tok, max_turns=2).collect(ScriptedSampler(tok, [bad, unknown]), [0], 4, 0)
    for ep in episodes:
        assert ep.end_reason == "max_turns" and len(ep.turns) == 2
        for turn in ep.turns:
            (call,) = turn.tool_calls
            assert call.error in ("json", "unknown_tool") and turn.penalty == -0.1
        assert "Error:" in tok.decode(ep.turns[1].prompt_ids[ep.turns[0].end :])
    stats = RolloutStats.of(episodes)
    assert stats.tool_calls == stats.tool_errors == 8


def test_the_search_tool_counts_against_the_budget() -> None:
    env = SearchQAEnv(max_searches=1)
    env.reset(seed=0)
    assert env.search("Rasklosk Foundry").startswith('Search results for "Rasklosk Foundry"')
    assert env.search("again").startswith("No searches left")
    assert isinstance(Toolbox.from_specs(["search"], SearchQAEnv).bind(env)["search"], Tool)
