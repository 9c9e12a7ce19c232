"""Advantage estimators, KL in the reward and policy objectives on a real collated batch, by hand."""

from __future__ import annotations

import functools

import pytest
import torch
from helpers import turn

from ragen2.agent.episode import Episode
from ragen2.algos.advantages import grpo, reinforce_pp
from ragen2.algos.kl import AdaptiveKLController, FixedKLController
from ragen2.algos.losses import clipped_surrogate, gspo_surrogate
from ragen2.data.batch import RolloutBatch, collate_episodes
from ragen2.modules import (
    GAEAdvantage,
    KLInReward,
    OutcomeAdvantage,
    TokenAdvantage,
    TokenRatioLoss,
    TurnRatioLoss,
)
from ragen2.modules.estimators import turn_ends

RESPONSE = [3, 4, 7, 8]  # the sampled positions of the episode below


def _batch() -> RolloutBatch:
    # turn 1 samples positions 3, 4 (reward 0.5); env tokens 5, 6; turn 2 samples 7, 8 (reward 1.0)
    turns = [turn([1, 2, 3], [4, 5], 0.5), turn([1, 2, 3, 4, 5, 6, 7], [8, 9], 1.0)]
    ep = Episode(env_id="x", seed=0, group=0, sample=0, system_prompt="", turns=turns)
    return collate_episodes([ep], num_groups=1, pad_id=0)


def _values() -> torch.Tensor:
    v = torch.zeros(1, 9)
    v[0, RESPONSE] = torch.tensor([0.2, 0.4, 0.6, 0.8])
    return v


def test_turn_ends_mark_each_turns_last_sampled_token() -> None:
    batch = _batch()
    assert batch.turn_index[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 2, 2]
    assert torch.nonzero(turn_ends(batch.turn_index)[0]).squeeze(-1).tolist() == [4, 8]
    # back-to-back turns with no env token between them still split
    assert turn_ends(torch.tensor([[1, 1, 2, 2, 0]]))[0].tolist() == [False, True, False, True, False]


def test_outcome_advantage_broadcasts_to_sampled_tokens() -> None:
    batch = _batch()
    adv, returns = OutcomeAdvantage(functools.partial(grpo, norm_by_std=False))(batch)
    # a singleton group: mean 0 (verl), so A = R = 1.5 on every sampled token, 0 elsewhere
    want = torch.zeros(1, 9)
    want[0, RESPONSE] = 1.5
    assert torch.allclose(adv, want) and returns is None


@pytest.mark.parametrize(
    ("reward", "expected"), [("turn", [0.866025, 0.866025, -0.866025, -0.866025]), ("episode", [0.0] * 4)]
)
def test_token_advantage_reads_the_configured_rewards(reward: str, expected: list[float]) -> None:
    # turn: returns-to-go (γ = 1) are 1.5, 1.5 in turn 1 and 1.0, 1.0 in turn 2; whitened: mean 1.25,
    # Bessel var = 4·0.25²/3 = 1/12, so ±0.25·sqrt(12) = ±0.866025. episode: 1.5 everywhere ⇒ all 0.
    adv, _ = TokenAdvantage(functools.partial(reinforce_pp, gamma=1.0), reward=reward)(_batch())
    assert torch.allclose(adv[0, RESPONSE], torch.tensor(expected), atol=1e-5)
    assert adv[0, [0, 1, 2, 5, 6]].abs().sum() == 0


def test_gae_advantage_raw_whitened_and_bilevel() -> None:
    batch, values = _batch(), _values()
    # γ = λ = 1, turn rewards: A_t = (rewards to go) − V_t = 1.5−0.2, 1.5−0.4, 1.0−0.6, 1.0−0.8
    adv, returns = GAEAdvantage(whiten_advantages=False)(batch, values)
    assert torch.allclose(adv[0, RESPONSE], torch.tensor([1.3, 1.1, 0.4, 0.2]))
    assert torch.allclose(returns[0, RESPONSE], torch.tensor([1.5, 1.5, 1.0, 1.0]))  # A + V, not whitened
    white, returns_w = GAEAdvantage()(batch, values)
    m = batch.loss_mask.bool()
    assert abs(float(white[m].mean())) < 1e-6 and abs(float(white[m].std()) - 1.0) < 1e-4
    assert torch.equal(returns_w, returns)
    # episode reward: 1.5 on the last token only ⇒ A_t = 1.5 − V_t
    adv_ep, _ = GAEAdvantage(reward="episode", whiten_advantages=False)(batch, values)
    assert torch.allclose(adv_ep[0, RESPONSE], torch.tensor([1.3, 1.1, 0.9, 0.7]))
    # bi-level, turn_gamma 0.5. Turn 2 (end V 0.8): δ = 1.0 − 0.8 = 0.2 = A₂, G₂ = 1.0.
    # Turn 1 (end V 0.4): δ = 0.5 + 0.5·0.8 − 0.4 = 0.5, A₁ = 0.5 + 0.5·0.2 = 0.6, G₁ = 1.0.
    # Tokens: pos 4 = G₁ − 0.4 = 0.6; pos 3 = (0 + 0.4 − 0.2) + 0.6 = 0.8; pos 8 = 0.2; pos 7 = 0.2 + 0.2 = 0.4
    bi, _ = GAEAdvantage(whiten_advantages=False, bilevel=True, turn_gamma=0.5)(batch, values)
    assert torch.allclose(bi[0, RESPONSE], torch.tensor([0.8, 0.6, 0.4, 0.2]))


