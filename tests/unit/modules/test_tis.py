"""The sampler–trainer mismatch: its metrics and truncated importance sampling (``algo.tis.cap``) against
hand-derived numbers, the config's refusal of a bad cap, (a deliberately mistuned sampler: tests/integration/test_mismatch.py)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from ragen2.algos.losses import tis_weights
from ragen2.distributed import ONE_PROCESS
from ragen2.errors import ConfigError
from ragen2.models.loading import load_model
from ragen2.modules.update import Update, _logprob_gap
from unit.modules.test_update import make_algo, make_batch, own_logp

LOG2 = math.log(2.0)


def test_tis_weights_are_the_capped_ratio_and_one_without_a_sampler_log_prob() -> None:
    old = torch.log(torch.tensor([[0.5, 0.2, 0.3, 0.1]]))
    sampler = torch.log(torch.tensor([[0.25, 0.4, 0.3, 0.1]]))
    sampler[0, 3] = float("nan")  # a sampler that reports no log-prob for this token
    # ratios 0.5/0.25 = 2 (capped at 1.5), 0.2/0.4 = 0.5, 1, and 1 for the NaN
    torch.testing.assert_close(tis_weights(old, sampler, cap=1.5), torch.tensor([[1.5, 0.5, 1.0, 1.0]]))
    # an overflowing ratio (Δ = 100) is the cap, not inf
    assert float(tis_weights(torch.tensor([[0.0]]), torch.tensor([[-100.0]]), cap=3.0)) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="cap=0"):
        tis_weights(old, sampler, cap=0)


@pytest.mark.parametrize("cap", ["0", "-1"])
def test_a_cap_that_is_not_positive_is_refused_naming_the_key(cap: str) -> None:
    with pytest.raises(ConfigError, match=rf"algo.tis.cap={cap}.* must be > 0.*Fix: algo.tis.cap=2"):
        make_algo(f"algo.tis.cap={cap}")


@pytest.mark.parametrize(
    ("shift", "cap", "weight", "capped"),
    [
        (LOG2, 1.5, 0.5, 0.0),  # the sampler gave each token twice π_old: w = 1/2
        (-LOG2, 1.5, 1.5, 1.0),  # half π_old: w = min(2, 1.5), every token at the cap
    ],
)
def test_loss_terms_weigh_each_tokens_loss(shift: float, cap: float, weight: float, capped: float) -> None:
    torch.manual_seed(0)
    policy = load_model("tiny")
    update = Update(make_algo(f"algo.tis.cap={cap}"), policy)
    batch = make_batch()
    rows = torch.arange(8)
    old = own_logp(policy, batch, rows)  # on-policy rows: old = this forward's own
    sampler = torch.where(batch.loss_mask.bool(), old + shift, torch.full_like(old, float("nan")))
    batch = dataclasses.replace(batch, sampler_logprobs=sampler)
    inputs = update.prepare(batch, rows, on_policy=rows, kl_reward=None)
    terms, _ = update.loss_terms(inputs, rows)
    # without the correction the loss is token-mean(−A · 1) = 1.5/23 (test_update's derivation); every
    # token's weight is the same w here, so it is w · 1.5/23
    assert terms.policy is not None
    assert float(terms.policy.detach()) == pytest.approx(weight * 1.5 / 23, rel=1e-4)
    assert terms.stats["tis_weight"] == pytest.approx(weight, rel=1e-4)
    assert terms.stats["tis_capped"] == capped


def test_the_mismatch_metrics_by_hand() -> None:
    batch = make_batch()
    mask = batch.loss_mask.bool()
    old = torch.zeros_like(batch.loss_mask)
    # Δ = log π_old − log π_sampler: +log 2 on the first sampled token of each row, −log 2 on the others
    first = mask & (mask.cumsum(-1) == 1)
    sampler = torch.where(first, old - LOG2, old + LOG2)
    sampler[~mask] = float("nan")
    m = _logprob_gap(old, dataclasses.replace(batch, sampler_logprobs=sampler), ONE_PROCESS)
    n_first, n = int(first.sum()), int(mask.sum())  # 8 rows, 23 tokens
    # k3 = e^Δ − 1 − Δ: 2 − 1 − log 2 = 0.3069 at Δ = log 2, 1/2 − 1 + log 2 = 0.1931 at Δ = −log 2
    want_k3 = (n_first * (1 - LOG2) + (n - n_first) * (LOG2 - 0.5)) / n
    assert (n_first, n) == (8, 23) and m is not None
    assert m.k3 == pytest.approx(want_k3, rel=1e-5)
    assert m.abs == pytest.approx(LOG2, rel=1e-5)
    assert m.max == pytest.approx(LOG2, rel=1e-5)
    assert m.large_share == 1.0  # every |Δ| = 0.693 > 0.1
    small = _logprob_gap(
        old, dataclasses.replace(batch, sampler_logprobs=torch.where(mask, old - 0.05, sampler)), ONE_PROCESS
    )
    assert small is not None and small.large_share == 0.0
    assert small.k3 == pytest.approx(math.exp(0.05) - 1 - 0.05, rel=1e-4)
