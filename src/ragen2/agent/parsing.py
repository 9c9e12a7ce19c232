"""Parsing a turn's sampled text (which starts right after the forced ``<think>``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ragen2.agent.render import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE

ACTION_SEP = "||"
# reasoning, then </think>, then exactly one <answer>…</answer>, then only whitespace / special tokens
_FORMAT = re.compile(
    rf"^(?P<think>.*?){re.escape(THINK_CLOSE)}\s*{re.escape(ANSWER_OPEN)}(?P<answer>.*?){re.escape(ANSWER_CLOSE)}\s*$",
    re.DOTALL,
)


@dataclass(frozen=True)
class ParsedTurn:
    format_ok: bool
    think: str | None
    answer: str | None
    actions: list[str] = field(default_factory=list)
    dropped_actions: int = 0  # actions beyond max_actions_per_turn


def normal_reasoning(think: str) -> str:
    """The reasoning as a grammar compares it: whitespace runs read as one space, the ends stripped."""
    return " ".join(think.split())


def parse_turn(
    text: str,
    max_actions: int,
    strip_tokens: tuple[str, ...] = (),
    grammar: frozenset[str] | None = None,
) -> ParsedTurn:
    """Extract ``<answer>`` and split it on ``||``; keep at most ``max_actions`` actions.

    ``strip_tokens`` are special-token strings (EOS, end-of-turn) removed from the end before matching.
    A turn is well-formed when the reasoning closes, one answer follows and it names at least one action, and,
    where the env holds the reasoning to a ``grammar`` (``TextEnv.reasoning_grammar``), the reasoning is one of
    its sentences (``normal_reasoning``).
    """
    body = text
    for tok in strip_tokens:
        body = body.replace(tok, "")
    match = _FORMAT.match(body)
    if match is None or THINK_CLOSE in match["answer"] or ANSWER_OPEN in match["answer"]:
        return ParsedTurn(format_ok=False, think=None, answer=None)
    actions = [a.strip() for a in match["answer"].split(ACTION_SEP)]
    actions = [a for a in actions if a]
    if not actions or (grammar is not None and normal_reasoning(match["think"]) not in grammar):
        return ParsedTurn(format_ok=False, think=match["think"], answer=match["answer"])
    return ParsedTurn(
        format_ok=True,
        think=match["think"],
        answer=match["answer"],
        actions=actions[:max_actions],
        dropped_actions=max(0, len(actions) - max_actions),
    )
