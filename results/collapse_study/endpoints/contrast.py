"""Post hoc (2026-12-02, not in any protocol): what the study's MI criterion could register, read from the
committed files.

    python results/collapse_study/endpoints/contrast.py --out results/collapse_study/endpoints

Writes ``contrast.json`` and ``contrast.md`` (with the commit, the machine and the command):

- **The input contrast of each endpoint pass** (``passes/<model>/seed<s>/rows.jsonl``): per row, the
  log-likelihood of its reasoning under its own prompt minus the mean over the other prompts, per sequence
  (each column's ``logp_per_token`` × ``num_tokens``; the rows' MI and H(Z|X) recomputed from the same
  numbers agree with ``metrics.json``). Beside it, the share of every row's log-likelihood gaps that would have
  to vanish (all gaps scaled down alike) before the pass's ``mi_est_seq`` fell to half its value, which is
  when rule (a) reads a collapse.
- **The saturation arithmetic**: with N prompt columns and every mismatched column Δ nats behind the matched
  one, the in-batch estimate is log N − log(1 + (N − 1) e^(−Δ)); it is at most ½ log N only for
  Δ ≤ log(1 + √N): log 3 for N = 4, log 5 for N = 16.
- **The regulariser's size** (``../runs/*/csv/metrics.csv``; the same for the second study's pilot runs): per
  gradient pass and RV bucket with reward variance (``grad/<q>/rv_mean`` > 0), the entropy term's gradient
  norm over the task term's (both with their coefficients, as the optimizer sees them); and the ``none``
  runs' steps in iterations without a group of mixed outcome, where the entropy bonus was the whole update.
- **The second study's start**: the rebuilt warm start's pass (``../ppo/warmstart_b1d0e17``, its pilots'
  held-out instances), read as the endpoint passes are, with its cell-reading ceiling
  (``criteria.py``'s ``reading_ceiling``).
- **The instances each first-turn pass scored** (``rollouts.rank0.jsonl.gz``): its groups' start and goal
  cells, and the MI of reasoning that reads exactly those cells (log(C / k) per row, k the groups sharing
  its cells): below log C where two instances share both.
- **(b3)'s points and (c2)'s passes**: the ``none`` runs' (zero-RV share, ΔMI) pairs, and the iterations
  whose instances (c2) compares at matched optimizer steps (``analyze.py``'s own functions).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import importlib.util
import json
import math
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from provenance import provenance

HERE = Path(__file__).resolve().parent
STUDY = HERE.parent

PILOTS = STUDY.parent / "collapse_study_2" / "pilot"  # the second study's pilot runs, <lr>/0
MODELS = ("warmstart", "0", "1", "2", "3", "4", "5")
MI = "diag/first_turn/mi_est_seq"
CELL = re.compile(r"Start: \(([^)]*)\).*?Goal: \(([^)]*)\)", re.S)


def _logsumexp(xs: list[float]) -> float:
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


def sequence_scores(row: dict[str, object]) -> list[float]:
    """log p(z | x_j) per sequence for every column j: the stored per-token mean × the row's tokens."""
    return [float(v) * int(row["num_tokens"]) for v in row["logp_per_token"]]  # type: ignore[union-attr, arg-type]


def mi_scaled(rows: list[dict[str, object]], keep: float) -> float:
    """``mi_est_seq`` of the rows with every log-likelihood gap to the matched column multiplied by ``keep``."""
    values = []
    for row in rows:
        scores, own = sequence_scores(row), int(row["column"])  # type: ignore[arg-type]
        gaps = [keep * (s - scores[own]) for s in scores]
        values.append(math.log(len(scores)) - _logsumexp(gaps))
    return statistics.fmean(values)


def vanish_to_half(rows: list[dict[str, object]]) -> float:
    """The share of every gap that must vanish (all scaled alike) before MI is half its measured value."""
    half, low, high = mi_scaled(rows, 1.0) / 2, 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if mi_scaled(rows, mid) <= half else (low, mid)
    return 1.0 - high


def endpoint_pass(folder: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]
    logged = json.loads((folder / "metrics.json").read_text())["metrics"]
    contrast, matched = [], []
    for row in rows:
        scores, own = sequence_scores(row), int(row["column"])
        others = [s for j, s in enumerate(scores) if j != own]
        contrast.append(scores[own] - statistics.fmean(others))
        matched.append(scores[own])
    return {
        "columns": len(rows[0]["logp_per_token"]),
        "rows": len(rows),
        "mi_est_seq": mi_scaled(rows, 1.0),
        "mi_est_seq_logged": logged["mi_est_seq"],
        "cond_entropy_seq": -statistics.fmean(matched),
        "cond_entropy_seq_logged": logged["cond_entropy_seq"],
        "contrast": statistics.fmean(contrast),
        "contrast_min": min(contrast),
        "contrast_max": max(contrast),
        "vanish_to_half": vanish_to_half(rows),
    }


