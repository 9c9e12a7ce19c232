"""The collapse study's pre-registered criteria (PROTOCOL.md) from its runs' metrics, written before any run.

    python results/collapse_study/analyze.py outputs/collapse_study/runs [--out results/collapse_study]
    python results/collapse_study/analyze.py results/collapse_study/ppo/runs --algo ppo --out results/collapse_study/ppo
    python results/collapse_study/analyze.py outputs/collapse_study_gpu/runs --curve heldout --out <folder>

Reads each run's ``.hydra/overrides.yaml`` (filter, seed, algo) and ``csv/metrics.csv``; prints and writes
``criteria.json`` and ``criteria.md``: (a) each run's outcome at its last MI pass against iteration 0,
(b2) the per-sample entropy-gradient ratio across RV buckets, (b3) Spearman's ρ of the zero-RV share
against the next pass's change in MI over the ``none`` runs, (c1) validation success top_p − none per
seed and its 95 % t interval, (c2) first-turn MI top_p − none per seed at the largest optimizer-step count
both runs of the pair reached at a pass (linear between passes, as ``ragen2-aggregate --pair`` matches steps)
and its 95 % t interval. MI and H(Z|X) are the batch's first-turn curve's, as registered, or with
``--curve heldout`` those of the held-out instances (``diagnostics.heldout``).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from provenance import provenance

from ragen2.grids.stats import ci95, spearman
from ragen2.grids.steps import STEPS_KEY, at_step, by_steps


def curve_keys(curve: str) -> tuple[str, str]:
    """The MI and H(Z|X) columns the criteria read of an MI curve (``first_turn`` as registered; ``heldout``
    for a run with ``diagnostics.heldout``)."""
    return f"diag/{curve}/mi_est_seq", f"diag/{curve}/cond_entropy_seq"


MI, H = curve_keys("first_turn")
LOG2 = math.log(2.0)
# pairs the protocol plans per algorithm; fewer finished: every verdict is interim
PAIRS = {"grpo": 3, "ppo": 1}


def _float(value: str | None) -> float | None:
    try:
        x = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return x if x is not None and math.isfinite(x) else None


def overrides(folder: Path) -> dict[str, str]:
    """A run's command-line overrides, from its ``.hydra/overrides.yaml``."""
    lines = (folder / ".hydra" / "overrides.yaml").read_text().splitlines()
    return dict(line.removeprefix("- ").split("=", 1) for line in lines if "=" in line)


def read_run(folder: Path) -> dict[str, object]:
    """One run: its arm (filter, seed, algo) and its metrics by iteration (every row logged at that step)."""
    arm = overrides(folder)
    by_iteration: dict[int, dict[str, float]] = {}
    with (folder / "csv" / "metrics.csv").open() as f:
        for row in csv.DictReader(f):
            it = _float(row.get("step"))  # the iteration: validation's rows carry no train/iteration
            if it is None:
                continue
            values = {k: x for k, v in row.items() if (x := _float(v)) is not None}
            by_iteration.setdefault(int(it), {}).update(values)
    return {
        "folder": folder.name,
        "filter": arm.get("filter", "top_p"),
        "seed": int(arm.get("seed", 0)),
        "algo": arm.get("algo", "grpo"),
        "iterations": by_iteration,
    }


def t_interval(values: list[float]) -> dict[str, float | int | None]:
    """Mean and two-sided 95 % Student t interval (``ragen2.grids.stats.ci95``; None bounds for fewer than
    2 values)."""
    ci = ci95(values)
    bound = {k: None if math.isnan(v) else v for k, v in (("low", ci.low), ("high", ci.high))}
    return {"n": len(values), "mean": ci.mean, **bound}


def passes(run: dict[str, object], keys: tuple[str, str] = (MI, H)) -> list[tuple[int, float, float]]:
    """(iteration, MI, H) at each MI pass."""
    its: dict[int, dict[str, float]] = run["iterations"]  # type: ignore[assignment]
    mi, h = keys
    return [(i, m[mi], m[h]) for i, m in sorted(its.items()) if mi in m and h in m]


def mi_by_steps(run: dict[str, object], mi: str = MI) -> list[tuple[float, float]]:
    """(c2): (optimizer steps taken before the pass's iteration, MI) at each MI pass, read as
    ``ragen2-aggregate`` reads it (``ragen2.grids.steps.by_steps`` of the run's columns by iteration)."""
    its: dict[int, dict[str, float]] = run["iterations"]  # type: ignore[assignment]
    series: dict[str, list[tuple[float, float]]] = {}
    for i, m in sorted(its.items()):
        for key in (mi, STEPS_KEY, "train/iteration"):
            if key in m:
                series.setdefault(key, []).append((float(i), m[key]))
    return by_steps(series, mi)


