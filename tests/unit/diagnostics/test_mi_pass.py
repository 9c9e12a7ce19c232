"""The typed MI pass: the one place it becomes logged numbers, what the regimes read of it, and the findings
the module logs with its own numbers."""

from __future__ import annotations

import math

from ragen2.diagnostics.findings import Findings, held_findings
from ragen2.diagnostics.gradients import ALL, Bucket, GradientPass, TermNorm
from ragen2.diagnostics.mi_pass import CurvePass, MIPass
from ragen2.diagnostics.regimes import PassMetrics, Regime, RegimeReading

PROXIES = {
    "mi_est": 0.25,
    "cond_entropy": 1.5,
    "mi_zscore_ema": 0.3,
    "contrast": 0.7,
    "retrieval_above_chance": 0.1,
}


def test_as_metrics_names_every_curve_s_numbers_and_the_cost() -> None:
    found = MIPass(
        iteration=5,
        curves={"first_turn": CurvePass(12, 8, 4, PROXIES), "turn_2": CurvePass(1)},
        tokens_processed=90,
        token_bound=120,
        seconds=2.5,
    )
    assert found.as_metrics() == {
        "diag/first_turn/valid_rows": 12.0,
        **{f"diag/first_turn/{k}": v for k, v in PROXIES.items()},
        "diag/first_turn/rows": 8.0,
        "diag/first_turn/columns": 4.0,
        "diag/first_turn/chance": 0.25,
        "diag/turn_2/valid_rows": 1.0,  # fewer than two distinct contexts: no MI, only what it could draw
        "diag/tokens_processed": 90.0,
        "diag/token_bound_ratio": 0.75,
        "time/diagnostics": 2.5,
    }
    # nothing scored: no bound, so no ratio
    assert "diag/token_bound_ratio" not in MIPass(0, {"first_turn": CurvePass(1)}).as_metrics()


def test_the_regimes_read_three_finite_numbers_of_a_curve() -> None:
    found = MIPass(3, {"trajectory": CurvePass(8, 8, 8, PROXIES), "first_turn": CurvePass(0)})
    assert found.regime_input("trajectory") == PassMetrics(1.5, 0.7, 0.1)  # the z-score is not read
    assert found.regime_input("first_turn") is None  # no MI on the curve
    assert found.regime_input("turn_2") is None  # no such curve
    nan = CurvePass(8, 8, 8, {**PROXIES, "contrast": math.nan})
    assert MIPass(3, {"trajectory": nan}).regime_input("trajectory") is None
    z_nan = CurvePass(8, 8, 8, {**PROXIES, "mi_zscore_ema": math.nan})  # logged, but no input of the regimes
    assert MIPass(3, {"trajectory": z_nan}).regime_input("trajectory") == PassMetrics(1.5, 0.7, 0.1)


def test_findings_log_only_the_iteration_s_own_passes() -> None:
    findings = Findings()
    assert findings.before_update(0) == (None, None)
    findings.mi = MIPass(4, {"first_turn": CurvePass(2)}, seconds=1.0)
    everything = Bucket(ALL, 2, 8.0, 40.0, 0.25, norms={"task": TermNorm(0.5, 0.5, 0.1)})
    findings.gradients = GradientPass(5, (), everything, seconds=3.0)
    findings.regime = RegimeReading(4, Regime.TEMPLATE_COLLAPSE, Regime.COLLAPSED)
    assert findings.before_update(4) == (findings.mi, None)  # the regime is logged by its monitor
    assert findings.before_update(5) == (None, findings.gradients)
    assert findings.gradients.as_metrics() == {
        "grad/all/groups": 2.0,
        "grad/all/samples": 8.0,
        "grad/all/tokens": 40.0,
        "grad/all/rv_mean": 0.25,
        "grad/all/task": 0.5,
        "grad/all/task_per_sample": 0.5,
        "grad/all/task_per_token": 0.1,
        "time/gradient_buckets": 3.0,
    }
    assert findings.regime.as_metrics() == {"diag/regime": 1.0, "diag/regime_raw": 3.0}
    assert held_findings(type("M", (), {"findings": findings})()) is findings
    assert held_findings(object()) is None
