"""Shared fixtures: the tiny model's tokenizer (the real SmolLM2 tokenizer, ChatML template) and model."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tokenizer():
    from ragen2.models import load_tokenizer

    return load_tokenizer("tiny")


@pytest.fixture(scope="session")
def tiny_model():
    from ragen2.models import load_model

    model = load_model("tiny")
    model.eval()
    return model


@pytest.fixture(scope="session")
def small_llama():
    """A 2-layer random Llama over a 128-token vocabulary: exact-math tests that need a real causal LM."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=128,
        num_hidden_layers=2,
    )
    return LlamaForCausalLM(config).eval()
