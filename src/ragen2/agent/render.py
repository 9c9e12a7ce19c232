"""Prompt rendering through the model's own chat template, growing the context by appending ids.

docs/method.md §2: turn t's prompt ids = turn t−1's prompt ids + the ids sampled in turn t−1 + the ids the
template adds to close that assistant turn + the rendered ids of the next user message (with the
assistant header and the forced ``<think>``). History is never re-rendered, so every prompt is an exact
prefix of the final training sequence. The two template fragments (the assistant-turn closer and the
user-turn wrapper) are found once, by rendering placeholders, and checked to be prefix-stable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_ASSISTANT = "\x00ASSISTANT\x00"
_USER = "\x00USER\x00"


@dataclass(frozen=True)
class TemplateFragments:
    closer: str  # text the template puts after an assistant message's content (e.g. "<|im_end|>\n")
    user_prefix: str  # text before a (non-first) user message's content
    user_suffix: str  # text after it, through the assistant generation header


def template_fragments(tokenizer, system_prompt: str) -> TemplateFragments:
    """Split the chat template into the pieces appended between turns, checking prefix stability."""

    def render(messages: list[dict[str, str]], gen: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)

    head = [{"role": "system", "content": system_prompt}, {"role": "user", "content": "u"}]
    with_assistant = render([*head, {"role": "assistant", "content": _ASSISTANT}], gen=False)
    with_user = render(
        [*head, {"role": "assistant", "content": _ASSISTANT}, {"role": "user", "content": _USER}], gen=True
    )
    cut = with_assistant.find(_ASSISTANT)
    if cut < 0 or not with_user.startswith(with_assistant):
        raise ValueError(
            "the model's chat template re-renders history (a later turn changes earlier text), so the "
            "context cannot grow by appending ids. Fix: use a model whose chat template is prefix-stable "
            "(ChatML, Llama-3, Qwen2.5 instruct) or set model.chat_template to one that is."
        )
    closer = with_assistant[cut + len(_ASSISTANT) :]
    user_turn = with_user[len(with_assistant) :]
    user_prefix, user_suffix = user_turn.split(_USER)
    return TemplateFragments(closer=closer, user_prefix=user_prefix, user_suffix=user_suffix)


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
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self._encode(text + THINK_OPEN)

    def next_prompt(self, prompt_ids: Sequence[int], sampled_ids: Sequence[int], user_text: str) -> list[int]:
        ended_with_eos = len(sampled_ids) > 0 and sampled_ids[-1] == self.tokenizer.eos_token_id
        closer = self._closer_after_eos if ended_with_eos else self._closer_ids
        f = self.fragments
        user = self._encode(f.user_prefix + user_text + f.user_suffix + THINK_OPEN)
        return [*prompt_ids, *sampled_ids, *closer, *user]
