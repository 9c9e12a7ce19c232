"""PPO's critic as a component of ``PolicyModule`` (``algo.critic``; absent for critic-free algorithms).

A critic is a value head on a trunk, the loss that trains it and the optimizer group it trains in:
- ``trunk=null``: a zero-initialised linear head on the policy's own last hidden state (the default).
  The trunk is shared: the value loss reaches it through the policy's parameter group, × ``vf_coef``.
- ``trunk=<model>``: a separate trunk (any HF causal LM, by default the policy's own weights, its LM head
  dropped) with its own head.
Under ``model.lora`` the trunk is frozen but for LoRA adapters: a shared trunk's value loss trains the
policy's adapters (the base does not move), a separate trunk gets adapters of its own with the same
settings (training it whole would undo what LoRA saves).
Before the update one no-grad pass over the kept rows gives the old log-probs and the values (one
trunk forward when the trunk is shared); every micro-batch adds ``vf_coef ·`` the clipped value loss
(clip 0.5) to the policy's terms. The critic's parameters are their own optimizer group with their own
learning rate and gradient clip. For the first ``warmup_iterations`` iterations only the critic
learns: no policy terms, and the policy's gradients (a shared trunk's included) are dropped before the
step, so the policy stays as sampled.

Departures from the paper's code (RAGEN, verl): one optimizer with two parameter groups instead of
two workers, so one LightningModule owns both; the value head starts at zero (verl's is random), so
the first advantages are the whitened returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ragen2.algos.logprobs import masked_mean
from ragen2.algos.losses import value_loss
from ragen2.errors import ConfigError
from ragen2.models.forward import by_sequence
from ragen2.models.loading import load_model
from ragen2.models.lora import LoRAConfig
from ragen2.models.value import position_values, zero_head


@dataclass(frozen=True)
class CriticStats:
    """The critic's view of the kept batch before the update (``Critic.stats``): ``train/critic/*``."""

    values_mean: float
    returns_mean: float
    explained_variance: float  # 1 − Var(R − V)/Var(R): 1 is a perfect critic, ≤ 0 no better than a constant
    warmup: bool  # the policy waits while the critic warms up (``algo.critic.warmup_iterations``)

    def as_metrics(self) -> dict[str, float]:
        return {f"train/critic/{k}": float(v) for k, v in vars(self).items()}


