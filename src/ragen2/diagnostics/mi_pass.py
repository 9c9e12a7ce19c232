"""One MI pass over an iteration's trajectories, as a typed ``MIPass`` (docs/diagnostics.md).

Each curve (``ragen2.diagnostics.sampling``) draws its rows, they are cross-scored under the policy
(``cross_score``) and the curve's own ``MIMetric`` (its EMA) computes the MI proxies. ``MIPass.as_metrics``
is the one place the pass becomes logged numbers (``diag/<curve>/*``, ``diag/tokens_processed``,
``diag/token_bound_ratio``, ``time/diagnostics``); the collapse monitor reads ``MIPass.regime_input``.

How to read ``columns`` and ``chance``. Columns are the distinct X among the rows scored. On turn 1 the
rollouts of a group share their prompt, so R rows fall into about N = groups columns and retrieval's
chance level is 1/N. After turn 1, X holds each rollout's own history, so nearly every row is its own
column: C ≈ R, chance ≈ 1/R and ``mi_upper_bound`` = log C ≈ log R. Compare each curve with its own chance
level (``retrieval_above_chance``, ``mi_zscore_ema``), never the raw accuracy or MI across curves with
different column counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from ragen2.diagnostics.cross_scoring import cross_score
from ragen2.diagnostics.exact import EXACT, exact_mi, grammar_logprobs
from ragen2.diagnostics.metric import MIMetric
from ragen2.diagnostics.regimes import KEYS, PassMetrics
from ragen2.diagnostics.sampling import (
    HELDOUT,
    Row,
    Trajectory,
    curve_rows,
    curves,
    mode_of,
    turn_candidates,
)


@dataclass(frozen=True)
class CurvePass:
    """One curve of one MI pass: the rows it could draw from and, when at least two distinct contexts had
    a valid Z, what it scored and the curve's MI proxies (``MIMetric.compute``: ``METRIC_KEYS`` and the EMA
    z-scores)."""

    valid_rows: int  # rows (trajectories for ``trajectory``) the curve could draw from
    rows: int = 0  # R, the rows scored; 0 when the curve had no MI
    columns: int = 0  # C, the distinct X among them
    proxies: Mapping[str, float] | None = None  # None when the curve had no MI

    @property
    def chance(self) -> float:
        """Retrieval's chance level, 1/C."""
        return 1.0 / self.columns

    @property
    def regime_input(self) -> PassMetrics | None:
        """The three numbers that place the curve among the regimes, or None without MI or when one is not
        finite."""
        if self.proxies is None:
            return None
        values = [float(self.proxies[key]) for key in KEYS]
        return PassMetrics(*values) if all(math.isfinite(v) for v in values) else None

    def as_metrics(self, curve: str) -> dict[str, float]:
        """``diag/<curve>/*``."""
        prefix = f"diag/{curve}/"
        out = {prefix + "valid_rows": float(self.valid_rows)}
        if self.proxies is not None:
            out.update({prefix + k: float(v) for k, v in self.proxies.items()})
            out[prefix + "rows"] = float(self.rows)
            out[prefix + "columns"] = float(self.columns)
            out[prefix + "chance"] = self.chance
        return out


@dataclass(frozen=True)
class MIPass:
    """One iteration's MI pass: each curve's ``CurvePass``, the exact figures where the env's reasoning has a
    grammar (``diag/exact/*``, ``ragen2.diagnostics.exact``) and what the pass cost."""

    iteration: int
    curves: Mapping[str, CurvePass]
    tokens_processed: int = 0  # positions the model ran, all curves
    token_bound: int = 0  # the fewest it could have run (Σ over curves of ``CrossScores.token_bound``)
    seconds: float = 0.0
    exact: Mapping[str, float] | None = None  # ``exact_mi``'s keys; None without ``diagnostics.exact``

    def regime_input(self, curve: str) -> PassMetrics | None:
        """``curve``'s numbers for the regimes, or None when the pass lacks the curve or its MI."""
        found = self.curves.get(curve)
        return None if found is None else found.regime_input

    def as_metrics(self) -> dict[str, float]:
        """The pass's logged numbers: ``diag/<curve>/*``, ``diag/tokens_processed``,
        ``diag/token_bound_ratio`` (when some curve was scored) and ``time/diagnostics``."""
        out: dict[str, float] = {}
        for name, curve in self.curves.items():
            out.update(curve.as_metrics(name))
        out.update({f"diag/{EXACT}/{k}": float(v) for k, v in (self.exact or {}).items()})
        out["diag/tokens_processed"] = float(self.tokens_processed)
        if self.token_bound:
            out["diag/token_bound_ratio"] = self.tokens_processed / self.token_bound
        out["time/diagnostics"] = self.seconds
        return out


@dataclass(frozen=True)
class Grammar:
    """What the exact figures read: the first prompts of the held-out instances and every sentence of the
    env's reasoning grammar, each as the ids it is scored as (its text and ``</think>``)."""

    prompts: Sequence[Sequence[int]]
    sentences: Sequence[Sequence[int]]


def measure_pass(
    policy: Any,
    trajs: Sequence[Trajectory],
    iteration: int,
    modes: Sequence[str],
    budgets: Mapping[str, int],
    seed: int,
    metrics: MutableMapping[str, MIMetric],
    heldout: Sequence[Trajectory] = (),
    columns: Sequence[int] = (),
    grammar: Grammar | None = None,
) -> MIPass:
    """The pass on (already gathered) trajectories: identical inputs give identical numbers and forwards.

    ``metrics`` holds one ``MIMetric`` per curve (their EMAs advance; a curve met for the first time gets
    a fresh one). ``heldout``: first-turn trajectories of fixed held-out instances, sampled for the pass
    (``diagnostics.heldout``); every one with a valid Z is a row of the ``heldout`` curve, none drawn out.
    ``columns``: for each n, every curve with more than n prompts also gives ``<curve>_c<n>``, the proxies of
    its rows under its first n prompts (a block of the same scores: no forward of its own), what a batch of
    n prompts would read. ``grammar``: the exact figures (``ragen2.diagnostics.exact``) on its prompts.
    """
    start = time.perf_counter()
    found: dict[str, CurvePass] = {}
    processed = bound = 0

    def score(curve: str, rows: list[Row], valid: int) -> None:
        nonlocal processed, bound
        count = len({x for x, _ in rows})
        if count < 2:  # MI needs at least two distinct contexts with a valid Z
            found[curve] = CurvePass(valid)
            return
        scores = cross_score(policy, rows)
        processed += scores.tokens_processed
        bound += scores.token_bound
        blocks = [(curve, count)] + [(f"{curve}_c{n}", n) for n in columns if 2 <= n < count]
        for name, n in blocks:
            # columns are the prompts in order of first appearance: the first n, and the rows that read them
            kept = scores.prompt_index < n
            metric = metrics.setdefault(name, MIMetric())
            metric.update(scores.logp_sum[kept][:, :n], scores.prompt_index[kept], scores.num_tokens[kept])
            found[name] = CurvePass(valid, int(kept.sum()), n, metric.compute())

    for curve in curves(modes, trajs):
        score(curve, *curve_rows(curve, trajs, budgets[mode_of(curve)], seed, iteration))
    if heldout:
        rows = turn_candidates(heldout, 1)
        score(HELDOUT, rows, len(rows))
    exact = None
    if grammar is not None:
        exact = exact_mi(grammar_logprobs(policy, grammar.prompts, grammar.sentences))
    return MIPass(iteration, found, processed, bound, time.perf_counter() - start, exact)
