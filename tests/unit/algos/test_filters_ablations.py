"""The paper's two filter controls as pure functions: one RV quantile band of groups (the quartile ablation)
and the most extreme rollouts within each group (the trajectory-level filter). Masks derived by hand."""

from __future__ import annotations

import pytest
import torch

from ragen2.algos.filters import extreme_rows, select_groups
from ragen2.diagnostics.gradients import rv_buckets


def _mask(*bits: int) -> torch.Tensor:
    return torch.tensor([bool(b) for b in bits])


def _t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def _band(scores: torch.Tensor, band: int, **kw: object) -> torch.Tensor:
    return select_groups(scores, "quantile", band, **kw)


# ---------------------------------------------------------------- quantile bands


G8 = _t(0.5, 2.0, 0.1, 1.5, 0.0, 3.0, 0.7, 1.0)


@pytest.mark.parametrize(
    ("include_zero", "band", "want"),
    [
        # ascending: g4 0, g2 .1 | g0 .5, g6 .7 | g7 1, g3 1.5 | g1 2, g5 3; rank r → band 4 − ⌊4r/8⌋
        (True, 1, _mask(0, 1, 0, 0, 0, 1, 0, 0)),
        (True, 2, _mask(0, 0, 0, 1, 0, 0, 0, 1)),
        (True, 3, _mask(1, 0, 0, 0, 0, 0, 1, 0)),
        (True, 4, _mask(0, 0, 1, 0, 1, 0, 0, 0)),
        # without include_zero the quartiles are of the nonzero groups: g4 (score 0) drops out, C = 7,
        # ascending g2 g0 g6 g7 g3 g1 g5, ⌊4r/7⌋ = 0 0 1 1 2 2 3 → bands 4 4 3 3 2 2 1
        (False, 1, _mask(0, 0, 0, 0, 0, 1, 0, 0)),
        (False, 2, _mask(0, 1, 0, 1, 0, 0, 0, 0)),
        (False, 3, _mask(0, 0, 0, 0, 0, 0, 1, 1)),
        (False, 4, _mask(1, 0, 1, 0, 0, 0, 0, 0)),
    ],
)
def test_quartiles_of_eight_groups(include_zero: bool, band: int, want: torch.Tensor) -> None:
    assert torch.equal(_band(G8, band, include_zero=include_zero), want)


def test_six_groups_give_bands_of_one_and_two() -> None:
    # ascending g5 0, g2 .1, g0 .3, g3 .6, g1 .9, g4 1.2; ⌊4r/6⌋ = 0 0 1 2 2 3 → bands 4 4 3 2 2 1:
    # sizes 1, 2, 1, 2 from band 1
    s = _t(0.3, 0.9, 0.1, 0.6, 1.2, 0.0)
    masks = [_band(s, b, include_zero=True) for b in (1, 2, 3, 4)]
    assert torch.equal(masks[0], _mask(0, 0, 0, 0, 1, 0))
    assert torch.equal(masks[1], _mask(0, 1, 0, 1, 0, 0))
    assert torch.equal(masks[2], _mask(1, 0, 0, 0, 0, 0))
    assert torch.equal(masks[3], _mask(0, 0, 1, 0, 0, 1))


def test_five_groups_and_smallest_first() -> None:
    # ascending g2 1, g0 2, g4 3, g1 4, g3 5; ⌊4r/5⌋ = 0 0 1 2 3 → bands 4 4 3 2 1
    s = _t(2.0, 4.0, 1.0, 5.0, 3.0)
    assert [_band(s, b).nonzero().flatten().tolist() for b in (1, 2, 3, 4)] == [[3], [1], [4], [0, 2]]
    # largest=False ranks −s: ascending g3 g1 g4 g0 g2 → band 1 is the lowest score (g2), band 4 the two
    # highest (g1, g3)
    low = [_band(s, b, largest=False).nonzero().flatten().tolist() for b in (1, 2, 3, 4)]
    assert low == [[2], [0], [4], [1, 3]]


def test_ties_straddling_a_band_edge_go_by_group_id() -> None:
    # four groups at 1, four at 0: stable ascending g4 g5 g6 g7 g0 g1 g2 g3 → bands 4 4 3 3 2 2 1 1.
    # Each tied run is split by an edge; its higher ids land in the band of higher scores.
    s = _t(1, 1, 1, 1, 0, 0, 0, 0)
    assert torch.equal(_band(s, 1, include_zero=True), _mask(0, 0, 1, 1, 0, 0, 0, 0))
    assert torch.equal(_band(s, 2, include_zero=True), _mask(1, 1, 0, 0, 0, 0, 0, 0))
    assert torch.equal(_band(s, 3, include_zero=True), _mask(0, 0, 0, 0, 0, 0, 1, 1))
    assert torch.equal(_band(s, 4, include_zero=True), _mask(0, 0, 0, 0, 1, 1, 0, 0))


def test_fewer_groups_than_bands_and_nothing_to_rank() -> None:
    # C = 3 < 4: one band per group (g1 .5, g0 .2, g2 .1), band 4 empty
    s = _t(0.2, 0.5, 0.1)
    assert [_band(s, b).nonzero().flatten().tolist() for b in (1, 2, 3, 4)] == [[1], [0], [2], []]
    assert not _band(torch.zeros(4), 1).any()  # every group zero, none a candidate
    assert _band(torch.zeros(4), 1, include_zero=True).sum() == 1  # band 1 of four zeros: group 3
    assert _band(s, 1, bands=1).all()  # one band holds every candidate


