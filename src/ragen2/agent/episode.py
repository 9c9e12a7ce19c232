"""What the runner returns: episodes made of turns, token ids exactly as sampled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ragen2.agent.render import THINK_OPEN, template_fragments
from ragen2.agent.tools import ToolCall
from ragen2.errors import ConfigError

# end_reason of an episode whose env call overran env.step_timeout_s (ragen2.agent.runner)
ENV_TIMEOUT = "env_timeout"
# the info key of an env that ended its episode on a failure of its own side (a remote server that stopped
# answering: ragen2_envs.openenv), counted in rollout/env_errors
ENV_ERROR = "env_error"


@dataclass
class Turn:
    prompt_ids: list[int]  # the whole context the model saw, through the forced <think> (X)
    sampled_ids: list[int]  # exactly the ids the sampler returned
    sampler_logprobs: list[float] | None
    text: str  # decoded sampled ids
    finish_reason: str
    observation: str  # the env text shown in this turn's user message
    format_ok: bool
    actions: list[str]
    actions_valid: list[bool]
    reward: float  # env reward summed over this turn's actions
    penalty: float  # format penalty (≤ 0)
    reasoning_ids: list[int] | None  # Z: sampled ids before </think>; None when it never closed
    infos: list[dict[str, Any]] = field(default_factory=list)
    # entropy of the sampler's next-token distribution at each sampled position; None if not recorded
    entropies: list[float] | None = None
    # where this turn's sequence (prompt + sampled) starts in the episode's training row: 0 where prompts
    # grow by appending (each turn's prompt holds the earlier turns), the earlier turns' sequences' total
    # length where each turn is a sequence of its own (rollout.layout=per_turn, ``ragen2.agent.render``)
    offset: int = 0
    # a tool turn's calls and their results (env.tools, ``ragen2.agent.tools``); the env did not move
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def start(self) -> int:
        """Index of the first sampled id in the episode's training row."""
        return self.offset + len(self.prompt_ids)

    @property
    def end(self) -> int:
        return self.start + len(self.sampled_ids)


@dataclass
class Episode:
    env_id: str
    seed: int  # the instance: every rollout of a group shares it
    group: int
    sample: int  # index within the group
    system_prompt: str
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    end_reason: str = ""  # "terminated" | "env_truncated" | "max_turns" | "context" | "env_timeout"
    success: bool = False
    kind: str = ""  # the instance's kind, where the env sorts them (reset info "kind": TwoHop's learnable …)

    @property
    def token_ids(self) -> list[int]:
        """The training row: the last prompt plus the last sampled ids, after the earlier turns' own
        sequences where each turn is one (``Turn.offset``)."""
        last = self.turns[-1]
        earlier = [i for t in self.turns[:-1] for i in (*t.prompt_ids, *t.sampled_ids)] if last.offset else []
        return [*earlier, *last.prompt_ids, *last.sampled_ids]

    @property
    def sequences(self) -> list[tuple[int, int]]:
        """The [start, end) spans of the row's sequences, each run on its own context: the whole row, or
        each turn's where each turn is a sequence of its own."""
        if not self.turns[-1].offset:
            return [(0, len(self.token_ids))]
        return [(t.offset, t.end) for t in self.turns]

    @property
    def episode_return(self) -> float:
        return sum(t.reward + t.penalty for t in self.turns)

    @property
    def sampled_tokens(self) -> int:
        """Tokens the policy sampled over all turns."""
        return sum(len(t.sampled_ids) for t in self.turns)

    @property
    def token_entropies(self) -> list[float] | None:
        """The next-token entropy at every sampled position, in order; None if a turn did not record it."""
        if any(t.entropies is None for t in self.turns):
            return None
        return [h for t in self.turns for h in t.entropies or ()]

    @property
    def mean_entropy(self) -> float | None:
        """Mean of ``token_entropies`` (0 with no sampled token); None if they were not recorded."""
        values = self.token_entropies
        return None if values is None else (sum(values) / len(values) if values else 0.0)

    def to_record(self) -> dict[str, Any]:
        """A JSON-serialisable record (for rollout.save_jsonl)."""
        return {
            "env_id": self.env_id,
            "seed": self.seed,
            "group": self.group,
            "sample": self.sample,
            "return": self.episode_return,
            "success": self.success,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "end_reason": self.end_reason,
            **({"kind": self.kind} if self.kind else {}),
            "system_prompt": self.system_prompt,
            "turns": [
                {
                    "prompt_ids": t.prompt_ids,
                    "sampled_ids": t.sampled_ids,
                    "text": t.text,
                    "observation": t.observation,
                    "finish_reason": t.finish_reason,
                    "format_ok": t.format_ok,
                    "actions": t.actions,
                    "actions_valid": t.actions_valid,
                    "reward": t.reward,
                    "penalty": t.penalty,
                    **({"offset": t.offset} if t.offset else {}),
                    **({"tool_calls": [c.as_record() for c in t.tool_calls]} if t.tool_calls else {}),
                }
                for t in self.turns
            ],
        }


