"""Pure torch RL math: SNR-aware filters, advantages, KL estimators, losses and token log-probs.

Imports only torch and the leaf ``ragen2.plugins`` (the tables its strategies, loss aggregations, KL estimators
and loss scalings register in), so it sits at the bottom of the dependency graph.
"""

from ragen2.algos.advantages import bilevel_gae, gae, grpo, reinforce_pp, reinforce_pp_baseline, rloo, whiten
from ragen2.algos.batching import micro_batch_share, micro_batches, minibatch_order
from ragen2.algos.filters import (
    LOSS_SCALINGS,
    extreme_rows,
    filter_stats,
    group_scores,
    loss_scale,
    select_groups,
)
from ragen2.algos.kl import KL_KINDS, AdaptiveKLController, FixedKLController, kl_penalty
from ragen2.algos.logprobs import masked_mean, sampled_logprobs, token_stats
from ragen2.algos.losses import (
    AGG_MODES,
    aggregate,
    clipped_surrogate,
    entropy_loss,
    gspo_surrogate,
    overlong_penalty,
    value_loss,
)

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "LOSS_SCALINGS",
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate",
    "bilevel_gae",
    "clipped_surrogate",
    "entropy_loss",
    "extreme_rows",
    "filter_stats",
    "gae",
    "group_scores",
    "grpo",
    "gspo_surrogate",
    "kl_penalty",
    "loss_scale",
    "masked_mean",
    "micro_batch_share",
    "micro_batches",
    "minibatch_order",
    "overlong_penalty",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
    "sampled_logprobs",
    "select_groups",
    "token_stats",
    "value_loss",
    "whiten",
]
