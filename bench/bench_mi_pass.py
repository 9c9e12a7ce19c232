"""The MI pass's cost at the paper's cadence and budget, on the main job's settings (docs/method.md §3 "Cost").

Trains the main job (built-in SmolLM2-135M on FrozenLake, the CPU defaults) with ``diagnostics=paper``
(every mode, 64 rows per mode) but the pass run at *every* iteration, so each iteration gives a pass
time and its own iteration time (rollout + update) side by side in one run. The paper runs the pass
every 5 iterations, so its share of the iterations it serves is pass / (5 · iteration); the goal is
≤ 15 %. Prints a table and writes ``bench/results/mi_pass.json``.

    python bench/bench_mi_pass.py [--iterations 2] [--every 5] [extra Hydra overrides …]
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
from pathlib import Path

from provenance import provenance

from ragen2.config import compose
from ragen2.train import run

RESULTS = Path(__file__).resolve().parent / "results" / "mi_pass.json"
GOAL = 0.15


def _rows(metrics_csv: Path) -> list[dict[str, float]]:
    """One dict per iteration of the non-empty numbers Lightning's CSV logger wrote."""
    by_step: dict[int, dict[str, float]] = {}
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            step = int(float(row.get("step") or 0))
            by_step.setdefault(step, {}).update({k: float(v) for k, v in row.items() if v not in ("", None)})
    return [by_step[s] for s in sorted(by_step)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--every", type=int, default=5, help="the paper's cadence: one pass per this many")
    parser.add_argument(
        "overrides", nargs="*", help="extra Hydra overrides (e.g. model=tiny for a smoke run)"
    )
    args = parser.parse_args()
    record = provenance()

    overrides = [
        "diagnostics=paper",
        "diagnostics.every_n_iterations=1",  # a pass at every iteration: each one measured beside it
        f"iterations={args.iterations}",
        "trainer.limit_val_batches=0",  # validation is not part of an iteration's cost
        "callbacks.curves=null",
        *args.overrides,
    ]
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose(overrides, run_dir=run_dir)
        start = time.perf_counter()
        run(cfg)
        wall = time.perf_counter() - start
        logged = [r for r in _rows(Path(run_dir) / "csv" / "metrics.csv") if "time/diagnostics" in r]

    table = []
    for r in logged:
        update = r.get("time/update", 0.0)  # absent when the filter kept no group: no update ran
        iteration = r["time/rollout"] + update
        curves = sorted(k.split("/")[1] for k in r if k.startswith("diag/") and k.endswith("/columns"))
        table.append(
            {
                "iteration": int(r.get("epoch", len(table))),
                "rollout_s": round(r["time/rollout"], 2),
                "update_s": round(update, 2),
                "iteration_s": round(iteration, 2),
                "pass_s": round(r["time/diagnostics"], 2),
                "share_of_every_5": round(r["time/diagnostics"] / (args.every * iteration), 4),
                "tokens_processed": int(r["diag/tokens_processed"]),
                "token_bound_ratio": round(r.get("diag/token_bound_ratio", float("nan")), 3),
                "curves": {
                    c: {"rows": int(r[f"diag/{c}/rows"]), "columns": int(r[f"diag/{c}/columns"])}
                    for c in curves
                },
            }
        )
    print(
        f"{'iter':>4}{'rollout s':>11}{'update s':>10}{'pass s':>8}{'pass/(5·iter)':>15}{'tokens':>9}"
        f"{'tok/bound':>11}  curves (rows×columns)"
    )
    for row in table:
        shapes = " ".join(f"{c} {v['rows']}×{v['columns']}" for c, v in row["curves"].items())
        print(
            f"{row['iteration']:>4}{row['rollout_s']:>11.1f}{row['update_s']:>10.1f}{row['pass_s']:>8.1f}"
            f"{row['share_of_every_5']:>15.1%}{row['tokens_processed']:>9}{row['token_bound_ratio']:>11.3f}  {shapes}"
        )
    total_pass = sum(r["pass_s"] for r in table)
    total_iter = sum(r["iteration_s"] for r in table)
    share = total_pass / (args.every * total_iter) if total_iter else float("nan")
    print(
        f"all iterations: pass / ({args.every} · iteration) = {share:.1%} (goal ≤ {GOAL:.0%}); run {wall:.0f} s"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "provenance": record,
                "setup": {"overrides": overrides, "every": args.every, "goal": GOAL},
                "iterations": table,
                "share_of_every_5": round(share, 4),
                "within_goal": share <= GOAL,
                "run_seconds": round(wall, 1),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
