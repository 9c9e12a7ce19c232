"""LightningModules: the policy-gradient module (GRPO family) and the actor-critic module (PPO)."""

from ragen2.modules.actor_critic import ActorCriticModule
from ragen2.modules.estimators import (
    AdvantageEstimator,
    Advantages,
    GAEAdvantage,
    GroupTokenAdvantage,
    KLInReward,
    OutcomeAdvantage,
    TokenAdvantage,
)
from ragen2.modules.objectives import PolicyObjective, TokenRatioLoss, TurnRatioLoss
from ragen2.modules.policy import PolicyModule, micro_batches, sampled_logprobs

__all__ = [
    "ActorCriticModule",
    "AdvantageEstimator",
    "Advantages",
    "GAEAdvantage",
    "GroupTokenAdvantage",
    "KLInReward",
    "OutcomeAdvantage",
    "PolicyModule",
    "PolicyObjective",
    "TokenAdvantage",
    "TokenRatioLoss",
    "TurnRatioLoss",
    "micro_batches",
    "sampled_logprobs",
]
