"""The summary line: fields of the module's record of the iteration and the collapse monitor's latest regime
reading, read as objects."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
from helpers import episode, turn

from ragen2.callbacks import IterationSummary
from ragen2.data.record import GroupStats, IterationRecord, RolloutStats
from ragen2.diagnostics.findings import Findings
from ragen2.diagnostics.mi_pass import CurvePass, MIPass
from ragen2.diagnostics.regimes import Regime, RegimeReading
from ragen2.modules.record import Iteration
from ragen2.modules.update import AdvantageStats, UpdateStats
from ragen2.perf import PhasePerf


def line(module: object, iteration: int, caplog: pytest.LogCaptureFixture) -> str | None:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ragen2"):
        IterationSummary().on_train_epoch_end(SimpleNamespace(current_epoch=iteration), module)  # type: ignore[arg-type]
    return caplog.records[0].getMessage() if caplog.records else None


def rollouts() -> IterationRecord:
    """Two groups of two: one mixed (returns 1, 0), one all-fail; the filter kept the mixed one."""
    eps = [
        episode(g, [turn([1, 2], [3], reward=r)], sample=s)
        for g, s, r in ((0, 0, 1.0), (0, 1, 0.0), (1, 0, 0.0), (1, 1, 0.0))
    ]
    eps[0].success = True
    return IterationRecord(
        RolloutStats.of(eps), GroupStats.of([eps]), filter={"kept": 1.0}, perf=PhasePerf(2.4, 12.0)
    )


def update(loss: float, nonfinite: int = 0) -> UpdateStats:
    return UpdateStats(
        None, AdvantageStats(0.0, 0.5, 2, 0.5), None, {"loss": loss}, 4, nonfinite, {"policy": 1e-4}, None
    )


def test_the_line_reads_the_iteration_s_fields(caplog: pytest.LogCaptureFixture) -> None:
    module = SimpleNamespace(
        last=Iteration(3, rollouts(), update=update(0.5), perf=PhasePerf(1.6, 8.0)), findings=Findings()
    )
    assert line(module, 3, caplog) == (
        "iteration 3: success 0.25 | return +0.25 | format 1.00 | all_ok 0.00 | all_fail 0.50 | mixed 0.50 | "
        "kept 1 | eff_reward +0.50 | loss +0.5000 | steps 4 | rollout_s 2 | update_s 2"
    )
    # an iteration the filter skipped shows no update; non-finite steps show when there were some
    skipped = Iteration(4, rollouts(), empty_streak=1)
    assert line(SimpleNamespace(last=skipped), 4, caplog) == (
        "iteration 4: success 0.25 | return +0.25 | format 1.00 | all_ok 0.00 | all_fail 0.50 | mixed 0.50 | "
        "kept 1 | rollout_s 2"
    )
    bad = Iteration(5, update=update(math.nan, nonfinite=2))  # a loss that is not finite is left out
    assert (
        line(SimpleNamespace(last=bad), 5, caplog) == "iteration 5: eff_reward +0.50 | steps 4 | nonfinite 2"
    )
    assert line(SimpleNamespace(), 6, caplog) is None  # a module without a record: no line


def test_the_line_shows_the_mi_pass_and_the_latest_regime_from_the_findings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    findings = Findings()
    passed = MIPass(0, {"first_turn": CurvePass(8, 8, 4, {"mi_est": 0.75, "retrieval_acc": 0.5})})
    module = SimpleNamespace(last=Iteration(0, update=update(0.5), mi=passed), findings=findings)
    # no reading yet: no regime
    assert (
        line(module, 0, caplog)
        == "iteration 0: eff_reward +0.50 | loss +0.5000 | steps 4 | mi +0.750 | retr 0.50"
    )
    findings.regime = RegimeReading(0, Regime.TEMPLATE_COLLAPSE, Regime.COLLAPSED)
    assert line(module, 0, caplog) == (
        "iteration 0: eff_reward +0.50 | loss +0.5000 | steps 4 | mi +0.750 | retr 0.50 | regime 1"
    )
    # an iteration without a pass shows the regime declared at the latest one
    module.last = Iteration(1, update=update(0.25))
    assert line(module, 1, caplog) == "iteration 1: eff_reward +0.50 | loss +0.2500 | steps 4 | regime 1"


def test_the_row_is_the_record_s_metrics_in_the_order_runs_logged_them() -> None:
    passed = MIPass(2, {"first_turn": CurvePass(3)}, seconds=0.5)
    row = Iteration(2, rollouts(), mi=passed, update=update(0.5), perf=PhasePerf(1.5, 9.0))
    keys = list(row.as_metrics())
    assert (
        keys.index("filter/kept") < keys.index("diag/first_turn/valid_rows") < keys.index("train/iteration")
    )
    assert keys[keys.index("train/iteration") + 1] == "filter/skipped" and keys[-3:] == [
        "time/update",
        "perf/update_tokens",
        "perf/update_tokens_per_s",
    ]
    assert row.as_metrics()["filter/skipped"] == 0.0 and row.as_metrics()["train/loss"] == 0.5
    skipped = Iteration(2, empty_streak=3).as_metrics()
    assert skipped == {"train/iteration": 2.0, "filter/skipped": 1.0, "filter/empty_streak": 3.0}
    assert "train/loss" not in Iteration(2, update=update(math.inf)).as_metrics()  # not finite: left out
