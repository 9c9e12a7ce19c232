"""Prompt rendering through the model's own chat template, growing the context by appending ids.

docs/method.md §2: turn t's prompt ids = turn t−1's prompt ids + the ids sampled in turn t−1 + the ids the
template adds to close that assistant turn + the rendered ids of the next user message (with the
assistant header and the forced ``<think>``). History is never re-rendered, so every prompt is an exact
prefix of the final training sequence. The two template fragments (the assistant-turn closer and the
user-turn wrapper) are found once, by rendering placeholders.

That is only the conversation the model's template would write when the template keeps history verbatim:
``template_fragments`` renders an assistant turn as the protocol writes it (``<think>…</think><answer>…
</answer>``) and refuses a template that changes it, renders it differently once a later turn follows, or
opens the assistant turn with other text than its generation prompt. Qwen2.5's, SmolLM2's and other
plain ChatML templates pass; Qwen3's do not (they move the last turn's reasoning into
``<think>\n…\n</think>\n\n`` and drop it from earlier turns).

Such a template gets one sequence per turn instead (``TurnRenderer``): each turn's prompt is the conversation so
far through the template, exactly as the model would be shown it, and the update trains each turn on its own
context (``Turn.offset``: the turns' sequences packed one after another in the episode's row, each run alone by
``ragen2.models.forward.decoder_hidden``). ``rollout.layout`` chooses (``renderer_for``): ``sequence``,
``per_turn``, or ``auto`` (the default: ``sequence`` where the template keeps history verbatim, else
``per_turn``), checked when an ``EpisodeRunner`` is built, before the first rollout (in training, before the
model loads), and logged.

With tools (``env.tools``, ``ragen2.agent.tools``) every rendering passes the tools' JSON schemas to the
template (``apply_chat_template(tools=…)``), and a tool turn's results are appended inside the template's
tool-message wrapper, found like the user wrapper by rendering placeholders (``tool_fragments``); a template
that cannot be split that way takes ``per_turn`` under ``auto``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ragen2.errors import ConfigError
from ragen2.log import log

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_ASSISTANT = "\x00ASSISTANT\x00"
_USER = "\x00USER\x00"
# an assistant turn as the protocol writes it: the forced <think> (in the prompt), then the sampled text
_REPLY = f"{THINK_OPEN}\x00REASONING\x00{THINK_CLOSE}{ANSWER_OPEN}{_ASSISTANT}{ANSWER_CLOSE}"
# a tool turn as the policy writes it in Qwen2.5's format (a template renders any format's content as written),
# and two tool results
_TOOL_REPLY = f"{THINK_OPEN}\x00REASONING\x00{THINK_CLOSE}\n<tool_call>\n\x00CALL\x00\n</tool_call>"
_RESULTS = ("\x00RESULT1\x00", "\x00RESULT2\x00")

Tools = Sequence[dict[str, Any]] | None  # JSON schemas for ``apply_chat_template(tools=…)``; None: text mode


@dataclass(frozen=True)
class TemplateFragments:
    closer: str  # text the template puts after an assistant message's content (e.g. "<|im_end|>\n")
    user_prefix: str  # text before a (non-first) user message's content
    user_suffix: str  # text after it, through the assistant generation header


class _Render(Protocol):
    def __call__(self, messages: list[dict[str, str]], gen: bool) -> str: ...


def _renderer(tokenizer: Any, tools: Tools) -> _Render:
    """``render(messages, gen)``: the template's text, with the tools' schemas where there are tools."""
    extra = {} if tools is None else {"tools": list(tools)}

    def render(messages: list[dict[str, str]], gen: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **extra)

    return render


def template_fragments(tokenizer: Any, system_prompt: str, tools: Tools = None) -> TemplateFragments:
    """Split the chat template into the pieces appended between turns; a ``ConfigError`` naming the model
    when the template does not keep history verbatim (the module's docstring)."""
    render = _renderer(tokenizer, tools)

    head = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "u"}]
    reply = {"role": "assistant", "content": _REPLY}
    with_assistant = render([*head, reply], gen=False)
    with_user = render([*head, reply, {"role": "user", "content": _USER}], gen=True)
    cut = with_assistant.find(_REPLY)
    if cut < 0:
        why = "it rewrites an assistant turn's <think>…</think><answer>…</answer> text"
    elif not with_user.startswith(with_assistant) or _USER not in with_user[len(with_assistant) :]:
        why = "a later turn changes how it renders the earlier ones"
    elif with_assistant[:cut] != render(head, gen=True):
        why = "it opens an assistant turn with other text than its generation prompt"
    else:
        closer = with_assistant[cut + len(_REPLY) :]
        user_prefix, user_suffix = with_user[len(with_assistant) :].split(_USER)
        return TemplateFragments(closer=closer, user_prefix=user_prefix, user_suffix=user_suffix)
    raise ConfigError(
        f"model.name_or_path={model_name(tokenizer)!r}: its chat template does not keep history verbatim ({why}), so "
        "prompts cannot grow by appending the sampled ids (rollout.layout=sequence, docs/method.md §2); "
        "Qwen3's templates drop earlier <think> blocks. Fix: rollout.layout=per_turn (or auto: one sequence "
        "per turn), or a model whose template keeps every turn as written (Qwen2.5-Instruct, SmolLM2, ChatML)"
    )


