"""Advantage estimators and reward terms as config objects (``algo.advantage``, ``algo.kl_reward``).

An estimator takes the kept batch (and the critic's values when it ``needs_values``) and returns
``Advantages``: [B, T] advantages, zero off the loss mask, and the value targets (critics only).
Which rewards a token estimator reads is a config key: ``turn`` puts each turn's reward (plus its
format penalty) on that turn's last sampled token, so a turn is credited with what follows it;
``episode`` puts the whole return on the last sampled token, as the reference does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple, Protocol

import torch

from ragen2.algos.advantages import Reduce, bilevel_gae, gae, same, whiten
from ragen2.algos.kl import KL_KINDS, AdaptiveKLController, FixedKLController, kl_penalty
from ragen2.data.batch import RolloutBatch
from ragen2.errors import ConfigError

REWARDS = {"turn": "turn_rewards", "episode": "token_rewards"}


class Advantages(NamedTuple):
    advantages: torch.Tensor  # [B, T], 0 off the loss mask
    returns: torch.Tensor | None  # [B, T] value targets (critic estimators), else None


class AdvantageEstimator(Protocol):
    needs_values: ClassVar[bool]

    def __call__(
        self, batch: RolloutBatch, values: torch.Tensor | None = None, reduce: Reduce = same
    ) -> Advantages:
        """``reduce`` sums batch statistics over data-parallel ranks (estimators that whiten use it)."""
        ...


def _reward_field(reward: str) -> str:
    if reward not in REWARDS:
        raise ConfigError(
            f"algo.advantage.reward={reward!r} is unknown. Fix: choose one of {sorted(REWARDS)} "
            "(turn: each turn's reward at its end; episode: the return at the last sampled token)"
        )
    return REWARDS[reward]


def turn_ends(turn_index: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the last sampled token of each turn (turn ids are contiguous spans, 0 elsewhere)."""
    nxt = torch.nn.functional.pad(turn_index[:, 1:], (0, 1))  # [B, T] the id of the following token
    return (turn_index > 0) & (nxt != turn_index)


class OutcomeAdvantage:
    """Episode-level advantages (GRPO, Dr.GRPO, RLOO) broadcast to every sampled token.

    ``fn(returns[B], group_index[B]) -> [B]`` is one of ``ragen2.algos.advantages``. A group-level filter
    keeps whole groups, so a kept group's statistics are those of the unfiltered batch; under
    trajectory-level filtering (``filter.trajectory_fraction`` < 1) they are those of its kept rollouts.
    """

    needs_values: ClassVar[bool] = False

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.fn = fn

    def __call__(
        self, batch: RolloutBatch, values: torch.Tensor | None = None, reduce: Reduce = same
    ) -> Advantages:
        adv = self.fn(batch.returns, batch.group_index).to(batch.loss_mask.dtype)  # [B]
        return Advantages(adv[:, None] * batch.loss_mask, None)


class GroupTokenFn(Protocol):
    """``fn(returns [B], group_index [B], mask [B, T], reduce=…) -> advantages [B, T]``."""

    def __call__(
        self, returns: torch.Tensor, group_index: torch.Tensor, mask: torch.Tensor, *, reduce: Reduce = ...
    ) -> torch.Tensor: ...