def test_gae_advantage_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="critic"):
        GAEAdvantage()(_batch(), None)
    with pytest.raises(ValueError, match="algo.advantage.reward"):
        GAEAdvantage(reward="final")
    with pytest.raises(ValueError, match="bilevel"):
        GAEAdvantage(reward="episode", bilevel=True)
    with pytest.raises(ValueError, match="algo.advantage.lam"):
        GAEAdvantage(lam=1.5)


def _logps() -> tuple[torch.Tensor, torch.Tensor]:
    old, ref = torch.zeros(1, 9), torch.zeros(1, 9)
    old[0, RESPONSE] = torch.tensor([-1.0, -0.5, -2.0, -1.0])
    ref[0, RESPONSE] = torch.tensor([-1.2, -0.5, -1.5, -1.1])
    return old, ref


def test_kl_in_reward_fixed_coefficient() -> None:
    batch = _batch()
    old, ref = _logps()
    shaped, stats = KLInReward(FixedKLController(0.1), kind="k1")(batch, old, ref)
    # k1 = old − ref = 0.2, 0, −0.5, 0.1; −β·k1 = −0.02, 0, +0.05, −0.01 on the sampled tokens
    penalty = torch.tensor([-0.02, 0.0, 0.05, -0.01])
    assert torch.allclose(shaped.token_rewards[0, RESPONSE], torch.tensor([0.0, 0.0, 0.0, 1.5]) + penalty)
    assert torch.allclose(shaped.turn_rewards[0, RESPONSE], torch.tensor([0.0, 0.5, 0.0, 1.0]) + penalty)
    assert torch.allclose(shaped.returns, torch.tensor([1.5 + 0.02]))
    assert stats.coef == 0.1 and abs(stats.kl - (-0.05)) < 1e-7  # (0.2+0−0.5+0.1)/4
    assert abs(stats.penalty - 0.02) < 1e-7  # the row's return rose by −Σ β·k1 = 0.02
    assert list(stats.as_metrics()) == [
        "train/kl_reward/kl",
        "train/kl_reward/coef",
        "train/kl_reward/penalty",
    ]
    assert torch.equal(batch.returns, torch.tensor([1.5]))  # the input batch is untouched


def test_kl_in_reward_adaptive_controller_moves_beta() -> None:
    old, ref = _logps()
    term = KLInReward(AdaptiveKLController(0.1, target_kl=0.1, horizon=10), kind="k1")
    _, stats = term(_batch(), old, ref)
    # KL −0.05 vs target 0.1: error clip(−0.5 − 1, ±0.2) = −0.2; β = 0.1·(1 − 0.2·1/10) = 0.098
    assert stats.coef == 0.1
    assert abs(term.controller.value - 0.098) < 1e-12
    with pytest.raises(ValueError, match="algo.kl_reward.kind"):
        KLInReward(FixedKLController(0.1), kind="k9")


def test_objectives_pass_what_each_loss_needs() -> None:
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(2, 6, generator=g)
    old = logp + 0.01 * torch.randn(2, 6, generator=g)
    adv = torch.randn(2, 6, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0]], dtype=torch.float32)
    turns = torch.tensor([[0, 1, 1, 0, 2, 2], [0, 0, 1, 1, 1, 0]])
    token = TokenRatioLoss(functools.partial(clipped_surrogate, clip_low=0.2))(logp, old, adv, mask, turns)
    assert torch.equal(token[0], clipped_surrogate(logp, old, adv, mask, clip_low=0.2)[0])
    seq = TurnRatioLoss(functools.partial(gspo_surrogate))(logp, old, adv, mask, turns)
    assert torch.equal(seq[0], gspo_surrogate(logp, old, adv, mask, segment_index=turns)[0])
    # per-turn ratios differ from one ratio per row when the row holds two turns
    row = gspo_surrogate(logp, old, adv, mask, segment_index=(turns > 0).long())[0]
    assert not torch.equal(seq[0], row)
