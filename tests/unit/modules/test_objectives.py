"""Loss terms: separate tensors that sum, in a fixed order, to the loss the optimizer sees."""

from __future__ import annotations

import pytest
import torch

from ragen2.errors import ConfigError
from ragen2.modules.objectives import LossTerms, TokenRatioLoss


def test_terms_sum_to_the_total_and_each_backpropagates_alone() -> None:
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    terms = LossTerms(policy=w.sum(), entropy=-0.5 * w[0], kl=w[1].square(), value=3.0 * w[0])
    # total = value + policy + entropy + kl = 3·1 + 3 − 0.5 + 4 = 9.5
    assert terms.total.item() == pytest.approx(9.5)
    grads = [
        torch.autograd.grad(t, w, retain_graph=True)[0]
        for t in (terms.policy, terms.entropy, terms.kl, terms.value)
    ]
    (total_grad,) = torch.autograd.grad(terms.total, w)
    torch.testing.assert_close(sum(grads), total_grad)  # d/dw: (1,1) + (−.5,0) + (0,4) + (3,0) = (3.5, 5)
    torch.testing.assert_close(total_grad, torch.tensor([3.5, 5.0]))
    logged = terms.logged()
    assert logged == pytest.approx(
        {"loss": 9.5, "pg_loss": 3.0, "entropy_loss": -0.5, "kl_loss": 4.0, "value_loss": 3.0}
    )


def test_absent_terms_are_neither_summed_nor_logged() -> None:
    terms = LossTerms(value=torch.tensor(2.0), stats={"critic/value_loss": 4.0})
    assert terms.total.item() == 2.0
    assert terms.logged() == {"loss": 2.0, "value_loss": 2.0, "critic/value_loss": 4.0}
    with pytest.raises(ValueError, match="no term"):
        LossTerms().total  # noqa: B018


def test_objective_refuses_bad_keywords_at_construction() -> None:
    from functools import partial

    from ragen2.algos.losses import clipped_surrogate

    with pytest.raises(ConfigError, match=r"algo\.policy_loss\.fn: .*clip_low"):
        TokenRatioLoss(partial(clipped_surrogate, clip_low=1.5))
    with pytest.raises(ConfigError, match=r"algo\.policy_loss\.fn: .*agg"):
        TokenRatioLoss(partial(clipped_surrogate, agg="mean"))
