"""The main table's algorithms side by side: one real iteration each, same model, same seeds.

Each algorithm runs ``ragen2-train``'s own code path (``ragen2.train.run``) for one iteration with the
scripted sampler (so rollouts are cheap and identical across algorithms and the update dominates), the
given model, and no filter, so every algorithm trains on the same batch. Reports seconds of rollout and
update, optimizer steps and tokens trained, and the update time as a ratio to GRPO's. DAPO's rollout
covers its extra dynamic-sampling rounds. Writes bench/results/algorithms.json.

  python bench/bench_algorithms.py [--model builtin] [--algos grpo,drgrpo,dapo,ppo,ppo-separate]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ragen2._env import set_defaults

set_defaults()

from ragen2.config import compose  # noqa: E402
from ragen2.train import run  # noqa: E402

VARIANTS = {
    "grpo": ["algo=grpo"],
    "drgrpo": ["algo=drgrpo"],
    "dapo": ["algo=dapo"],
    "ppo": ["algo=ppo"],
    "ppo-separate": ["algo=ppo", "+algo/critic=separate"],
    "rloo": ["algo=rloo"],
    "reinforce_pp": ["algo=reinforce_pp"],
    "gspo": ["algo=gspo"],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--algos", default="grpo,drgrpo,dapo,ppo,ppo-separate")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    names = args.algos.split(",")
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"--algos: unknown {unknown}; choose from {sorted(VARIANTS)}")
    common = [
        f"model.name_or_path={args.model}",
        "rollout=scripted",
        f"rollout.groups={args.groups}",
        f"rollout.group_size={args.group_size}",
        "filter=none",
        "iterations=1",
        "diagnostics=off",
        "trainer.limit_val_batches=0",
        "callbacks.curves=null",
        "callbacks.rollout_table=null",
    ]
    rows: dict[str, dict[str, float]] = {}
    for name in names:
        with tempfile.TemporaryDirectory() as run_dir:
            m = run(compose([*common, *VARIANTS[name]], run_dir=run_dir))
        rows[name] = {
            "rollout_s": m["time/rollout"],
            "update_s": m["time/update"],
            "optimizer_steps": m["train/optimizer_steps"],
            "episodes": m.get("filter/dynamic_groups_kept", args.groups) * args.group_size,
        }
    base = rows.get("grpo", next(iter(rows.values())))["update_s"]
    print(f"\n{'algo':<14}{'rollout s':>10}{'update s':>10}{'steps':>7}{'episodes':>10}{'update ÷ grpo':>15}")
    for name, r in rows.items():
        r["update_ratio_to_grpo"] = r["update_s"] / base
        print(
            f"{name:<14}{r['rollout_s']:>10.1f}{r['update_s']:>10.1f}{r['optimizer_steps']:>7.0f}"
            f"{r['episodes']:>10.0f}{r['update_ratio_to_grpo']:>15.2f}"
        )
    out = Path(__file__).parent / "results" / "algorithms.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
