"""The organism study's rules (PROTOCOL.md) applied to its collected runs (``results/organism/runs``).

    python results/organism/analyze.py engineering     the stage-0 run's LR rule → engineering/engineering.json
    python results/organism/analyze.py pilot [stage]   the pilot's β* rule → <stage>/<stage>.json, .md, .png
                                                       (stage: pilot, or a fallback: stronger, p0)
    python results/organism/analyze.py main            claims (a), (b1) and (c) on the main stage → main/main.json, main.md
    python results/organism/analyze.py dose            claim (b2) and (b) on the dose stage with the main stage's
                                                       seeds 0–9 at β* → dose/dose.json, dose.md, dose.png
    python results/organism/analyze.py negative        the negative control's (n1), (n2) beside the main stage's
                                                       none runs of seeds 0–9 → negative/negative.json, .md
    python results/organism/analyze.py calibration [stages …]   every MI proxy against the exact MI over the
                                                       stages' runs (default: the pilot's) → calibration/

Each run is read from ``runs/<stage>/<cell>/s<seed>/metrics.csv.gz`` (``run.py collect``). The measures are the
protocol's: MI_t and H_t the exact figures of the pass at iteration t, S the mean learnable success over the
last 50 iterations.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import statistics
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "bench"))
from provenance import provenance  # noqa: E402

ITERATION = "train/iteration"
MI, H, MASS = "diag/exact/mi", "diag/exact/cond_entropy", "diag/exact/grammar_mass"
SUCCESS = "rollout/success_learnable"
LAST = 50  # S: the mean of the last 50 iterations' learnable success


def _float(value: str | None) -> float | None:
    if value in (None, ""):
        return None
    x = float(value)
    return None if math.isnan(x) else x


def read(folder: Path) -> list[dict[str, float]]:
    """A run's logged rows, the empty cells dropped, in logging order."""
    with gzip.open(folder / "metrics.csv.gz", "rt") as f:
        rows = [{k: x for k, v in row.items() if (x := _float(v)) is not None} for row in csv.DictReader(f)]
    return [r for r in rows if ITERATION in r or any(k.startswith("diag/") for k in r)]


def passes(rows: list[dict[str, float]], key: str) -> dict[int, float]:
    """``key`` at each iteration whose row holds it (an MI pass's figures are on its iteration's row)."""
    return {int(r[ITERATION]): r[key] for r in rows if key in r and ITERATION in r}


@dataclass(frozen=True)
class Outcome:
    """One run read by the protocol's measures (Amendment 1: the end pass is the last one whose grammar mass is
    at least ``FORMAT_HELD``)."""

    mi0: float
    mi_end: float
    h0: float
    h_end: float
    end: int  # the iteration of the end pass
    success: float  # S
    success0: float  # the mean learnable success over the first 50 iterations
    format_end: float  # the mean format rate over the last 50 iterations
    format_broke: int | None = None  # the first pass whose grammar mass fell below FORMAT_HELD

    @property
    def collapse(self) -> bool:
        return self.mi_end <= 0.5 * self.mi0

    @property
    def template_collapse(self) -> bool:
        return self.collapse and self.h_end >= self.h0


#: the grammar mass at or above which a pass reads reasonings the policy still writes (Amendment 1)
FORMAT_HELD = 0.5


def _mean_of(values: dict[int, float], iterations: Iterable[int]) -> float:
    picked = [values[i] for i in iterations if i in values]
    return statistics.fmean(picked) if picked else math.nan


def outcome(rows: list[dict[str, float]]) -> Outcome:
    mi, h, mass = passes(rows, MI), passes(rows, H), passes(rows, MASS)
    if not mi:
        raise ValueError(f"no {MI} in the run: it logged no exact pass")
    held = [i for i in mi if mass.get(i, 1.0) >= FORMAT_HELD]
    broke = [i for i in mi if mass.get(i, 1.0) < FORMAT_HELD]
    first, end = min(mi), max(held or mi)
    success, fmt = passes(rows, SUCCESS), passes(rows, "rollout/format_valid_rate")
    last_iteration = max(success) if success else max(mi)
    tail = range(last_iteration - LAST + 1, last_iteration + 1)
    return Outcome(
        mi0=mi[first],
        mi_end=mi[end],
        h0=h[first],
        h_end=h[end],
        end=end,
        success=_mean_of(success, tail),
        success0=_mean_of(success, range(LAST)),
        format_end=_mean_of(fmt, tail),
        format_broke=min(broke) if broke else None,
    )


def runs(stage: str) -> dict[tuple[str, int], Path]:
    """Each collected run of a stage by (cell, seed)."""
    root = HERE / "runs" / stage
    return {
        (folder.parent.name, int(folder.name[1:])): folder
        for folder in sorted(root.glob("*/s*"))
        if (folder / "metrics.csv.gz").is_file()
    }


