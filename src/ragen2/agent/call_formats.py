"""The function-call formats a policy writes its tool calls in (``env.tool_format``, docs/tools.md).

A tool turn is the reasoning, ``</think>``, then only calls, in the format the model's chat template teaches:

- ``hermes``: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes);
- ``llama3_json``: JSON objects ``{"name": …, "parameters": {…}}``, after an optional ``<|python_tag|>``,
  separated by ``;`` (Llama 3.1, 3.2 and 3.3's custom tools, as vLLM's ``llama3_json`` parser reads them); after
  ``<|python_tag|>``, Llama 3.1's built-in tools too: ``brave_search.call(query="…")`` is a call of the tool
  ``brave_search`` (``wolfram_alpha`` alike), and any other code is a call of ``code_interpreter`` with that
  ``code``;
- ``pythonic``: a Python list of calls with keyword arguments, ``[f(a=1, b="x"), g()]``, optionally between
  ``<|python_start|>`` and ``<|python_end|>`` (Llama 3.2's and Llama 4's pythonic templates, Gemma 3's and
  the Berkeley function-calling format: vLLM's ``pythonic`` parser);
- ``mistral``: ``[TOOL_CALLS]`` then a JSON list of ``{"name": …, "arguments": {…}}`` (tokenizers v3 to v7),
  or ``[TOOL_CALLS]name[ARGS]{…}`` once per call (v11 and later).

Each format splits a turn's calls into one JSON text per call, ``{"name": …, "arguments": …}`` (Llama's
``parameters`` is read as ``arguments``; a Python call's keyword arguments, literals only); a call that is not
JSON (or not such a Python call) stays its own text, and
``ragen2.agent.tools.parse_call`` answers it with an error message and a format penalty, as any bad call.
``auto`` reads the format off the chat template (or, for a tokenizer without one, its special tokens).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ragen2.agent.render import THINK_CLOSE, model_name
from ragen2.errors import ConfigError

AUTO = "auto"
PYTHON_TAG = "<|python_tag|>"
EOM = "<|eom_id|>"  # Llama's end of a tool-calling message, when it is not the tokenizer's eos
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"  # Llama 4's code span
CODE_INTERPRETER = "code_interpreter"  # Llama 3.1's built-in tool for the code after <|python_tag|>
TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_TURN = re.compile(r"(?:<tool_call>.*?</tool_call>\s*)+", re.DOTALL)
_DECODER = json.JSONDecoder()


def _hermes(calls: str) -> list[str] | None:
    if not _HERMES_TURN.fullmatch(calls):
        return None
    return [body.strip() for body in _HERMES_CALL.findall(calls)]


def _json_objects(text: str, separator: str) -> list[str]:
    """Each JSON value of ``text`` (values separated by ``separator`` and whitespace) as its own text; what
    does not decode is one last text, for its call to fail as not JSON."""
    bodies, at = [], 0
    while at < len(text):
        try:
            value, end = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            return [*bodies, text[at:].strip()]
        bodies.append(json.dumps(value))
        at = end
        while at < len(text) and (text[at].isspace() or text[at] == separator):
            at += 1
    return bodies


def _python_call(node: ast.expr, source: str) -> str:
    """A Python call ``f(a=1)`` (or a built-in tool's ``f.call(a=1)``) with literal keyword arguments as a JSON
    call; anything else as its source text, for its call to fail as not JSON, or as arguments that are not an
    object (positional or computed arguments)."""
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Attribute) and func.attr == "call":  # Llama 3.1's brave_search.call(query=…)
        func = func.value
    if not isinstance(node, ast.Call) or not isinstance(func, ast.Name):
        return ast.get_source_segment(source, node) or source
    try:
        if node.args or any(k.arg is None for k in node.keywords):
            raise ValueError("positional arguments")
        return json.dumps(
            {"name": func.id, "arguments": {k.arg: ast.literal_eval(k.value) for k in node.keywords}}
        )
    # positional, computed or not JSON (a set, bytes): the policy is told to write the arguments as an object
    except (ValueError, TypeError, RecursionError, MemoryError):
        return json.dumps({"name": func.id, "arguments": ast.get_source_segment(source, node) or source})


def _python_calls(text: str) -> list[str] | None:
    """Each call of a Python list of calls, or of a single call, as ``_python_call`` writes it; None when
    ``text`` is not a Python expression of that shape."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a null byte
        return None
    if isinstance(tree, ast.List):
        return [_python_call(node, text) for node in tree.elts]
    return [_python_call(tree, text)] if isinstance(tree, ast.Call) else None


def _llama3_json(calls: str) -> list[str] | None:
    tagged = calls.startswith(PYTHON_TAG)
    calls = calls.removeprefix(PYTHON_TAG).removesuffix(EOM).strip()
    if calls.startswith("{"):
        return _json_objects(calls, ";")
    if not tagged:
        return None
    # Llama 3.1's built-in tools: brave_search.call(query="…"); any other code is the code interpreter's
    try:
        tree: ast.expr | None = ast.parse(calls, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        tree = None
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and tree.func.attr == "call":
        return [_python_call(tree, calls)]
    return [json.dumps({"name": CODE_INTERPRETER, "arguments": {"code": calls}})]


def _pythonic(calls: str) -> list[str] | None:
    calls = calls.removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
    if not calls.startswith("["):
        return None
    bodies = _python_calls(calls)
    return [calls] if bodies is None else bodies  # not Python: one call that fails as not JSON


def _mistral(calls: str) -> list[str] | None:
    if not calls.startswith(TOOL_CALLS):
        return None
    rest = calls.removeprefix(TOOL_CALLS).strip()
    if rest.startswith("["):  # v3 to v7: one JSON list
        try:
            value, end = _DECODER.raw_decode(rest)
        except json.JSONDecodeError:
            return [rest]
        if not isinstance(value, list) or rest[end:].strip():
            return [rest]
        return [json.dumps(v) for v in value]
    bodies = []  # v11+: name[ARGS]{…}, each call after its own [TOOL_CALLS]
    for part in rest.split(TOOL_CALLS):
        name, found, arguments = part.strip().partition(ARGS)
        # the arguments' text as a JSON string: parse_call decodes it, or answers that it is no JSON object
        bodies.append(
            json.dumps({"name": name.strip(), "arguments": arguments.strip()}) if found else part.strip()
        )
    return bodies


@dataclass(frozen=True)
class CallFormat:
    """A function-call format: how a tool turn's calls are written after ``</think>``."""

    name: str
    mark: str  # text in a chat template (or a special token) that says the template teaches it
    # a turn's calls -> each call's text; None: not this format's calls
    split: Callable[[str], list[str] | None]

    def turn(self, text: str) -> tuple[str, list[str]] | None:
        """The reasoning and each call's text of a tool turn, or None when ``text`` is not one (an
        ``<answer>`` turn, or a bad format: ``ragen2.agent.parsing``)."""
        think, closed, calls = text.partition(THINK_CLOSE)
        if not closed or THINK_CLOSE in calls:
            return None
        bodies = self.split(calls.strip())
        return None if not bodies else (think, bodies)


HERMES = CallFormat("hermes", "<tool_call>", _hermes)
# Meta's Llama 3.1–3.3 templates teach the JSON calls in this sentence (3.2's never names <|python_tag|>)
LLAMA3_JSON = CallFormat(
    "llama3_json", '"parameters": dictionary of argument name and its value', _llama3_json
)
MISTRAL = CallFormat("mistral", TOOL_CALLS, _mistral)
# the pythonic templates' instruction: "Respond in the format [func_name1(params_name1=params_value1, …)]"
PYTHONIC = CallFormat("pythonic", "[func_name1(", _pythonic)
FORMATS: Mapping[str, CallFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, PYTHONIC)}


def check_format_name(name: str) -> None:
    if name != AUTO and name not in FORMATS:
        raise ConfigError(
            f"env.tool_format={name!r} is not a function-call format ragen2 reads. "
            f"Fix: env.tool_format=auto (read off the chat template) or one of {', '.join(FORMATS)}"
        )


def _template_text(tokenizer: Any) -> str:
    """The chat template's text (every named template of a dict), and the special tokens' names."""
    template = getattr(tokenizer, "chat_template", None) or ""
    texts = list(template.values()) if isinstance(template, dict) else [str(template)]
    return "\n".join([*texts, *map(str, getattr(tokenizer, "all_special_tokens", ()) or ())])


def call_format(tokenizer: Any, name: str = AUTO) -> CallFormat:
    """The format ``env.tool_format`` names; ``auto``: the one the chat template teaches, or a
    ``ConfigError`` that names the model and the fix when it teaches none ragen2 reads, or several."""
    check_format_name(name)
    if name != AUTO:
        return FORMATS[name]
    text = _template_text(tokenizer)
    found = [f for f in FORMATS.values() if f.mark in text]
    if len(found) == 1:
        return found[0]
    why = "names several" if found else "names none"
    raise ConfigError(
        f"model.name_or_path={model_name(tokenizer)!r}: env.tool_format=auto reads the function-call format off the chat "
        f"template, and it {why} of {', '.join(f'{f.name} ({f.mark})' for f in FORMATS.values())}. "
        "Fix: env.tool_format=<the format the model writes>"
    )
