"""The held-out MI curve during training against ``ragen2-diagnose`` on the same weights.

One training iteration from a warm start with ``diagnostics.heldout.num_seeds=16 samples=4`` and seed 0: its MI
pass samples and scores the first turns of the same 16 held-out instances, with the same sampler seed, as
``ragen2-diagnose num_seeds=16 samples=4 seed=0`` (``endpoints/run.sh``) does before any step. The two
should agree; this writes both, side by side, with the weights' hash, the commit, the machine and the
command.

    python results/collapse_study/heldout_check.py outputs/collapse_study_ppo_pair/warmstart/model \
        results/collapse_study/ppo/warmstart_b1d0e17/metrics.json --out results/collapse_study/ppo/warmstart_b1d0e17/heldout_check.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from provenance import provenance

from ragen2.config import compose
from ragen2.train import run

# run.sh's environment and rollout settings, one iteration on a small batch (2 x 2, one mini-batch):
# the held-out curve's instances and sampler seed come from the run's seed alone, not from the batch
OVERRIDES = [
    "env=frozenlake",
    "env.kwargs.size=3",
    "env.kwargs.p=0.8",
    "env.kwargs.observation=coord",
    "max_turns_cap=5",
    "rollout.max_new_tokens=48",
    "rollout.groups=2",
    "rollout.group_size=2",
    "algo.mini_batch_size=4",
    "iterations=1",
    "seed=0",
    "diagnostics.heldout.num_seeds=16",
    "diagnostics.heldout.samples=4",
    "trainer.limit_val_batches=0",
    "callbacks.curves=null",
]
KEYS = ("mi_est_seq", "cond_entropy_seq", "retrieval_acc", "rows", "columns")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="the warm start's HF folder")
    parser.add_argument("diagnose", type=Path, help="ragen2-diagnose's metrics.json on the same weights")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    record = {"provenance": provenance(), "weights_sha256": sha256(args.model / "model.safetensors")}
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = compose([*OVERRIDES, f"model.name_or_path={args.model.resolve()}"], run_dir=run_dir)
        metrics = run(cfg)
    diagnosed = json.loads(args.diagnose.read_text())["metrics"]
    record["overrides"] = OVERRIDES
    record["training_pass"] = {k: metrics[f"diag/heldout/{k}"] for k in KEYS}
    record["ragen2_diagnose"] = {k: diagnosed[k] for k in KEYS}
    record["difference"] = {k: record["training_pass"][k] - diagnosed[k] for k in KEYS}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print("| | " + " | ".join(KEYS) + " |\n|---|" + "---|" * len(KEYS))
    for name in ("training_pass", "ragen2_diagnose", "difference"):
        print(f"| {name} | " + " | ".join(f"{record[name][k]:.6g}" for k in KEYS) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