def beta_of(cell: str) -> float:
    """``none_b0.03`` → 0.03 (run.py's cell names)."""
    return float(next(part[1:] for part in cell.split("_") if part.startswith("b")))


def engineering() -> dict[str, object]:
    """Stage 0's rule: LR = 3e-4 unless format fell below 0.9 or learnable success fell by more than 0.1."""
    ((key, folder),) = runs("engineering").items()
    o = outcome(read(folder))
    healthy = o.format_end >= 0.9 and o.success >= o.success0 - 0.1
    return {"run": f"{key[0]}/s{key[1]}", **asdict(o), "healthy_at_3e-4": healthy}


def pilot_rule(outcomes: dict[tuple[float, int], Outcome], min_success: float | None = None) -> float | None:
    """β* = the smallest β at which at least 2 of the seeds reach template collapse (Amendment 1); with
    ``min_success``, also S ≥ it (the rule as first registered: 0.2). None if no β qualifies. A β missing some
    of its seeds cannot qualify on the missing ones."""
    for beta in sorted({b for b, _ in outcomes}):
        hits = sum(
            o.template_collapse and (min_success is None or o.success >= min_success)
            for (b, _), o in outcomes.items()
            if b == beta
        )
        if hits >= 2:
            return beta
    return None


def pilot(stage: str = "pilot") -> dict[str, object]:
    """The pilot's rule on a stage's runs (the pilot's or a fallback's: PROTOCOL.md)."""
    found = {(beta_of(cell), seed): outcome(read(folder)) for (cell, seed), folder in runs(stage).items()}
    table = [
        {"beta": b, "seed": s, **asdict(o), "collapse": o.collapse, "template_collapse": o.template_collapse}
        for (b, s), o in sorted(found.items())
    ]
    return {
        "stage": stage,
        "beta_star": pilot_rule(found),
        "beta_star_as_registered": pilot_rule(found, min_success=0.2),
        "runs": table,
        "found_runs": len(found),
    }


def filter_of(cell: str) -> str:
    """``top_p_b0.1`` → ``top_p`` (run.py's cell names: the filter, then ``b<β>``)."""
    return cell[: cell.rindex("_b")]


def claim_a(none_star: list[Outcome], none_zero: list[Outcome], seeds: int = 20) -> dict[str, object]:
    """(a): supported when ≥ 15 of the 20 ``none``+β* runs reach template collapse and ≤ 2 of the 20
    ``none``+β=0 runs collapse; refuted when ≤ 5 of the 20 ``none``+β* runs do; else inconclusive. Fewer runs
    than ``seeds`` in either arm: partial (the counts and the interval reported, no verdict)."""
    from ragen2.grids.stats import clopper_pearson

    k, j = sum(o.template_collapse for o in none_star), sum(o.collapse for o in none_zero)
    out: dict[str, object] = {"template_collapse_at_beta_star": k, "runs_at_beta_star": len(none_star)}
    out |= {"collapse_at_beta_0": j, "runs_at_beta_0": len(none_zero)}
    if none_star:
        out["rate_interval"] = list(clopper_pearson(k, len(none_star)))
    if len(none_star) < seeds or len(none_zero) < seeds:
        return out | {"verdict": "partial"}
    verdict = "supported" if k >= 15 and j <= 2 else "refuted" if k <= 5 else "inconclusive"
    return out | {"verdict": verdict}


def paired_test(
    arm: dict[int, Outcome], other: dict[int, Outcome], mi0: float, alpha: float = 0.05
) -> dict[str, object]:
    """One of (c)'s two tests over the seeds both arms ran: MI_end(arm) − MI_end(other) by the one-sided
    Wilcoxon signed-rank test, its mean against ¼ of the mean MI₀, and S(arm) − S(other) ≥ −0.05 on average."""
    from ragen2.grids.stats import wilcoxon_greater

    seeds = sorted(set(arm) & set(other))
    mi = [arm[s].mi_end - other[s].mi_end for s in seeds]
    success = [arm[s].success - other[s].success for s in seeds]
    w, p = wilcoxon_greater(mi) if seeds else (math.nan, math.nan)
    mean_mi = statistics.fmean(mi) if mi else math.nan
    mean_s = statistics.fmean(success) if success else math.nan
    holds = p < alpha and mean_mi > 0.25 * mi0 and mean_s >= -0.05
    return {"seeds": seeds, "mi_difference_mean": mean_mi, "w_plus": w, "p": p, "margin": 0.25 * mi0} | {
        "success_difference_mean": mean_s,
        "holds": bool(holds),
    }


