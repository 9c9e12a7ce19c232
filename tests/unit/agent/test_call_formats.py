"""Function-call formats (env.tool_format, ``ragen2.agent.call_formats``): Hermes/Qwen's ``<tool_call>``, Llama 3's
JSON (and 3.1's built-in tools), Mistral's ``[TOOL_CALLS]`` and the pythonic ``[f(a=1)]`` as a policy writes them,
each call run or answered with an error; ``auto`` read off real chat templates (Qwen2.5's, Llama 3.1's and 3.2's as
TRL ships them, 3.2's with the pythonic instruction, Mistral's tokenizers from mistral-common); and SearchQA
answered through its retriever in Llama 3.1's JSON and in pythonic calls through the episode runner."""

from __future__ import annotations

import copy
import importlib.util
import json
from functools import partial
from pathlib import Path

import pytest
import ragen2_envs
from ragen2_envs.searchqa.env import SearchQAEnv

from ragen2.agent import AgentConfig, EpisodeRunner
from ragen2.agent.call_formats import HERMES, LLAMA3_JSON, MISTRAL, PYTHONIC, CallFormat, call_format
from ragen2.agent.render import assistant_message
from ragen2.agent.tools import Toolbox, function_tool, run_call, tool_turn
from ragen2.data.record import RolloutStats
from ragen2.data.rollout_config import EnvConfig
from ragen2.errors import ConfigError
from ragen2.rollout import SamplingParams
from ragen2.rollout.scripted import ScriptedSampler

from .test_runner import Recorder


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


TOOLS = {"add": function_tool(add, "test")}
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"]


def _trl_template(name: str) -> str:
    spec = importlib.util.find_spec("trl")
    assert spec is not None and spec.submodule_search_locations
    return (Path(spec.submodule_search_locations[0]) / "chat_templates" / f"{name}.jinja").read_text()


@pytest.fixture(scope="module")
def llama_tokenizer():
    """The tiny model's BPE vocabulary under Llama 3.1's chat template (TRL's copy of Meta's) and its header,
    end-of-turn and ``<|python_tag|>`` tokens: the prompts a Llama 3.1 model reads, token for token in form."""
    from ragen2.models import load_tokenizer

    tok = load_tokenizer("tiny")
    tok.add_special_tokens({"additional_special_tokens": [*LLAMA_SPECIAL, "<|python_tag|>"]})
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    tok.chat_template = _trl_template("llama3_1")
    return tok


@pytest.fixture(scope="module")
def pythonic_tokenizer():
    """The tiny model's vocabulary under Llama 3.2's chat template (TRL's copy of Meta's) with its JSON
    instruction swapped for the pythonic one, as Llama 3.2's pythonic templates teach calls."""
    from ragen2.models import load_tokenizer

    tok = load_tokenizer("tiny")
    tok.add_special_tokens({"additional_special_tokens": LLAMA_SPECIAL})
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|eot_id|>"
    template = _trl_template("llama3_2")
    json_format = 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
    assert template.count(json_format) == 2, (
        "TRL's Llama 3.2 template no longer words its JSON instruction so"
    )
    pythonic = "Respond in the format [func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]"
    tok.chat_template = template.replace(json_format, pythonic).replace(
        "with JSON for a function call", "with a python list of calls"
    )
    return tok


def _results(fmt: CallFormat, text: str) -> list[str] | None:
    turn = tool_turn(text, ("<|eot_id|>",), fmt)
    return None if turn is None else [run_call(body, TOOLS, None).content for body in turn[1]]


@pytest.mark.parametrize(
    ("fmt", "text", "results"),
    [
        (
            HERMES,
            'Sum.</think>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
            ["3"],
        ),
        (
            LLAMA3_JSON,
            'Sum.</think><|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; '
            '{"name": "add", "parameters": {"a": 3, "b": 4}}<|eom_id|>',
            ["3", "7"],
        ),
        (LLAMA3_JSON, 'Sum.</think>\n{"name": "add", "arguments": {"a": 5, "b": 5}}<|eot_id|>', ["10"]),
        (
            MISTRAL,
            'Sum.</think>[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
            '{"name": "add", "arguments": {"a": 3, "b": 4}}]',
            ["3", "7"],
        ),
        (
            MISTRAL,
            'Sum.</think>[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}[TOOL_CALLS]add[ARGS]{"a": 3, "b": 4}',
            ["3", "7"],
        ),
        (PYTHONIC, "Sum.</think>[add(a=1, b=2), add(a=3, b=4)]<|eot_id|>", ["3", "7"]),
        (PYTHONIC, "Sum.</think><|python_start|>[add(b=2, a=40)]<|python_end|>", ["42"]),
        # not tool turns: the answer, text after the calls, a second </think>, another format's calls
        (LLAMA3_JSON, "Sum.</think><answer>3</answer>", None),
        (HERMES, 'Sum.</think><tool_call>{"name": "add"}</tool_call> and then', None),
        (MISTRAL, "Sum.</think>[TOOL_CALLS][]</think>", None),
        (MISTRAL, '</think><tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>', None),
        (HERMES, '</think>{"name": "add", "parameters": {"a": 1, "b": 2}}', None),
        (PYTHONIC, '</think>{"name": "add", "parameters": {"a": 1, "b": 2}}', None),
        (LLAMA3_JSON, "</think>[add(a=1, b=2)]", None),
    ],
)
def test_each_format_reads_its_calls_and_only_them(
    fmt: CallFormat, text: str, results: list[str] | None
) -> None:
    assert _results(fmt, text) == results


