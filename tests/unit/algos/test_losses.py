"""Loss aggregation, PPO / GSPO surrogates, value and entropy losses, DAPO overlong penalty."""

from __future__ import annotations

import math

import pytest
import torch

from ragen2.algos.losses import (
    aggregate,
    clipped_surrogate,
    entropy_loss,
    gspo_surrogate,
    overlong_penalty,
    value_loss,
)

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "norm", "want"),
    [
        ("token-mean", None, 7 / 3),  # (1 + 2 + 4)/3
        ("seq-mean-token-mean", None, 2.75),  # rows 1.5 and 4, empty row 3 excluded
        ("seq-mean-token-sum", None, 3.5),  # rows 3 and 4
        ("seq-mean-token-sum-norm", None, 7 / 6),  # (3/3 + 4/3)/2, norm = width 3
        ("seq-mean-token-sum-norm", 2.0, 1.75),  # (3/2 + 4/2)/2
    ],
)
def test_aggregate(mode: str, norm: float | None, want: float) -> None:
    assert aggregate(LOSS, MASK, mode, norm).item() == pytest.approx(want)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_aggregate_all_masked_is_zero_with_grad(mode: str) -> None:
    x = LOSS.clone().requires_grad_(True)
    out = aggregate(x, torch.zeros(3, 3), mode)
    out.backward()
    assert out.item() == 0.0 and torch.equal(x.grad, torch.zeros(3, 3))


def test_aggregate_errors() -> None:
    with pytest.raises(ValueError, match=r"agg='mean' \(algo\.loss_agg\)\. Fix"):
        aggregate(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="norm"):
        aggregate(LOSS, MASK, "seq-mean-token-sum-norm", 0.0)
    with pytest.raises(ValueError, match="shape"):
        aggregate(LOSS, MASK[:2], "token-mean")


# ratios (1.5, .5, .9, 5, .5), advantages (1, 1, −1, −1, −1), ε_low .2, ε_high .28, c = 3:
# t0: max(−1.5, −1.28) = −1.28 (clipped high)   t1: max(−.5, −.8) = −.5
# t2: .9 (inside)                                t3: max(5, 1.28) = 5 → dual min(5, 3) = 3
# t4: max(.5, .8) = .8 (clipped low)             token-mean = 2.92/5 = .584
RATIOS = [1.5, 0.5, 0.9, 5.0, 0.5]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)


def _logp() -> torch.Tensor:
    return torch.log(torch.tensor([RATIOS], dtype=torch.float64)).requires_grad_(True)


def test_clipped_surrogate_values_and_stats() -> None:
    logp = _logp()
    loss, st = clipped_surrogate(logp, torch.zeros(1, 5, dtype=torch.float64), ADV, torch.ones(1, 5))
    assert loss.item() == pytest.approx(0.584)
    assert st["clipfrac_high"].item() == pytest.approx(0.2)
    assert st["clipfrac_low"].item() == pytest.approx(0.2)
    assert st["clipfrac"].item() == pytest.approx(0.4)
    assert st["clipfrac_dual"].item() == pytest.approx(0.2)
    # approx_kl = mean(−log r) = −log(1.5·.5·.9·5·.5)/5; ratio_mean = 8.4/5
    assert st["approx_kl"].item() == pytest.approx(-math.log(1.6875) / 5)
    assert st["ratio_mean"].item() == pytest.approx(1.68)
    assert all(not v.requires_grad for v in st.values())
    # Gradient: only unclipped tokens: d(−A·r)/dlogp = −A·r → t1 −.5/5, t2 .9/5.
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.1, 0.18, 0.0, 0.0]], dtype=torch.float64))


def test_clipped_surrogate_without_dual_clip() -> None:
    # t3 keeps 5: (−1.28 − .5 + .9 + 5 + .8)/5 = .984
    loss, st = clipped_surrogate(
        _logp(), torch.zeros(1, 5, dtype=torch.float64), ADV, torch.ones(1, 5), dual_clip=None
    )
    assert loss.item() == pytest.approx(0.984) and st["clipfrac_dual"].item() == 0.0


def test_clipped_surrogate_mask_and_ratio_clamp() -> None:
    # Masking t3 out: (−1.28 − .5 + .9 + .8)/4 = −.02. A masked token with log-ratio 1000 changes nothing
    # (its ratio is exp(20) after the clamp, finite, and masked).
    logp = _logp().detach().clone()
    logp[0, 3] = 1000.0
    mask = torch.tensor([[1, 1, 1, 0, 1]])
    loss, st = clipped_surrogate(logp, torch.zeros(1, 5, dtype=torch.float64), ADV, mask)
    assert loss.item() == pytest.approx(-0.02)
    assert math.isfinite(st["ratio_mean"].item())