class TokenFn(Protocol):
    """``fn(rewards [B, T], mask [B, T], reduce=…) -> (advantages [B, T], returns [B, T])``."""

    def __call__(
        self, rewards: torch.Tensor, mask: torch.Tensor, *, reduce: Reduce = ...
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class GroupTokenAdvantage:
    """Group baselines whitened over tokens (REINFORCE++-baseline): ``fn(returns, group_index, mask) -> [B, T]``."""

    needs_values: ClassVar[bool] = False

    def __init__(self, fn: GroupTokenFn) -> None:
        self.fn = fn

    def __call__(
        self, batch: RolloutBatch, values: torch.Tensor | None = None, reduce: Reduce = same
    ) -> Advantages:
        return Advantages(self.fn(batch.returns, batch.group_index, batch.loss_mask, reduce=reduce), None)


class TokenAdvantage:
    """Token-level returns without a critic (REINFORCE++): ``fn(rewards[B, T], mask) -> (adv, returns)``."""

    needs_values: ClassVar[bool] = False

    def __init__(
        self,
        fn: TokenFn,
        reward: str = "turn",
    ) -> None:
        self.fn = fn
        self.field = _reward_field(reward)

    def __call__(
        self, batch: RolloutBatch, values: torch.Tensor | None = None, reduce: Reduce = same
    ) -> Advantages:
        adv, _ = self.fn(getattr(batch, self.field), batch.loss_mask, reduce=reduce)
        return Advantages(adv, None)


class GAEAdvantage:
    """PPO's GAE over response tokens with the critic's values, advantages whitened over the kept batch.

    ``bilevel=True`` is RAGEN's bi-level GAE: turn-level GAE over turn ends with ``turn_gamma``, then
    token-level GAE inside each turn (``ragen2.algos.advantages.bilevel_gae``); it reads turn rewards.
    Returns (the value targets) are A + V before whitening, as verl.
    """

    needs_values: ClassVar[bool] = True

    def __init__(
        self,
        gamma: float = 1.0,
        lam: float = 1.0,
        reward: str = "turn",
        whiten_advantages: bool = True,
        bilevel: bool = False,
        turn_gamma: float = 1.0,
    ) -> None:
        for key, v in (("gamma", gamma), ("lam", lam), ("turn_gamma", turn_gamma)):
            if not 0.0 <= v <= 1.0:
                raise ConfigError(
                    f"algo.advantage.{key}={v} must be in [0, 1]. Fix: e.g. algo.advantage.{key}=1.0"
                )
        if bilevel and reward != "turn":
            raise ConfigError(
                f"algo.advantage.bilevel=true with algo.advantage.reward={reward!r}: bi-level GAE credits each "
                "turn's reward. Fix: algo.advantage.reward=turn"
            )
        self.gamma, self.lam, self.turn_gamma = gamma, lam, turn_gamma
        self.field = _reward_field(reward)
        self.whiten = whiten_advantages
        self.bilevel = bilevel

    def __call__(
        self, batch: RolloutBatch, values: torch.Tensor | None = None, reduce: Reduce = same
    ) -> Advantages:
        if values is None:
            raise ValueError("GAEAdvantage needs the critic's values: use it with algo=ppo (algo.critic set)")
        rewards, mask = getattr(batch, self.field), batch.loss_mask
        adv, returns = (
            bilevel_gae(
                rewards, values, mask, turn_ends(batch.turn_index), self.gamma, self.lam, self.turn_gamma
            )
            if self.bilevel
            else gae(rewards, values, mask, self.gamma, self.lam)
        )
        return Advantages(whiten(adv, mask, reduce=reduce) if self.whiten else adv, returns)


@dataclass(frozen=True)
class KLRewardStats:
    """What KL in the reward did to one iteration's batch (``KLInReward``): logged as ``train/kl_reward/*``."""

    kl: float  # the batch's mean per-token KL to the reference (per sequence, then over sequences)
    coef: float  # β the penalty used (the controller moves after)
    penalty: float  # the mean penalty a row's return got

    def as_metrics(self) -> dict[str, float]:
        return {f"train/kl_reward/{k}": v for k, v in vars(self).items()}


class KLInReward:
    """KL to the reference as a per-token reward, −β·KL(old ‖ ref), with a fixed or adaptive β.

    Applied to the kept batch before the advantages (verl ``apply_kl_penalty``): it lands on every
    sampled token of ``token_rewards`` and ``turn_rewards`` and its sum on ``returns``, so outcome and
    token estimators both see it. The controller then moves β toward its target from the batch's
    mean per-token KL (per sequence, then over sequences).
    """

    def __init__(self, controller: FixedKLController | AdaptiveKLController, kind: str = "k1") -> None:
        if kind not in KL_KINDS:
            raise ConfigError(f"algo.kl_reward.kind={kind!r} is unknown. Fix: choose one of {KL_KINDS}")
        self.controller = controller
        self.kind = kind

    def __call__(
        self, batch: RolloutBatch, old_logp: torch.Tensor, ref_logp: torch.Tensor, reduce: Reduce = same
    ) -> tuple[RolloutBatch, KLRewardStats]:
        """``reduce`` sums over data-parallel ranks: the controller moves on every rank's mean KL."""
        mask = batch.loss_mask
        kl = kl_penalty(old_logp, ref_logp, self.kind) * mask  # [B, T]
        beta = self.controller.value
        penalty = -beta * kl
        seq_kl = (kl.sum(-1) / mask.sum(-1).clamp(min=1.0))[mask.sum(-1) > 0]  # [B'] per-token mean
        total = reduce(torch.stack([seq_kl.sum(), torch.tensor(float(seq_kl.numel()), dtype=seq_kl.dtype)]))
        current = float(total[0] / total[1]) if float(total[1]) > 0 else 0.0
        rows = reduce(torch.tensor(float(mask.shape[0]), dtype=torch.float64))
        self.controller.update(current, n_steps=int(rows))
        shaped = replace(
            batch,
            token_rewards=batch.token_rewards + penalty,
            turn_rewards=batch.turn_rewards + penalty,
            returns=batch.returns + penalty.sum(-1),
        )
        rows_kept = (mask.sum(-1) > 0).to(mask.dtype)  # [B] rows with sampled tokens
        total_pen = reduce(torch.stack([(penalty.sum(-1) * rows_kept).sum(), rows_kept.sum()]))
        penalty_mean = float(total_pen[0] / torch.where(total_pen[1] > 0, total_pen[1], 1.0))
        return shaped, KLRewardStats(kl=current, coef=beta, penalty=penalty_mean)
