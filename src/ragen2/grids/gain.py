"""Where the filter helps: Spearman's rank correlation, across a grid's comparisons (e.g. env × algo), of a
predictor read on the baseline arm against the filter's gain, as the paper reads Std(RV)/Mean(RV)
(docs/method.md §4: a high ratio means bimodal RV, and filtering helps; ≈ 0.33 on FrozenLake-GRPO, where it
hurt).

The gain of a comparison is its paired mean difference, arm A minus arm B (``ragen2.grids.pairs``), of
``GAINS``. Each predictor is read on arm B's paired runs (for ``filter=top_p,none``, the unfiltered ones)
and averaged over them:

- Std(RV)/Mean(RV), first batch: ``rollout/rv_cv`` at the run's first iteration, the ratio the paper takes
  from one rollout batch before training (both runs of a pair roll out the same first batch); RV is a
  group's reward std, whatever score the filter ranks by.
- score_cv, mean over training: ``filter/score_cv`` averaged over the run's iterations, the same ratio of the
  filter's own score batch by batch as the policy trains (0 in a batch where no group had variance).

ρ needs 3 comparisons with a finite predictor and gain; scipy gives its two-sided p-value (Student's t with
n − 2 degrees of freedom), which for so few points is rough.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ragen2.grids.pairs import Arms, Comparison
from ragen2.grids.stats import spearman
from ragen2.grids.table import Metric, label, run_value

PREDICTORS: dict[str, Metric] = {
    "Std(RV)/Mean(RV), first batch": Metric(("rollout/rv_cv",), read="first"),
    "score_cv, mean over training": Metric(("filter/score_cv",), read="mean"),
}
GAINS = ("final_success", "final_mi_zscore_ema")  # METRICS' names


def predictor(comparison: Comparison, metric: Metric) -> float:
    """The predictor's mean over arm B's paired runs that logged a finite value (NaN: none did)."""
    key = metric.keys[0]
    found = [run_value(p.b.series, key, metric.read) for p in comparison.pairs]
    values = [v for v in found if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else math.nan


def gain(comparison: Comparison, name: str) -> float:
    """The paired mean difference of one of GAINS (NaN without pairs)."""
    return comparison.metrics[name].interval.mean


def markdown(comparisons: Sequence[Comparison], arms: Arms, others: Sequence[str]) -> list[str]:
    """aggregate_paired.md's Spearman section: ρ of each predictor against each gain, then each comparison's
    numbers."""
    lines = [
        f"## Predictors of the gain ({arms.a} − {arms.b}): Spearman's ρ across comparisons",
        "",
        f"Predictors read on the {arms.key}={arms.b} runs of each comparison's pairs: "
        + "; ".join(f"{name}: `{m.keys[0]}` ({m.read})" for name, m in PREDICTORS.items())
        + ". ρ needs 3 comparisons with both numbers finite.",
        "",
        "| predictor | gain in | comparisons | ρ | p |",
        "|---|---|---|---|---|",
    ]
    for name, metric in PREDICTORS.items():
        xs = [predictor(c, metric) for c in comparisons]
        for target in GAINS:
            both = [(x, gain(c, target)) for x, c in zip(xs, comparisons)]
            points = [(x, y) for x, y in both if math.isfinite(x) and math.isfinite(y)]
            rho, p = spearman([x for x, _ in points], [y for _, y in points])
            shown = "—" if math.isnan(rho) else f"{rho:+.3f}"
            lines.append(
                f"| {name} | {target} | {len(points)} | {shown} | {'—' if math.isnan(p) else f'{p:.3g}'} |"
            )
    header = [" ".join(others) or "comparison", "pairs", *PREDICTORS, *(f"gain in {g}" for g in GAINS)]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in comparisons:
        values = [predictor(c, m) for m in PREDICTORS.values()] + [gain(c, g) for g in GAINS]
        row = [
            label(others, c.values),
            str(len(c.pairs)),
            *("—" if math.isnan(v) else f"{v:.3g}" for v in values),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return lines
