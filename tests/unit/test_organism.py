"""The organism model: a plain transformers folder that the normal model path loads, a word-level vocabulary
that covers every TwoHop prompt, a grammar each of whose sentences encodes one way, and the refusal of any
other env."""

from __future__ import annotations

from pathlib import Path

import pytest
import ragen2_envs

from ragen2 import organism
from ragen2.agent.runner import AgentConfig, EpisodeRunner
from ragen2.config import compose
from ragen2.errors import ConfigError
from ragen2.models.loading import load_model, load_tokenizer
from ragen2.rollout.base import SamplingParams


@pytest.fixture(scope="module")
def folder() -> str:
    return organism.folder()


def runner(tokenizer, max_new_tokens: int = organism.MAX_NEW_TOKENS, env_id: str = organism.ENV_ID, **kwargs):
    return EpisodeRunner(
        lambda: ragen2_envs.make(organism.ENV_ID, **kwargs),
        tokenizer,
        AgentConfig(max_turns=1, max_actions_per_turn=1),
        SamplingParams(max_new_tokens=max_new_tokens),
        env_id=env_id,
    )


def test_the_folder_loads_through_the_normal_model_path(folder: str) -> None:
    model, tokenizer = load_model(folder), load_tokenizer(folder)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (
        organism.HIDDEN,
        organism.LAYERS,
        organism.HEADS,
    )
    assert cfg.vocab_size == len(tokenizer) and tokenizer.chat_template
    assert 50_000 < sum(p.numel() for p in model.parameters()) < 200_000
    assert (Path(folder) / "model.safetensors").is_file()
    # built once: the second call finds the folder
    assert organism.folder() == folder


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"hops": 1},
        {"num_pairs": 2, "zero_variance_share": 0.5},
        {"num_pairs": 16, "num_middles": 32, "num_values": 32, "num_styles": 1},
    ],
)
def test_its_words_cover_every_prompt(folder: str, kwargs: dict) -> None:
    tokenizer = load_tokenizer(folder)
    prompts = runner(tokenizer, **kwargs).first_prompts(range(40))
    unknown = tokenizer.unk_token_id
    assert all(unknown not in ids for ids, _ in prompts)
    # the protocol's fixed sentences and the default tables' rows are one token each: a 4-row prompt is about
    # 30 tokens, not 160, and each row is one token
    if not kwargs:
        assert max(len(ids) for ids, _ in prompts) < 35
        words = tokenizer.convert_ids_to_tokens(prompts[0][0])
        assert sum("=" in w and len(w) > 1 for w in words) == 8  # 4 keys rows, 4 links rows
    # other settings change the rule's text: it splits into words, all still known
    longer = runner(tokenizer, max_new_tokens=12, **kwargs).first_prompts(range(5))
    assert all(unknown not in ids and len(ids) > len(prompts[0][0]) for ids, _ in longer)


def test_each_sentence_of_the_grammar_encodes_one_way(folder: str) -> None:
    tokenizer = load_tokenizer(folder)
    grammar = ragen2_envs.make(organism.ENV_ID).reasoning_grammar()
    ids = runner(tokenizer).grammar_ids()
    assert ids is not None and len(ids) == len(grammar) == len({tuple(i) for i in ids})
    for sentence, sentence_ids in zip(grammar, ids):
        assert len(sentence_ids) == 4  # style, middle, value, </think>
        assert " ".join(tokenizer.decode(sentence_ids[:3]).split()) == sentence


def test_another_env_is_refused_naming_the_model_and_the_env(folder: str) -> None:
    tokenizer = load_tokenizer(folder)
    with pytest.raises(
        ConfigError, match=r"model\.name_or_path=.*env\.id='ragen2/FrozenLake-v0'.*Fix: env=twohop"
    ):
        runner(tokenizer, env_id="ragen2/FrozenLake-v0")


def test_model_organism_composes_to_the_folder(folder: str) -> None:
    cfg = compose(["env=twohop", "model=organism"])
    assert cfg.model.name_or_path == folder
    bad = compose(["env=twohop", "model=organism", "model.name_or_path=${ragen2.organism:nope}"])
    with pytest.raises(Exception, match=r"ragen2\.organism:nope"):
        str(bad.model.name_or_path)