def test_clipped_surrogate_errors() -> None:
    z = torch.zeros(1, 5)
    with pytest.raises(ValueError, match=r"dual_clip=1\.0 must be > 1"):
        clipped_surrogate(z, z, z, z, dual_clip=1.0)
    with pytest.raises(ValueError, match=r"clip_low=1\.0 must be in \[0, 1\)"):
        clipped_surrogate(z, z, z, z, clip_low=1.0)


def test_gspo_segment_ratio() -> None:
    # One row, two turns: log-ratios (.1, .3 | −.2, 0) → segment means .2 and −.1.
    # ε (.2, .3): s = e^.2 = 1.2214 (A = 1) and e^−.1 = .9048 (A = −1), both inside the clip range.
    # seq-mean-token-mean: (2·(−e^.2) + 2·e^−.1)/4. Gradient per token = −A·s_seg/4.
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.tensor([[0.1, 0.3, -0.2, 0.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    seg = torch.tensor([[0, 0, 1, 1]])
    loss, st = gspo_surrogate(logp, old, adv, torch.ones(1, 4), seg, clip_low=0.2, clip_high=0.3)
    a, b = math.exp(0.2), math.exp(-0.1)
    assert loss.item() == pytest.approx((-2 * a + 2 * b) / 4)
    assert st["ratio_mean"].item() == pytest.approx((2 * a + 2 * b) / 4)
    assert st["clipfrac"].item() == 0.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-a / 4, -a / 4, b / 4, b / 4]], dtype=torch.float64))


def test_gspo_default_clip_and_segments_per_row() -> None:
    # Default ε (3e-4, 4e-4): e^.2 > 1.0004 with A > 0 → clipped high; e^−.1 < .9997 with A < 0 → low.
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = torch.tensor([[0.1, 0.3, -0.2, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    _, st = gspo_surrogate(logp, old, adv, torch.ones(1, 4), torch.tensor([[0, 0, 1, 1]]))
    assert st["clipfrac_high"].item() == 0.5 and st["clipfrac_low"].item() == 0.5
    # Same segment id 0 in two rows: separate segments, means .2 and −.1; masked token (id −1) ignored.
    logp2 = torch.tensor([[0.1, 0.3, 5.0], [-0.2, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    seg = torch.tensor([[0, 0, -1], [0, 0, -1]])
    _, st2 = gspo_surrogate(logp2, torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3), mask, seg)
    assert st2["ratio_mean"].item() == pytest.approx((2 * math.exp(0.2) + 2 * math.exp(-0.1)) / 4)


def test_gspo_rejects_negative_segment_on_response_token() -> None:
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="segment_index"):
        gspo_surrogate(z, z, z, torch.ones(1, 2), torch.tensor([[0, -1]]))


def test_value_loss() -> None:
    # clip .2. t0: v 1, old .5, R 0: (1)² vs (.7)² → 1.  t1: v = old = 2, R 3 → 1.
    # t2: v 1, old 0, R 1: 0 vs (.2 − 1)² = .64 → .64 (clipped counts). 0.5·(2.64/3) = .44.
    v = torch.tensor([[1.0, 2.0, 1.0]], requires_grad=True)
    old = torch.tensor([[0.5, 2.0, 0.0]])
    ret = torch.tensor([[0.0, 3.0, 1.0]])
    loss, st = value_loss(v, old, ret, torch.ones(1, 3), clip=0.2)
    assert loss.item() == pytest.approx(0.44)
    assert st["vf_clipfrac"].item() == pytest.approx(1 / 3)
    assert st["vpred_mean"].item() == pytest.approx(4 / 3)
    # Unclipped: 0.5·(1 + 1 + 0)/3 = 1/3.
    loss2, st2 = value_loss(v, old, ret, torch.ones(1, 3), clip=None)
    assert loss2.item() == pytest.approx(1 / 3) and st2["vf_clipfrac"].item() == 0.0


def test_entropy_loss_is_aggregated_entropy() -> None:
    assert entropy_loss(LOSS, MASK).item() == pytest.approx(7 / 3)
    assert entropy_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)


def test_overlong_penalty() -> None:
    # max 100, cache 20: ≤ 80 → 0; 90 → (80 − 90)/20 = −.5; 100 → −1; beyond → −1.
    lengths = torch.tensor([50, 80, 90, 100, 120])
    torch.testing.assert_close(overlong_penalty(lengths, 100, 20), torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(
        overlong_penalty(lengths, 100, 20, 0.5), torch.tensor([0.0, 0.0, -0.25, -0.5, -0.5])
    )
    # cache 0: hard cut above max_len only.
    torch.testing.assert_close(overlong_penalty(lengths, 100, 0), torch.tensor([0.0, 0.0, 0.0, 0.0, -1.0]))
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, 100, 200)
