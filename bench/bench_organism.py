"""The organism's speed through ``ragen2-train``: one run of ``experiment=organism`` on one CPU thread, its wall
time and each iteration's split (rollout, update, the MI pass with the exact figures, and the rest: Lightning,
logging, checkpoints, callbacks). The goal (docs/organism.md): 1,000 iterations in ≤ 3 minutes.

The run is the program itself, in a subprocess pinned to one core (``taskset``) with every thread pool at one
thread, so start-up (imports, the model's load) is in the wall time. Iteration times come from the run's own
``time/*`` columns and the timestamps of its ``train.log`` lines. Prints a table and writes
``bench/results/organism_speed.json``. With ``--baseline REF`` the code of that commit (a git worktree) runs at
the same time on the next core, both loaded alike, and the two splits and their ratios go to
``bench/results/organism_speed_side_by_side.json``: the machine's speed drifts from hour to hour, so a change
is measured against its baseline in one run, not against an older file.

    python bench/bench_organism.py [--iterations 1000] [--baseline REF] [extra Hydra overrides …]
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
SIDE_BY_SIDE = RESULTS.with_name("organism_speed_side_by_side.json")
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


class Run:
    """One ``ragen2-train`` run of the organism, started in a subprocess pinned to ``core``; ``source``: the
    ``src`` and ``envs`` folders of a checkout whose code runs instead of the installed one."""

    def __init__(self, iterations: int, core: int, overrides: list[str], source: Path | None = None) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="bench_organism_"))
        train = shutil.which("ragen2-train") or str(Path(sys.executable).parent / "ragen2-train")
        command = [train, "experiment=organism", f"iterations={iterations}", f"hydra.run.dir={self.folder}"]
        self.command = [*command, *overrides]
        if shutil.which("taskset"):
            self.command = ["taskset", "-c", str(core), *self.command]
        env = {**os.environ, **ONE_THREAD}
        if source is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(source / "src"), str(source / "envs")])
        self.output = self.folder / "bench_output.txt"  # a file, not a pipe: a run never waits on a reader
        self.start = time.time()
        with self.output.open("w") as out:
            self.process = subprocess.Popen(self.command, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.end: float | None = None

    def poll(self) -> bool:
        """Whether the run has ended (its end time noted the first time it is seen)."""
        if self.end is None and self.process.poll() is not None:
            self.end = time.time()
        return self.end is not None

    def result(self) -> dict:
        """Wait for the run; its wall time, start-up and each iteration's split."""
        while not self.poll():
            time.sleep(0.1)
        assert self.end is not None
        wall = self.end - self.start
        if self.process.returncode != 0:
            sys.exit(f"ragen2-train failed ({self.process.returncode}):\n{self.output.read_text()[-3000:]}")
        times = iteration_times(self.folder / "train.log")
        first, last = min(times), max(times)
        sums = column_sums(
            self.folder / "csv" / "metrics.csv", ("time/rollout", "time/update", "time/diagnostics")
        )
        n = last - first  # iterations between the first and the last summary line
        loop = times[last] - times[first]
        per_ms = {k.split("/")[1]: 1000 * sums[k][0] / len(times) for k in sums}  # every iteration's share
        per_ms["iteration"] = 1000 * loop / n
        per_ms["other"] = per_ms["iteration"] - sum(per_ms[k] for k in ("rollout", "update", "diagnostics"))
        return {
            "command_run": " ".join(self.command),
            "iterations": len(times),
            "wall_s": round(wall, 1),
            "start_up_s": round(times[first] - self.start, 1),
            "loop_s": round(loop, 1),
            "mi_passes": sums["time/diagnostics"][1],
            "per_iteration_ms": {k: round(v, 2) for k, v in per_ms.items()},
            "projected_1000_s": round(times[first] - self.start + 1000 * loop / n, 1),
        }

    def clean(self, keep: bool) -> None:
        if keep:
            print(f"run folder: {self.folder}")
        else:
            shutil.rmtree(self.folder, ignore_errors=True)


def table(runs: dict[str, dict]) -> None:
    names = list(runs)
    print("| per iteration (ms) | " + " | ".join(names) + (" | ratio |" if len(names) == 2 else ""))
    print("|---" * (len(names) + 1 + (len(names) == 2)) + "|")
    for k in runs[names[0]]["per_iteration_ms"]:
        values = [runs[n]["per_iteration_ms"][k] for n in names]
        ratio = f" | {values[1] / values[0]:.3f}" if len(values) == 2 and values[0] else ""
        print(f"| {k} | " + " | ".join(f"{v:.1f}" for v in values) + ratio + (" |" if ratio else ""))


def git_worktree(ref: str) -> tuple[Path, str]:
    """A detached checkout of ``ref`` beside the repository's history, and its commit."""
    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", ref], cwd=root, capture_output=True, text=True, check=True)
    where = Path(tempfile.mkdtemp(prefix="bench_organism_baseline_"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(where), ref], cwd=root, capture_output=True, check=True
    )
    return where, commit.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--core", type=int, default=0, help="the core the run is pinned to")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help="also run the code of this git commit at the same time on the next core (both loaded alike), and "
        "write the two side by side with their ratios (organism_speed_side_by_side.json)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    record = provenance()
    if args.baseline:
        where, commit = git_worktree(args.baseline)
        try:
            runs = {
                "baseline": Run(args.iterations, args.core + 1, args.overrides, where),
                "current": Run(args.iterations, args.core, args.overrides),
            }
            while not all([run.poll() for run in runs.values()]):  # each run's end noted as it comes
                time.sleep(0.1)
            results = {name: run.result() for name, run in runs.items()}
        finally:
            root = Path(__file__).resolve().parents[1]
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(where)], cwd=root, capture_output=True
            )
        for run in runs.values():
            run.clean(args.keep)
        table(results)
        out = {**record, "threads": ONE_THREAD, "baseline_commit": commit, **results}
        out["ratio_current_over_baseline"] = {
            k: round(
                results["current"]["per_iteration_ms"][k] / results["baseline"]["per_iteration_ms"][k], 3
            )
            for k in results["current"]["per_iteration_ms"]
            if results["baseline"]["per_iteration_ms"][k]
        }
        SIDE_BY_SIDE.write_text(json.dumps(out, indent=2) + "\n")
        return
    run = Run(args.iterations, args.core, args.overrides)
    result = {**record, "threads": ONE_THREAD, **run.result(), "goal_s": GOAL_S}
    run.clean(args.keep)
    wall, n = result["wall_s"], result["iterations"]
    result["met"] = result["projected_1000_s"] <= GOAL_S if n < 1000 else wall <= GOAL_S
    print(f"{n} iterations in {wall:.1f} s (start-up {result['start_up_s']} s, loop {result['loop_s']} s)")
    table({"ms": result})
    print(
        f"1,000 iterations: {result['projected_1000_s']} s (goal ≤ {GOAL_S:.0f} s): {'met' if result['met'] else 'not met'}"
    )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
