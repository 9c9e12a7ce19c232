"""Z extraction (docs/method.md §2) on real SmolLM2 token ids.

Z = the sampled ids before the first token whose text touches ``</think>``; a token straddling the tag is
excluded; no tag, no Z (None). In this tokenizer ``</think><answer>`` is ``</`` ``think`` ``><`` ``answer``
``>``: ``><`` straddles the end of the tag, and `` </`` / ``></`` straddle its start.
"""

from __future__ import annotations

import pytest

from ragen2.agent import reasoning_ids


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _dec(tokenizer):
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def _pieces(tokenizer, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i]) for i in ids]


def _reference(tokenizer, ids: list[int]) -> list[int] | None:
    """Linear scan: the longest prefix whose decoded text is a prefix of the text before the tag."""
    dec = _dec(tokenizer)
    text = dec(ids)
    cut = text.find("</think>")
    if cut < 0:
        return None
    best = 0
    for k in range(len(ids) + 1):
        if text[:cut].startswith(dec(ids[:k])):
            best = k
    return ids[:best]


def test_well_formed_turn(tokenizer) -> None:
    ids = _enc(tokenizer, "I push right.</think><answer>Right</answer>")
    z = reasoning_ids(ids, _dec(tokenizer))
    assert z is not None
    assert tokenizer.decode(z) == "I push right."
    assert ids[: len(z)] == z
    assert tokenizer.decode([ids[len(z)]]) == "</"


def test_tag_straddling_end_token_of_real_tokenizer(tokenizer) -> None:
    # the tokenizer's own split of "</think><answer>": "><" holds the tag's ">" and the answer's "<"
    tail = _enc(tokenizer, "</think><answer>")
    assert _pieces(tokenizer, tail) == ["</", "think", "><", "answer", ">"]
    ids = _enc(tokenizer, "ok") + tail + _enc(tokenizer, "Up</answer>")
    assert reasoning_ids(ids, _dec(tokenizer)) == _enc(tokenizer, "ok")


@pytest.mark.parametrize(
    ("text", "straddler", "z_text"),
    [
        ("plan </think><answer>Up</answer>", " </", "plan"),  # " </": a reasoning space + the tag's "</"
        ("x <b></think><answer>Up</answer>", "></", "x <b"),  # "></": a reasoning ">" + the tag's "</"
    ],
)
def test_token_straddling_the_tag_start_is_excluded(
    tokenizer, text: str, straddler: str, z_text: str
) -> None:
    ids = _enc(tokenizer, text)
    pieces = _pieces(tokenizer, ids)
    assert straddler in pieces  # the real tokenizer does produce the straddling token here
    z = reasoning_ids(ids, _dec(tokenizer))
    assert z is not None
    assert tokenizer.decode(z) == z_text  # the straddler's reasoning half is lost with it
    assert pieces[len(z)] == straddler


def test_hand_built_straddler_ids(tokenizer) -> None:
    """Ids a model could sample but the tokenizer would not produce: 'ing' + 'think' after a '></'."""
    vocab = tokenizer.get_vocab()
    ids = [
        *_enc(tokenizer, "reason"),
        vocab["ing"],
        vocab["></"],
        vocab["think"],
        vocab["><"],
        vocab["answer"],
    ]
    assert tokenizer.decode(ids) == "reasoning></think><answer"
    assert reasoning_ids(ids, _dec(tokenizer)) == ids[:2]


def test_unclosed_think_has_no_z(tokenizer) -> None:
    dec = _dec(tokenizer)
    assert reasoning_ids(_enc(tokenizer, "I am still thinking about the box"), dec) is None
    assert reasoning_ids(_enc(tokenizer, "almost closed </think"), dec) is None  # cut by the length limit
    assert reasoning_ids(_enc(tokenizer, "no tag <answer>Up</answer>"), dec) is None
    assert reasoning_ids([], dec) is None


def test_earlier_angle_slash_is_not_the_tag(tokenizer) -> None:
    ids = _enc(tokenizer, "a</b then</think><answer>Up</answer>")
    pieces = _pieces(tokenizer, ids)
    assert pieces.count("</") >= 2  # the reasoning's "</" is the same token as the tag's
    z = reasoning_ids(ids, _dec(tokenizer))
    assert z is not None
    assert tokenizer.decode(z) == "a</b then"


def test_empty_reasoning_is_an_empty_z_not_none(tokenizer) -> None:
    assert reasoning_ids(_enc(tokenizer, "</think><answer>Up</answer>"), _dec(tokenizer)) == []


def test_only_the_first_tag_counts(tokenizer) -> None:
    z = reasoning_ids(_enc(tokenizer, "one</think>two</think><answer>Up</answer>"), _dec(tokenizer))
    assert tokenizer.decode(z) == "one"


def test_eos_after_the_answer_does_not_matter(tokenizer) -> None:
    ids = [*_enc(tokenizer, "fine</think><answer>Up</answer>"), tokenizer.eos_token_id]
    assert tokenizer.decode(reasoning_ids(ids, _dec(tokenizer))) == "fine"


@pytest.mark.parametrize(
    "text",
    [
        "我想向右推箱子</think><answer>Right</answer>",  # multi-token CJK characters
        "a 🙂🙂🙂 b</think><answer>Up</answer>",  # emoji split into byte tokens
        "x 🤖🤖</think>",
        "🙂</think>",
        "é ü ß — “quoted” </think><answer>Up</answer>",
        "1 < 2 > 0 <</think>",
    ],
)
def test_matches_a_linear_scan(tokenizer, text: str) -> None:
    ids = _enc(tokenizer, text)
    z = reasoning_ids(ids, _dec(tokenizer))
    assert z == _reference(tokenizer, ids)
    before = text[: text.find("</think>")]
    assert before.startswith(tokenizer.decode(z))
    assert len(tokenizer.decode(ids[: len(z) + 1])) > len(before)  # the next token touches the tag
