"""The LightningModule of every algorithm and the pieces an algorithm config composes into it; the warm
start's supervised fine-tuning module."""

from ragen2.modules.algo_config import AlgoConfig, OptimConfig
from ragen2.modules.critic import Critic
from ragen2.modules.estimators import (
    AdvantageEstimator,
    Advantages,
    GAEAdvantage,
    GroupTokenAdvantage,
    KLInReward,
    OutcomeAdvantage,
    TokenAdvantage,
)
from ragen2.modules.objectives import LossTerms, PolicyObjective, TokenRatioLoss, TurnRatioLoss
from ragen2.modules.policy import PolicyModule
from ragen2.modules.sft import SFTConfig, SFTModule

__all__ = [
    "AdvantageEstimator",
    "Advantages",
    "AlgoConfig",
    "Critic",
    "GAEAdvantage",
    "GroupTokenAdvantage",
    "KLInReward",
    "LossTerms",
    "OptimConfig",
    "OutcomeAdvantage",
    "PolicyModule",
    "PolicyObjective",
    "SFTConfig",
    "SFTModule",
    "TokenAdvantage",
    "TokenRatioLoss",
    "TurnRatioLoss",
]
