"""The algorithms side by side: one real iteration each, same model, same episodes.

Each variant runs ``ragen2-train``'s own code path (``ragen2.train.run``) for one iteration with the
scripted sampler (rollouts are cheap and identical across variants, so the update dominates), the given
model, and no filter, so every variant trains on the same batch. Reports seconds of rollout and update,
optimizer steps and the update time as a ratio to GRPO's, and records every ``train/*`` number the
iteration logged (losses, grad norms, clip fractions, critic stats) at full precision.

``--baseline FILE`` compares those numbers with an earlier run's JSON, key by key and bit for bit, and
exits 1 on any difference: the guard of a refactor that must not move a number. Keys the baseline lacks
(metrics added since) are listed, not compared.

  python bench/bench_algorithms.py [--model builtin|tiny] [--algos grpo,ppo,...] [--iterations 1]
                                  [--baseline FILE] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from provenance import provenance

from ragen2._env import set_defaults

set_defaults()

from ragen2.config import compose  # noqa: E402
from ragen2.train import run  # noqa: E402

VARIANTS = {
    "grpo": ["algo=grpo"],
    "grpo-kl": ["algo=grpo", "algo.kl_coef=0.001"],
    "drgrpo": ["algo=drgrpo"],
    "dapo": ["algo=dapo"],
    "ppo": ["algo=ppo"],
    "ppo-separate": ["algo=ppo", "algo/critic=separate"],
    "ppo-kl_reward": ["algo=ppo", "algo/kl_reward=adaptive"],
    "rloo": ["algo=rloo"],
    "reinforce_pp": ["algo=reinforce_pp"],
    "reinforce_pp_baseline": ["algo=reinforce_pp_baseline"],
    "gspo": ["algo=gspo"],
}
ALL = ",".join(VARIANTS)


def compare(rows: dict[str, dict], baseline: dict[str, dict]) -> list[str]:
    """Every recorded ``train/*`` number that differs from the baseline's, as printable lines."""
    diffs = []
    for name, row in rows.items():
        if name not in baseline:
            continue
        old, new = baseline[name]["train"], row["train"]
        for key in sorted(old):
            if key not in new:
                diffs.append(f"{name}: {key} no longer logged (baseline {old[key]!r})")
            elif new[key] != old[key]:
                diffs.append(f"{name}: {key} {old[key]!r} -> {new[key]!r}")
        added = sorted(set(new) - set(old))
        if added:
            print(f"{name}: new keys, not compared: {', '.join(added)}")
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="builtin")
    parser.add_argument("--algos", default=ALL)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=1, help="numbers are the last iteration's")
    parser.add_argument("--baseline", type=Path, default=None, help="a results JSON to compare bit for bit")
    parser.add_argument(
        "--out", type=Path, default=None, help="default bench/results/algorithms[_MODEL].json"
    )
    args = parser.parse_args()
    record = provenance()
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
        f"iterations={args.iterations}",
        "diagnostics=off",
        "trainer.limit_val_batches=0",
        "callbacks.curves=null",
        "callbacks.rollout_table=null",
    ]
    rows: dict[str, dict] = {}
    for name in names:
        with tempfile.TemporaryDirectory() as run_dir:
            m = run(compose([*common, *VARIANTS[name]], run_dir=run_dir))
        rows[name] = {
            "rollout_s": m["time/rollout"],
            "update_s": m["time/update"],
            "optimizer_steps": m["train/optimizer_steps"],
            "episodes": m.get("filter/dynamic_groups_kept", args.groups) * args.group_size,
            "train": {k: v for k, v in sorted(m.items()) if k.startswith("train/")},
        }
    base = rows.get("grpo", next(iter(rows.values())))["update_s"]
    print(
        f"\n{'variant':<22}{'rollout s':>10}{'update s':>10}{'steps':>7}{'episodes':>10}"
        f"{'loss':>12}{'grad norm':>12}{'update ÷ grpo':>15}"
    )
    for name, r in rows.items():
        r["update_ratio_to_grpo"] = r["update_s"] / base
        print(
            f"{name:<22}{r['rollout_s']:>10.1f}{r['update_s']:>10.1f}{r['optimizer_steps']:>7.0f}"
            f"{r['episodes']:>10.0f}{r['train']['train/loss']:>+12.6f}{r['train']['train/grad_norm']:>12.6f}"
            f"{r['update_ratio_to_grpo']:>15.2f}"
        )
    suffix = "" if args.model == "builtin" else f"_{Path(args.model).name}"
    out = args.out or Path(__file__).parent / "results" / f"algorithms{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "provenance": record,
                "args": {**vars(args), "baseline": args.baseline and str(args.baseline), "out": str(out)},
                "results": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    if args.baseline is not None:
        diffs = compare(rows, json.loads(args.baseline.read_text())["results"])
        compared = [n for n in rows if n in json.loads(args.baseline.read_text())["results"]]
        print("\n".join(diffs) if diffs else f"bit-identical to {args.baseline}: {', '.join(compared)}")
        if diffs:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
