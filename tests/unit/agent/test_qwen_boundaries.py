"""Qwen2.5's tokenization of the protocol's tags: where Z ends, where a turn stops, what the agent parses.

Qwen's pre-tokenizer glues a punctuation run to what follows it, so its tokens straddle the tags where
SmolLM2's do not: ``left.</think>`` is ``left`` ``.</`` ``think`` ``><`` (SmolLM2: ``.`` ``</``),
``</answer>\\n\\n`` ends with ``>\\n\\n`` and ``</answer>.`` with ``>.``. Z (docs/method.md §2) then loses the
final ``.`` (its token touches the tag), and a turn stops on the token that completes ``</answer>``, with
whatever it carries past it, in both samplers (the HF sampler's stop rule and ``cut_at_stop``, vLLM's).
"""

from __future__ import annotations

import pytest
from helpers import ScriptLM

from ragen2.agent import parse_turn, reasoning_ids
from ragen2.rollout import SamplingParams
from ragen2.rollout.hf import HFSampler, stop_candidates
from ragen2.rollout.vllm import cut_at_stop

STOP = ("</answer>",)


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _pieces(tokenizer, text: str) -> list[str]:
    return [tokenizer.decode([i]) for i in _enc(tokenizer, text)]


def test_qwen_tokens_straddle_the_tags_where_smollm2_tokens_do_not(qwen_tokenizer, tokenizer) -> None:
    assert _pieces(qwen_tokenizer, "I go left.</think><answer>Left</answer>") == [
        *("I", " go", " left", ".</", "think", "><", "answer", ">", "Left", "</", "answer", ">"),
    ]
    assert _pieces(tokenizer, "I go left.</think>") == ["I", " go", " left", ".", "</", "think", ">"]
    assert _pieces(qwen_tokenizer, "Up</answer>\n\n")[-1] == ">\n\n"
    assert _pieces(qwen_tokenizer, "(1,2)</answer>.")[-3:] == [")</", "answer", ">."]
    assert _pieces(qwen_tokenizer, "<think>") == ["<th", "ink", ">"]  # the forced <think>: three tokens


@pytest.mark.parametrize(
    ("text", "z_text"),
    [
        ("I go left.</think><answer>Left</answer>", "I go left"),  # ".</" touches the tag: excluded
        ("ok)</think><answer>(1,2)</answer>", "ok"),  # ")</" likewise
        ("go up</think><answer>Up</answer>", "go up"),  # "</" opens the tag: nothing lost
        ("a\n</think>\n<answer>Up</answer>", "a\n"),  # "\n" is its own token before "</"
    ],
)
def test_z_ends_before_the_token_that_touches_think_close(qwen_tokenizer, text: str, z_text: str) -> None:
    ids = _enc(qwen_tokenizer, text)
    z = reasoning_ids(ids, qwen_tokenizer.decode)
    assert z is not None and z == ids[: len(z)]
    assert qwen_tokenizer.decode(z) == z_text
    assert "</" in qwen_tokenizer.decode([ids[len(z)]])  # the next token is the one touching the tag


def _script(qwen_tokenizer, reply: str, after: str) -> tuple[list[int], list[int], HFSampler]:
    start = _enc(qwen_tokenizer, " Hello")
    ids = _enc(qwen_tokenizer, reply)
    model = ScriptLM(len(qwen_tokenizer), {start[-1]: [*ids, *_enc(qwen_tokenizer, after)]}, default=ids[0])
    return start, ids, HFSampler(qwen_tokenizer, model, reuse_prefix=False)


@pytest.mark.parametrize(
    ("reply", "after", "last_piece", "actions"),
    [
        ("go up</think><answer>Up</answer>\n\n", " and more", ">\n\n", ["Up"]),  # the stop token holds "\n\n"
        ("ok)</think><answer>Down</answer>", "<|im_end|>", ">", ["Down"]),
        # the stop token holds a "." the format does not allow after the answer: a bad turn, as with SmolLM2
        ("x.</think>\n<answer>Left || Up</answer>.", " More text", ">.", []),
    ],
)
def test_a_turn_stops_on_the_token_that_completes_answer_close(
    qwen_tokenizer, reply: str, after: str, last_piece: str, actions: list[str]
) -> None:
    start, ids, sampler = _script(qwen_tokenizer, reply, after)
    (sample,) = sampler.generate(
        [start], SamplingParams(max_new_tokens=40, temperature=0.0, stop=STOP), seed=0
    )
    assert (sample.ids, sample.finish_reason) == (ids, "stop")
    assert qwen_tokenizer.decode(sample.ids[-1:]) == last_piece
    eos = {qwen_tokenizer.eos_token_id}
    script = [*ids, *_enc(qwen_tokenizer, after)]
    assert cut_at_stop(script, eos, STOP, qwen_tokenizer.decode, 8) == (
        ids,
        "stop",
    )  # vLLM's rule: the same cut
    parsed = parse_turn(qwen_tokenizer.decode(sample.ids), max_actions=2)
    assert (parsed.format_ok, parsed.actions) == (bool(actions), actions)


def test_stop_candidates_under_qwen_are_the_tokens_that_can_end_answer_close(qwen_tokenizer) -> None:
    table = stop_candidates(qwen_tokenizer, STOP, 151936)
    vocab = qwen_tokenizer.get_vocab()
    for token in (">", ">ĊĊ", ">.", "><", ">(", ">Ċ"):  # spelled in the byte alphabet: "Ċ" is "\n"
        assert table[vocab[token]], token
    assert not any(table[i] for i in _enc(qwen_tokenizer, "</answer")) and not table[vocab[".</"]]
    assert table[len(qwen_tokenizer) :].all()  # the embedding's padding rows: never decoded to text
    assert 0.001 < table.float().mean() < 0.02
