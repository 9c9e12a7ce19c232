"""Hand-derived checks of the MI proxies (docs/method.md §3)."""

import math

import pytest
import torch

from ragen2.diagnostics.mi import METRIC_KEYS, STD_EPS, mi_metrics, true_rank, zscore

ln = math.log


def _hand_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4 rows × 2 prompts; every quantity below is derived from these in the test's comments."""
    logp_sum = torch.tensor(
        [
            [ln(0.5), ln(0.1)],  # row 0, true 0, |z| = 1
            [2 * ln(0.6), 2 * ln(0.2)],  # row 1, true 0, |z| = 2 -> per token [ln .6, ln .2]
            [ln(0.4), ln(0.2)],  # row 2, true 1, |z| = 1: retrieves the wrong prompt
            [ln(0.3), ln(0.3)],  # row 3, true 1, |z| = 1: a tie
        ],
        dtype=torch.float64,
    )
    return logp_sum, torch.tensor([0, 0, 1, 1]), torch.tensor([1, 2, 1, 1])


def test_hand_derived_4x2() -> None:
    out = mi_metrics(*_hand_case())
    assert tuple(out) == METRIC_KEYS
    # Per token: matched = [ln .5, ln .6, ln .2, ln .3];
    # marginal = ln((a + b)/2) = [ln .3, ln .4, ln .3, ln .3];
    # matched − marginal = [ln 5/3, ln 1.5, ln 2/3, 0], sum = ln(5/3 · 1.5 · 2/3) = ln 5/3.
    assert out["mi_est"] == pytest.approx(ln(5 / 3) / 4, abs=1e-12)
    # Per sequence: matched = [ln .5, ln .36, ln .2, ln .3], marginal = [ln .3, ln .2, ln .3, ln .3]
    # (row 1: (.36 + .04)/2 = .2); differences [ln 5/3, ln 1.8, ln 2/3, 0] sum to ln 2.
    assert out["mi_est_seq"] == pytest.approx(ln(2) / 4, abs=1e-12)
    assert out["mi_upper_bound"] == pytest.approx(ln(2), abs=1e-12)
    # H(Z|X) = −mean(matched): .5·.6·.2·.3 = .018 per token; .5·.36·.2·.3 = .0108 per sequence.
    assert out["cond_entropy"] == pytest.approx(-ln(0.018) / 4, abs=1e-12)
    assert out["cond_entropy_seq"] == pytest.approx(-ln(0.0108) / 4, abs=1e-12)
    # H(Z) = −mean(marginal): .3·.4·.3·.3 = .0108 per token; .3·.2·.3·.3 = .0054 per sequence.
    assert out["reasoning_entropy"] == pytest.approx(-ln(0.0108) / 4, abs=1e-12)
    assert out["reasoning_entropy_seq"] == pytest.approx(-ln(0.0054) / 4, abs=1e-12)
    # Ranks: row 0 → 1, row 1 → 1, row 2 → 2 (.4 > .2), row 3 → 2 (tie counts against it).
    assert out["retrieval_acc"] == 0.5
    assert out["retrieval_acc@2"] == out["retrieval_acc@4"] == out["retrieval_acc@8"] == 1.0
    assert out["retrieval_chance"] == 0.5
    assert out["retrieval_above_chance"] == 0.0
    # Per-token marginals: three at ln .3, one at ln .4; with d = ln 4/3 the deviations from the
    # mean are −d/4 (×3) and 3d/4, so var = (3d²/16 + 9d²/16)/4 = 3d²/16 and σ = d·√3/4.
    sigma = ln(4 / 3) * math.sqrt(3) / 4
    sigma_seq = ln(1.5) * math.sqrt(3) / 4  # same shape, d = ln(.3/.2)
    assert out["marginal_std"] == pytest.approx(sigma, abs=1e-12)
    assert out["marginal_std_seq"] == pytest.approx(sigma_seq, abs=1e-12)
    # σ is one number, so mean((m − g)/(σ + ε)) = mi_est/(σ + ε).
    assert out["mi_zscore"] == pytest.approx(ln(5 / 3) / 4 / (sigma + STD_EPS), abs=1e-12)
    assert out["mi_zscore_seq"] == pytest.approx(ln(2) / 4 / (sigma_seq + STD_EPS), abs=1e-12)


def test_single_prompt_has_no_information() -> None:
    # C = 1: marginal = L − log 1 = matched, so MI and z-score are 0, chance is 1 and always hit.
    out = mi_metrics(torch.tensor([[-3.0], [-1.0]]), torch.tensor([0, 0]), torch.tensor([3, 1]))
    assert out["mi_est"] == out["mi_est_seq"] == out["mi_upper_bound"] == 0.0
    assert out["mi_zscore"] == out["mi_zscore_seq"] == 0.0
    assert out["retrieval_chance"] == out["retrieval_acc"] == out["retrieval_acc@8"] == 1.0
    assert out["retrieval_above_chance"] == 0.0
    assert out["cond_entropy"] == pytest.approx(1.0)  # per token: −mean(−1, −1)
    assert out["cond_entropy_seq"] == pytest.approx(2.0)  # −mean(−3, −1)