def claim_c(by_arm: dict[str, dict[int, Outcome]], seeds: int = 20) -> dict[str, object]:
    """(c) at β*: ``top_p`` against ``none`` and against ``random_drop`` (``paired_test``); supported when
    both hold, refuted when the mean of ``top_p`` − ``none`` is ≤ 0, else inconclusive; partial with fewer than
    ``seeds`` pairs."""
    top, none, drop = by_arm.get("top_p", {}), by_arm.get("none", {}), by_arm.get("random_drop", {})
    everyone = [o for arm in (top, none, drop) for o in arm.values()]
    mi0 = statistics.fmean(o.mi0 for o in everyone) if everyone else math.nan
    vs_none, vs_drop = paired_test(top, none, mi0), paired_test(top, drop, mi0)
    out = {"mean_mi0": mi0, "top_p_vs_none": vs_none, "top_p_vs_random_drop": vs_drop}
    if min(len(vs_none["seeds"]), len(vs_drop["seeds"])) < seeds:  # type: ignore[arg-type]
        return out | {"verdict": "partial"}
    if vs_none["holds"] and vs_drop["holds"]:
        return out | {"verdict": "supported"}
    return out | {"verdict": "refuted" if vs_none["mi_difference_mean"] <= 0 else "inconclusive"}  # type: ignore[operator]


BUCKETS = tuple(f"q{i}" for i in range(1, 7))


def _slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys on xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else math.nan


def gradient_slopes(rows: list[dict[str, float]]) -> dict[str, float]:
    """(b1)'s per-run numbers: at each gradient pass, the slope of the task gradient's norm (and the entropy
    term's) on the buckets' mean reward variance over the buckets that hold groups (two or more of them), each
    also divided by that pass's mean norm; the run's value is the mean over its passes."""
    task, entropy, task_scaled, entropy_scaled = [], [], [], []
    for row in rows:
        held = [b for b in BUCKETS if row.get(f"grad/{b}/groups", 0.0) > 0]
        if len(held) < 2:
            continue
        rv = [row[f"grad/{b}/rv_mean"] for b in held]
        for key, raw, scaled in (("task", task, task_scaled), ("entropy", entropy, entropy_scaled)):
            norms = [row.get(f"grad/{b}/{key}", 0.0) for b in held]
            slope, mean = _slope(rv, norms), statistics.fmean(norms)
            if math.isfinite(slope):
                raw.append(slope)
                scaled.append(slope / mean if mean > 0 else 0.0)
    mean = lambda v: statistics.fmean(v) if v else math.nan  # noqa: E731
    return {
        "passes": len(task),
        "task": mean(task),
        "entropy": mean(entropy),
        "task_scaled": mean(task_scaled),
        "entropy_scaled": mean(entropy_scaled),
    }


def claim_b1(per_run: list[dict[str, float]], expected: int = 40) -> dict[str, object]:
    """(b1) over the main stage's ``none`` runs (both β: ``expected`` of them): the mean task slope's 95 %
    bootstrap interval (over runs) above 0, and the entropy term's scaled slope below a quarter of the task's
    scaled slope; partial (numbers, no verdict) while runs are missing."""
    from ragen2.grids.stats import bootstrap_mean_interval

    runs_ = [r for r in per_run if r["passes"] > 0 and math.isfinite(r["task"])]
    if not runs_:
        return {"runs": 0, "verdict": "partial"}
    interval = bootstrap_mean_interval([r["task"] for r in runs_])
    task_scaled = statistics.fmean(r["task_scaled"] for r in runs_)
    entropy_scaled = statistics.fmean(r["entropy_scaled"] for r in runs_)
    holds = interval.low > 0 and entropy_scaled < 0.25 * task_scaled
    refuted = interval.mean <= 0
    return {
        "runs": len(runs_),
        "task_slope": list(interval),
        "task_scaled": task_scaled,
        "entropy_scaled": entropy_scaled,
        "holds": holds,
        "verdict": "partial"
        if len(per_run) < expected
        else "supported"
        if holds
        else "refuted"
        if refuted
        else "inconclusive",
    }


def claim_b2(points: list[tuple[float, float, bool]], expected: int | None = None) -> dict[str, object]:
    """(b2): the logistic fit of collapse (0/1) on log(β/(1 − p₀)) over the ``none`` runs at β*, one point
    (β, p₀, collapse) a run; a positive slope with a Wald p below 0.05 holds, a slope ≤ 0 refutes. Fewer than
    ``expected`` runs (or a single p₀): partial, the fit reported where there is one."""
    from ragen2.grids.stats import logistic_fit

    partial = expected is not None and len(points) < expected
    if len({p0 for _, p0, _ in points}) < 2:  # one level of p₀: no axis yet
        return {"runs": len(points), "verdict": "partial"}
    if len({c for *_, c in points}) < 2:  # no slope to estimate
        same = f"every run {'collapsed' if points[0][2] else 'held'}"
        return {"runs": len(points), "no_fit": same, "verdict": "partial" if partial else "inconclusive"}
    xs = [math.log(b / (1 - p0)) for b, p0, _ in points]
    fit = logistic_fit(xs, [int(c) for _, _, c in points])
    verdict = (
        "supported"
        if fit.slope > 0 and fit.p_value < 0.05
        else "refuted"
        if fit.slope <= 0
        else "inconclusive"
    )
    return {"runs": len(points), **fit._asdict(), "verdict": "partial" if partial else verdict}


