"""``parse_turn``: the agent owns the format (docs/method.md §7). The text starts right after the forced <think>."""

from __future__ import annotations

import pytest

from ragen2.agent import parse_turn

EOS = "<|im_end|>"


def test_well_formed() -> None:
    p = parse_turn("The box is left of me.</think><answer>Left</answer>", max_actions=2)
    assert p.format_ok
    assert p.think == "The box is left of me."
    assert p.answer == "Left"
    assert p.actions == ["Left"]
    assert p.dropped_actions == 0


def test_whitespace_around_tags_and_actions_is_tolerated() -> None:
    p = parse_turn(" plan \n</think>\n\n<answer>  Up ||\tLeft \n</answer>\n ", max_actions=2)
    assert p.format_ok
    assert p.think == " plan \n"  # reasoning is kept verbatim
    assert p.actions == ["Up", "Left"]


@pytest.mark.parametrize(
    "text",
    [
        "I never close my reasoning <answer>Up</answer>",  # missing </think>
        "I never close my reasoning",  # length-truncated: no tag at all
        "done</think>",  # missing answer
        "done</think><answer>Up",  # unclosed answer
        "done</think>Up",  # bare action, no tags
        "done</think><answer>Up</answer><answer>Down</answer>",  # two answers
        "done</think><answer>Up</answer> and then more text",  # text after the answer
        "done</think><answer>Up</answer></think>",
        "done</think><answer><answer>Up</answer>",  # nested open tag
    ],
)
def test_bad_formats(text: str) -> None:
    p = parse_turn(text, max_actions=2)
    assert not p.format_ok
    assert p.actions == []


@pytest.mark.parametrize("answer", ["", "   ", "||", " || \n|| "])
def test_empty_answer_is_a_format_error(answer: str) -> None:
    p = parse_turn(f"hmm</think><answer>{answer}</answer>", max_actions=2)
    assert not p.format_ok
    assert p.actions == []


def test_split_keeps_at_most_max_actions_and_counts_the_rest() -> None:
    p = parse_turn("go</think><answer>Up || Down||Left || Right</answer>", max_actions=2)
    assert p.format_ok
    assert p.actions == ["Up", "Down"]
    assert p.dropped_actions == 2
    p3 = parse_turn("go</think><answer>Up||Down||Left</answer>", max_actions=3)
    assert p3.actions == ["Up", "Down", "Left"]
    assert p3.dropped_actions == 0


def test_empty_pieces_between_separators_are_not_actions() -> None:
    p = parse_turn("go</think><answer>Up |||| Left||</answer>", max_actions=5)
    assert p.actions == ["Up", "Left"]
    assert p.dropped_actions == 0


def test_action_text_with_inner_spaces_and_symbols_is_kept() -> None:
    p = parse_turn("calc</think><answer>87 + (42 - 31)</answer>", max_actions=2)
    assert p.actions == ["87 + (42 - 31)"]
    p = parse_turn("q</think><answer>search[who wrote it?]</answer>", max_actions=2)
    assert p.actions == ["search[who wrote it?]"]


def test_eos_string_at_the_end_is_stripped() -> None:
    text = f"ok</think><answer>Right</answer>{EOS}"
    assert not parse_turn(text, max_actions=2).format_ok  # without stripping, the EOS is trailing text
    p = parse_turn(text, max_actions=2, strip_tokens=(EOS,))
    assert p.format_ok
    assert p.actions == ["Right"]
    p = parse_turn(f"ok</think><answer>Right</answer>\n{EOS}{EOS}", max_actions=2, strip_tokens=(EOS,))
    assert p.actions == ["Right"]


def test_eos_does_not_rescue_a_bad_format() -> None:
    p = parse_turn(f"ok</think>{EOS}", max_actions=2, strip_tokens=(EOS,))
    assert not p.format_ok


def test_reasoning_may_contain_other_tags_and_partial_closers() -> None:
    p = parse_turn("a</b> then <i>x</i></think><answer>Up</answer>", max_actions=2)
    assert p.format_ok
    assert p.think == "a</b> then <i>x</i>"
    assert p.actions == ["Up"]
