"""The summary line: the module's numbers and the collapse monitor's latest regime reading, read as an object."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from ragen2.callbacks import IterationSummary
from ragen2.diagnostics.findings import Findings
from ragen2.diagnostics.regimes import Regime, RegimeReading


def line(module: object, iteration: int, caplog: pytest.LogCaptureFixture) -> str:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ragen2"):
        IterationSummary().on_train_epoch_end(SimpleNamespace(current_epoch=iteration), module)  # type: ignore[arg-type]
    (record,) = caplog.records
    return record.getMessage()


def test_the_line_shows_the_latest_regime_from_the_findings(caplog: pytest.LogCaptureFixture) -> None:
    findings = Findings()
    module = SimpleNamespace(
        last_metrics={"rollout/success": 0.25, "train/loss": 0.5, "train/nonfinite_steps": 0.0},
        findings=findings,
    )
    assert line(module, 0, caplog) == "iteration 0: success 0.25 | loss +0.5000"  # no pass yet: no regime
    findings.regime = RegimeReading(0, Regime.TEMPLATE_COLLAPSE, Regime.COLLAPSED)
    assert line(module, 0, caplog) == "iteration 0: success 0.25 | loss +0.5000 | regime 1"
    # an iteration without a pass shows the regime declared at the latest one
    assert line(module, 1, caplog).endswith("| regime 1")
    # a module without findings: the module's numbers alone
    bare = SimpleNamespace(last_metrics={"train/loss": -0.25})
    assert line(bare, 2, caplog) == "iteration 2: loss -0.2500"
