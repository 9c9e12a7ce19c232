"""The organism's speed through ``ragen2-train``: one run of ``experiment=organism`` on one CPU thread, its wall
time and each iteration's split (rollout, update, the MI pass with the exact figures, and the rest: Lightning,
logging, checkpoints, callbacks). The goal (docs/organism.md): 1,000 iterations in ≤ 3 minutes.

The run is the program itself, in a subprocess pinned to one core (``taskset``) with every thread pool at one
thread, so start-up (imports, the model's load) is in the wall time. Iteration times come from the run's own
``time/*`` columns and the timestamps of its ``train.log`` lines. Prints a table and writes
``bench/results/organism_speed.json``.

    python bench/bench_organism.py [--iterations 1000] [extra Hydra overrides …]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results" / "organism_speed.json"
GOAL_S = 180.0
_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[ragen2\]\[INFO\] - iteration (\d+):")
ONE_THREAD = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def iteration_times(train_log: Path) -> dict[int, float]:
    """Each iteration's summary line's time, in seconds since the epoch."""
    out = {}
    for line in train_log.read_text().splitlines():
        if m := _LINE.match(line):
            when = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
            out[int(m.group(2))] = when.timestamp()
    return out


def column_sums(metrics_csv: Path, keys: tuple[str, ...]) -> dict[str, tuple[float, int]]:
    """Each key's sum over the rows that hold it, and how many rows do."""
    sums = {k: (0.0, 0) for k in keys}
    with metrics_csv.open() as f:
        for row in csv.DictReader(f):
            for k in keys:
                if row.get(k):
                    total, n = sums[k]
                    sums[k] = (total + float(row[k]), n + 1)
    return sums


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--core", type=int, default=0, help="the core the run is pinned to")
    parser.add_argument("--keep", action="store_true", help="keep the run folder (printed)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    record = provenance()
    folder = Path(tempfile.mkdtemp(prefix="bench_organism_"))
    overrides = [
        "experiment=organism",
        f"iterations={args.iterations}",
        f"hydra.run.dir={folder}",
        *args.overrides,
    ]
    train = shutil.which("ragen2-train") or str(Path(sys.executable).parent / "ragen2-train")
    command = [train, *overrides]
    if shutil.which("taskset"):
        command = ["taskset", "-c", str(args.core), *command]
    start = time.time()
    done = subprocess.run(command, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True)
    wall = time.time() - start
    if done.returncode != 0:
        sys.exit(f"ragen2-train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    times = iteration_times(folder / "train.log")
    first, last = min(times), max(times)
    sums = column_sums(folder / "csv" / "metrics.csv", ("time/rollout", "time/update", "time/diagnostics"))
    n = last - first  # iterations between the first and the last summary line
    loop = times[last] - times[first]
    per = {k.split("/")[1]: sums[k][0] / len(times) for k in sums}  # every iteration's share, passes spread
    per_ms = {k: 1000 * v for k, v in per.items()}
    per_ms["iteration"] = 1000 * loop / n
    per_ms["other"] = per_ms["iteration"] - sum(per_ms[k] for k in ("rollout", "update", "diagnostics"))
    result = {
        **record,
        "command_run": " ".join(command),
        "threads": ONE_THREAD,
        "iterations": len(times),
        "wall_s": round(wall, 1),
        "start_up_s": round(times[first] - start, 1),
        "loop_s": round(loop, 1),
        "mi_passes": sums["time/diagnostics"][1],
        "per_iteration_ms": {k: round(v, 2) for k, v in per_ms.items()},
        "goal_s": GOAL_S,
        "projected_1000_s": round(times[first] - start + 1000 * loop / n, 1),
    }
    result["met"] = result["projected_1000_s"] <= GOAL_S if len(times) < 1000 else wall <= GOAL_S
    print(f"{len(times)} iterations in {wall:.1f} s (start-up {result['start_up_s']} s, loop {loop:.1f} s)")
    print("| per iteration | ms |\n|---|---|")
    for k, v in result["per_iteration_ms"].items():
        print(f"| {k} | {v:.1f} |")
    print(
        f"1,000 iterations: {result['projected_1000_s']} s (goal ≤ {GOAL_S:.0f} s): {'met' if result['met'] else 'not met'}"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    if args.keep:
        print(f"run folder: {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
