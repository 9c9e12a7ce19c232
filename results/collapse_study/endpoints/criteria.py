"""The supplement's pre-registered criteria (PROTOCOL.md beside this file) from its 64-row MI passes.

    python results/collapse_study/endpoints/criteria.py outputs/collapse_study/endpoints \
        [--runs results/collapse_study/runs] [--out results/collapse_study/endpoints]

Reads ``<passes>/<model>/seed<s>/metrics.json`` (``ragen2-diagnose``'s report; model = ``warmstart`` or a
study run's folder name) and each run's arm (filter, seed) from ``<runs>/<r>/.hydra/overrides.yaml``; writes
``endpoints.json`` and ``endpoints.md``: per model the mean over its passes of I = ``mi_est_seq`` and H =
``cond_entropy_seq``, then (a-64) each run's outcome against the warm start, (a-loss) I_r − I_W per arm and
(c-end) I(top_p) − I(none) per pair, each with its 95 % t interval, and the saturation check.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[2] / "bench")]
from analyze import collapse_outcome, collapse_verdict, overrides, paired, paired_seeds  # noqa: E402  (the study's own verdict rules)
from provenance import provenance  # noqa: E402

WARM = "warmstart"
SATURATED = {"retrieval_acc": 0.95, "mi_fraction": 0.9}  # PROTOCOL.md's saturation check
# the warm start's reasoning names the player's and the goal's cells ("I am at (0, 1). The goal is at (0, 2).")
CELLS = re.compile(r"I am at \((\d+), (\d+)\)\. The goal is at \((\d+), (\d+)\)")


def read_passes(folder: Path) -> dict[str, list[dict[str, float]]]:
    """model -> the metrics of each of its passes (by seed folder name)."""
    out: dict[str, list[dict[str, float]]] = {}
    for path in sorted(folder.glob("*/seed*/metrics.json")):
        out.setdefault(path.parent.parent.name, []).append(json.loads(path.read_text())["metrics"])
    return out


def read_arm(run: Path) -> tuple[str, int]:
    """(filter, seed) of a study run, from its Hydra overrides (the defaults: top_p, 0)."""
    arm = overrides(run)
    return arm.get("filter", "top_p"), int(arm.get("seed", 0))


def summary(passes: list[dict[str, float]]) -> dict[str, object]:
    """One model: I and H as the mean over its passes, and each pass's I, H, retrieval, C and rows."""
    return {
        "I": statistics.fmean(p["mi_est_seq"] for p in passes),
        "H": statistics.fmean(p["cond_entropy_seq"] for p in passes),
        "passes": [
            {
                "I": p["mi_est_seq"],
                "H": p["cond_entropy_seq"],
                "retrieval": p["retrieval_acc"],
                "C": round(math.exp(p["mi_upper_bound"])),
                "rows": int(p["rows"]),
            }
            for p in passes
        ],
    }


def outcome(model: dict[str, object], warm: dict[str, object]) -> str:
    """(a-64): the study's rule (a), with the warm start as iteration 0."""
    return collapse_outcome(warm["I"], warm["H"], model["I"], model["H"])  # type: ignore[arg-type]


def saturated(warm_passes: list[dict[str, float]]) -> bool:
    return all(
        p["retrieval_acc"] >= SATURATED["retrieval_acc"]
        and p["mi_est_seq"] >= SATURATED["mi_fraction"] * p["mi_upper_bound"]
        for p in warm_passes
    )


def reading_ceiling(rows: list[dict[str, object]]) -> float | None:
    """Post hoc (not in PROTOCOL.md): the pass's MI if the reasoning read exactly the player's and the goal's
    cells and nothing else. A row then scores alike under the k prompts that share its instance's two cells
    and far lower under the rest, so its matched − marginal is log(C / k); the mean over rows. Each prompt's
    cells are the ones its rows name most often; None when some prompt's rows name none."""
    named: dict[int, collections.Counter[tuple[str, ...]]] = {}
    for row in rows:
        found = CELLS.search(str(row["reasoning"]))
        if found:
            named.setdefault(int(row["column"]), collections.Counter())[found.groups()] += 1  # type: ignore[arg-type]
    columns = {int(row["column"]) for row in rows}  # type: ignore[arg-type]
    if set(named) != columns:
        return None
    cells = {c: counts.most_common(1)[0][0] for c, counts in named.items()}
    sharing = collections.Counter(cells.values())
    return statistics.fmean(math.log(len(columns) / sharing[cells[int(r["column"])]]) for r in rows)  # type: ignore[arg-type]