def model_name(tokenizer: Any) -> str:
    """The model a tokenizer came from, for messages: its folder or name, else its class."""
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


@dataclass(frozen=True)
class ToolFragments:
    prefix: str  # text before the first of a turn's tool results (e.g. "<|im_start|>user\n<tool_response>\n")
    separator: str  # text between two results of one turn
    suffix: str  # text after the last, through the assistant generation header


def tool_fragments(tokenizer: Any, system_prompt: str, tools: Tools) -> ToolFragments:
    """Split the chat template's tool-message wrapper, by rendering a tool turn followed by one and by two
    placeholder results; a ``ConfigError`` when it does not render them verbatim after the turn as written."""
    render = _renderer(tokenizer, tools)
    head = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "u"}]
    turn = [*head, {"role": "assistant", "content": _TOOL_REPLY}]
    base = render(turn, gen=False)
    one, two = (
        render([*turn, *({"role": "tool", "content": r} for r in results)], gen=True)
        for results in (_RESULTS[:1], _RESULTS)
    )
    first, second = _RESULTS
    tail_one, tail_two = one[len(base) :], two[len(base) :]
    if _TOOL_REPLY in base and one.startswith(base) and two.startswith(base) and tail_one.count(first) == 1:
        prefix, suffix = tail_one.split(first)
        middle = tail_two.removeprefix(prefix + first).removesuffix(second + suffix)
        if tail_two == prefix + first + middle + second + suffix:
            return ToolFragments(prefix=prefix, separator=middle, suffix=suffix)
    raise ConfigError(
        f"model.name_or_path={model_name(tokenizer)!r}: its chat template does not append tool results after a "
        "tool call as written, so prompts cannot grow by appending ids (rollout.layout=sequence). Fix: "
        "rollout.layout=per_turn (or auto)"
    )


def check_tool_template(tokenizer: Any, tools: Tools) -> None:
    """Refuse, at start-up, tools under a chat template that has no tool format: one that renders the same
    prompt with and without the tools' schemas, or leaves a tool message's content out."""
    if not tools:
        return
    head = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    plain = tokenizer.apply_chat_template(head, tokenize=False, add_generation_prompt=True)
    render = _renderer(tokenizer, tools)
    answered = [*head, {"role": "assistant", "content": "a"}, {"role": "tool", "content": _RESULTS[0]}]
    # a template may write the result as JSON (Llama 3.1's does): escaped, the placeholder's NULs read \u0000
    written = render(answered, gen=True)
    if render(head, gen=True) == plain or not any(
        r in written for r in (_RESULTS[0], json.dumps(_RESULTS[0])[1:-1])
    ):
        raise ConfigError(
            f"model.name_or_path={model_name(tokenizer)!r}: its chat template has no tool format (it renders no "
            "tool schemas or no tool results), so env.tools cannot be shown to the policy. Fix: a model whose "
            "template renders tools (model=tiny_qwen2, Qwen2.5-Instruct), or env.tools=[] (text actions)"
        )


#: a task-vocabulary tokenizer's ``tokenizer_config.json`` key naming the env ids whose text its words cover
ENVS_KEY = "ragen2_envs"


def check_vocabulary(tokenizer: Any, env_id: str) -> None:
    """Refuse, at start-up, a tokenizer whose vocabulary covers only other envs' text (``ENVS_KEY``): every
    prompt of ``env_id`` would be unknown words."""
    envs = getattr(tokenizer, "init_kwargs", {}).get(ENVS_KEY)
    if envs is not None and env_id and env_id not in envs:
        model = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise ConfigError(
            f"model.name_or_path={model!r} has a task vocabulary that covers only {', '.join(envs)}, not "
            f"env.id={env_id!r}: its prompts would read as unknown words. Fix: env=twohop with model=organism, or "
            "a model with a general tokenizer for this env (model=builtin)"
        )


LAYOUTS = ("auto", "sequence", "per_turn")


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ConfigError(
            f"rollout.layout={layout!r} is not a layout. Fix: rollout.layout=auto (or one of {', '.join(LAYOUTS)})"
        )


