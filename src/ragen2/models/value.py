"""Value heads: the state before each sampled token -> its value V(s_p).

A value head maps the hidden state at position p to the value of the state in which token p+1 is
sampled, and is read only where the loss mask says a token was sampled, aligned with the log-probs
(``ragen2.algos.logprobs.sampled_logprobs``). Heads are zero-initialised: V ≡ 0 before training, so the
first GAE advantages are the discounted returns and no random value noise enters the first updates.
"""

from __future__ import annotations

import torch
from torch import nn


def position_values(head: nn.Module, hidden: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """[b, T, H] hidden states -> [b, T] values at sampled positions (0 elsewhere)."""
    target = loss_mask[:, 1:].bool()  # position p predicts (and values the state before) token p+1
    v = head(hidden[:, :-1][target].float()).squeeze(-1)  # [N]
    out = torch.zeros(loss_mask.shape, dtype=torch.float32, device=hidden.device)
    out[:, 1:][target] = v
    return out


def zero_head(hidden_size: int) -> nn.Linear:
    """A linear value head whose output is 0 for every input."""
    head = nn.Linear(hidden_size, 1)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head
