"""Advantage estimators: GRPO / Dr.GRPO, RLOO, REINFORCE++ (with and without baseline), GAE, bi-level GAE.

Group estimators take one outcome score per rollout and a group id; token estimators take [B, T]
rewards placed on response tokens. In a multi-turn row the mask marks the sampled (response) tokens;
prompt and env tokens between turns are skipped: returns and TD errors carry across them, as in
verl's multi-turn GAE. Departures from verl / the reference:
- `reinforce_pp` accumulates returns over response tokens only and carries them across env tokens;
  verl resets the running return at every unmasked token, which in a multi-turn row would cut
  earlier turns off the outcome reward.
- Rewards on tokens outside the mask raise (they would be silently dropped by the recursions).
- `gae` and `bilevel_gae` return raw advantages; whitening is the caller's step (`whiten`), so that
  γ = λ = 1 GAE is exactly returns-to-go minus values. Outside the mask both outputs are 0.
- `whiten` with fewer than two masked entries uses variance 0 instead of raising (verl raises).
- `bilevel_gae` takes the turn-end positions explicitly; the reference infers them from non-zero
  rewards, so a turn whose reward is 0 silently merges into the next one, and it crashes when a row's
  last response token carries no reward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["bilevel_gae", "gae", "grpo", "reinforce_pp", "reinforce_pp_baseline", "rloo", "same", "whiten"]

#: sums a tensor over data-parallel ranks (``ragen2.distributed.Ranks.sum``); ``same`` for one process
Reduce = Callable[[torch.Tensor], torch.Tensor]


def _group_stats(scores: torch.Tensor, group_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-rollout (group mean, unbiased group std, group size) for scores [B] and group ids [B]."""
    if scores.dim() != 1 or group_index.shape != scores.shape:
        raise ValueError(
            f"scores {tuple(scores.shape)} and group_index {tuple(group_index.shape)} must both be [B]"
        )
    if group_index.dtype.is_floating_point:
        raise ValueError(f"group_index must be an integer tensor, got {group_index.dtype}")
    if not scores.dtype.is_floating_point:
        raise ValueError(f"scores must be a floating tensor (rewards), got {scores.dtype}")
    _, inv = torch.unique(group_index, return_inverse=True)  # [B] dense group id
    n_groups = int(inv.max().item()) + 1 if inv.numel() else 0
    x = scores.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(0, inv, torch.ones_like(x))
    total = torch.zeros_like(count).index_add_(0, inv, x)
    mean = total / count  # [G]
    sq = torch.zeros_like(count).index_add_(0, inv, (x - mean[inv]).square())
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))  # [G]
    return mean[inv], std[inv], count[inv]


def grpo(
    scores: torch.Tensor, group_index: torch.Tensor, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO advantage (R − mean_g)/(std_g + eps) per rollout [B] -> [B]; Dr.GRPO with norm_by_std=False.

    std is Bessel-corrected. A singleton group uses mean 0 and std 1 (verl), so its advantage is
    its raw score (/(1 + eps) when normalised), not 0.
    """
    mean, std, count = _group_stats(scores, group_index)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores.to(torch.float64) - mean
    if norm_by_std:
        adv = adv / (std + eps)
    return adv.to(scores.dtype)


def rloo(scores: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline R_i − mean_{j≠i} R_j = n/(n−1)·(R_i − mean_g), [B] -> [B].

    A singleton group keeps its raw score (no baseline exists), as verl.
    """
    mean, _, count = _group_stats(scores, group_index)
    x = scores.to(torch.float64)
    adv = torch.where(count > 1, count / (count - 1).clamp(min=1.0) * (x - mean), x)
    return adv.to(scores.dtype)


def _check_token_inputs(mask: torch.Tensor, **tensors: torch.Tensor) -> torch.Tensor:
    for name, t in tensors.items():
        if t.dim() != 2 or t.shape != mask.shape:
            raise ValueError(f"{name} {tuple(t.shape)} and mask {tuple(mask.shape)} must both be [B, T]")
    m = mask.to(torch.bool)
    rewards = tensors.get("token_rewards")
    if rewards is not None and (rewards[~m] != 0).any():
        raise ValueError(
            "token_rewards has non-zero entries outside the mask; place each reward on a response "
            "token (the episode return on the last sampled token)"
        )
    return m


def same(x: torch.Tensor) -> torch.Tensor:
    """The ``reduce`` of one process: statistics over this batch alone."""
    return x


def whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8, reduce: Reduce = same
) -> torch.Tensor:
    """(x − μ)/sqrt(σ² + eps) over masked entries (σ² Bessel-corrected), as verl `masked_whiten`.

    shift_mean=False adds μ back. Entries outside the mask are 0. ``reduce`` sums a tensor over the
    data-parallel ranks, so that μ and σ² are those of every rank's rows.
    """
    if x.shape != mask.shape:
        raise ValueError(f"whiten: x {tuple(x.shape)} and mask {tuple(mask.shape)} must match")
    m = mask.to(x.dtype)
    total = reduce(torch.stack([(x * m).sum(), m.sum()]))
    n = total[1]
    mean = total[0] / n.clamp(min=1.0)
    var = reduce(((x - mean).square() * m).sum()) / (n - 1).clamp(min=1.0)
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * m


