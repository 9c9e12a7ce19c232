"""The two halves of an HF causal LM that the update and the critic use separately: trunk and LM head.

The update runs the decoder once per micro-batch and the LM head only on the positions that predict
sampled tokens (``ragen2.algos.logprobs.sampled_logprobs``); a value head on the shared trunk reads the
same hidden states.
"""

from __future__ import annotations

from typing import Any

import torch


def decoder_hidden(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, T] ids -> [b, T, H] last hidden states of the causal LM's decoder (no LM head)."""
    return model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def lm_head(model: Any) -> torch.nn.Module:
    """The causal LM's output projection, [n, H] -> [n, V]."""
    return model.get_output_embeddings()