def trend_exact(points: list[tuple[float, float, bool]]) -> float:
    """Not registered (PROTOCOL.md's (b2) is the Wald test above, which has no value where the runs are
    separated by p₀): the exact one-sided permutation p of the Cochran–Armitage trend, Σ x over the collapsed
    runs (x = log(β/(1 − p₀))), against every way of choosing as many collapsed runs among them, counted level
    by level: P(S ≥ S_observed) = Σ_{c: Σc = k, Σ c·x ≥ S} Π C(n_level, c_level) / C(n, k)."""
    levels: dict[float, list[bool]] = {}
    for b, p0, c in points:
        levels.setdefault(round(math.log(b / (1 - p0)), 12), []).append(c)
    xs, ns = list(levels), [len(v) for v in levels.values()]
    k = sum(sum(v) for v in levels.values())
    observed = sum(x * sum(v) for x, v in levels.items())
    ways: dict[tuple[int, float], int] = {(0, 0.0): 1}  # (collapses chosen so far, their Σ x) -> ways
    for x, n in zip(xs, ns, strict=True):
        ways = _chosen(ways, x, n, k)
    hits = sum(w for (c, total), w in ways.items() if c == k and total >= observed - 1e-9)
    return hits / math.comb(sum(ns), k)


def _chosen(ways: dict[tuple[int, float], int], x: float, n: int, k: int) -> dict[tuple[int, float], int]:
    """``ways`` after one more level of ``n`` runs at ``x``, of which 0 … n are chosen (at most k in all)."""
    out: dict[tuple[int, float], int] = {}
    for (c, total), w in ways.items():
        for j in range(min(n, k - c) + 1):
            key = (c + j, round(total + j * x, 9))
            out[key] = out.get(key, 0) + w * math.comb(n, j)
    return out


#: the main stage's share of zero-variance prompts (the dose stage's fourth level, PROTOCOL.md stage 3)
MAIN_P0 = 0.75
DOSE_SEEDS = 10


def p0_of(cell: str) -> float:
    """``none_b0.1_p00.25`` → 0.25 (run.py's cell names); a main-stage cell has none: ``MAIN_P0``."""
    return next((float(part[2:]) for part in cell.split("_") if part.startswith("p0")), MAIN_P0)


def dose_outcomes() -> tuple[float, dict[tuple[str, float], dict[int, Outcome]]]:
    """β* and every dose-response run by (filter, p₀): the dose stage's, and the main stage's seeds 0–9 at β*
    as p₀ = 0.75."""
    beta_star = json.loads((HERE / "pilot" / "pilot.json").read_text())["beta_star"]
    found: dict[tuple[str, float], dict[int, Outcome]] = {}
    picked = [*runs("dose").items()]
    picked += [(k, f) for k, f in runs("main").items() if beta_of(k[0]) == beta_star and k[1] < DOSE_SEEDS]
    for (cell, seed), folder in picked:
        if filter_of(cell) in ("none", "top_p"):
            found.setdefault((filter_of(cell), p0_of(cell)), {})[seed] = outcome(read(folder))
    return beta_star, found


def dose_stage() -> dict[str, object]:
    """Claim (b2) and the phase table: per filter and p₀, how many runs collapsed; the ``none`` runs' logistic
    fit on log(β*/(1 − p₀)); the ``top_p`` runs' fit, reported (the protocol expects its rate not to rise)."""
    from ragen2.grids.stats import clopper_pearson

    beta_star, found = dose_outcomes()
    table = []
    for (f, p0), arms in sorted(found.items()):
        k = sum(o.collapse for o in arms.values())
        table.append(
            {
                "filter": f,
                "p0": p0,
                "runs": len(arms),
                "collapsed": k,
                "template_collapse": sum(o.template_collapse for o in arms.values()),
                "rate": k / len(arms),
                "rate_interval": list(clopper_pearson(k, len(arms)))[1:],  # (low, high)
                "mi_ratio_mean": statistics.fmean(o.mi_end / o.mi0 for o in arms.values()),
            }
        )
    expected = 4 * DOSE_SEEDS  # p₀ ∈ {0.25, 0.5, 0.75, 0.9} × seeds 0–9
    points = {
        f: [(beta_star, p0, o.collapse) for (g, p0), arms in found.items() if g == f for o in arms.values()]
        for f in ("none", "top_p")
    }
    main = HERE / "main" / "main.json"
    b1 = json.loads(main.read_text())["b1"] if main.is_file() else {"verdict": "partial"}
    b2 = claim_b2(points["none"], expected)
    verdicts = {b1["verdict"], b2["verdict"]}
    b = (
        "partial"
        if "partial" in verdicts
        else "supported"
        if verdicts == {"supported"}
        else "refuted"
        if "refuted" in verdicts
        else "inconclusive"
    )
    return {
        "beta_star": beta_star,
        "phase": table,
        "b2": b2,
        "top_p_trend": claim_b2(points["top_p"], expected),
        "trend_exact": {f: trend_exact(points[f]) for f in ("none", "top_p")},  # not registered
        "b1": b1,
        "b": {"verdict": b},
    }


