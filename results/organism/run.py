"""The organism study's runs (PROTOCOL.md): each stage's grid of cells × seeds through ``ragen2-train
experiment=organism``, ``--jobs`` runs at a time, each on one thread. A run writes to ``<out>/<stage>/<cell>/s<seed>``;
a run cut off resumes from its ``last.ckpt``; a finished one (``done``, or collected into ``results/organism/runs/``)
is skipped, so a stage can stop anywhere and be run again to continue, on this machine or from a fresh checkout. ``collect`` copies what the analysis reads (the config, the logged columns it
uses, compressed) into ``results/organism/runs/``.

    python results/organism/run.py pilot [--jobs 2] [--out outputs/organism] [--hours 2.5]
    python results/organism/run.py collect pilot
    python results/organism/run.py list main          (the runs and their commands, nothing run)

The same grids as Hydra multiruns, e.g. on SLURM: ``ragen2-train -m +sweep=organism_pilot hydra/launcher=slurm``
(``conf/sweep/organism_*.yaml``).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
#: the held-out proxies (64 learnable prompts × 2 first turns) and each curve's 4- and 16-prompt readings, for
#: the calibration of the proxies against the exact MI (pilot runs only: they cost about a third of a run)
CALIBRATION = [
    "diagnostics.heldout.num_seeds=64",
    "diagnostics.heldout.samples=2",
    "diagnostics.heldout.info={kind:learnable}",
    "diagnostics.columns=[4,16]",
]
#: the logged columns the analysis reads (a run logs ~250; these are kept in results/organism/runs)
KEPT = (
    "step",
    "epoch",
    "train/iteration",
    "rollout/success",
    "rollout/success_learnable",
    "rollout/success_easy",
    "rollout/success_impossible",
    "rollout/format_valid_rate",
    "rollout/token_entropy",
    "rollout/groups_mixed",
    "filter/kept",
    "filter/kept_ratio",
    "filter/score_cv",
    "train/optimizer_steps",
    "train/entropy",
    "train/pg_loss",
    "train/grad_norm",
)
KEPT_PREFIXES = ("diag/exact/", "diag/first_turn", "diag/heldout", "grad/", "diag/regime")


def beta_star() -> float:
    """β*, as the pilot's analysis chose it (pilot/pilot.json)."""
    chosen = json.loads((HERE / "pilot" / "pilot.json").read_text()).get("beta_star")
    if chosen is None:
        sys.exit("pilot/pilot.json names no β*: the main stages do not run (PROTOCOL.md, the pilot's rule)")
    return float(chosen)


def stage(name: str) -> tuple[list[dict[str, str]], list[int], list[str]]:
    """A stage's cells (overrides by name), seeds, and the overrides every run of it takes."""
    if name == "engineering":
        return [{"algo.entropy_coef": "0.001", "filter": "top_p"}], [999], []
    if name == "pilot":
        cells = [{"filter": "none", "algo.entropy_coef": b} for b in ("0.003", "0.01", "0.03", "0.1")]
        return cells, [100, 101, 102], CALIBRATION
    if name == "stronger":  # the pilot's fallback 2 (PROTOCOL.md)
        return [{"filter": "none", "algo.entropy_coef": "0.3"}], [100, 101, 102], CALIBRATION
    if name == "p0":  # the pilot's fallback 3
        cells = [
            {"filter": "none", "algo.entropy_coef": b, "env.kwargs.zero_variance_share": "0.9"}
            for b in ("0.01", "0.03", "0.1")
        ]
        return cells, [100, 101, 102], CALIBRATION
    b = f"{beta_star():g}"
    if name == "main":
        cells = [
            {"filter": f, "algo.entropy_coef": e} for e in ("0", b) for f in ("none", "top_p", "random_drop")
        ]
        return cells, list(range(20)), []
    if name == "dose":
        cells = [
            {"filter": f, "algo.entropy_coef": b, "env.kwargs.zero_variance_share": p}
            for p in ("0.25", "0.5", "0.9")
            for f in ("none", "top_p")
        ]
        return cells, list(range(10)), []
    if name == "negative":
        cells = [{"filter": "none", "algo.entropy_coef": e, "env.kwargs.hops": "1"} for e in ("0", b)]
        return cells, list(range(10)), []
    sys.exit(
        f"stage={name!r} is not a stage. Fix: one of engineering, pilot, stronger, p0, main, dose, negative"
    )


