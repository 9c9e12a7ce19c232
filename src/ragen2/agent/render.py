"""Prompt rendering through the model's own chat template, growing the context by appending ids.

docs/method.md §2: turn t's prompt ids = turn t−1's prompt ids + the ids sampled in turn t−1 + the ids the
template adds to close that assistant turn + the rendered ids of the next user message (with the
assistant header and the forced ``<think>``). History is never re-rendered, so every prompt is an exact
prefix of the final training sequence. The two template fragments (the assistant-turn closer and the
user-turn wrapper) are found once, by rendering placeholders.

That is only the conversation the model's template would write when the template keeps history verbatim:
``template_fragments`` renders an assistant turn as the protocol writes it (``<think>…</think><answer>…
</answer>``) and refuses a template that changes it, renders it differently once a later turn follows, or
opens the assistant turn with other text than its generation prompt. Qwen3's templates are refused (they
move the last turn's reasoning into ``<think>\n…\n</think>\n\n`` and drop it from earlier turns);
Qwen2.5's, SmolLM2's and other plain ChatML templates pass. ``check_chat_template`` runs it when an
``EpisodeRunner`` is built, before the first rollout (in training, before the model loads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragen2.errors import ConfigError

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_ASSISTANT = "\x00ASSISTANT\x00"
_USER = "\x00USER\x00"
# an assistant turn as the protocol writes it: the forced <think> (in the prompt), then the sampled text
_REPLY = f"{THINK_OPEN}\x00REASONING\x00{THINK_CLOSE}{ANSWER_OPEN}{_ASSISTANT}{ANSWER_CLOSE}"


@dataclass(frozen=True)
class TemplateFragments:
    closer: str  # text the template puts after an assistant message's content (e.g. "<|im_end|>\n")
    user_prefix: str  # text before a (non-first) user message's content
    user_suffix: str  # text after it, through the assistant generation header


def template_fragments(tokenizer: Any, system_prompt: str) -> TemplateFragments:
    """Split the chat template into the pieces appended between turns; a ``ConfigError`` naming the model
    when the template does not keep history verbatim (the module's docstring)."""

    def render(messages: list[dict[str, str]], gen: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

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
    model = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    raise ConfigError(
        f"model.name_or_path={model!r}: its chat template does not keep history verbatim ({why}), so "
        "prompts cannot grow by appending the sampled ids (docs/method.md §2); Qwen3's templates drop "
        "earlier <think> blocks. Fix: a model whose template keeps every turn as written (Qwen2.5-Instruct, "
        "SmolLM2, plain ChatML), or put such a chat_template in the model folder's tokenizer_config.json"
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


def check_chat_template(tokenizer: Any) -> None:
    """Refuse, at start-up, a chat template under which prompts cannot grow by appending ids."""
    template_fragments(tokenizer, "You are an agent.")


def thinking_ids(tokenizer: Any, text: str) -> list[int]:
    """The ids of a rendered prompt ``text`` through the forced ``<think>`` (not doubled where the template
    already opens it, as some reasoning models' generation prompts do)."""
    forced = text if text.rstrip().endswith(THINK_OPEN) else text + THINK_OPEN
    return list(tokenizer.encode(forced, add_special_tokens=False))


def turn_one_ids(tokenizer: Any, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Turn 1's prompt ids (X): ``messages`` through the chat template with its generation prompt, then the
    forced ``<think>``. Other trainers' rollouts are read with it too (``ragen2.diagnostics.readers``)."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return thinking_ids(tokenizer, text)


class ChatRenderer:
    """Turns env text into prompt ids for one episode's turns."""

    def __init__(self, tokenizer, system_prompt: str) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.fragments = template_fragments(tokenizer, system_prompt)
        closer_ids = self._encode(self.fragments.closer)
        eos = tokenizer.eos_token_id
        # A sampled EOS already closes the turn in ChatML-like templates: skip the closer's copy of it.
        self._closer_ids = closer_ids
        self._closer_after_eos = closer_ids[1:] if closer_ids[:1] == [eos] else closer_ids

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def first_prompt(self, user_text: str) -> list[int]:
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": user_text},
        ]
        return turn_one_ids(self.tokenizer, messages)

    def next_prompt(self, prompt_ids: Sequence[int], sampled_ids: Sequence[int], user_text: str) -> list[int]:
        ended_with_eos = len(sampled_ids) > 0 and sampled_ids[-1] == self.tokenizer.eos_token_id
        closer = self._closer_after_eos if ended_with_eos else self._closer_ids
        f = self.fragments
        user = self._encode(f.user_prefix + user_text + f.user_suffix + THINK_OPEN)
        return [*prompt_ids, *sampled_ids, *closer, *user]
