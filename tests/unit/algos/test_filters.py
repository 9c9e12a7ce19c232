"""SNR-aware filter: hand-derived masks for every strategy and edge case, plus a reference cross-check."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from ragen2.algos.filters import filter_stats, group_scores, loss_scale, select_groups


def _mask(*bits: int) -> torch.Tensor:
    return torch.tensor([bool(b) for b in bits])


def _t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


# ---------------------------------------------------------------- group_scores
# (each registered score's reduction: tests/unit/data/test_group_filter.py)

VALUES = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0]])


def test_group_scores_reduces_each_group_in_float64() -> None:
    # row 0: mean 0.5, squared deviations 4·0.25 = 1, Bessel var 1/3; row 1: constant → 0; row 2: var 3/3 = 1
    scores = group_scores(VALUES.float(), lambda x: x.var(dim=1), "reward_var", min_rollouts=2)
    assert scores.dtype == torch.float64
    torch.testing.assert_close(scores, _t(1 / 3, 0.0, 1.0))


def test_group_scores_errors() -> None:
    with pytest.raises(ValueError, match=r"filter\.score='reward_std' needs at least 2 rollouts"):
        group_scores(torch.ones(3, 1), torch.std, "reward_std", min_rollouts=2)
    with pytest.raises(ValueError, match=r"\[G, K\]"):
        group_scores(torch.ones(3), torch.mean, "reward_mean")
    with pytest.raises(ValueError, match="NaN"):
        group_scores(torch.tensor([[1.0, float("nan")]]), torch.mean, "reward_mean")


# ---------------------------------------------------------------- top_p linear

SCORES = _t(0.5, 0.0, 1.0, 0.3, 0.2)


def test_top_p_linear_default() -> None:
    # Zero group 1 dropped; Σ = 2.0, target 0.9·2 − 0.01 = 1.79. Descending 1.0, 0.5, 0.3, 0.2:
    # running 1.0, 1.5, 1.8 ≥ 1.79 → keep groups 2, 0, 3.
    assert torch.equal(select_groups(SCORES), _mask(1, 0, 1, 1, 0))


def test_top_p_linear_small_p() -> None:
    # target 0.5·2 − 0.01 = 0.99: the first score 1.0 suffices.
    assert torch.equal(select_groups(SCORES, "top_p", 0.5), _mask(0, 0, 1, 0, 0))


def test_top_p_eps_matters() -> None:
    # Four scores of 1, p = 0.75: eps 0.01 → target 2.99 → 3 groups; p = 0.76, eps 0 → 3.04 → 4 groups.
    ones = torch.ones(4)
    assert int(select_groups(ones, "top_p", 0.75).sum()) == 3
    assert int(select_groups(ones, "top_p", 0.76, eps=0.0).sum()) == 4


def test_top_p_ties_are_stable() -> None:
    # Target 0.5·4 − 0 = 2 → two of four equal scores; the stable sort keeps the lowest indices.
    assert torch.equal(select_groups(torch.ones(4), "top_p", 0.5, eps=0.0), _mask(1, 1, 0, 0))


def test_top_p_all_zero_is_empty() -> None:
    zeros = torch.zeros(4)
    # include_zero=False: no candidates. include_zero=True: target 0.9·0 − 0.01 < 0 is met by the
    # empty prefix before any score is added → empty again (Σ ≈ 0).
    assert not select_groups(zeros).any()
    assert not select_groups(zeros, include_zero=True).any()


def test_top_p_value_at_least_one_keeps_candidates() -> None:
    # p ≥ 1 keeps every candidate: without zeros when include_zero=False, everything when True.
    assert torch.equal(select_groups(SCORES, "top_p", 1.0), _mask(1, 0, 1, 1, 1))
    assert torch.equal(select_groups(SCORES, "top_p", 1.5), _mask(1, 0, 1, 1, 1))
    assert select_groups(SCORES, "top_p", 1.0, include_zero=True).all()
    assert select_groups(torch.zeros(3), "top_p", 1.0, include_zero=True).all()


def test_top_p_include_zero_changes_nothing_for_positive_prefix() -> None:
    # With the zero kept, Σ and target are unchanged (1.79); the zero sorts last and is never reached.
    assert torch.equal(select_groups(SCORES, include_zero=True), _mask(1, 0, 1, 1, 0))


def test_top_p_negative_sum_is_empty() -> None:
    # Σ = 1 − 0.5 − 0.8 = −0.3, target −0.28: met before adding anything → nothing kept.
    assert not select_groups(_t(1.0, -0.5, -0.8)).any()


def test_top_p_smallest() -> None:
    # largest=False sorts ascending: Σ = 6, target 0.5·6 − 0.01 = 2.99; 1.0 → 1, +2.0 → 3 ≥ 2.99.
    assert torch.equal(select_groups(_t(3.0, 1.0, 2.0), "top_p", 0.5, largest=False), _mask(0, 1, 1))
    # Ascending with a negative first: the loop stops at the first score ≤ 0 with 0 < 3.59 → empty.
    assert not select_groups(_t(-1.0, 2.0, 3.0), "top_p", 0.9, largest=False).any()


def test_top_p_single_group() -> None:
    # G = 1: target 0.9·0.4 − 0.01 = 0.35 ≤ 0.4 → kept; a single zero group → empty.
    assert torch.equal(select_groups(_t(0.4)), _mask(1))
    assert not select_groups(_t(0.0)).any()


# ---------------------------------------------------------------- top_p softmax


def test_top_p_softmax() -> None:
    # softmax(log 2, log 6, log 2) = (0.2, 0.6, 0.2); sorted (0.6, 0.2, 0.2), cumulative (0.6, 0.8, 1).
    # p = 0.5 → first cumulative ≥ 0.5 is index 0 → 1 group; p = 0.7 → index 1 → 2 groups, tie → lower idx.
    s = torch.log(_t(2.0, 6.0, 2.0))
    with pytest.warns(UserWarning, match="scale"):
        assert torch.equal(select_groups(s, "top_p", 0.5, mode="softmax"), _mask(0, 1, 0))
    with pytest.warns(UserWarning):
        assert torch.equal(select_groups(s, "top_p", 0.7, mode="softmax"), _mask(1, 1, 0))


def test_top_p_softmax_is_scale_dependent() -> None:
    # Scores (1, 2): softmax (0.269, 0.731) → p = 0.8 needs both; ×10: (4.5e-5, 0.99995) → one.
    s = _t(1.0, 2.0)
    with pytest.warns(UserWarning):
        assert int(select_groups(s, "top_p", 0.8, mode="softmax").sum()) == 2
        assert int(select_groups(10 * s, "top_p", 0.8, mode="softmax").sum()) == 1


# ---------------------------------------------------------------- top_k, top_k_abs, min_p, none


def test_top_k_fraction() -> None:
    # G = 5: int(0.5·5) = 2 → groups 2 (1.0) and 0 (0.5); int(0.1·5) = 0 → at least 1 → group 2.
    assert torch.equal(select_groups(SCORES, "top_k", 0.5), _mask(1, 0, 1, 0, 0))
    assert torch.equal(select_groups(SCORES, "top_k", 0.1), _mask(0, 0, 1, 0, 0))
    # int(1.0·4) = 4 but only one non-zero candidate → 1.
    assert torch.equal(select_groups(_t(0, 0, 0.7, 0), "top_k", 1.0), _mask(0, 0, 1, 0))


def test_top_k_abs_smallest_negative_and_ties() -> None:
    s = _t(-1.0, -3.0, 2.0, -3.0)
    # Two smallest are the two −3s; with one, the tie goes to the lower index (1).
    assert torch.equal(select_groups(s, "top_k_abs", 2, largest=False), _mask(0, 1, 0, 1))
    assert torch.equal(select_groups(s, "top_k_abs", 1, largest=False), _mask(0, 1, 0, 0))
    # Largest 10 of 4 candidates → all 4.
    assert select_groups(s, "top_k_abs", 10).all()


def test_min_p() -> None:
    # largest: keep s ≥ 0.5·max = 0.5 → groups 1 (1.0), 2 (0.5).
    assert torch.equal(select_groups(_t(0.2, 1.0, 0.5, 0.49), "min_p", 0.5), _mask(0, 1, 1, 0))
    # smallest: keep s ≤ min/p = 0.2/0.5 = 0.4 → groups 0 (0.2), 2 (0.3).
    assert torch.equal(select_groups(_t(0.2, 1.0, 0.3, 0.5), "min_p", 0.5, largest=False), _mask(1, 0, 1, 0))


def test_none_keeps_everything() -> None:
    assert select_groups(torch.zeros(3), "none").all()


@pytest.mark.parametrize(
    ("strategy", "value", "kwargs", "match"),
    [
        ("best", 0.9, {}, r"filter\.strategy.*'best'"),
        ("top_p", 0.0, {}, r"filter\.value.*top_p"),
        ("top_p", 0.9, {"mode": "cubic"}, r"filter\.mode.*'cubic'"),
        ("top_p", 0.9, {"eps": -1.0}, r"filter\.eps"),
        ("top_k", 1.5, {}, r"filter\.value.*top_k"),
        ("top_k_abs", 2.5, {}, r"filter\.value.*top_k_abs"),
        ("min_p", 0.0, {}, r"filter\.value.*min_p"),
        ("top_p", float("nan"), {}, r"filter\.value.*finite"),
    ],
)
def test_select_groups_errors(strategy: str, value: float, kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        select_groups(SCORES, strategy, value, **kwargs)


def test_select_groups_bad_scores() -> None:
    with pytest.raises(ValueError, match="NaN"):
        select_groups(_t(1.0, float("nan")))
    with pytest.raises(ValueError, match=r"\[G\]"):
        select_groups(torch.ones(2, 2))


# ---------------------------------------------------------------- cross-check with the reference


def _reference_select(
    scores: torch.Tensor,
    strategy: str,
    value: float,
    mode: str,
    include_zero: bool,
    eps: float,
    largest: bool,
) -> set[int]:
    """Transcription of the logic of RAGEN `RolloutFilter._select_top_groups` (rollout_filter.py):
    float32 scores, zero drop, strategy dispatch, returning the kept group indices."""
    scores = scores.float()
    num_groups = scores.numel()
    indices = torch.arange(num_groups)
    if not include_zero:
        nz = scores.abs() > 1e-10
        scores, indices = scores[nz], indices[nz]
        if indices.numel() == 0:
            return set()
    if strategy == "top_p":
        if value >= 1.0:
            return set(indices.tolist())
        if mode == "softmax":
            probs = torch.softmax(scores if largest else -scores, dim=0)
            sp, si = torch.sort(probs, descending=True)
            k = min(int(torch.searchsorted(torch.cumsum(sp, 0), value).item()) + 1, indices.numel())
            return set(indices[si[:k]].tolist())
        ss, si = torch.sort(scores, descending=largest)
        threshold = value * scores.sum() - eps
        total, count = 0.0, 0
        for s in ss:
            if total >= threshold or s.item() <= 0:
                break
            total += s.item()
            count += 1
        return set(indices[si[:count]].tolist()) if total >= threshold else set()
    if strategy in ("top_k", "top_k_abs"):
        # top_k's fraction is of num_groups, i.e. all groups before the zero drop.
        k = int(value * num_groups) if strategy == "top_k" else int(value)
        k = max(min(k, indices.numel()), 1)
        picked = (scores if largest else -scores).topk(k).indices
        return set(indices[picked].tolist())
    if largest:
        hit = scores >= scores.max() * value - 1e-10
    else:
        hit = scores <= scores.min() / (value + 1e-10) + 1e-10
    return set(indices[hit].tolist())


def test_matches_reference_on_random_scores() -> None:
    # Random continuous scores (no ties, so the reference's unspecified tie order cannot matter),
    # with one exact zero and some negatives, over every strategy × option combination.
    gen = torch.Generator().manual_seed(0)
    configs = [
        ("top_p", v, m, iz, lg)
        for v in (0.3, 0.6, 0.9, 0.98, 1.0)
        for m in ("linear", "softmax")
        for iz in (False, True)
        for lg in (True, False)
    ]
    configs += [
        (s, v, "linear", iz, lg)
        for s in ("top_k", "min_p")
        for v in (0.1, 0.5, 1.0)
        for iz in (False, True)
        for lg in (True, False)
    ]
    configs += [
        ("top_k_abs", v, "linear", iz, lg) for v in (1, 3, 50) for iz in (False, True) for lg in (True, False)
    ]
    n_checked = 0
    for trial in range(30):
        g = int(torch.randint(1, 17, (1,), generator=gen))
        s = torch.rand(g, generator=gen, dtype=torch.float64) * 2.0
        if trial % 3 == 0:
            s = s - 0.5  # some negative scores
        if trial % 2 == 0:
            s[int(torch.randint(0, g, (1,), generator=gen))] = 0.0
        for strategy, value, mode, include_zero, largest in configs:
            want = _reference_select(s, strategy, value, mode, include_zero, 0.01, largest)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # the softmax warning is tested above
                got = select_groups(s, strategy, value, mode=mode, include_zero=include_zero, largest=largest)
            assert set(got.nonzero().squeeze(-1).tolist()) == want, (
                s,
                strategy,
                value,
                mode,
                include_zero,
                largest,
            )
            n_checked += 1
    assert n_checked == 30 * len(configs)


# ---------------------------------------------------------------- stats and loss scaling


def test_filter_stats() -> None:
    # scores (0, 1, 3), keep groups 1, 2. mean 4/3; population var ((16+1+25)/9)/3 = 14/9 → std √14/3;
    # kept (1, 3): mean 2, pop std 1, max 3; cv = (√14/3)/(4/3) = √14/4.
    st = filter_stats(_t(0.0, 1.0, 3.0), _mask(0, 1, 1))
    want = {
        "kept": 2.0,
        "kept_ratio": 2 / 3,
        "zero_score": 1.0,
        "score_mean": 4 / 3,
        "score_std": math.sqrt(14) / 3,
        "score_max": 3.0,
        "kept_score_mean": 2.0,
        "kept_score_std": 1.0,
        "kept_score_max": 3.0,
        "score_cv": math.sqrt(14) / 4,
        "empty": 0.0,
    }
    assert st.keys() == want.keys()
    for k, v in want.items():
        assert st[k] == pytest.approx(v), k


def test_filter_stats_empty_and_zero_mean() -> None:
    # Nothing kept: kept_* are 0 and empty = 1. Mean (−1 + 1)/2 = 0 → cv defined as 0.
    st = filter_stats(_t(-1.0, 1.0), _mask(0, 0))
    assert st["empty"] == 1.0 and st["kept"] == 0.0 and st["kept_score_max"] == 0.0
    assert st["score_cv"] == 0.0 and st["score_std"] == pytest.approx(1.0)


def test_loss_scale() -> None:
    assert loss_scale(0.25, "none") == 1.0
    assert loss_scale(0.25, "linear") == 0.25
    assert loss_scale(0.25, "sqrt") == pytest.approx(0.5)
    with pytest.raises(ValueError, match=r"algo\.loss_scaling"):
        loss_scale(0.5, "log")
    with pytest.raises(ValueError, match="kept_ratio"):
        loss_scale(1.5, "linear")


def test_random_drop_keeps_as_many_as_top_p_drawn_from_every_group() -> None:
    # scores (4, 3, 2, 1, 0, 0): top_p 0.9 keeps the first three (4 + 3 + 2 = 9 ≥ 0.9 · 10 − 0.01), so
    # random_drop keeps three groups, drawn from all six (zero-score groups too), the same for one seed
    scores = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, 0.0])
    assert select_groups(scores, "top_p", 0.9).tolist() == [True, True, True, False, False, False]
    draws = [
        select_groups(scores, "random_drop", 0.9, generator=torch.Generator().manual_seed(s))
        for s in range(200)
    ]
    assert all(int(d.sum()) == 3 for d in draws)
    # each group kept about half the time (3 of 6): a draw blind to the scores; sd over 200 draws ≈ 0.035
    share = torch.stack(draws).double().mean(0)
    assert torch.all((share - 0.5).abs() < 0.15), share
    again = select_groups(scores, "random_drop", 0.9, generator=torch.Generator().manual_seed(7))
    assert torch.equal(again, draws[7])
    with pytest.raises(ValueError, match="generator"):
        select_groups(scores, "random_drop", 0.9)


def test_the_filter_draws_from_its_seed_and_the_iteration() -> None:
    from ragen2.data.group_filter import GroupFilter

    f = GroupFilter(strategy="random_drop", value=0.9, seed=3)
    scores = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0, 0.0, 0.5, 0.25])
    first, stats = f.select(scores, iteration=5)
    assert int(first.sum()) == int(select_groups(scores, "top_p", 0.9).sum()) == stats["kept"]
    assert torch.equal(f.select(scores, iteration=5)[0], first)  # a resumed run draws the same
    others = [f.select(scores, iteration=i)[0] for i in range(6, 16)]
    assert any(not torch.equal(o, first) for o in others)  # and each iteration draws anew