def reinforce_pp(
    token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, reduce: Reduce = same
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted returns-to-go over response tokens [B, T], whitened over the batch.

    Returns (advantages, returns), both [B, T] and 0 outside the mask.
    """
    m = _check_token_inputs(mask, token_rewards=token_rewards)
    mf = m.to(token_rewards.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])  # [B]
    for t in reversed(range(token_rewards.shape[1])):
        # Discount once per response token; env tokens pass the running return through unchanged.
        running = mf[:, t] * (token_rewards[:, t] + gamma * running) + (1 - mf[:, t]) * running
        returns[:, t] = running
    returns = returns * mf
    return whiten(returns, m, reduce=reduce), returns


def reinforce_pp_baseline(
    scores: torch.Tensor, group_index: torch.Tensor, mask: torch.Tensor, reduce: Reduce = same
) -> torch.Tensor:
    """REINFORCE++-baseline: R − mean_g broadcast to response tokens, whitened over the batch -> [B, T].

    A singleton group gets baseline 0 (verl).
    """
    mean, _, count = _group_stats(scores, group_index)
    if mask.dim() != 2 or mask.shape[0] != scores.shape[0]:
        raise ValueError(f"mask {tuple(mask.shape)} must be [B, T] with B = {scores.shape[0]}")
    centred = scores.to(torch.float64) - torch.where(count > 1, mean, torch.zeros_like(mean))  # [B]
    m = mask.to(torch.bool)
    tokens = centred.to(scores.dtype).unsqueeze(-1).expand(mask.shape) * m  # [B, T]
    return whiten(tokens, m, reduce=reduce)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the response tokens of each row.

    δ_t = r_t + γ·V_next − V_t with V_next the value at the next *response* token (0 after the last),
    A_t = δ_t + γλ·A_next. Returns (advantages, returns = A + V), [B, T], 0 outside the mask.
    """
    m = _check_token_inputs(mask, token_rewards=token_rewards, values=values)
    mf = m.to(values.dtype)
    adv = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])  # [B]
    last_gae = torch.zeros_like(values[:, 0])  # [B]
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        cand = delta + gamma * lam * last_gae
        # Non-response tokens carry the next value and the running advantage through unchanged.
        next_value = mf[:, t] * values[:, t] + (1 - mf[:, t]) * next_value
        last_gae = mf[:, t] * cand + (1 - mf[:, t]) * last_gae
        adv[:, t] = last_gae
    adv = adv * mf
    return adv, (adv + values) * mf


def bilevel_gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_end: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    turn_gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bi-level GAE (RAGEN's `compute_bi_level_gae_advantage_return`): turn level, then token level.

    `turn_end` [B, T] marks the last response token of each turn, where that turn's reward sits.
    1. Turn level, over turn ends only: δ_k = r_k + turn_gamma·V(end_{k+1}) − V(end_k),
       A_k = δ_k + turn_gamma·λ·A_{k+1}; the turn target G_k = A_k + V(end_k).
    2. Token level, inside each turn: at the turn end δ = G_k − V (no bootstrap, so A = A_k); before
       it δ_t = r_t + γ·V_next − V_t over the turn's response tokens, A_t = δ_t + γλ·A_next.
    Returns (advantages, returns = A + V), [B, T], 0 outside the mask, not whitened.
    """
    m = _check_token_inputs(mask, token_rewards=token_rewards, values=values, turn_end=turn_end)
    ends = turn_end.to(torch.bool)
    if (ends & ~m).any():
        raise ValueError("turn_end marks tokens outside the mask; a turn ends on its last sampled token")
    # Every response token must belong to a closed turn: the last one of each row is a turn end.
    pos = torch.arange(m.shape[1], device=m.device).expand(m.shape)
    last = torch.where(m, pos, torch.full_like(pos, -1)).max(dim=1).values  # [B]
    has = last >= 0
    if not ends[has, last[has]].all():
        raise ValueError("bilevel_gae: the last response token of every row must be marked in turn_end")
    mf = m.to(values.dtype)
    ef = ends.to(values.dtype)
    zeros = torch.zeros_like(values[:, 0])  # [B]

    target = torch.zeros_like(values)  # turn-level return at each turn end
    next_end_value, turn_gae = zeros, zeros
    for t in reversed(range(values.shape[1])):
        delta = token_rewards[:, t] + turn_gamma * next_end_value - values[:, t]
        cand = delta + turn_gamma * lam * turn_gae
        turn_gae = ef[:, t] * cand + (1 - ef[:, t]) * turn_gae
        next_end_value = ef[:, t] * values[:, t] + (1 - ef[:, t]) * next_end_value
        target[:, t] = ef[:, t] * (turn_gae + values[:, t])

    adv = torch.zeros_like(values)
    next_value, last_gae = zeros, zeros
    for t in reversed(range(values.shape[1])):
        # At a turn end the turn-level target replaces reward plus bootstrap, and the recursion restarts.
        next_value = next_value * (1 - ef[:, t])
        last_gae = last_gae * (1 - ef[:, t])
        reward = ef[:, t] * target[:, t] + (1 - ef[:, t]) * token_rewards[:, t]
        cand = reward + gamma * next_value - values[:, t] + gamma * lam * last_gae
        next_value = mf[:, t] * values[:, t] + (1 - mf[:, t]) * next_value
        last_gae = mf[:, t] * cand + (1 - mf[:, t]) * last_gae
        adv[:, t] = last_gae
    adv = adv * mf
    return adv, (adv + values) * mf
