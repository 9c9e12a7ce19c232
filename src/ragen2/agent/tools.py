"""Tool-calling turns (``env.tools``, docs/tools.md): the policy acts through its chat template's function calls.

A tool turn is the reasoning, ``</think>``, then one or more calls in the format the chat template teaches
(``env.tool_format``, ``ragen2.agent.call_formats``: Qwen's and Hermes' ``<tool_call>{"name": …, "arguments":
{…}}</tool_call>`` blocks, Llama 3's JSON, Mistral's ``[TOOL_CALLS]``); the template renders the tools' JSON
schemas into the prompt and each result as a ``{"role": "tool"}`` message. Each call runs, and the results are the next
turn's prompt (prompt ids, never trained on). A tool answers with text, and the env does not move; or with an
``EnvStep`` (the text, and gymnasium's reward, terminated, truncated and info): the tool moved the env, as an
environment that acts through tools does (an MCP server's game, a verifiers tool env), and the turn takes its
reward, success and end as a text turn takes its actions'. A call that ends the episode is the turn's last: the
calls after it do not run. A turn that writes ``<answer>…</answer>`` instead acts on the env as in text mode.

Tools come from ``env.tools``, a list of specs resolved at start-up (``Toolbox``):

- ``<name>``: a tool of the env (a method it lists in ``tool_names``), bound to each episode's own env;
- ``*``: every tool of the env: those it lists in ``tool_names``, or, for an env whose tools live on a server it
  talks to (OpenEnv's MCP environments), those its ``list_tools()`` lists at start-up, each called through its
  ``call_tool(name, **arguments)``;
- ``<module>:<function>``: a Python function (type hints and a Google-style docstring give its JSON schema,
  as ``transformers.utils.get_json_schema`` reads them);
- ``mcp:<command>``: every tool of an MCP server started locally over stdio (``ragen2.agent.mcp``).

Bad model output is never a crash: a call that is not JSON, names no known tool, or whose arguments do not
match the schema, and a tool that raises, answers with an error message to the policy and costs the turn one
format penalty; a tool that overruns ``env.step_timeout_s`` answers with an error message and no penalty, and an
``EnvStep`` whose reward is not a finite number counts as 0 with no penalty (the fault is the tool's). Each call
counts in ``rollout/tool_calls``, each failure in ``rollout/tool_errors``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ragen2_envs.base import EnvStep

from ragen2.agent.call_formats import HERMES, CallFormat
from ragen2.agent.timeout import EnvTimeout, call_with_timeout
from ragen2.errors import ConfigError
from ragen2.log import log

MCP_PREFIX = "mcp:"
EVERY = "*"  # every tool of the env
#: ``ToolCall.error`` of a call past ``env.step_timeout_s``, and of an ``EnvStep`` whose reward is not a finite
#: number: the tool's fault, not the policy's
TIMEOUT = "timeout"
BAD_REWARD = "reward"

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


@dataclass(frozen=True)
class Tool:
    name: str
    schema: dict[
        str, Any
    ]  # OpenAI-style: {"type": "function", "function": {"name", "description", "parameters"}}
    call: Callable[..., Any]

    @property
    def parameters(self) -> dict[str, Any]:
        return self.schema["function"].get("parameters") or {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolCall:
    """One call as the policy wrote it, the tool message that answered it, and the env's step when the tool
    moved the env."""

    name: str  # "" when the call did not parse
    arguments: dict[str, Any] | None  # None when they did not parse
    content: str  # the tool message's text
    # "" for a call that ran; else json | unknown_tool | arguments | raised | timeout | reward
    error: str = ""
    step: EnvStep | None = None  # None: the env did not move

    @property
    def penalized(self) -> bool:
        return bool(self.error) and self.error not in (TIMEOUT, BAD_REWARD)

    def as_record(self) -> dict[str, Any]:
        """The call as a rollouts file keeps it (JSON: the step's numbers, not its info)."""
        record = {
            "name": self.name,
            "arguments": self.arguments,
            "content": self.content,
            "error": self.error,
        }
        if self.step is not None:
            record |= {
                "reward": self.step.reward,
                "terminated": self.step.terminated,
                "truncated": self.step.truncated,
            }
        return record


def function_tool(fn: Callable[..., Any], where: str) -> Tool:
    """``fn`` as a tool, its schema read from its type hints and docstring; a ``ConfigError`` naming ``where``
    (the config key) when they do not give one."""
    from transformers.utils.chat_template_utils import get_json_schema

    try:
        schema = get_json_schema(fn)
    except Exception as err:  # transformers raises its own parsing exceptions, and TypeError on odd hints
        raise ConfigError(
            f"{where}: {getattr(fn, '__name__', fn)!r} gives no tool schema ({err}). Fix: type-hint every "
            "argument and document each under 'Args:' in a Google-style docstring"
        ) from None
    return Tool(name=schema["function"]["name"], schema=schema, call=fn)


def tool_turn(
    text: str, strip_tokens: Sequence[str] = (), call_format: CallFormat = HERMES
) -> tuple[str, list[str]] | None:
    """The reasoning and each call's text of a tool turn in ``call_format``, or None when ``text`` is not a
    tool turn (an ``<answer>`` turn, or a bad format: ``ragen2.agent.parsing``)."""
    for tok in strip_tokens:
        text = text.replace(tok, "")
    return call_format.turn(text)


def argument_error(parameters: Mapping[str, Any], arguments: Mapping[str, Any]) -> str:
    """Why ``arguments`` do not match a JSON-schema ``parameters`` object ("" when they do): required keys,
    unknown keys and the JSON type of each."""
    properties = parameters.get("properties", {})
    missing = [k for k in parameters.get("required", ()) if k not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(missing)}"
    for key, value in arguments.items():
        if key not in properties:
            return f"unknown argument {key!r} (expected: {', '.join(properties) or 'none'})"
        kind = properties[key].get("type")
        kinds = kind if isinstance(kind, list) else [kind] if kind else []
        if kinds and not any(_is_json(value, k) for k in kinds):
            return f"argument {key!r} must be {' or '.join(kinds)}, not {json.dumps(value)}"
    return ""


def _is_json(value: Any, kind: str) -> bool:
    if isinstance(value, bool) != (kind == "boolean"):  # JSON's true is no number, Python's is
        return False
    return isinstance(value, _JSON_TYPES.get(kind, object))


def parse_call(body: str, tools: Mapping[str, Tool]) -> tuple[Tool, dict[str, Any]] | ToolCall:
    """The tool and arguments a call's text names, or the failed ``ToolCall`` saying why not."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as err:
        return ToolCall("", None, f"Error: the tool call is not valid JSON ({err}).", "json")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        shape = 'Write {"name": <tool name>, "arguments": {…}}.'
        return ToolCall("", None, f"Error: the tool call names no tool. {shape}", "json")
    name, arguments = call["name"], call.get("arguments", call.get("parameters", {}))  # Llama 3: parameters
    if isinstance(arguments, str):  # OpenAI's wire format sends the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    tool = tools.get(name)
    if tool is None:
        known = ", ".join(tools)
        return ToolCall(name, None, f"Error: there is no tool {name!r}. Tools: {known}.", "unknown_tool")
    if not isinstance(arguments, dict):
        return ToolCall(name, None, f"Error: {name}'s arguments must be a JSON object.", "arguments")
    problem = argument_error(tool.parameters, arguments)
    if problem:
        return ToolCall(name, arguments, f"Error: {name}: {problem}.", "arguments")
    return tool, arguments


def run_call(body: str, tools: Mapping[str, Tool], timeout_s: float | None) -> ToolCall:
    """One call's text run: its result, or an error message for the policy (never a raise)."""
    parsed = parse_call(body, tools)
    if isinstance(parsed, ToolCall):
        return parsed
    tool, arguments = parsed
    try:
        result = call_with_timeout(tool.call, timeout_s, **arguments)
    except EnvTimeout:
        log.warning(
            "tool %s(%s) did not return within env.step_timeout_s=%g s; the policy is told so (rollout/tool_errors)",
            tool.name,
            json.dumps(arguments)[:200],
            timeout_s,
        )
        return ToolCall(tool.name, arguments, f"Error: {tool.name} did not return in time.", TIMEOUT)
    except Exception as err:  # a tool is arbitrary code: what it raises goes back to the policy
        log.warning("tool %s raised %s: %s (rollout/tool_errors)", tool.name, type(err).__name__, err)
        return ToolCall(
            tool.name, arguments, f"Error: {tool.name} raised {type(err).__name__}: {err}", "raised"
        )
    if isinstance(result, EnvStep):
        return _moved(tool.name, arguments, result)
    content = result if isinstance(result, str) else json.dumps(result, default=str)
    return ToolCall(tool.name, arguments, content)


def _moved(name: str, arguments: dict[str, Any], step: EnvStep) -> ToolCall:
    """A call whose tool moved the env; a reward that is not a finite number counts as 0 and is a tool error."""
    content = step.content if isinstance(step.content, str) else str(step.content)
    try:
        reward = float(step.reward)
    except (TypeError, ValueError):
        reward = math.nan
    if math.isfinite(reward):
        return ToolCall(name, arguments, content, step=replace(step, content=content, reward=reward))
    log.warning("tool %s's env step gave reward %r; counted as 0 (rollout/tool_errors)", name, step.reward)
    return ToolCall(name, arguments, content, BAD_REWARD, replace(step, content=content, reward=0.0))


@dataclass
class Toolbox:
    """A run's tools, from ``env.tools``: function and MCP tools shared by every episode, env tools bound to
    each episode's env (``bind``)."""

    shared: list[Tool] = field(default_factory=list)
    env_tools: list[str] = field(default_factory=list)  # names of the env's tools
    env_schemas: list[dict[str, Any]] = field(default_factory=list)
    listed: set[str] = field(default_factory=set)  # the env's tools called through its call_tool

    @classmethod
    def from_specs(
        cls, specs: Sequence[str], env_class: type, make_env: Callable[[], Any] | None = None
    ) -> Toolbox:
        """Resolve ``env.tools`` (``check_specs`` first), starting the MCP servers it names; ``make_env`` makes the
        env whose ``list_tools`` a ``*`` asks."""
        box = cls()
        for n, spec in enumerate(check_specs(specs, env_class)):
            where = f"env.tools[{n}]={spec!r}"
            if spec == EVERY and hasattr(env_class, "list_tools"):
                schemas = _listed(env_class, make_env, where)
                box.env_tools += [s["function"]["name"] for s in schemas]
                box.env_schemas += schemas
                box.listed.update(box.env_tools[-len(schemas) :])
            elif spec.startswith(MCP_PREFIX):
                from ragen2.agent.mcp import McpSession

                server = McpSession(spec[len(MCP_PREFIX) :].strip(), where)
                box.shared += [
                    Tool(s["function"]["name"], s, server.caller(s["function"]["name"]))
                    for s in server.schemas()
                ]
            elif ":" in spec:
                box.shared.append(function_tool(_import(spec, where), where))
            else:  # one of the env's tool_names, or (*) every one
                names = list(env_class.tool_names) if spec == EVERY else [spec]
                box.env_tools += names
                box.env_schemas += [function_tool(getattr(env_class, t), where).schema for t in names]
        names = [t.name for t in box.shared] + box.env_tools
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(
                f"env.tools={list(specs)} gives two tools the name {', '.join(twice)}. Fix: list each tool once"
            )
        return box

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools' JSON schemas, in ``env.tools`` order of kinds (what ``apply_chat_template(tools=…)`` renders)."""
        return [*self.env_schemas, *(t.schema for t in self.shared)]

    def bind(self, env: Any) -> dict[str, Tool]:
        """Every tool by name, the env's own calling ``env``: its methods, or its ``call_tool`` for the tools it
        listed."""
        own = {
            name: Tool(
                name, schema, partial(env.call_tool, name) if name in self.listed else getattr(env, name)
            )
            for name, schema in zip(self.env_tools, self.env_schemas, strict=True)
        }
        return {**own, **{t.name: t for t in self.shared}}


def _listed(env_class: type, make_env: Callable[[], Any] | None, where: str) -> list[dict[str, Any]]:
    """The tools an env of ``env_class`` lists (``list_tools``), asked of one env made for it."""
    if make_env is None:
        raise ConfigError(
            f"{where}: {env_class.__name__} lists its tools at run time, and no env was made to ask"
        )
    env = make_env()
    try:
        return env.list_tools()
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    finally:
        env.close()


def check_specs(specs: Sequence[str], env_class: type) -> list[str]:
    """``env.tools`` checked without starting anything: each spec a tool ``env_class`` lists in ``tool_names``,
    ``*`` for an env that has tools, an importable ``module:function`` or an ``mcp:<command>``; a ``ConfigError``
    naming the key and the fix."""
    own = tuple(getattr(env_class, "tool_names", ()))
    checked = []
    for n, spec in enumerate(specs):
        where = f"env.tools[{n}]={spec!r}"
        if not isinstance(spec, str) or not spec.strip():
            raise ConfigError(
                f"{where} is not a tool spec. Fix: a tool name, module:function or mcp:<command>"
            )
        spec = spec.strip()
        if spec == EVERY:
            if not own and not hasattr(env_class, "list_tools"):
                raise ConfigError(
                    f"{where}: {env_class.__name__} has no tools (no tool_names, no list_tools). Fix: a "
                    "module:function path or mcp:<command>, or leave env.tools empty (docs/tools.md)"
                )
        elif spec.startswith(MCP_PREFIX):
            if not spec[len(MCP_PREFIX) :].strip():
                raise ConfigError(f"{where} names no command. Fix: e.g. 'mcp:python -m my_server'")
        elif ":" in spec:
            _import(spec, where)
        elif spec not in own:
            offer = f"its tools: {', '.join(own)}" if own else "it has none"
            raise ConfigError(
                f"{where} is not a tool of {env_class.__name__} ({offer}). Fix: one of its tools, a "
                "module:function path, or mcp:<command> (docs/tools.md)"
            )
        checked.append(spec)
    return checked


def _import(spec: str, where: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"{where} does not import ({type(err).__name__}: {err}). Fix: an importable module:function path "
            "(the module on PYTHONPATH or installed)"
        ) from None
    if not callable(fn):
        raise ConfigError(f"{where} is not a function. Fix: a module:function path to a callable")
    return fn