def dose_markdown(result: dict[str, object]) -> str:
    b2, top = result["b2"], result["top_p_trend"]

    def fit(r: dict[str, object]) -> str:
        if "slope" not in r:
            return f"no fit ({r['runs']} runs)"
        if not math.isfinite(r["p_value"]):  # type: ignore[arg-type]
            return f"no finite fit: the runs are separated by p₀ (Newton stopped at slope {r['slope']:+.2f}), {r['runs']} runs"
        return f"slope {r['slope']:+.2f} ± {r['slope_se']:.2f} (Wald p {r['p_value']:.3g}), {r['runs']} runs"

    rows = [
        dict(r, rate_interval="[{:.2f}, {:.2f}]".format(*r["rate_interval"]))  # type: ignore[arg-type]
        for r in result["phase"]  # type: ignore[attr-defined]
    ]
    keys = [
        "filter",
        "p0",
        "runs",
        "collapsed",
        "template_collapse",
        "rate",
        "rate_interval",
        "mi_ratio_mean",
    ]
    return (
        f"# Dose-response (claim (b))\n\n(b): {result['b']['verdict']}; (b1): {result['b1']['verdict']}; "  # type: ignore[index]
        f"(b2): {b2['verdict']}, {fit(b2)}; `top_p`'s rate on the same axis: {fit(top)}\n\n"  # type: ignore[index]
        + (
            "Not registered (the Wald test has no value where the runs are separated by p₀): the exact one-sided "
            "trend test of collapse on the same axis gives p = {none:.2g} without a filter, {top_p:.2g} for "
            "`top_p`.\n\n"
        ).format(**result["trend_exact"])  # type: ignore[arg-type]
        + _table(rows, keys)
        + "\n\n![phase](dose.png)\n"
    )