def test_perfect_retrieval() -> None:
    # Row r (true column r) puts ln .7 on its prompt and ln .1 on the other three.
    n = 4
    logp = torch.full((n, n), ln(0.1)).fill_diagonal_(ln(0.7))
    out = mi_metrics(logp, torch.arange(n), torch.ones(n))
    assert out["retrieval_acc"] == out["retrieval_acc@2"] == 1.0
    assert out["retrieval_above_chance"] == pytest.approx(1 - 1 / 4)
    # C = 4: chance@2 = 2/4, chance@4 = chance@8 = 1; perfect retrieval is 1/2 above chance at k = 2
    assert [out[f"retrieval_chance@{k}"] for k in (2, 4, 8)] == [0.5, 1.0, 1.0]
    assert [out[f"retrieval_above_chance@{k}"] for k in (2, 4, 8)] == [0.5, 0.0, 0.0]
    # marginal = ln((.7 + 3·.1)/4) = ln .25 for every row: MI = ln(.7/.25) = ln 2.8, σ = 0.
    assert out["mi_est"] == pytest.approx(ln(2.8), abs=1e-6)
    assert out["marginal_std"] == pytest.approx(0.0, abs=1e-6)
    assert out["mi_zscore"] == pytest.approx(ln(2.8) / STD_EPS, rel=1e-4)


def test_uniform_rows_are_input_blind() -> None:
    # Equal scores in a row: marginal = log(C·e^a) − log C = a = matched, MI 0; every column ties
    # with the true one so the conservative rank is C: accuracy 0, @k hits only when k >= C = 3.
    logp = torch.tensor([[-2.0] * 3, [-5.0] * 3, [-1.0] * 3])
    out = mi_metrics(logp, torch.tensor([0, 1, 2]), torch.tensor([2, 5, 1]))
    assert out["mi_est"] == pytest.approx(0.0, abs=1e-12)
    assert out["mi_est_seq"] == pytest.approx(0.0, abs=1e-12)
    assert out["mi_zscore"] == pytest.approx(0.0, abs=1e-9)
    assert out["retrieval_acc"] == out["retrieval_acc@2"] == 0.0
    assert out["retrieval_acc@4"] == out["retrieval_acc@8"] == 1.0
    assert out["retrieval_above_chance"] == pytest.approx(-1 / 3)
    # chance@k = min(k, C)/C with C = 3: 2/3 at k = 2, 1 at k = 4 and 8 (every column is in the top k)
    assert out["retrieval_chance@2"] == pytest.approx(2 / 3)
    assert out["retrieval_chance@4"] == out["retrieval_chance@8"] == 1.0
    assert out["retrieval_above_chance@2"] == pytest.approx(0 - 2 / 3)
    assert out["retrieval_above_chance@4"] == out["retrieval_above_chance@8"] == 0.0
    # per-token rows are all −1: σ = 0; per sequence [−2, −5, −1]: mean −8/3, σ² = (4+49+25)/27.
    assert out["marginal_std"] == pytest.approx(0.0, abs=1e-12)
    assert out["marginal_std_seq"] == pytest.approx(math.sqrt(78 / 27), abs=1e-12)


def test_true_rank_counts_ties_against_the_true_column() -> None:
    scores = torch.tensor([[1.0, 1.0, 0.0, 2.0], [3.0, 1.0, 1.0, 1.0]])
    # row 0 true 0: one greater (2.0), one tie → rank 3; row 1 true 2: one greater, two ties → 4.
    assert true_rank(scores, torch.tensor([0, 2])).tolist() == [3, 4]


def test_zscore_helper() -> None:
    # differences [1, 3], σ = 0.999: mean(d)/(σ + 1e-3) = 2/1.
    assert zscore(torch.tensor([1.0, 4.0]), torch.tensor([0.0, 1.0]), 0.999) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="sigma"):
        zscore(torch.zeros(1), torch.zeros(1), -1.0)


@pytest.mark.parametrize(
    ("logp", "index", "tokens", "match"),
    [
        (torch.zeros(3), torch.zeros(3, dtype=torch.long), torch.ones(3), "logp_sum"),
        (torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.ones(2), "logp_sum"),
        (torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), torch.ones(0), "at least one row"),
        (torch.tensor([[0.0, float("-inf")]]), torch.zeros(1, dtype=torch.long), torch.ones(1), "non-finite"),
        (torch.zeros(2, 2), torch.zeros(3, dtype=torch.long), torch.ones(2), "prompt_index"),
        (torch.zeros(2, 2), torch.zeros(2), torch.ones(2), "prompt_index"),
        (torch.zeros(2, 2), torch.tensor([0, 2]), torch.ones(2), r"\[0, 2\)"),
        (torch.zeros(2, 2), torch.tensor([0, 1]), torch.ones(3), "num_tokens"),
        (torch.zeros(2, 2), torch.tensor([0, 1]), torch.tensor([1, 0]), "drop rows"),
    ],
)
def test_bad_input_raises(logp: torch.Tensor, index: torch.Tensor, tokens: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mi_metrics(logp, index, tokens)