def outcome(run: dict[str, object], keys: tuple[str, str] = (MI, H)) -> str:
    """(a): template collapse, full collapse or none, the last pass against iteration 0's."""
    p = passes(run, keys)
    if len(p) < 2 or p[0][0] != 0:
        return "too few passes"
    (_, mi0, h0), (_, mit, ht) = p[0], p[-1]
    return collapse_outcome(mi0, h0, mit, ht)


def collapse_outcome(mi0: float, h0: float, mit: float, ht: float) -> str:
    """(a) from MI and H at the start and at the end."""
    if mit > 0.5 * mi0:
        return "no collapse"
    return "template collapse" if ht >= 0.5 * h0 else "full collapse"


def entropy_ratios(run: dict[str, object]) -> list[float]:
    """(b2): per gradient pass, log(largest / smallest) per-sample entropy-gradient norm over the buckets."""
    out = []
    for m in run["iterations"].values():  # type: ignore[union-attr]
        norms = [
            v for k, v in m.items() if k.startswith("grad/q") and k.endswith("/entropy_per_sample") and v > 0
        ]
        if len(norms) >= 2:
            out.append(math.log(max(norms) / min(norms)))
    return out


def zero_share_vs_mi_change(
    run: dict[str, object], keys: tuple[str, str] = (MI, H)
) -> list[tuple[float, float]]:
    """(b3): (mean zero-RV share over iterations t … t′−1, MI_t′ − MI_t) for consecutive passes t, t′.

    ``rollout/groups_all_success`` and ``rollout/groups_all_fail`` are already shares of the iteration's
    groups (``ragen2.data.metrics``), so an iteration's zero-RV share is their sum."""
    its: dict[int, dict[str, float]] = run["iterations"]  # type: ignore[assignment]
    p = passes(run, keys)
    pairs = []
    for (t, mi_t, _), (u, mi_u, _) in itertools.pairwise(p):
        shares = [
            m.get("rollout/groups_all_success", 0.0) + m.get("rollout/groups_all_fail", 0.0)
            for i in range(t, u)
            if (m := its.get(i)) and ("rollout/groups_all_success" in m or "rollout/groups_all_fail" in m)
        ]
        if shares:
            pairs.append((statistics.fmean(shares), mi_u - mi_t))
    return pairs


def collapse_verdict(outcomes: list[str]) -> str:
    """(a) over the ``none`` runs' outcomes."""
    if outcomes.count("template collapse") >= 2:
        return "supported"
    if outcomes and all(o == "no collapse" for o in outcomes):
        return "refuted for this setting"
    return "not separated from full collapse" if outcomes.count("full collapse") >= 2 else "inconclusive"


def last(run: dict[str, object], key: str) -> float | None:
    its: dict[int, dict[str, float]] = run["iterations"]  # type: ignore[assignment]
    values = [m[key] for _, m in sorted(its.items()) if key in m]
    return values[-1] if values else None


def paired_seeds(by_arm: dict[tuple[str, int], object]) -> list[int]:
    """The seeds with both a ``top_p`` and a ``none`` run."""
    return sorted({s for f, s in by_arm if f == "top_p"} & {s for f, s in by_arm if f == "none"})


def paired(diffs: dict[int, float], per_seed: object, above: str, below: str) -> dict[str, object]:
    """(c): the mean top_p − none difference over the pairs with its 95 % t interval, each seed's entry, and
    the verdict: ``above`` if the interval is above 0, ``below`` if below, else no difference shown."""
    ci: dict[str, object] = {**t_interval(list(diffs.values())), "per_seed": per_seed}
    low, high = ci["low"], ci["high"]
    ci["verdict"] = (
        "inconclusive"
        if low is None
        else above
        if low > 0  # type: ignore[operator]
        else below
        if high < 0  # type: ignore[operator]
        else "no difference shown"
    )
    return ci


