"""Critics for PPO: a value head on the policy's trunk, or a separate causal-LM trunk with its own head.

A critic maps the hidden state at position p to V(s_p), the value of the state in which token p+1 is
sampled, and is read only where the loss mask says a token was sampled, aligned with the log-probs
(``ragen2.modules.policy.sampled_logprobs``). Heads are zero-initialised: V ≡ 0 before training, so the
first GAE advantages are the discounted returns and no random value noise enters the first updates.
Both critics are built lazily by ``build(policy)`` (the hidden size is known only once the policy is
loaded, in ``configure_model``), and are ``nn.Module``s so Lightning checkpoints them with the policy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ragen2.models.loading import load_model


def position_values(head: nn.Module, hidden: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """[b, T, H] hidden states -> [b, T] values at sampled positions (0 elsewhere)."""
    target = loss_mask[:, 1:].bool()  # position p predicts (and values the state before) token p+1
    v = head(hidden[:, :-1][target].float()).squeeze(-1)  # [N]
    out = torch.zeros(loss_mask.shape, dtype=torch.float32, device=hidden.device)
    out[:, 1:][target] = v
    return out


def _zero_head(hidden_size: int) -> nn.Linear:
    head = nn.Linear(hidden_size, 1)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


class ValueHeadCritic(nn.Module):
    """A linear value head on the policy's own last hidden state: no second model, the trunk is shared.

    Its parameters are the head only; the trunk learns from the value loss through the policy's
    parameter group, weighted by ``algo.vf_coef``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.head: nn.Linear | None = None

    def build(self, policy: Any) -> None:
        if self.head is None:
            self.head = _zero_head(policy.config.hidden_size)

    def _hidden(
        self, policy_hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        return policy_hidden

    def forward(
        self,
        policy_hidden: torch.Tensor,  # [b, T, H] the policy trunk's output for these rows
        input_ids: torch.Tensor,  # [b, T]
        attention_mask: torch.Tensor,  # [b, T]
        loss_mask: torch.Tensor,  # [b, T]
    ) -> torch.Tensor:
        """[b, T] values at sampled positions (0 elsewhere)."""
        assert self.head is not None, "call build(policy) first"
        return position_values(self.head, self._hidden(policy_hidden, input_ids, attention_mask), loss_mask)


class SeparateCritic(ValueHeadCritic):
    """A separate trunk (any HF causal LM, by default the policy's own weights) plus a value head.

    The LM head of the loaded model is dropped: only the decoder is kept. ``gradient_checkpointing``
    trades compute for memory as for the policy.
    """

    def __init__(
        self, name_or_path: str, dtype: str = "float32", gradient_checkpointing: bool = False
    ) -> None:
        super().__init__()
        self.name_or_path = name_or_path
        self.dtype = dtype
        self.gradient_checkpointing = gradient_checkpointing
        self.trunk: nn.Module | None = None

    def build(self, policy: Any) -> None:
        if self.trunk is not None:
            return
        model = load_model(self.name_or_path, self.dtype)
        if self.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        model.config.use_cache = False
        self.trunk = model.get_decoder().train()
        self.head = _zero_head(model.config.hidden_size)

    def _hidden(
        self, policy_hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        assert self.trunk is not None, "call build(policy) first"
        return self.trunk(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