def plot_dose(result: dict[str, object], path: Path) -> None:
    """The phase plot: each filter's collapse rate (95 % Clopper–Pearson) and its runs' MI_end/MI₀ over p₀."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, found = dose_outcomes()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for offset, f in ((-0.008, "none"), (0.008, "top_p")):
        rows = [r for r in result["phase"] if r["filter"] == f]  # type: ignore[attr-defined]
        if not rows:
            continue
        x = [r["p0"] + offset for r in rows]
        y = [r["rate"] for r in rows]
        low = [max(0.0, r["rate"] - r["rate_interval"][0]) for r in rows]  # (rounding at 0 and 1)
        high = [max(0.0, r["rate_interval"][1] - r["rate"]) for r in rows]
        axes[0].errorbar(x, y, yerr=[low, high], marker="o", capsize=3, label=f)
        dots = [
            (p0 + offset, o.mi_end / o.mi0)
            for (g, p0), arms in found.items()
            if g == f
            for o in arms.values()
        ]
        axes[1].scatter(*zip(*dots), s=12, alpha=0.6, label=f)
    axes[0].set(
        xlabel="p₀ (share of zero-variance prompts)",
        ylabel="collapse rate (MI_end ≤ ½ MI₀)",
        ylim=(-0.05, 1.05),
    )
    axes[1].axhline(0.5, color="grey", lw=0.8, ls="--")
    axes[1].set(xlabel="p₀", ylabel="MI_end / MI₀ (exact, per run)")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(f"β* = {result['beta_star']}: collapse against the share of zero-variance prompts")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main_stage() -> dict[str, object]:
    """Claims (a) and (c) on the main stage's collected runs (PROTOCOL.md, Amendment 1's measures)."""
    beta_star = json.loads((HERE / "pilot" / "pilot.json").read_text())["beta_star"]
    found: dict[tuple[str, float], dict[int, Outcome]] = {}
    slopes = []
    for (cell, seed), folder in runs("main").items():
        rows = read(folder)
        found.setdefault((filter_of(cell), beta_of(cell)), {})[seed] = outcome(rows)
        if filter_of(cell) == "none":
            slopes.append(gradient_slopes(rows))
    at_star = {f: arms for (f, b), arms in found.items() if b == beta_star}
    table = [
        {"filter": f, "beta": b, "seed": s, **asdict(o), "template_collapse": o.template_collapse}
        for (f, b), arms in sorted(found.items())
        for s, o in sorted(arms.items())
    ]
    return {
        "beta_star": beta_star,
        "a": claim_a(list(at_star.get("none", {}).values()), list(found.get(("none", 0.0), {}).values())),
        "c": claim_c(at_star),
        "b1": claim_b1(slopes),
        "runs": table,
    }


#: the negative control's seeds (PROTOCOL.md stage 4), and the main stage's two-hop runs it is reported beside
NEGATIVE_SEEDS = 10


def negative_predictions(
    one_hop: dict[float, dict[int, Outcome]], two_hop: dict[float, dict[int, Outcome]], beta_star: float
) -> dict[str, object]:
    """The negative control's two predictions (PROTOCOL.md stage 4), reported either way, no verdict resting on
    them. (n1): at β*, the one-hop runs collapse (MI_end ≤ ½ MI₀) at least as often as the two-hop ones. (n2):
    across the one-hop runs (both β), S does not rise with MI_end/MI₀ (Spearman ρ ≤ 0.2); across the two-hop
    runs it does (ρ > 0.2). ``partial`` while either side has fewer than its 20 runs."""
    from ragen2.grids.stats import spearman

    def rate(arms: dict[float, dict[int, Outcome]]) -> dict[str, object]:
        at_star = list(arms.get(beta_star, {}).values())
        k = sum(o.collapse for o in at_star)
        return {
            "runs_at_beta_star": len(at_star),
            "collapsed_at_beta_star": k,
            "template_collapse_at_beta_star": sum(o.template_collapse for o in at_star),
            "rate_at_beta_star": k / len(at_star) if at_star else math.nan,
            "collapsed_at_beta_0": sum(o.collapse for o in arms.get(0.0, {}).values()),
            "runs_at_beta_0": len(arms.get(0.0, {})),
        }

    def rho(arms: dict[float, dict[int, Outcome]]) -> dict[str, object]:
        every = [o for by_seed in arms.values() for o in by_seed.values()]
        r, p = spearman([o.mi_end / o.mi0 for o in every], [o.success for o in every])
        return {"runs": len(every), "rho": r, "p": p}

    one, two = rate(one_hop), rate(two_hop)
    n1 = {"one_hop": one, "two_hop": two, "holds": bool(one["rate_at_beta_star"] >= two["rate_at_beta_star"])}
    r1, r2 = rho(one_hop), rho(two_hop)
    n2 = {"one_hop": r1, "two_hop": r2, "holds": bool(r1["rho"] <= 0.2 and r2["rho"] > 0.2)}  # NaN: False
    complete = all(
        len(arms.get(b, {})) >= NEGATIVE_SEEDS for arms in (one_hop, two_hop) for b in (0.0, beta_star)
    )
    return {"n1": n1, "n2": n2, "status": "complete" if complete else "partial"}


def negative_stage() -> dict[str, object]:
    """Stage 4 beside the main stage's ``none`` runs of seeds 0–9 (both β): ``negative_predictions`` and each
    run's outcome."""
    beta_star = json.loads((HERE / "pilot" / "pilot.json").read_text())["beta_star"]
    one_hop: dict[float, dict[int, Outcome]] = {}
    two_hop: dict[float, dict[int, Outcome]] = {}
    for (cell, seed), folder in runs("negative").items():
        one_hop.setdefault(beta_of(cell), {})[seed] = outcome(read(folder))
    for (cell, seed), folder in runs("main").items():
        if filter_of(cell) == "none" and seed < NEGATIVE_SEEDS:
            two_hop.setdefault(beta_of(cell), {})[seed] = outcome(read(folder))
    table = [
        {"hops": hops, "beta": b, "seed": s, **asdict(o), "template_collapse": o.template_collapse}
        for hops, arms in ((1, one_hop), (2, two_hop))
        for b, by_seed in sorted(arms.items())
        for s, o in sorted(by_seed.items())
    ]
    return {"beta_star": beta_star, **negative_predictions(one_hop, two_hop, beta_star), "runs": table}