def analyze(
    runs: list[dict[str, object]], algo: str = "grpo", curve: str = "first_turn"
) -> dict[str, object]:
    """The criteria over the runs of one algorithm (the GRPO pairs, or the PPO pair read the same way), MI
    and H(Z|X) read of ``curve``."""
    keys = curve_keys(curve)
    chosen = [r for r in runs if r["algo"] == algo]
    none = [r for r in chosen if r["filter"] == "none"]
    result: dict[str, object] = {
        "algo": algo,
        "curve": curve,
        "runs": [
            {
                "folder": r["folder"],
                "filter": r["filter"],
                "seed": r["seed"],
                "algo": r["algo"],
                "iterations": len(r["iterations"]),  # type: ignore[arg-type]
                "passes": passes(r, keys),
                "outcome": outcome(r, keys),
                "val/success": last(r, "val/success"),
                "val/sampled_success": last(r, "val/sampled_success"),
            }
            for r in chosen
        ],
    }
    outcomes = [outcome(r, keys) for r in none]
    result["a"] = {"none_outcomes": outcomes, "verdict": collapse_verdict(outcomes)}
    ratios = [x for r in chosen for x in entropy_ratios(r)]
    b2 = t_interval(ratios)
    b2["verdict"] = (
        "inconclusive"
        if b2["high"] is None
        else "supported"
        if b2["high"] < LOG2  # type: ignore[operator]
        else "refuted"
        if b2["low"] > LOG2  # type: ignore[operator]
        else "inconclusive"
    )
    result["b2"] = b2
    points = [p for r in none for p in zero_share_vs_mi_change(r, keys)]
    if len(points) >= 3:
        rho, p_two = spearman([s for s, _ in points], [d for _, d in points])
        p_less = p_two / 2 if rho < 0 else 1 - p_two / 2
        verdict = "supported" if rho <= -0.3 and p_less < 0.05 else "refuted" if rho >= 0 else "inconclusive"
        result["b3"] = {"n": len(points), "rho": float(rho), "p_one_sided": float(p_less), "verdict": verdict}
    else:
        result["b3"] = {"n": len(points), "verdict": "too few passes"}
    for key in ("val/sampled_success", "val/success"):
        arms = {(r["filter"], r["seed"]): last(r, key) for r in chosen}
        diffs = {
            s: arms["top_p", s] - arms["none", s]
            for s in paired_seeds(arms)
            if None not in (arms["top_p", s], arms["none", s])
        }  # type: ignore[operator]
        result[f"c1 {key}"] = paired(diffs, diffs, "filter helps", "filter hurts")
    curves = {(r["filter"], r["seed"]): mi_by_steps(r, keys[0]) for r in chosen}
    matched: dict[int, dict[str, float]] = {}
    for s in paired_seeds(curves):
        a, b = curves["top_p", s], curves["none", s]
        if a and b:
            steps = min(a[-1][0], b[-1][0])
            mi_a, mi_b = at_step(a, steps), at_step(b, steps)
            matched[s] = {"steps": steps, "top_p": mi_a, "none": mi_b, "diff": mi_a - mi_b}  # type: ignore[operator]
    diffs = {s: m["diff"] for s, m in matched.items()}
    result["c2"] = paired(diffs, matched, "filter preserves MI", "refuted")
    # a finished pair: both arms validated, i.e. a seed of (c1)'s differences
    finished = len(result["c1 val/sampled_success"]["per_seed"])  # type: ignore[index]
    result["pairs"] = {"finished": finished, "planned": PAIRS[algo], "interim": finished < PAIRS[algo]}
    return result


def markdown(result: dict[str, object]) -> str:
    lines = [
        f"# The collapse study's criteria (analyze.py, algo={result['algo']}, curve={result['curve']})",
        "",
        "| run | filter | seed | algo | iterations | outcome | val success | val sampled |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:  # type: ignore[union-attr]
        lines.append(
            f"| {r['folder']} | {r['filter']} | {r['seed']} | {r['algo']} | {r['iterations']} | {r['outcome']} | "
            f"{r['val/success']} | {r['val/sampled_success']} |"
        )
    pairs = result["pairs"]
    if pairs["interim"]:  # type: ignore[index]
        lines += [
            "",
            f"**Interim: {pairs['finished']} of {pairs['planned']} pairs finished.** Each verdict below "  # type: ignore[index]
            "applies the criterion to the finished runs only; the study's verdict needs every pair.",
        ]
    lines.append("")
    for key in ("pairs", "a", "b2", "b3", "c1 val/sampled_success", "c1 val/success", "c2"):
        lines.append(f"- **{key}**: `{json.dumps(result[key])}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, help="the study's runs folder (0/, 1/, …)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    parser.add_argument("--algo", choices=sorted(PAIRS), default="grpo", help="whose runs the criteria read")
    parser.add_argument(
        "--curve",
        choices=("first_turn", "heldout"),
        default="first_turn",
        help="the MI curve the criteria read",
    )
    args = parser.parse_args(argv)
    runs = [
        read_run(f)
        for f in sorted(args.runs.iterdir(), key=lambda p: p.name)
        if (f / "csv" / "metrics.csv").is_file()
    ]
    result = analyze(runs, args.algo, args.curve)
    # the analysis's own commit, machine and command (the runs' are in their .hydra/ and stages/*.log)
    record = {"provenance": provenance(), **result}
    (args.out / "criteria.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "criteria.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main(sys.argv[1:])