class Critic(nn.Module):
    """A value head on the policy's trunk or on a trunk of its own, with its loss and optimizer settings."""

    def __init__(
        self,
        trunk: str | None = None,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        lr: float = 1e-5,
        weight_decay: float = 0.01,
        grad_clip: float = 1.0,
        vf_coef: float = 0.5,
        value_clip: float | None = 0.5,
        warmup_iterations: int = 0,
    ) -> None:
        super().__init__()
        checks = (
            ("lr", lr, lr > 0, "e.g. algo.critic.lr=1e-5 (verl's default: 10× the policy's)"),
            ("weight_decay", weight_decay, weight_decay >= 0, "algo.critic.weight_decay=0.01"),
            ("grad_clip", grad_clip, grad_clip >= 0, "algo.critic.grad_clip=1.0 (0 = no clipping)"),
            (
                "vf_coef",
                vf_coef,
                vf_coef > 0,
                "the critic learns only from the value loss: algo.critic.vf_coef=0.5",
            ),
            (
                "value_clip",
                value_clip,
                value_clip is None or value_clip > 0,
                "algo.critic.value_clip=0.5, or null",
            ),
            (
                "warmup_iterations",
                warmup_iterations,
                warmup_iterations >= 0,
                "algo.critic.warmup_iterations=0",
            ),
        )
        for key, value, ok, fix in checks:
            if not ok:
                raise ConfigError(f"algo.critic.{key}={value} is out of range. Fix: {fix}")
        self.trunk_name = trunk
        self.trunk_dtype = dtype
        self.gradient_checkpointing = gradient_checkpointing
        self.lr, self.weight_decay, self.grad_clip = lr, weight_decay, grad_clip
        self.vf_coef = vf_coef
        self.value_clip = value_clip
        self.warmup_iterations = warmup_iterations
        self.trunk: nn.Module | None = None
        self.head: nn.Linear | None = None

    def build(self, policy: Any, lora: LoRAConfig | None = None) -> None:
        """Create the head (and load the separate trunk, with ``lora``'s adapters when the policy has them):
        the hidden size is known once the policy is."""
        if self.head is not None:
            return
        hidden_size = policy.config.hidden_size
        if self.trunk_name is not None:
            model = load_model(self.trunk_name, self.trunk_dtype)
            if self.gradient_checkpointing:
                model.gradient_checkpointing_enable()
            if lora is not None:
                model = lora.attach(model, f"algo.critic.trunk={self.trunk_name!r}")
            model.config.use_cache = False
            self.trunk = model.get_decoder().train()  # registered before the head: the optimizer's order
            hidden_size = model.config.hidden_size
        self.head = zero_head(hidden_size)

    def forward(
        self,
        policy_hidden: torch.Tensor,  # [b, T, H] the policy trunk's output for these rows
        input_ids: torch.Tensor,  # [b, T]
        attention_mask: torch.Tensor,  # [b, T]
        loss_mask: torch.Tensor,  # [b, T]
        sequence_index: torch.Tensor | None = None,  # [b, T] rows packing several sequences
    ) -> torch.Tensor:
        """[b, T] values at sampled positions (0 elsewhere)."""
        assert self.head is not None, "call build(policy) first"
        hidden = (
            policy_hidden
            if self.trunk is None
            else self._trunk_hidden(input_ids, attention_mask, sequence_index)
        )
        return position_values(self.head, hidden, loss_mask)

    def _trunk_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, sequence_index: torch.Tensor | None
    ) -> torch.Tensor:
        """The critic's own trunk's hidden states (each packed sequence alone, as the policy's)."""
        assert self.trunk is not None
        trunk = self.trunk

        def run(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return trunk(input_ids=ids, attention_mask=mask).last_hidden_state

        return by_sequence(run, input_ids, attention_mask, sequence_index)

    def param_group(self) -> dict[str, Any]:
        """The critic's own optimizer group (a shared trunk trains in the policy's group)."""
        return {
            "name": "critic",
            "params": [p for p in self.parameters() if p.requires_grad],
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "max_norm": self.grad_clip,
        }

    def trains_policy(self, iteration: int) -> bool:
        """Whether the policy's terms train this iteration (not during the critic's warm-up)."""
        return iteration >= self.warmup_iterations

    def loss(
        self,
        values: torch.Tensor,  # [b, T] this forward's values
        old_values: torch.Tensor,  # [b, T] the values before the update
        returns: torch.Tensor,  # [b, T] value targets
        mask: torch.Tensor,  # [b, T]
        agg: str,
        norm: float | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``vf_coef ·`` the clipped value loss, and its stats (the unscaled loss among them)."""
        loss, stats = value_loss(values, old_values, returns, mask, clip=self.value_clip, agg=agg, norm=norm)
        out = {
            "critic/value_loss": float(loss.detach()),
            **{f"critic/{k}": float(v) for k, v in stats.items()},
        }
        return self.vf_coef * loss, out

    def stats(
        self, returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, iteration: int
    ) -> CriticStats:
        """The critic's view of the kept batch before the update: values, targets, explained variance."""
        var_ret = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
        resid = returns - values
        var_res = masked_mean((resid - masked_mean(resid, mask)).square(), mask)
        return CriticStats(
            values_mean=float(masked_mean(values, mask)),
            returns_mean=float(masked_mean(returns, mask)),
            explained_variance=float(1.0 - var_res / var_ret) if float(var_ret) > 0 else 0.0,
            warmup=not self.trains_policy(iteration),
        )