def negative_markdown(result: dict[str, object]) -> str:
    n1, n2 = result["n1"], result["n2"]
    one, two = n1["one_hop"], n1["two_hop"]  # type: ignore[index]
    keys = ["hops", "beta", "seed", "mi0", "mi_end", "h_end", "end", "success", "template_collapse"]
    return (
        f"# Negative control (the reasoning not needed; {result['status']})\n\n"
        f"(n1) at β* = {result['beta_star']}: one-hop {one['collapsed_at_beta_star']}/{one['runs_at_beta_star']} "
        f"collapse, two-hop {two['collapsed_at_beta_star']}/{two['runs_at_beta_star']}: "
        f"{'holds' if n1['holds'] else 'does not hold'}.  \n"  # type: ignore[index]
        f"(n2) Spearman ρ(MI_end/MI₀, S): one-hop {n2['one_hop']['rho']:+.2f} over {n2['one_hop']['runs']} runs, "
        f"two-hop {n2['two_hop']['rho']:+.2f} over {n2['two_hop']['runs']}: "  # type: ignore[index]
        f"{'holds' if n2['holds'] else 'does not hold'}.\n\n"  # type: ignore[index]
        + _table(result["runs"], keys)  # type: ignore[arg-type]
        + "\n"
    )


# the proxies compared with the exact MI: (curve, key, its ceiling's column count or None when it has none)
PROXIES = (
    ("first_turn", "mi_est", 16),
    ("first_turn_c4", "mi_est", 4),
    ("heldout", "mi_est", 64),
    ("first_turn", "contrast", None),
    ("first_turn", "contrast_seq", None),
    ("heldout", "contrast", None),
    ("first_turn", "mi_zscore_ema", None),
    ("first_turn", "retrieval_acc", None),
    ("heldout", "retrieval_acc", None),
)


def saturation_gap(columns: int, within: float = 0.1) -> float:
    """The matched-minus-mismatched gap Δ (nats) beyond which the in-batch estimate log N − log(1 + (N−1)e^(−Δ))
    is within ``within`` of its ceiling log N: past it the estimate cannot show a change in Δ."""
    return -math.log((columns**within - 1) / (columns - 1))