def _script(path: Path):  # results/ is no package: a script's module, loaded from its file
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gradient_ratios(runs: list[Path]) -> dict[str, object]:
    ratios = []
    for run in runs:
        with (run / "csv" / "metrics.csv").open() as f:
            for row in csv.DictReader(f):
                for q in (f"q{i}" for i in range(1, 7)):
                    task, ent, rv = (row.get(f"grad/{q}/{k}") for k in ("task", "entropy", "rv_mean"))
                    if task and ent and rv and float(rv) > 0 and float(task) > 0:
                        ratios.append(float(ent) / float(task))
    return {
        "n": len(ratios),
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def entropy_only(run: dict[str, object]) -> dict[str, float]:
    """A run's iterations with no group of mixed outcome (every advantage 0, so any step it took followed the
    entropy bonus alone) and the optimizer steps they took."""
    its: dict[int, dict[str, float]] = run["iterations"]  # type: ignore[assignment]
    alone = {
        i: m.get("train/optimizer_steps", 0.0) for i, m in its.items() if m.get("rollout/groups_mixed") == 0
    }
    total = sum(m.get("train/optimizer_steps", 0.0) for m in its.values())
    return {"iterations": sorted(alone), "steps": sum(alone.values()), "of_steps": total}


def instances(run: Path) -> list[dict[str, object]]:
    """Per first-turn pass: the MI logged, the groups' (start, goal) cells and the cell-reading ceiling."""
    with (run / "csv" / "metrics.csv").open() as f:
        logged = {int(r["step"]): float(r[MI]) for r in csv.DictReader(f) if r.get(MI)}
    cells: dict[int, dict[int, tuple[str, str]]] = collections.defaultdict(dict)
    rows: dict[int, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    with gzip.open(run / "rollouts.rank0.jsonl.gz", "rt") as f:
        for line in f:
            episode = json.loads(line)
            it = episode["iteration"]
            if it not in logged:
                continue
            turn = episode["turns"][0]
            found = CELL.search(turn["observation"])
            assert found, turn["observation"]
            cells[it][episode["group"]] = found.groups()  # type: ignore[assignment]
            if "</think>" in turn["text"]:  # a row the pass scores: its reasoning ends
                rows[it][episode["group"]] += 1
    out = []
    for it, mi in sorted(logged.items()):
        sharing = collections.Counter(cells[it].values())
        n, c = sum(rows[it].values()), len(cells[it])
        ceiling = sum(k * math.log(c / sharing[cells[it][g]]) for g, k in rows[it].items()) / n
        shared = sorted({cell for cell, k in sharing.items() if k > 1})
        out.append({"iteration": it, "mi": mi, "ceiling": ceiling, "columns": c, "shared": shared})
    return out


def reading(endpoints: Path, runs: Path, ppo: list[Path]) -> dict[str, object]:
    passes = {m: {s: endpoint_pass(endpoints / m / f"seed{s}") for s in (0, 1)} for m in MODELS}
    analyze = _script(STUDY / "analyze.py")
    study = [analyze.read_run(runs / m) for m in MODELS[1:]]
    arms = {r["folder"]: (r["filter"], r["seed"]) for r in study}
    rise = {
        m: {s: passes[m][s]["contrast"] - passes["warmstart"][s]["contrast"] for s in (0, 1)}
        for m in MODELS[1:]
    }
    saturation = {str(n): math.log(1 + math.sqrt(n)) for n in (4, 16)}
    b3 = {r["folder"]: analyze.zero_share_vs_mi_change(r) for r in study if r["filter"] == "none"}
    c2 = {}
    for seed in sorted({s for _, s in arms.values()}):
        pair = {r["filter"]: r for r in study if r["seed"] == seed}
        its = {f: [i for i, _, _ in analyze.passes(r)] for f, r in pair.items()}  # the passes' iterations
        top, none = analyze.mi_by_steps(pair["top_p"]), analyze.mi_by_steps(pair["none"])
        steps = min(top[-1][0], none[-1][0])
        k = max(j for j, (s, _) in enumerate(none) if s <= steps)
        c2[str(seed)] = {
            "steps": steps,
            "top_p_pass": next((i for i, (s, _) in zip(its["top_p"], top) if s == steps), None),
            "none_between": its["none"][k : k + 1 if none[k][0] == steps else k + 2],
        }
    return {
        "passes": passes,
        "contrast_rise": rise,
        "arms": arms,
        "saturation": saturation,
        "gradient_ratio": gradient_ratios([runs / m for m in MODELS[1:]]),
        "study_2": {
            "start_pass": endpoint_pass(STUDY / "ppo" / "warmstart_b1d0e17"),
            "start_reading_ceiling": _script(HERE / "criteria.py").reading_ceiling(
                [json.loads(line) for line in (STUDY / "ppo" / "warmstart_b1d0e17" / "rows.jsonl").open()]
            ),
            "gradient_ratio": gradient_ratios(sorted(PILOTS.glob("*/0"))),
        },
        "instances": {
            str(p.relative_to(STUDY)): instances(p) for p in [*(runs / m for m in MODELS[1:]), *ppo]
        },
        "entropy_only": {r["folder"]: entropy_only(r) for r in study if r["filter"] == "none"},
        "b3_points": b3,
        "c2_passes": c2,
    }


def markdown(result: dict[str, object]) -> str:
    passes, arms, rise = result["passes"], result["arms"], result["contrast_rise"]
    lines = [
        "# The input contrast and the figures the 2026-12-02 reading rests on (contrast.py, post hoc)",
        "",
        "Contrast = matched − mean mismatched log-likelihood of a row's reasoning, per sequence (nats), the mean "
        "over the pass's rows (min–max over rows); MI = `mi_est_seq` recomputed from the rows (logged value "
        "beside it); vanish = the share of every row's gaps that must vanish, all scaled alike, before MI is "
        "half its value.",
        "",
        "| model | filter | pass | columns | MI (logged) | contrast (rows) | change from the warm start | vanish |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, by_seed in passes.items():  # type: ignore[union-attr]
        arm = "–" if m == "warmstart" else arms[m][0]  # type: ignore[index]
        for s, p in by_seed.items():
            change = "–" if m == "warmstart" else f"{rise[m][s]:+.2f}"  # type: ignore[index]
            lines.append(
                f"| {m} | {arm} | seed{s} | {p['columns']} | {p['mi_est_seq']:.4f} ({p['mi_est_seq_logged']:.4f}) "
                f"| {p['contrast']:.2f} ({p['contrast_min']:.1f}–{p['contrast_max']:.1f}) | {change} "
                f"| {p['vanish_to_half']:.3f} |"
            )
    sat = result["saturation"]
    g = result["gradient_ratio"]
    st, g2 = result["study_2"]["start_pass"], result["study_2"]["gradient_ratio"]  # type: ignore[index]
    lines += [
        "",
        "- **saturation**: MI ≤ ½ log N needs every mismatched column within Δ ≤ log(1 + √N) of the matched "
        f"one: {sat['4']:.3f} nats for N = 4 (log 3), {sat['16']:.3f} for N = 16 (log 5)",  # type: ignore[index]
        f"- **entropy / task gradient norm**, buckets with reward variance: median {100 * g['median']:.2f} % "  # type: ignore[index]
        f"over {g['n']} (run, pass, bucket), {100 * g['min']:.2f}–{100 * g['max']:.2f} %",  # type: ignore[index]
        f"- **the second study's start** (`ppo/warmstart_b1d0e17`, seed 0's 16 held-out instances, its pilots' "
        f"iteration 0): MI {st['mi_est_seq']:.4f}, contrast {st['contrast']:.2f} ({st['contrast_min']:.1f}–"  # type: ignore[index]
        f"{st['contrast_max']:.1f}), vanish {st['vanish_to_half']:.3f}, cell-reading ceiling "  # type: ignore[index]
        f"{result['study_2']['start_reading_ceiling']:.4f}; its pilots' entropy / task gradient norm: "  # type: ignore[index]
        f"median {100 * g2['median']:.2f} % over {g2['n']}, {100 * g2['min']:.2f}–{100 * g2['max']:.2f} %",  # type: ignore[index]
        "- **steps on the entropy bonus alone** (`none` runs, iterations with no group of mixed outcome): "
        + "; ".join(
            f"run {r}: {e['steps']:g} of {e['of_steps']:g} steps (iterations {', '.join(map(str, e['iterations']))})"
            for r, e in result["entropy_only"].items()  # type: ignore[union-attr]
        ),
        "",
        "First-turn passes whose instances share start and goal (MI logged against the cell-reading ceiling):",
        "",
    ]
    for run, rows in result["instances"].items():  # type: ignore[union-attr]
        gaps = max(abs(r["mi"] - r["ceiling"]) for r in rows)
        shared = [
            f"iteration {r['iteration']}, two instances with start ({a}) and goal ({b}): MI {r['mi']:.3f}, "
            f"ceiling {r['ceiling']:.4f}"
            for r in rows
            for a, b in r["shared"]
        ]
        lines.append(
            f"- `{run}`: {'; '.join(shared) or 'none'} (largest |MI − ceiling| over its passes {gaps:.3f})"
        )
    lines += ["", "(b3)'s points, (zero-RV share, ΔMI), per `none` run:", ""]
    for run, points in result["b3_points"].items():  # type: ignore[union-attr]
        lines.append(f"- run {run}: " + ", ".join(f"({s:.4f}, {d:+.3g})" for s, d in points))
    lines += [
        "",
        "(c2)'s matched steps: the `top_p` pass against the `none` passes interpolated between:",
        "",
    ]
    for seed, c in result["c2_passes"].items():  # type: ignore[union-attr]
        lines.append(
            f"- seed {seed}: {c['steps']:g} steps, `top_p` iteration {c['top_p_pass']}, "
            f"`none` iterations {' and '.join(map(str, c['none_between']))}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=Path, default=HERE / "passes")
    parser.add_argument("--runs", type=Path, default=STUDY / "runs")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    ppo = [*sorted((STUDY / "ppo" / "pair_b1d0e17" / "runs").iterdir()), STUDY / "ppo" / "runs" / "0"]
    result = reading(args.passes, args.runs, ppo)
    (args.out / "contrast.json").write_text(
        json.dumps({"provenance": provenance(), **result}, indent=1) + "\n"
    )
    (args.out / "contrast.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main(sys.argv[1:])
