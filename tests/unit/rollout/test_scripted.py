"""ScriptedSampler: seeded choice among templates, ``{oracle}`` and ``{reasoning}`` filled in, ``length`` when truncated."""

from __future__ import annotations

import pytest

from ragen2.rollout import PromptMeta, Sampler, SamplingParams
from ragen2.rollout.scripted import ScriptedSampler

PARAMS = SamplingParams(max_new_tokens=64)
PROMPTS = [[1, 2, 3]] * 12
RESPONSES = (
    "a</think><answer>Up</answer>",
    "b</think><answer>Down</answer>",
    "c</think><answer>Left</answer>",
)


def _enc(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_is_a_sampler_that_needs_the_oracle(tokenizer) -> None:
    s = ScriptedSampler(tokenizer)
    assert isinstance(s, Sampler)
    assert s.needs_oracle


def test_seeded(tokenizer) -> None:
    s = ScriptedSampler(tokenizer, RESPONSES)
    a = s.generate(PROMPTS, PARAMS, seed=4)
    assert [x.ids for x in a] == [x.ids for x in s.generate(PROMPTS, PARAMS, seed=4)]
    assert [x.ids for x in a] != [x.ids for x in s.generate(PROMPTS, PARAMS, seed=5)]
    assert len({tuple(x.ids) for x in a}) > 1  # rows of one call draw independently
    assert {tokenizer.decode(x.ids) for x in a} <= set(RESPONSES)


def test_ids_are_the_tokenized_response_and_finish_is_stop(tokenizer) -> None:
    s = ScriptedSampler(tokenizer, RESPONSES[:1])
    (out,) = s.generate(PROMPTS[:1], PARAMS, seed=0)
    assert out.ids == _enc(tokenizer, RESPONSES[0])
    assert out.finish_reason == "stop"
    assert out.logprobs is None


def test_oracle_is_filled_per_prompt_with_a_fallback(tokenizer) -> None:
    s = ScriptedSampler(tokenizer, ["go</think><answer>{oracle}</answer>"], fallback="Wait")
    meta = [PromptMeta(oracle="Left"), PromptMeta(oracle=None), PromptMeta(oracle="87 + (42 - 31)")]
    out = s.generate(PROMPTS[:3], PARAMS, seed=0, meta=meta)
    texts = [tokenizer.decode(x.ids) for x in out]
    assert texts == [
        "go</think><answer>Left</answer>",
        "go</think><answer>Wait</answer>",
        "go</think><answer>87 + (42 - 31)</answer>",
    ]
    no_meta = s.generate(PROMPTS[:1], PARAMS, seed=0)
    assert tokenizer.decode(no_meta[0].ids) == "go</think><answer>Wait</answer>"


def test_reasoning_is_filled_per_prompt_with_a_fallback(tokenizer) -> None:
    s = ScriptedSampler(tokenizer, ["{reasoning}</think><answer>{oracle}</answer>"], fallback_reasoning="hm")
    meta = [PromptMeta(oracle="v3", reasoning="so m2 v3"), PromptMeta(oracle="Up")]
    texts = [tokenizer.decode(x.ids) for x in s.generate(PROMPTS[:2], PARAMS, seed=0, meta=meta)]
    assert texts == ["so m2 v3</think><answer>v3</answer>", "hm</think><answer>Up</answer>"]


def test_truncated_response_is_length(tokenizer) -> None:
    text = "a long line of reasoning that goes on</think><answer>Up</answer>"
    n = len(_enc(tokenizer, text))
    s = ScriptedSampler(tokenizer, [text])
    (cut,) = s.generate(PROMPTS[:1], SamplingParams(max_new_tokens=n - 1), seed=0)
    assert cut.finish_reason == "length"
    assert cut.ids == _enc(tokenizer, text)[: n - 1]
    (exact,) = s.generate(PROMPTS[:1], SamplingParams(max_new_tokens=n), seed=0)
    assert exact.finish_reason == "stop"
    assert exact.ids == _enc(tokenizer, text)


def test_eos_in_the_response_is_the_eos_id(tokenizer) -> None:
    s = ScriptedSampler(tokenizer, ["a</think><answer>Up</answer><|im_end|>"])
    (out,) = s.generate(PROMPTS[:1], PARAMS, seed=0)
    assert out.ids[-1] == tokenizer.eos_token_id


def test_no_responses_is_refused(tokenizer) -> None:
    with pytest.raises(ValueError, match=r"rollout\.responses"):
        ScriptedSampler(tokenizer, [])