_USER = "\x00USER\x00"


def record_messages(record: Mapping[str, Any], tokenizer: Any) -> list[dict[str, str]]:
    """A saved episode's conversation as OpenAI chat messages (what other tools read), recovered from its
    token ids: the system prompt, then each turn's user message (the text its prompt ids add to the
    context, inside the template's user-turn wrapper; ``template_fragments``) and the assistant's reply
    (the forced ``<think>`` and the sampled text, special tokens left out); after a tool turn, each call's
    result as a tool message, as the runner gave them to the template. Where the ids do not decode to the
    wrapper (a tokenizer that does not round-trip), the turn's env text stands in for the user message.
    A turn rendered anew (``offset``: rollout.layout=per_turn) holds the whole conversation: its user message
    is the last one in it.
    """

    def decode(ids: Sequence[int], special: bool = False) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=not special)

    system = str(record["system_prompt"])
    head = [{"role": "system", "content": system}, {"role": "user", "content": _USER}]
    first_prefix, first_suffix = tokenizer.apply_chat_template(
        head, tokenize=False, add_generation_prompt=True
    ).split(_USER)
    # turn 1's user header: what follows the system's text (a tool turn's template renders the tools, which
    # the record does not keep, between the two)
    cut = first_prefix.rfind(system) if system else -1
    first = (first_prefix[cut + len(system) :] if cut >= 0 else first_prefix, first_suffix)
    try:
        f = template_fragments(tokenizer, system)
        later = (f.user_prefix, f.user_suffix)
    except ConfigError:
        # a template that rewrites earlier turns: its user header is the one after the system's
        later = first
    messages = [{"role": "system", "content": system}]
    context = 0  # ids of the context before this turn's new user text
    for n, turn in enumerate(record["turns"]):
        context = 0 if turn.get("offset") else context
        calls = record["turns"][n - 1].get("tool_calls") if n else None
        if calls:
            # after a tool turn, its results are tool messages (the template wraps them; the env waited)
            messages += [{"role": "tool", "content": c["content"]} for c in calls]
        else:
            added = decode(turn["prompt_ids"][context:], special=True)
            prefix, suffix = first if n == 0 else later
            # as ``thinking_ids``
            tail = suffix if suffix.rstrip().endswith(THINK_OPEN) else suffix + THINK_OPEN
            start, end = added.rfind(prefix), len(added) - len(tail)
            fits = start >= 0 and added.endswith(tail) and start + len(prefix) <= end
            user = added[start + len(prefix) : end] if fits else str(turn["observation"])
            messages.append({"role": "user", "content": user})
        messages.append({"role": "assistant", "content": THINK_OPEN + decode(turn["sampled_ids"])})
        context = len(turn["prompt_ids"]) + len(turn["sampled_ids"])
    return messages