def check_chat_template(tokenizer: Any, layout: str = "sequence", tools: Tools = None) -> str:
    """What ``rollout.layout`` comes to under ``tokenizer``'s template, ``sequence`` or ``per_turn``, checked
    and logged at start-up: ``sequence`` refuses a template under which prompts cannot grow by appending
    ids (with ``tools``: nor by appending tool results), ``auto`` takes ``per_turn`` for it."""
    check_layout(layout)
    chosen, why = layout, "as set"
    if layout != "per_turn":
        try:
            template_fragments(tokenizer, "You are an agent.", tools)
            if tools:
                tool_fragments(tokenizer, "You are an agent.", tools)
            chosen, why = "sequence", "its chat template keeps history verbatim: one sequence per episode"
        except ConfigError:
            if layout == "sequence":
                raise
            chosen, why = "per_turn", "its chat template rewrites earlier turns: one sequence per turn"
    log.info("rollout.layout=%s for %s (%s)", chosen, model_name(tokenizer), why)
    return chosen


def thinking_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of a rendered prompt ``text`` through the forced ``<think>`` (not doubled where the template
    already opens it, as some reasoning models' generation prompts do)."""
    forced = text if text.rstrip().endswith(THINK_OPEN) else text + THINK_OPEN
    return list(tokenizer.encode(forced, add_special_tokens=False))


def turn_one_ids(tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Tools = None) -> list[int]:
    """Turn 1's prompt ids (X): ``messages`` through the chat template with its generation prompt, then the
    forced ``<think>``. Other trainers' rollouts are read with it too (``ragen2.diagnostics.readers``)."""
    text = _renderer(tokenizer, tools)(list(messages), gen=True)
    return thinking_ids(tokenizer, text)


Message = dict[str, str]


def assistant_message(tokenizer: Any, sampled_ids: Sequence[int]) -> Message:
    """A sampled reply as the chat message a template renders: the forced ``<think>`` and the sampled text,
    special tokens (the EOS that closed it) left out."""
    text = tokenizer.decode(list(sampled_ids), skip_special_tokens=True)
    return {"role": "assistant", "content": THINK_OPEN + text}


class TurnRenderer:
    """Each turn's prompt rendered anew from the conversation, as the template writes it (it may drop or move
    earlier turns' reasoning): one training sequence per turn (``rollout.layout=per_turn``)."""

    #: whether each turn's prompt is rendered anew rather than grown by appending (``Turn.offset``)
    rewrites = True

    def __init__(self, tokenizer: Any, system_prompt: str, tools: Tools = None) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.tools = tools

    def first_prompt(self, user_text: str) -> list[int]:
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": user_text},
        ]
        return turn_one_ids(self.tokenizer, messages, self.tools)

    def next_prompt(
        self, prompt_ids: Sequence[int], sampled_ids: Sequence[int], messages: Sequence[Message]
    ) -> list[int]:
        """The next turn's prompt ids, after ``prompt_ids`` and the ``sampled_ids`` answering them;
        ``messages``: the conversation so far, ending with the next user message or the tool results."""
        return turn_one_ids(self.tokenizer, messages, self.tools)


class ChatRenderer(TurnRenderer):
    """Prompts that grow by appending ids: one training sequence per episode (``rollout.layout=sequence``)."""

    rewrites = False

    def __init__(self, tokenizer: Any, system_prompt: str, tools: Tools = None) -> None:
        super().__init__(tokenizer, system_prompt, tools)
        self.fragments = template_fragments(tokenizer, system_prompt, tools)
        self.tool_fragments = tool_fragments(tokenizer, system_prompt, tools) if tools else None
        closer_ids = self._encode(self.fragments.closer)
        eos = tokenizer.eos_token_id
        # A sampled EOS already closes the turn in ChatML-like templates: skip the closer's copy of it.
        self._closer_ids = closer_ids
        self._closer_after_eos = closer_ids[1:] if closer_ids[:1] == [eos] else closer_ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def next_prompt(
        self, prompt_ids: Sequence[int], sampled_ids: Sequence[int], messages: Sequence[Message]
    ) -> list[int]:
        ended_with_eos = len(sampled_ids) > 0 and sampled_ids[-1] == self.tokenizer.eos_token_id
        closer = self._closer_after_eos if ended_with_eos else self._closer_ids
        return [*prompt_ids, *sampled_ids, *closer, *self._encode(self._wrapped(messages) + THINK_OPEN)]

    def _wrapped(self, messages: Sequence[Message]) -> str:
        """The messages after the last assistant turn (one user message, or that turn's tool results) inside
        the template's wrapper, through the assistant generation header."""
        results = []
        for m in reversed(messages):
            if m["role"] != "tool":
                break
            results.insert(0, m["content"])
        if results and self.tool_fragments is not None:
            t = self.tool_fragments
            return t.prefix + t.separator.join(results) + t.suffix
        f = self.fragments
        return f.user_prefix + messages[-1]["content"] + f.user_suffix


def renderer_for(tokenizer: Any, system_prompt: str, layout: str, tools: Tools = None) -> TurnRenderer:
    """The renderer of a layout ``check_chat_template`` settled (``sequence`` or ``per_turn``)."""
    return (TurnRenderer if layout == "per_turn" else ChatRenderer)(tokenizer, system_prompt, tools)