def cell_name(cell: dict[str, str]) -> str:
    short = {
        "filter": "",
        "algo.entropy_coef": "b",
        "env.kwargs.zero_variance_share": "p0",
        "env.kwargs.hops": "hops",
    }
    return "_".join(f"{short.get(k, k)}{v}" for k, v in cell.items())


def runs(name: str, out: Path) -> list[tuple[Path, list[str]]]:
    """Each run's folder and ``ragen2-train`` overrides, seed by seed (a stage that stops leaves whole seeds)."""
    cells, seeds, extra = stage(name)
    return [
        (
            out / name / cell_name(cell) / f"s{seed}",
            ["experiment=organism", f"seed={seed}", *(f"{k}={v}" for k, v in cell.items()), *extra],
        )
        for seed in seeds
        for cell in cells
    ]


def collected(folder: Path, out: Path) -> Path:
    """Where ``collect`` keeps a run's columns: a run found there is finished, whatever ``out`` still holds."""
    return HERE / "runs" / folder.relative_to(out) / "metrics.csv.gz"


def run_one(folder: Path, overrides: list[str], deadline: float, out: Path) -> str:
    if (folder / "done").is_file() or collected(folder, out).is_file():
        return f"{folder}: done before"
    resume = (folder / "checkpoints" / "last.ckpt").is_file()
    command = [
        shutil.which("ragen2-train") or str(Path(sys.executable).parent / "ragen2-train"),
        *overrides,
        f"hydra.run.dir={folder}",
        f"ckpt_path={'last' if resume else 'null'}",
    ]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "command.txt").write_text(" ".join(command) + "\n")
    left = deadline - time.time()
    if left <= 0:
        return f"{folder}: not started (the stage's time is over)"
    with (folder.parent / f"{folder.name}.log").open("a") as log:
        try:
            done = subprocess.run(
                command, env={**os.environ, **ONE_THREAD}, stdout=log, stderr=log, timeout=left
            )
        except subprocess.TimeoutExpired:
            return f"{folder}: stopped at the stage's end (resumes next time)"
    if done.returncode != 0:
        return f"{folder}: FAILED ({done.returncode}), see {folder}.log"
    (folder / "done").write_text("")
    return f"{folder}: finished"


def collect(name: str, out: Path) -> None:
    """Each finished run's config and kept columns into results/organism/runs/<stage>/<cell>/s<seed>/."""
    for folder, _ in runs(name, out):
        if not (folder / "done").is_file():
            continue
        target = HERE / "runs" / folder.relative_to(out)
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / ".hydra" / "config.yaml", target / "config.yaml")
        shutil.copy(folder / "command.txt", target / "command.txt")
        with (folder / "csv" / "metrics.csv").open() as f:
            reader = csv.DictReader(f)
            assert reader.fieldnames is not None
            keys = [k for k in reader.fieldnames if k in KEPT or k.startswith(KEPT_PREFIXES)]
            rows = [{k: row[k] for k in keys} for row in reader]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=keys)
        writer.writeheader()
        writer.writerows(r for r in rows if any(r[k] for k in keys if k not in ("step", "epoch")))
        kept = collected(folder, out)
        if kept.is_file() and gzip.decompress(kept.read_bytes()).decode() == buffer.getvalue():
            continue  # collected before: the file stays byte for byte
        kept.write_bytes(gzip.compress(buffer.getvalue().encode(), mtime=0))  # no timestamp: same rows, same bytes
        print(f"collected {target.relative_to(ROOT)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", help="a stage to run, or collect / list")
    parser.add_argument("stage", nargs="?")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "organism")
    parser.add_argument(
        "--hours", type=float, default=2.5, help="the stage's time: runs stop and resume later"
    )
    args = parser.parse_args()
    if args.what == "collect":
        return collect(args.stage, args.out)
    if args.what == "list":
        for folder, overrides in runs(args.stage, args.out):
            print(folder, " ".join(overrides))
        return None
    deadline = time.time() + 3600 * args.hours
    with ThreadPoolExecutor(args.jobs) as pool:
        for message in pool.map(lambda r: run_one(*r, deadline, args.out), runs(args.what, args.out)):
            print(message, flush=True)
    return None


if __name__ == "__main__":
    main()
