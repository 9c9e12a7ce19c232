"""The four regimes and the patient classifier, on constructed streams of MI passes.

Every stream starts from the same first pass FIRST = (H(Z|X) 2.0, contrast 1.0, retrieval above chance
0.4). With the default fractions (0.5) the thresholds are H ≤ 1.0 and contrast ≤ 0.5 (halving is exact in
floating point, so the boundary cases below are exact); retrieval is reported, not a vote.
"""

from __future__ import annotations

import pytest

from ragen2.diagnostics.regimes import (
    REGIME_TABLE,
    PassMetrics,
    Regime,
    RegimeState,
    RegimeThresholds,
    classify,
    evidence,
    regimes_markdown,
    step,
)

FIRST = PassMetrics(cond_entropy=2.0, contrast=1.0, retrieval_above_chance=0.4)
HEALTHY = PassMetrics(1.9, 0.9, 0.35)  # both axes above their thresholds
TEMPLATE = PassMetrics(1.9, 0.1, 0.0)  # entropy held, the contrast fallen
COMPRESSED = PassMetrics(0.6, 0.9, 0.38)  # entropy fallen, MI held
COLLAPSED = PassMetrics(0.6, 0.1, 0.0)  # both fallen

H, T, P, C = Regime.HEALTHY, Regime.TEMPLATE_COLLAPSE, Regime.COMPRESSED, Regime.COLLAPSED


def run(stream: list[PassMetrics], patience: int = 2, state: RegimeState | None = None):
    """Feed ``stream`` through ``step``: (declared regimes, raw regimes, passes where the alarm began, state)."""
    th = RegimeThresholds(patience=patience)
    state = state or RegimeState()
    declared, raw, began = [], [], []
    for i, now in enumerate(stream):
        out = step(state, now, th)
        state = out.state
        declared.append(state.regime)
        raw.append(out.raw)
        if out.alarm_began:
            began.append(i)
    return declared, raw, began, state


def test_codes_are_two_bits_and_the_table_matches_them() -> None:
    # code = mi_low + 2 · entropy_low
    assert [Regime.of(e, m) for e in (False, True) for m in (False, True)] == [H, T, P, C]
    assert [int(r) for r in (H, T, P, C)] == [0, 1, 2, 3]
    assert [r.alarm for r in (H, T, P, C)] == [False, True, False, True]
    assert [(code, name) for code, name, *_ in REGIME_TABLE] == [(int(r), r.label) for r in Regime]
    assert [row[2:4] for row in REGIME_TABLE] == [
        ("high", "high"),
        ("high", "low"),
        ("low", "high"),
        ("low", "low"),
    ]
    table = regimes_markdown()
    assert "| 1 | template collapse | high | low |" in table and table.count("\n") == 5


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (HEALTHY, H),
        (TEMPLATE, T),
        (COMPRESSED, P),
        (COLLAPSED, C),
        (FIRST, H),  # the first pass against itself: above half of every value
        (PassMetrics(1.0, 0.5, 0.2), C),  # exactly at every threshold counts as low
        (PassMetrics(1.0 + 1e-12, 0.5 + 1e-12, 0.2), H),  # just above both
        (PassMetrics(1.9, 0.5, 0.4), T),  # retrieval at its first value, the contrast halved: MI low
        (PassMetrics(1.9, 1.0, -0.1), H),  # retrieval fell below chance, the contrast held: MI high
        (PassMetrics(0.6, 0.5, 0.4), C),  # the same two under low entropy
        (PassMetrics(0.6, 1.0, -0.1), P),
    ],
)
def test_one_pass_on_its_own(now: PassMetrics, expected: Regime) -> None:
    assert classify(now, FIRST, RegimeThresholds()) == expected


def test_a_first_pass_at_chance_leaves_chance_as_the_threshold() -> None:
    # contrast −0.01: max(·, 0) = 0, so MI is low iff the contrast is ≤ 0 (no better than chance)
    blind = PassMetrics(2.0, -0.01, -0.05)
    th = RegimeThresholds()
    assert classify(blind, blind, th) == T
    assert classify(PassMetrics(2.0, 0.0, 0.0), blind, th) == T
    assert classify(PassMetrics(2.0, 0.02, -0.05), blind, th) == H  # the contrast rose above chance
    assert classify(PassMetrics(2.0, -0.3, 0.1), blind, th) == T  # retrieval rose: not a vote
    assert "no better than chance either" in evidence(blind, blind, th)
    assert "no better than chance" not in evidence(TEMPLATE, FIRST, th)


def test_fraction_zero_is_the_absolute_test_and_one_flags_any_pass_not_above_the_first() -> None:
    zero = RegimeThresholds(entropy_fraction=0.0, mi_fraction=0.0)
    assert classify(TEMPLATE, FIRST, zero) == H  # contrast 0.1 > 0: some input dependence left
    assert classify(PassMetrics(1.9, -0.01, 0.0), FIRST, zero) == T
    assert classify(PassMetrics(0.0, -0.01, 0.0), FIRST, zero) == C  # H(Z|X) = 0: deterministic reasoning
    one = RegimeThresholds(entropy_fraction=1.0, mi_fraction=1.0)
    assert classify(FIRST, FIRST, one) == C
    assert classify(PassMetrics(2.5, 1.5, 0.5), FIRST, one) == H