def pearson(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def calibration(stages: list[str]) -> dict[str, object]:
    """Every proxy at every pass of the stages' runs against the exact MI of that pass: Pearson's r over all
    passes and within runs (each run's changes from its first pass), the mean bias for the MI estimates, and how
    often an estimate sat within 10 % of its ceiling."""
    from ragen2.grids.stats import spearman

    rows_by_run = {(stage, *key): read(folder) for stage in stages for key, folder in runs(stage).items()}
    out: dict[str, object] = {}
    for curve, key, columns in PROXIES:
        name = f"diag/{curve}/{key}"
        pairs, changes, held = [], [], []
        for rows in rows_by_run.values():
            exact, proxy = passes(rows, MI), passes(rows, name)
            common = sorted(set(exact) & set(proxy))
            pairs += [(exact[i], proxy[i]) for i in common]
            if common:
                moved = [(exact[i] - exact[common[0]], proxy[i] - proxy[common[0]]) for i in common[1:]]
                changes += moved
                # the runs whose exact MI never halved: the small changes a proxy must follow to warn early
                if min(exact[i] for i in common) > 0.5 * exact[common[0]]:
                    held += moved
        if len(pairs) < 3:
            continue
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        halved = [
            seen for rows in rows_by_run.values() for seen in _halved(passes(rows, MI), passes(rows, name))
        ]
        entry: dict[str, object] = {
            "passes": len(pairs),
            "pearson": pearson(xs, ys),
            "spearman": spearman(xs, ys)[0],
            "pearson_of_changes": pearson([c[0] for c in changes], [c[1] for c in changes])
            if len(changes) >= 3
            else None,
            "spearman_of_changes_held": spearman([c[0] for c in held], [c[1] for c in held])[0]
            if len(held) >= 3
            else None,
            "exact_range": [min(xs), max(xs)],
            # at the passes where the exact MI was at most half its first: the share where the proxy was too
            "halved_passes": len(halved),
            "seen_halved": sum(halved) / len(halved) if halved else None,
            "proxy_range": [min(ys), max(ys)],
        }
        if columns is not None and key == "mi_est":
            ceiling = math.log(columns)
            entry |= {
                "columns": columns,
                "ceiling": ceiling,
                "bias": statistics.fmean(y - x for x, y in pairs),
                "saturated_share": sum(y >= 0.9 * ceiling for y in ys) / len(ys),
                "saturation_gap_nats": saturation_gap(columns),
            }
        out[name] = entry
    return {"stages": stages, "runs": len(rows_by_run), "proxies": out}


def _halved(exact: dict[int, float], proxy: dict[int, float]) -> list[bool]:
    """At each pass where the exact MI is at most half its first value: whether the proxy is at most half its
    first value too (the collapse seen by the proxy, or not)."""
    common = sorted(set(exact) & set(proxy))
    if not common:
        return []
    first = common[0]
    return [proxy[i] <= 0.5 * proxy[first] for i in common if exact[i] <= 0.5 * exact[first]]


def _table(rows: list[dict[str, object]], keys: list[str]) -> str:
    def cell(v: object) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    return "\n".join([*lines, *("| " + " | ".join(cell(r.get(k)) for k in keys) + " |" for r in rows)])


def pilot_markdown(result: dict[str, object]) -> str:
    keys = [
        "beta",
        "seed",
        "mi0",
        "mi_end",
        "h0",
        "h_end",
        "end",
        "format_broke",
        "success",
        "template_collapse",
    ]
    return (
        f"# {result['stage']} ({result['found_runs']} runs)\n\n"
        f"β* = {result['beta_star']} (PROTOCOL.md, Amendment 1: the smallest β at which ≥ 2 of 3 seeds reach "
        "template collapse at their end pass, the last with grammar mass ≥ 0.5); by the rule as first registered "
        f"(also S ≥ 0.2): {result['beta_star_as_registered']}. None: no β qualified.\n\n"
        + _table(result["runs"], keys)  # type: ignore[arg-type]
        + "\n"
    )


def calibration_markdown(result: dict[str, object]) -> str:
    proxies: dict[str, dict[str, object]] = result["proxies"]  # type: ignore[assignment]
    rows = [{"proxy": k, **v} for k, v in proxies.items()]
    keys = [
        "proxy",
        "passes",
        "pearson",
        "spearman",
        "pearson_of_changes",
        "spearman_of_changes_held",
        "bias",
        "saturated_share",
        "seen_halved",
    ]
    return (
        f"# Calibration: each proxy against the exact I(X;Z) ({result['runs']} runs of "
        f"{', '.join(result['stages'])})\n\n"  # type: ignore[arg-type]
        "pearson_of_changes: each run's change from its first pass, proxy against exact; spearman_of_changes_held: "
        "the same in the runs whose exact MI never halved (the small changes). saturated_share: the "
        "passes at which an in-batch estimate sat within 10 % of its ceiling log N. seen_halved: at the passes where the "
        "exact MI was at most half its first value, the share where the proxy was too.\n\n"
        + _table(rows, keys)
        + "\n"
    )


def plot_pilot(result: dict[str, object], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = runs(str(result["stage"]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    betas = sorted({beta_of(cell) for cell, _ in found})
    colours = {b: f"C{i}" for i, b in enumerate(betas)}
    for (cell, _seed), folder in found.items():
        rows, beta = read(folder), beta_of(cell)
        for ax, key in zip(axes, (MI, H)):
            curve = passes(rows, key)
            ax.plot(list(curve), list(curve.values()), color=colours.get(beta, "k"), alpha=0.7, lw=1)
    for ax, title in zip(axes, ("exact I(X;Z) (nats)", "exact H(Z|X) (nats)")):
        ax.set_xlabel("iteration")
        ax.set_title(title)
    for beta, colour in colours.items():
        axes[0].plot([], [], color=colour, label=f"β = {beta}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(folder: Path, name: str, result: dict[str, object], markdown: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({**result, "provenance": provenance()}, indent=1) + "\n")
    if markdown is not None:
        (folder / f"{name}.md").write_text(markdown)
        print(markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("engineering", "pilot", "main", "dose", "negative", "calibration"))
    parser.add_argument(
        "stages", nargs="*", help="pilot: the stage the rule reads; calibration: the stages pooled"
    )
    args = parser.parse_args()
    if args.what == "engineering":
        result = engineering()
        write(HERE / "engineering", "engineering", result)
        print(json.dumps(result, indent=1))
    elif args.what == "pilot":
        stage = (args.stages or ["pilot"])[0]
        result = pilot(stage)
        write(HERE / stage, stage, result, pilot_markdown(result))
        plot_pilot(result, HERE / stage / f"{stage}.png")
    elif args.what == "main":
        result = main_stage()
        keys = ["filter", "beta", "seed", "mi0", "mi_end", "h_end", "end", "success", "template_collapse"]
        verdicts = ", ".join(f"({k}): {result[k]['verdict']}" for k in ("a", "b1", "c"))  # type: ignore[index]
        write(
            HERE / "main",
            "main",
            result,
            f"# Main stage\n\n{verdicts}\n\n" + _table(result["runs"], keys) + "\n",
        )  # type: ignore[arg-type]
    elif args.what == "dose":
        result = dose_stage()
        write(HERE / "dose", "dose", result, dose_markdown(result))
        plot_dose(result, HERE / "dose" / "dose.png")
    elif args.what == "negative":
        result = negative_stage()
        write(HERE / "negative", "negative", result, negative_markdown(result))
    else:
        result = calibration(args.stages or ["pilot"])
        write(HERE / "calibration", "calibration", result, calibration_markdown(result))


if __name__ == "__main__":
    main()
