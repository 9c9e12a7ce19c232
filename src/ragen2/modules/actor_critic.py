"""ActorCriticModule: PPO with a critic (a value head on the policy trunk, or a separate model).

The policy update is ``PolicyModule``'s; this adds the critic. Before the update, one no-grad pass
over the kept rows gives the old log-probs and the values (one trunk forward when the trunk is shared);
GAE (or bi-level GAE) turns them into whitened advantages and value targets; every micro-batch then
adds ``vf_coef ·`` the clipped value loss (clip 0.5) to the policy loss. The critic is its own
parameter group with its own learning rate and gradient clip. For the first
``critic_warmup_iterations`` iterations only the critic learns: no policy loss, and the policy's
gradients (a shared trunk's included) are dropped before the step, so the policy stays as sampled.

Departures from the paper's code (RAGEN, verl): one optimizer with two parameter groups instead of
two workers, so one LightningModule owns both; the value head starts at zero (verl's is random), so
the first advantages are the whitened returns; per-turn rewards by default (``advantage.reward=turn``:
each turn's reward at its last token), where the reference puts the episode return on the last token
(``reward=episode`` restores that).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ragen2.algos.logprobs import masked_mean
from ragen2.algos.losses import value_loss
from ragen2.data.batch import RolloutBatch
from ragen2.models.value import ValueHeadCritic
from ragen2.modules.policy import PolicyModule, UpdateInputs, head_logprobs, trunk_hidden


class ActorCriticModule(PolicyModule):
    uses_critic: ClassVar[bool] = True

    def __init__(
        self,
        *args: Any,
        critic: ValueHeadCritic,  # or its subclass SeparateCritic
        critic_optim: dict[str, Any],
        vf_coef: float = 0.5,
        value_clip: float | None = 0.5,
        critic_warmup_iterations: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if vf_coef <= 0:
            raise ValueError(
                f"algo.vf_coef={vf_coef} must be > 0: the critic learns only from the value loss"
            )
        if critic_warmup_iterations < 0:
            raise ValueError(f"algo.critic_warmup_iterations={critic_warmup_iterations} must be ≥ 0")
        if "lr" not in critic_optim:
            raise ValueError(
                "algo.critic_optim.lr is missing: the critic has its own learning rate (e.g. 1e-5)"
            )
        self.critic = critic
        self.critic_optim = dict(critic_optim)
        self.vf_coef = vf_coef
        self.value_clip = value_clip
        self.critic_warmup_iterations = critic_warmup_iterations

    def configure_model(self) -> None:
        super().configure_model()
        self.critic.build(self.policy)

    def _param_groups(self) -> list[dict[str, Any]]:
        cfg = self.critic_optim
        return [
            *super()._param_groups(),
            {
                "name": "critic",
                "params": [p for p in self.critic.parameters() if p.requires_grad],
                "lr": cfg["lr"],
                "weight_decay": cfg.get("weight_decay", 0.0),
                "max_norm": cfg.get("grad_clip", 1.0),
            },
        ]

    @property
    def _old_logp_up_front(self) -> bool:
        return True  # GAE needs every row's values before the first step; their log-probs come along

    def _score_rollouts(self, batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        def score(mb: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
            hidden = trunk_hidden(self.policy, mb.input_ids, mb.attention_mask)
            lp, _ = head_logprobs(self.policy, hidden, mb.input_ids, mb.loss_mask, self.temperature)
            return lp, self.critic(hidden, mb.input_ids, mb.attention_mask, mb.loss_mask)

        logp, values = self._per_micro_batch(batch, score)
        return logp, values

    def _actor_active(self, iteration: int) -> bool:
        return iteration >= self.critic_warmup_iterations

    def _before_step(self, iteration: int) -> None:
        if not self._actor_active(iteration):
            for p in self.policy.parameters():
                p.grad = None

    def _auxiliary_loss(
        self, mb: RolloutBatch, idx: torch.Tensor, hidden: torch.Tensor, inputs: UpdateInputs
    ) -> tuple[torch.Tensor, dict[str, float]]:
        assert inputs.values is not None and inputs.returns is not None
        width = mb.input_ids.shape[1]
        values = self.critic(hidden, mb.input_ids, mb.attention_mask, mb.loss_mask)
        loss, stats = value_loss(
            values,
            inputs.values[idx, :width],
            inputs.returns[idx, :width],
            mb.loss_mask,
            clip=self.value_clip,
            agg=self.loss_agg,
            norm=self.loss_norm,
        )
        out = {
            "critic/value_loss": float(loss.detach()),
            **{f"critic/{k}": float(v) for k, v in stats.items()},
        }
        return self.vf_coef * loss, out

    def _advantage_stats(self, batch: RolloutBatch, inputs: UpdateInputs) -> dict[str, float]:
        assert inputs.values is not None and inputs.returns is not None
        mask = batch.loss_mask
        returns, values = inputs.returns, inputs.values
        var_ret = masked_mean((returns - masked_mean(returns, mask)).square(), mask)
        resid = returns - values
        var_res = masked_mean((resid - masked_mean(resid, mask)).square(), mask)
        return {
            **super()._advantage_stats(batch, inputs),
            "train/critic/values_mean": float(masked_mean(values, mask)),
            "train/critic/returns_mean": float(masked_mean(returns, mask)),
            # 1 − Var(R − V)/Var(R): 1 is a perfect critic, ≤ 0 no better than a constant
            "train/critic/explained_variance": float(1.0 - var_res / var_ret) if float(var_ret) > 0 else 0.0,
            "train/critic/warmup": float(not self._actor_active(batch.iteration)),
        }