def analyze(passes: dict[str, list[dict[str, float]]], arms: dict[str, tuple[str, int]]) -> dict[str, object]:
    models = {name: summary(p) for name, p in passes.items()}
    warm = models[WARM]
    runs = {
        r: {"filter": arms[r][0], "seed": arms[r][1], **models[r], "outcome": outcome(models[r], warm)}
        for r in sorted(arms)
        if r in models
    }
    none = [v["outcome"] for v in runs.values() if v["filter"] == "none"]
    result: dict[str, object] = {"warmstart": warm, "runs": runs, "saturated": saturated(passes[WARM])}
    result["a-64"] = {"none_outcomes": none, "verdict": collapse_verdict(none)}
    for arm in ("none", "top_p"):
        loss = {v["seed"]: v["I"] - warm["I"] for v in runs.values() if v["filter"] == arm}  # type: ignore[operator]
        result[f"a-loss {arm}"] = paired(loss, loss, "gained", "lost")
    by_arm = {(v["filter"], v["seed"]): v["I"] for v in runs.values()}
    diffs = {s: by_arm["top_p", s] - by_arm["none", s] for s in paired_seeds(by_arm)}  # type: ignore[operator]
    result["c-end"] = paired(diffs, diffs, "higher under the filter", "lower under the filter")
    return result


def markdown(result: dict[str, object]) -> str:
    warm = result["warmstart"]
    lines = [
        "# The 64-row endpoint passes (endpoints/criteria.py)",
        "",
        "I = `mi_est_seq`, H = `cond_entropy_seq` (nats), each the mean of the model's two passes "
        "(16 held-out instances × 4 first-turn samples each); per pass: I / retrieval / C / rows.",
        "",
        "| model | filter | seed | I | H | passes | outcome (a-64) |",
        "|---|---|---|---|---|---|---|",
    ]

    def cells(m: dict[str, object]) -> str:
        each = "; ".join(
            f"{p['I']:.3f} / {p['retrieval']:.2f} / {p['C']} / {p['rows']}"
            for p in m["passes"]  # type: ignore[union-attr]
        )
        return f"{m['I']:.3f} | {m['H']:.3f} | {each}"

    lines.append(f"| warm start | – | – | {cells(warm)} | – |")  # type: ignore[arg-type]
    for r, v in result["runs"].items():  # type: ignore[union-attr]
        lines.append(f"| run {r} | {v['filter']} | {v['seed']} | {cells(v)} | {v['outcome']} |")
    lines += ["", f"- **saturated** (PROTOCOL.md's check): {result['saturated']}"]
    for key in ("a-64", "a-loss none", "a-loss top_p", "c-end", "reading_ceiling (post hoc)"):
        lines.append(f"- **{key}**: `{json.dumps(result[key])}`")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("passes", type=Path, help="run.sh's folder: <model>/seed<s>/metrics.json")
    parser.add_argument("--runs", type=Path, default=HERE.parent / "runs", help="the study's runs (arms)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args(argv)
    arms = {f.name: read_arm(f) for f in args.runs.iterdir() if (f / ".hydra" / "overrides.yaml").is_file()}
    result = analyze(read_passes(args.passes), arms)
    warm_rows = sorted((args.passes / WARM).glob("seed*/rows.jsonl"))
    result["reading_ceiling (post hoc)"] = [
        reading_ceiling([json.loads(line) for line in path.read_text().splitlines()]) for path in warm_rows
    ]
    (args.out / "endpoints.json").write_text(
        json.dumps({"provenance": provenance(), **result}, indent=1) + "\n"
    )
    (args.out / "endpoints.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main(sys.argv[1:])