@pytest.mark.parametrize(
    ("fmt", "text", "error"),
    [
        (
            LLAMA3_JSON,
            'R.</think>{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "param',
            "json",
        ),
        (MISTRAL, 'R.</think>[TOOL_CALLS][{"name": "add", "arguments": {"a": 1', "json"),
        (MISTRAL, 'R.</think>[TOOL_CALLS]add[ARGS]{"a": 1', "arguments"),
        (MISTRAL, "R.</think>[TOOL_CALLS]add", "json"),
        (LLAMA3_JSON, 'R.</think>{"name": "sub", "parameters": {}}', "unknown_tool"),
        (PYTHONIC, "R.</think>[add(a=1", "json"),  # not Python
        (PYTHONIC, "R.</think>[add(1, 2)]", "arguments"),  # positional
        (PYTHONIC, "R.</think>[add(a=1, b=x + 1)]", "arguments"),  # computed
        (PYTHONIC, "R.</think>[add(a={1, 2}, b=2)]", "arguments"),  # a set: not JSON
        (PYTHONIC, "R.</think>[add(a=1, b=2), sub(a=1)]", "unknown_tool"),
        (PYTHONIC, "R.</think>[math.add(a=1, b=2)]", "json"),  # a method of something: no tool name
        (PYTHONIC, "R.</think>" + "[" * 200 + "]" * 200, "json"),  # nested past the parser's depth
    ],
)
def test_a_broken_call_in_any_format_is_an_error_message_and_a_penalty(
    fmt: CallFormat, text: str, error: str
) -> None:
    turn = tool_turn(text, (), fmt)
    assert turn is not None
    last = run_call(turn[1][-1], TOOLS, None)
    assert last.error == error and last.penalized and last.content.startswith("Error: ")


def test_auto_reads_the_format_off_real_templates(
    qwen_tokenizer, llama_tokenizer, pythonic_tokenizer, tokenizer
) -> None:
    from transformers.tokenization_mistral_common import MistralCommonBackend

    data = Path(importlib.util.find_spec("mistral_common").submodule_search_locations[0]) / "data"  # type: ignore[union-attr]
    mistral = MistralCommonBackend(tokenizer_path=str(data / "mistral_instruct_tokenizer_240323.model.v3"))
    assert call_format(qwen_tokenizer) is HERMES
    assert call_format(llama_tokenizer) is LLAMA3_JSON
    assert call_format(pythonic_tokenizer) is PYTHONIC
    llama_3_2 = copy.copy(pythonic_tokenizer)
    llama_3_2.chat_template = _trl_template("llama3_2")  # Meta's: JSON calls, and no <|python_tag|> in it
    assert call_format(llama_3_2) is LLAMA3_JSON
    assert call_format(mistral) is MISTRAL  # no jinja template: its [TOOL_CALLS] control token
    assert call_format(tokenizer, "mistral") is MISTRAL  # named: whatever the template
    with pytest.raises(ConfigError, match=r"it names none of hermes .*Fix: env.tool_format="):
        call_format(tokenizer)  # SmolLM2's template teaches no tool format


def test_llama_3_1_s_built_in_tools_are_calls_of_tools_by_their_names() -> None:
    """After <|python_tag|>, ``brave_search.call(query=…)`` calls the tool ``brave_search`` (as Meta's template
    names it), and any other code is the ``code_interpreter``'s."""
    search = 'Look.</think><|python_tag|>brave_search.call(query="weather in Menlo Park")<|eom_id|>'
    assert LLAMA3_JSON.turn(search) == (
        "Look.",
        ['{"name": "brave_search", "arguments": {"query": "weather in Menlo Park"}}'],
    )
    code = "Compute.</think><|python_tag|>import math\nprint(math.sqrt(2))<|eom_id|>"
    assert LLAMA3_JSON.turn(code) == (
        "Compute.",
        [json.dumps({"name": "code_interpreter", "arguments": {"code": "import math\nprint(math.sqrt(2))"}})],
    )
    assert LLAMA3_JSON.turn("Compute.</think>print(1)") is None  # code without the tag is no call


