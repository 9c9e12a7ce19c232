"""Reasoning-collapse diagnostics: in-batch cross-scoring, the MI proxies and the MI pass (docs/method.md §3)."""

from ragen2.diagnostics.cross_scoring import CrossScores, cross_score, naive_cross_score
from ragen2.diagnostics.findings import Findings
from ragen2.diagnostics.metric import MIMetric
from ragen2.diagnostics.mi import METRIC_KEYS, mi_metrics, zscore
from ragen2.diagnostics.mi_pass import CurvePass, MIPass, measure_pass
from ragen2.diagnostics.regimes import REGIME_TABLE, Regime, RegimeThresholds, classify
from ragen2.diagnostics.report import Diagnosis, diagnose, write_report

__all__ = [
    "METRIC_KEYS",
    "REGIME_TABLE",
    "CrossScores",
    "CurvePass",
    "Diagnosis",
    "Findings",
    "MIMetric",
    "MIPass",
    "Regime",
    "RegimeThresholds",
    "classify",
    "cross_score",
    "diagnose",
    "measure_pass",
    "mi_metrics",
    "naive_cross_score",
    "write_report",
    "zscore",
]
