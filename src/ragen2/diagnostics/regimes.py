"""The paper's four reasoning regimes, read off one MI pass, and a patient classifier over a run's passes.

RAGEN-2 places reasoning on two axes (docs/method.md §1): within-input diversity H(Z|X) and input dependence
I(X;Z). High/high is **healthy**; high H(Z|X) with low I(X;Z) is **template collapse** (diverse reasoning
that no longer depends on the input: invisible to entropy); low H(Z|X) with high I(X;Z) is **compressed**
(confident, still input-driven); both low is **collapsed**. The numeric code is two bits,
``code = mi_low + 2 · entropy_low``: 0 healthy, 1 template collapse, 2 compressed, 3 collapsed, so an odd
code means input dependence is lost (the alarm) and a code ≥ 2 means within-input diversity is lost.

Each pass is read from its MI proxies (docs/method.md §3, per-token scale):

* entropy axis: ``cond_entropy`` H(Z|X) (nats per token);
* input-dependence axis: ``contrast``, the matched log-likelihood minus the mean mismatched one
  (``ragen2.diagnostics.mi``). It is the unsaturated measure: the in-batch MI estimates stop at log C and
  retrieval accuracy at 1.0, so they fall only after a near-total loss of input dependence, while the
  contrast moves with every nat lost. One proxy is enough: the contrast averages every row × column of the
  pass (retrieval reads a few dozen rows), and patience guards against a single noisy pass;
* ``retrieval_above_chance`` (retrieval accuracy minus 1/C) is reported beside them, not a vote.

Thresholds are relative to the run's own first pass, whose values are the reference: a value is low when
``value ≤ fraction · max(reference, 0)``. The clamp at 0 means that a first pass with no input dependence
(a contrast at or below 0, as for a random model) leaves an absolute test, "no better than chance", rather
than a threshold below zero; ``fraction = 0`` is that absolute test for every pass, and ``fraction = 1``
flags any pass not above the first. H(Z|X) ≥ 0, so its clamp only matters for a deterministic first pass.

Patience: each axis is declared low (or high again) only after ``patience`` consecutive passes on the
other side of its threshold; a single pass across it resets nothing but its own streak. Counting per axis,
not per regime, keeps a run whose MI stays lost while its entropy hovers at the threshold (template
collapse and collapsed alternating) from never being declared. A run starts declared healthy: the first
pass is the reference, so with fractions below 1 it is healthy by construction unless its reference is
at or below 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from enum import IntEnum
from typing import Any


class Regime(IntEnum):
    """The logged code of ``diag/regime``: ``mi_low + 2 · entropy_low``."""

    HEALTHY = 0
    TEMPLATE_COLLAPSE = 1
    COMPRESSED = 2
    COLLAPSED = 3

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")

    @property
    def alarm(self) -> bool:
        """Input dependence lost: template collapse or collapsed."""
        return bool(self & 1)

    @classmethod
    def of(cls, entropy_low: bool, mi_low: bool) -> Regime:
        return cls(int(mi_low) + 2 * int(entropy_low))


REGIME_TABLE: tuple[tuple[int, str, str, str, str], ...] = (
    # (code, name, H(Z|X), I(X;Z), how to read it)
    (0, "healthy", "high", "high", "diverse reasoning that depends on the input"),
    (
        1,
        "template collapse",
        "high",
        "low",
        "diverse-looking reasoning that no longer depends on the input; entropy alone cannot see it",
    ),
    (2, "compressed", "low", "high", "confident, still input-driven reasoning (often healthy convergence)"),
    (3, "collapsed", "low", "low", "neither diverse nor input-driven: full collapse"),
)
"""One row per regime, for docs/diagnostics.md and the report: code, name, the two axes, the reading."""

KEYS = ("cond_entropy", "contrast", "retrieval_above_chance")
"""The MI proxies (``MIMetric.compute``'s keys) a pass is classified from, in ``PassMetrics``' order."""


@dataclass(frozen=True)
class PassMetrics:
    """The numbers of one MI pass that place it among the regimes (scalars, per-token scale): H(Z|X) and the
    contrast decide, retrieval is reported."""

    cond_entropy: float  # H(Z|X), nats per token
    contrast: float  # mean (matched − mean mismatched) log-likelihood, nats per token
    retrieval_above_chance: float  # retrieval accuracy − 1/C (in the evidence, not a vote)


@dataclass(frozen=True)
class RegimeThresholds:
    """What "low" means, relative to the first pass, and how many passes make a regime."""

    entropy_fraction: float = 0.5  # H(Z|X) low when ≤ this × the first pass's
    mi_fraction: float = 0.5  # I(X;Z) low when the contrast is ≤ this × the first pass's (clamped at 0)
    patience: int = 2  # consecutive passes before an axis changes side

    def __post_init__(self) -> None:
        for key in ("entropy_fraction", "mi_fraction"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(
                    f"{key}={value!r} must be a number in [0, 1]: the share of the first pass's value below "
                    f"which it counts as low (0 = no better than chance, 1 = not above the first pass). "
                    f"Fix: {key}=0.5"
                )
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 1:
            raise ValueError(
                f"patience={self.patience!r} must be an integer ≥ 1: the consecutive MI passes a regime must "
                "hold before it is declared (1 = at once). Fix: patience=2"
            )


def is_low(value: float, reference: float, fraction: float) -> bool:
    """``value ≤ fraction · max(reference, 0)`` (see the module doc for the clamp)."""
    return value <= fraction * max(reference, 0.0)


def axes(now: PassMetrics, first: PassMetrics, th: RegimeThresholds) -> tuple[bool, bool]:
    """(entropy low, input dependence low) of one pass against the first, without patience."""
    entropy_low = is_low(now.cond_entropy, first.cond_entropy, th.entropy_fraction)
    mi_low = is_low(now.contrast, first.contrast, th.mi_fraction)
    return entropy_low, mi_low


def classify(now: PassMetrics, first: PassMetrics, th: RegimeThresholds) -> Regime:
    """The regime of one pass on its own (no patience)."""
    return Regime.of(*axes(now, first, th))


@dataclass(frozen=True)
class RegimeState:
    """Everything the classifier carries from pass to pass (checkpointed by ``CollapseMonitor``)."""

    first: PassMetrics | None = None  # the reference: the run's first pass
    passes: int = 0  # passes seen, the first included
    entropy_low: bool = False  # declared side of each axis
    mi_low: bool = False
    entropy_streak: int = 0  # consecutive passes on the other side of the declared one
    mi_streak: int = 0
    warned: bool = False  # the alarm has been raised once in this run

    @property
    def regime(self) -> Regime:
        return Regime.of(self.entropy_low, self.mi_low)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> RegimeState:
        first = state.get("first")
        if first is not None and set(first) != set(KEYS):
            # saved before the MI axis read the contrast (its first pass holds mi_zscore_ema): no reference to
            # compare with, so the next pass becomes the reference and both axes restart healthy; the passes
            # counted and whether the run already warned are kept
            return cls(passes=state.get("passes", 0), warned=state.get("warned", False))
        return cls(**{**state, "first": None if first is None else PassMetrics(**first)})


def _side(declared: bool, raw: bool, streak: int, patience: int) -> tuple[bool, int]:
    """An axis after one pass: flips once ``patience`` consecutive passes disagree with it."""
    if raw == declared:
        return declared, 0
    streak += 1
    return (raw, 0) if streak >= patience else (declared, streak)


@dataclass(frozen=True)
class Step:
    """One pass through the classifier."""

    state: RegimeState  # after the pass
    raw: Regime  # the pass on its own
    changed: bool  # the declared regime differs from the one before the pass
    alarm_began: bool  # input dependence was just declared lost for the first time in the run


@dataclass(frozen=True)
class RegimeReading:
    """What ``CollapseMonitor`` found at one iteration's MI pass: the declared regime and the pass's own."""

    iteration: int
    declared: Regime  # after patience
    raw: Regime  # the pass on its own

    def as_metrics(self) -> dict[str, float]:
        """``diag/regime`` and ``diag/regime_raw``."""
        return {"diag/regime": float(self.declared), "diag/regime_raw": float(self.raw)}


def step(state: RegimeState, now: PassMetrics, th: RegimeThresholds) -> Step:
    """Advance the classifier by one pass (the first pass becomes the reference)."""
    first = state.first or now
    entropy_raw, mi_raw = axes(now, first, th)
    entropy_low, entropy_streak = _side(state.entropy_low, entropy_raw, state.entropy_streak, th.patience)
    mi_low, mi_streak = _side(state.mi_low, mi_raw, state.mi_streak, th.patience)
    after = replace(
        state,
        first=first,
        passes=state.passes + 1,
        entropy_low=entropy_low,
        mi_low=mi_low,
        entropy_streak=entropy_streak,
        mi_streak=mi_streak,
    )
    alarm_began = after.regime.alarm and not state.warned
    if alarm_began:
        after = replace(after, warned=True)
    return Step(after, Regime.of(entropy_raw, mi_raw), after.regime != state.regime, alarm_began)


def evidence(now: PassMetrics, first: PassMetrics, th: RegimeThresholds) -> str:
    """The numbers behind a regime, against the first pass and each threshold, in one line."""

    def part(name: str, value: float, ref: float, fraction: float | None, unit: str = "") -> str:
        if fraction is None:
            side = "reported, not a vote"
        else:
            low = is_low(value, ref, fraction)
            side = f"{'low' if low else 'high'}: threshold {fraction * max(ref, 0.0):.4g}"
        return f"{name} {value:.4g}{unit} vs {ref:.4g} at the first pass ({side})"

    nats = " nats/token"
    parts = [
        part("H(Z|X)", now.cond_entropy, first.cond_entropy, th.entropy_fraction, nats),
        part("contrast", now.contrast, first.contrast, th.mi_fraction, nats),
        part("retrieval above chance", now.retrieval_above_chance, first.retrieval_above_chance, None),
    ]
    if first.contrast <= 0:
        parts.append("the first pass was no better than chance either, so the MI threshold is chance")
    return "; ".join(parts)


def regimes_markdown() -> str:
    """``REGIME_TABLE`` as a markdown table (the one in docs/diagnostics.md)."""
    lines = ["| `diag/regime` | regime | H(Z\\|X) | I(X;Z) | reading |", "|---|---|---|---|---|"]
    lines += [f"| {code} | {name} | {h} | {i} | {reading} |" for code, name, h, i, reading in REGIME_TABLE]
    return "\n".join(lines)