def test_a_format_ragen2_does_not_read_is_one_line_at_start_up() -> None:
    with pytest.raises(ConfigError, match=r"env.tool_format='xml'.*Fix: env.tool_format=auto"):
        EnvConfig(id="ragen2/SearchQA-v0", tools=["search"], tool_format="xml")


def _searchqa(tok, call: str) -> list:
    """The SearchQA episodes of scripted replies (``call``, then the answer) that succeeded through a search
    call, checked to have run it without error. The templates here write a tool result as JSON, so prompts
    cannot grow by appending ids: ``auto`` takes one sequence a turn."""
    runner = EpisodeRunner(
        partial(ragen2_envs.make, "ragen2/SearchQA-v0"),
        tok,
        AgentConfig(max_turns=5, max_actions_per_turn=1),
        SamplingParams(max_new_tokens=96),
        env_id="ragen2/SearchQA-v0",
        tools=Toolbox.from_specs(["search"], SearchQAEnv),
    )
    assert runner.layout == "per_turn"
    answer = "I know it.</think><answer>{oracle}</answer><|eot_id|>"
    sampler = Recorder(ScriptedSampler(tok, [call, answer]))
    episodes = runner.collect(sampler, seeds=[0, 1, 2], group_size=4, sample_seed=0)
    stats = RolloutStats.of(episodes)
    assert stats.tool_calls > 0 and stats.tool_errors == 0
    by_tools = [
        ep for ep in episodes if ep.success and len(ep.turns) > 1 and all(t.tool_calls for t in ep.turns[:-1])
    ]
    assert by_tools, "no episode succeeded through tool calls"
    for ep in by_tools:
        (searched,) = ep.turns[0].tool_calls
        assert searched.name == "search" and searched.error == "" and ep.turns[0].penalty == 0.0
        assert searched.content.startswith('Search results for "')
    return by_tools


def test_searchqa_succeeds_through_llama_json_calls(llama_tokenizer) -> None:
    """Scripted replies in Llama 3.1's format call ``search`` and then answer: the calls run, their results are
    the next prompt as the template renders tool messages (``ipython``), and the episodes succeed."""
    tok = llama_tokenizer
    call = (
        'Look it up.</think><|python_tag|>{"name": "search", "parameters": {"query": "{oracle}"}}<|eot_id|>'
    )
    for ep in _searchqa(tok, call):
        first, second = ep.turns[0], ep.turns[1]
        (searched,) = first.tool_calls
        # the next prompt: the call as the template writes an assistant turn (special tokens such as
        # <|python_tag|> left out, as Meta's template writes a JSON call), then the result as a tool message (JSON)
        rendered = tok.decode(second.prompt_ids)
        ipython = f"<|start_header_id|>ipython<|end_header_id|>\n\n{json.dumps(searched.content)}<|eot_id|>"
        written = assistant_message(tok, first.sampled_ids)["content"]
        assert written.endswith(
            '</think>{"name": "search", "parameters": {"query": "' + searched.arguments["query"] + '"}}'
        )
        assert f"<|start_header_id|>assistant<|end_header_id|>\n\n{written}<|eot_id|>{ipython}" in rendered
        assert rendered.endswith(ipython + "<|start_header_id|>assistant<|end_header_id|>\n\n<think>")


def test_searchqa_succeeds_through_pythonic_calls(pythonic_tokenizer) -> None:
    """Scripted replies in Llama 3.2's pythonic format, ``[search(query="…")]``, then the answer: the calls run,
    each result is the next prompt's ``ipython`` message as the template renders it, and the episodes succeed."""
    tok = pythonic_tokenizer
    for ep in _searchqa(tok, 'Look it up.</think>[search(query="{oracle}")]<|eot_id|>'):
        first, second = ep.turns[0], ep.turns[1]
        (searched,) = first.tool_calls
        written = assistant_message(tok, first.sampled_ids)["content"]
        assert written.endswith('</think>[search(query="' + searched.arguments["query"] + '")]')
        ipython = f"<|start_header_id|>ipython<|end_header_id|>\n\n{json.dumps(searched.content)}<|eot_id|>"
        assert f"{written}<|eot_id|>{ipython}" in tok.decode(second.prompt_ids)