def test_healthy_then_template_collapse_then_collapsed() -> None:
    declared, raw, began, state = run([FIRST, HEALTHY, TEMPLATE, TEMPLATE, COLLAPSED, COLLAPSED])
    assert raw == [H, H, T, T, C, C]
    # patience 2: each axis changes side on its second consecutive pass across the threshold
    assert declared == [H, H, H, T, T, C]
    assert began == [3]  # the alarm once, when template collapse is declared; not again at collapsed
    assert state.first == FIRST and state.passes == 6 and state.warned
    assert (state.entropy_streak, state.mi_streak) == (0, 0)


def test_healthy_then_compressed_raises_no_alarm() -> None:
    declared, raw, began, state = run([FIRST, COMPRESSED, COMPRESSED, COMPRESSED])
    assert raw == [H, P, P, P]
    assert declared == [H, H, P, P]
    assert began == [] and not state.warned


def test_healthy_straight_to_collapsed_is_an_alarm_too() -> None:
    declared, _, began, _ = run([FIRST, COLLAPSED, COLLAPSED])
    assert declared == [H, H, C] and began == [2]


def test_recovery_and_relapse_warn_only_once() -> None:
    stream = [FIRST, TEMPLATE, TEMPLATE, HEALTHY, TEMPLATE, HEALTHY, HEALTHY, TEMPLATE, TEMPLATE]
    declared, _, began, state = run(stream)
    # pass 3 (healthy) starts a streak of 1; pass 4 (template again) resets it; passes 5-6 recover
    assert declared == [H, H, T, T, T, T, H, H, T]
    assert began == [2]
    assert state.regime == T and state.warned


def test_patience_not_yet_met_holds_the_declared_regime() -> None:
    declared, _, began, state = run([FIRST, TEMPLATE, TEMPLATE], patience=3)
    assert declared == [H, H, H] and began == [] and state.mi_streak == 2
    # one pass back above the threshold resets the streak: two more template passes are again not enough
    declared, _, began, state = run([HEALTHY, TEMPLATE, TEMPLATE], patience=3, state=state)
    assert declared == [H, H, H] and began == [] and state.mi_streak == 2
    declared, _, began, _ = run([TEMPLATE], patience=3, state=state)
    assert declared == [T] and began == [0]


def test_patience_one_declares_at_once() -> None:
    declared, _, began, _ = run([FIRST, TEMPLATE, COMPRESSED, HEALTHY], patience=1)
    assert declared == [H, T, P, H] and began == [1]


def test_patience_counts_per_axis_so_a_hovering_entropy_does_not_hide_lost_mi() -> None:
    # MI is lost on every pass while H(Z|X) hovers at its threshold: the raw regime alternates
    # template collapse / collapsed, which a per-regime streak would never declare
    declared, raw, began, _ = run([FIRST, TEMPLATE, COLLAPSED, TEMPLATE, COLLAPSED])
    assert raw == [H, T, C, T, C]
    assert declared == [H, H, T, T, T] and began == [2]


def test_state_round_trips_through_a_plain_dict() -> None:
    *_, state = run([FIRST, TEMPLATE, TEMPLATE, COLLAPSED])
    saved = state.to_dict()
    assert saved["first"] == {"cond_entropy": 2.0, "contrast": 1.0, "retrieval_above_chance": 0.4}
    assert RegimeState.from_dict(saved) == state
    assert RegimeState.from_dict(RegimeState().to_dict()) == RegimeState()
    # a resumed classifier continues exactly where the original would
    th = RegimeThresholds()
    assert step(RegimeState.from_dict(saved), COLLAPSED, th) == step(state, COLLAPSED, th)


def test_a_state_saved_with_the_z_score_reference_restarts_its_reference() -> None:
    # the shape the classifier saved when the MI axis read mi_zscore_ema: a template collapse declared
    # and warned after 4 passes
    old = {
        "first": {"cond_entropy": 2.0, "mi_zscore_ema": 1.0, "retrieval_above_chance": 0.4},
        "passes": 4,
        "entropy_low": False,
        "mi_low": True,
        "entropy_streak": 1,
        "mi_streak": 0,
        "warned": True,
    }
    state = RegimeState.from_dict(old)
    assert state == RegimeState(passes=4, warned=True)  # no reference, declared healthy, streaks reset
    # the next pass is the new reference; the run has warned already, so a later collapse does not again
    declared, _, began, state = run([HEALTHY, TEMPLATE, TEMPLATE], state=state)
    assert state.first == HEALTHY and state.passes == 7
    assert declared == [H, H, T] and began == []


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"entropy_fraction": 1.5}, "entropy_fraction=1.5"),
        ({"mi_fraction": -0.1}, "mi_fraction=-0.1"),
        ({"mi_fraction": "half"}, "mi_fraction='half'"),
        ({"patience": 0}, "patience=0"),
        ({"patience": 2.5}, "patience=2.5"),
    ],
)
def test_bad_thresholds_name_the_key_the_value_and_the_fix(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError) as err:
        RegimeThresholds(**kwargs)
    name = key.split("=")[0]
    assert str(err.value).startswith(f"{key} must be") and f"Fix: {name}=" in str(err.value)


def test_evidence_states_each_number_against_the_first_pass() -> None:
    text = evidence(TEMPLATE, FIRST, RegimeThresholds())
    assert text == (
        "H(Z|X) 1.9 nats/token vs 2 at the first pass (high: threshold 1); "
        "contrast 0.1 nats/token vs 1 at the first pass (low: threshold 0.5); "
        "retrieval above chance 0 vs 0.4 at the first pass (reported, not a vote)"
    )