def test_bands_partition_the_candidates_with_near_equal_sizes() -> None:
    gen = torch.Generator().manual_seed(0)
    for g in range(1, 40):
        s = torch.randint(0, 4, (g,), generator=gen).to(torch.float64)  # many ties and zeros
        for bands in (1, 3, 4, 6):
            masks = torch.stack([_band(s, b, bands=bands, include_zero=True) for b in range(1, bands + 1)])
            assert torch.equal(masks.sum(0), torch.ones(g, dtype=torch.long)), (s, bands)
            sizes = masks.sum(1)[: min(bands, g)]
            assert int(sizes.max() - sizes.min()) <= 1 and int(sizes.min()) >= 1
            # band 1 holds a maximum score and no band holds a score above any of a better band's
            assert masks[0][s.argmax()] or s[masks[0]].max() == s.max()
            for b in range(1, bands):
                if masks[b].any() and masks[b - 1].any():
                    assert s[masks[b]].max() <= s[masks[b - 1]].min()


def test_band_k_is_the_gradient_bucket_counted_from_the_top() -> None:
    # over the same groups, band k of n is rv_buckets' q(n + 1 − k): the quartile trained on is the
    # bucket whose gradient norms the diagnostics measure
    gen = torch.Generator().manual_seed(1)
    for g in range(1, 30):
        variance = (torch.randint(0, 5, (g,), generator=gen) * 0.25).to(torch.float64)
        for n in (4, 6):
            buckets = rv_buckets(variance, n)
            for k in range(1, n + 1):
                got = _band(variance, k, bands=n, include_zero=True).nonzero().flatten()
                want = buckets[len(buckets) - k] if k <= len(buckets) else torch.empty(0, dtype=torch.long)
                assert sorted(got.tolist()) == sorted(want.tolist()), (variance, n, k)


@pytest.mark.parametrize(
    ("value", "bands", "match"),
    [
        (0, 4, r"filter\.value=0: quantile .*filter\.bands=4.*Fix: filter\.value=1"),
        (5, 4, r"filter\.value=5: quantile .*from 1 \(the highest scores\) to 4"),
        (1.5, 4, r"filter\.value=1\.5: quantile"),
        (1, 0, r"filter\.bands=0: .*Fix: filter\.bands=4"),
        (1, 2.5, r"filter\.bands=2\.5: .*whole number"),
    ],
)
def test_quantile_errors(value: float, bands: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        select_groups(G8, "quantile", value, bands=bands)  # type: ignore[arg-type]


# ---------------------------------------------------------------- extreme rows


def test_top_and_bottom_quarter_of_sixteen() -> None:
    # fraction 0.5 of K = 16 → m = 8: the 4 highest (15 at 1, 14 at 7, 13 at 10, 12 at 4) and the 4 lowest
    # (0 at 2, 1 at 5, 2 at 8, 3 at 0)
    r = torch.tensor([[3, 15, 0, 7, 12, 1, 9, 14, 2, 5, 13, 6, 10, 4, 11, 8]], dtype=torch.float32)
    want = torch.zeros(1, 16, dtype=torch.bool)
    want[0, [0, 1, 2, 4, 5, 7, 8, 10]] = True
    assert torch.equal(extreme_rows(r, 0.5), want)


def test_small_groups_odd_counts_and_several_groups() -> None:
    # K = 4: m = max(2, ⌊2⌋) = 2, the top and the bottom; K = 5 at 0.5: ⌊2.5⌋ = 2, the same;
    # K = 5 at 0.6: m = 3, the top two (5 at 1, 4 at 4) and the bottom one (1 at 0)
    r = torch.tensor([[0.0, 1.0, 0.5, -1.0], [2.0, 3.0, -5.0, 2.5]])
    assert extreme_rows(r, 0.5).tolist() == [[False, True, False, True], [False, True, True, False]]
    five = torch.tensor([[1.0, 5.0, 3.0, 2.0, 4.0]])
    assert extreme_rows(five, 0.5).tolist() == [[True, True, False, False, False]]
    assert extreme_rows(five, 0.6).tolist() == [[True, True, False, False, True]]
    # at least one of each end: 0.1 of 4 is 0 rollouts, kept are the top and the bottom
    assert extreme_rows(r[:1], 0.1).tolist() == [[False, True, False, True]]
    assert extreme_rows(r, 1.0).all()


def test_ties_keep_the_ends_disjoint() -> None:
    # one stable descending sort: equal returns keep rollout order, so the top edge takes the lower index
    # and the bottom edge the higher one; a constant group still keeps m = 2 rollouts
    assert extreme_rows(torch.ones(1, 4), 0.5).tolist() == [[True, False, False, True]]
    # sorted: 1 (0), 1 (2), 0 (1), 0 (3) → top index 0, bottom index 3
    assert extreme_rows(torch.tensor([[1.0, 0.0, 1.0, 0.0]]), 0.5).tolist() == [[True, False, False, True]]
    # K = 6, m = 3: top two are the 1s at 0 and 2 (of three 1s), bottom one is the later 0 (index 5)
    r = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.5, 0.0]])
    assert extreme_rows(r, 0.5).tolist() == [[True, False, True, False, False, True]]


@pytest.mark.parametrize(
    ("returns", "fraction", "match"),
    [
        (torch.ones(2, 4), 0.0, r"filter\.trajectory_fraction.*\(0, 1\]"),
        (torch.ones(2, 4), 1.5, r"filter\.trajectory_fraction"),
        (torch.ones(2, 4), float("nan"), r"filter\.trajectory_fraction"),
        (torch.ones(4), 0.5, r"\[G, K\]"),
        (torch.tensor([[1.0, float("inf")]]), 0.5, "NaN or inf"),
    ],
)
def test_extreme_rows_errors(returns: torch.Tensor, fraction: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        extreme_rows(returns, fraction)
