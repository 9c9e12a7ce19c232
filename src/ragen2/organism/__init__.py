"""The organism model (``model=organism``): a 2-layer Llama of 170k parameters (d 64) with a word-level
tokenizer over exactly the words that the agent protocol and the TwoHop env write, built once and saved as a
plain transformers folder, so that ``ragen2-train``, ``ragen2-warmstart``, ``ragen2-eval`` and
``ragen2-diagnose`` load it as they load any model (docs/organism.md).

The vocabulary is read off the text it will see, not listed by hand: the system prompts and first user
messages that ``ragen2.agent.runner`` renders for TwoHop instances at every knob's extremes, the ChatML
template's tokens, the reasoning and answer tags, and the numbers the turn and token limits print. A word
outside it encodes as ``[UNK]``. The tokenizer's ``tokenizer_config.json`` names the environment its
vocabulary covers (``ragen2_envs``), and the agent refuses the model with another env before the first
rollout (``ragen2.agent.render.check_vocabulary``).

It lives above the agent (it renders through it), so ``conf/model/organism.yaml`` reaches it through the
``${ragen2.organism:}`` resolver (``ragen2.config``), which builds the folder under ``$RAGEN2_CACHE`` on
first use (``ragen2.models.loading.build_once``) and gives its path.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path

import ragen2_envs
from ragen2_envs.twohop.env import KEYS, MAX_MIDDLES, MAX_VALUES, STYLES, middle, value

from ragen2.agent.render import ANSWER_CLOSE, ANSWER_OPEN, ENVS_KEY, THINK_CLOSE, THINK_OPEN
from ragen2.agent.runner import AgentConfig, system_prompt, user_message
from ragen2.models.loading import build_once
from ragen2.models.wordlevel import word_tokenizer

ENV_ID = "ragen2/TwoHop-v0"
#: the numbers a prompt can print (turns, actions left, token limits)
NUMBERS = range(65)
#: the settings the organism's prompts are rendered with (conf/experiment/organism.yaml): its phrases say them
MAX_NEW_TOKENS = 8
AGENT = AgentConfig(max_turns=1, max_actions_per_turn=1)
#: the model's shape: 2 layers, d 64, 2 attention heads of 32, ~120k parameters. Trained on the solver's
#: demonstrations, smaller heads (4 of 16, 8 of 8; d 48 with heads of 12) learnt the first lookup and not the
#: second in 6,000–9,000 steps; heads of 32 learnt both (docs/organism.md, "The model")
HIDDEN = 64
LAYERS = 2
HEADS = 2
FFN = 192
MAX_POSITIONS = 512


def corpus() -> list[str]:
    """The text the organism's vocabulary covers: prompts of TwoHop at every knob's extremes through the
    agent's own rendering, plus every key, middle, value, style and the tags."""
    texts: list[str] = []
    for hops, num_pairs, seed in itertools.product((1, 2), (2, len(KEYS)), range(8)):
        env = ragen2_envs.make(
            ENV_ID,
            hops=hops,
            num_pairs=num_pairs,
            num_middles=MAX_MIDDLES,
            num_values=MAX_VALUES,
            num_styles=1,  # the grammar's size limit; every style word is added below
            zero_variance_share=0.5,
        )
        obs, _ = env.reset(seed=seed)
        texts += [
            system_prompt(env.instructions, AGENT, MAX_NEW_TOKENS),
            user_message(1, obs, AGENT.max_turns, AGENT, MAX_NEW_TOKENS),
        ]
        texts.append(env.step(str(env.oracle_action()))[0])
    texts += [" ".join(KEYS), " ".join(STYLES), " ".join(str(n) for n in NUMBERS)]
    texts += [" ".join(middle(i) for i in range(MAX_MIDDLES)), " ".join(value(i) for i in range(MAX_VALUES))]
    return texts


#: the symbols whose table rows are one token each (TwoHop's defaults); rows of larger tables split into words
ROW_SYMBOLS = 16


def phrases() -> list[str]:
    """The protocol's fixed sentences as the organism's settings render them, one token each: the whole
    system prompt (one per ``hops``) and the user message's lines that no instance changes (they take a
    prompt from 158 tokens to about 40; with other settings the same text splits into words), and every
    table row (``key=middle``, ``middle=value``, ``key=value``) of the default tables, so that finding a row
    is one attention step."""
    prompts = [
        system_prompt(ragen2_envs.make(ENV_ID, hops=hops).instructions, AGENT, MAX_NEW_TOKENS)
        for hops in (1, 2)
    ]
    lines = user_message(1, "", AGENT.max_turns, AGENT, MAX_NEW_TOKENS).split("\n")
    keys, middles = KEYS[:ROW_SYMBOLS], [middle(i) for i in range(ROW_SYMBOLS)]
    values = [value(i) for i in range(ROW_SYMBOLS)]
    tables = ((keys, middles), (middles, values), (keys, values))
    rows = [f"{a}={b}" for left, right in tables for a in left for b in right]
    return prompts + [line for line in lines if line] + rows


def build(out: Path) -> None:
    """Write the organism's folder: tokenizer, a freshly initialised model (seed 0), its generation config."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tags = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
    tokenizer = word_tokenizer(corpus(), tags=tags, phrases=phrases())
    tokenizer.init_kwargs[ENVS_KEY] = [ENV_ID]  # saved in tokenizer_config.json: the envs its words cover
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def folder_name() -> str:
    """The cache folder's name: a digest of the model's shape and the text its vocabulary is read from, so that
    a change to either builds a new folder beside the old one."""
    recipe = [HIDDEN, LAYERS, HEADS, FFN, MAX_POSITIONS, corpus(), phrases()]
    return "organism-" + hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]


def folder() -> str:
    """The organism's model folder, built on first use."""
    return str(build_once(folder_name(), build))


#: the warm start shipped with ragen2: ``ragen2-warmstart`` on TwoHop's solver from ``folder()``
#: (``warmstart.json`` inside records the command; docs/organism.md)
WARM_START = Path(__file__).resolve().parent / "warmstart"


def warm_start() -> str:
    """The shipped warm start's folder."""
    return str(WARM_START)
