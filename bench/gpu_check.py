"""The GPU check: everything that needs a CUDA device, in one call of at most 10 minutes.

Steps, each in its own process with its own time limit, in this order (the most important first, so a
call cut short still returns them):

1. ``tests``: the gpu-marked tests (``pytest -m gpu``): a bf16 iteration, DDP over NCCL and FSDP2 on one
   device, the CUDA-graph decode step against the eager one, ``ragen2-eval`` and ``ragen2-diagnose`` on
   the GPU.
2. ``decode``: ``bench_sampler.py decode`` on Qwen2.5-3B's shape (random bf16 weights) at 8 groups × 16,
   the current sampler, with and without ``rollout.sampler.compile``, each also with
   ``rollout.sampler.fuse_projections``, beside the previous one: decode steps/s against the bandwidth
   bound (goal ≥ 30 %).
3. ``eval``: ``ragen2-eval`` on the GPU under bf16 autocast, the tiny model on FrozenLake.
4. ``bench_gpu``: one real training iteration per row (``bench_gpu.py``): the built-in model's shape on
   the main job, Qwen2.5-3B's shape on the paper's settings (2 groups × 16, 2 turns).

Writes ``bench/results/gpu.json`` (or ``--out``) after every step, with the commit, the machine and each
step's command, exit status and seconds, and copies it to ``$OUT`` when that is set. Prints a summary.

  python bench/gpu_check.py [--out bench/results/gpu.json] [--decode-baseline 0bbda19|FOLDER|none]
  bash scripts/gpu_check.sh          # the same, after making the project importable where it is not
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from provenance import ROOT, provenance

BANDWIDTH_GOAL = 0.30  # decode steps/s as a fraction of the bandwidth bound, Qwen2.5-3B at 8 × 16


def gpu_test_files() -> list[str]:
    """The test files that hold gpu-marked tests: collecting only these keeps packages the GPU machine
    lacks (notebook kernels, vLLM) out of the collection."""
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in p.read_text()
    )


def run_step(name: str, cmd: list[str], limit_s: int, log: Path) -> dict[str, Any]:
    """Run ``cmd`` from the repository root with a time limit; its output goes to ``log``."""
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        try:
            rc = subprocess.run(
                cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=limit_s
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    seconds = time.perf_counter() - start
    tail = log.read_text(errors="replace")[-2500:]
    print(tail[-1200:], flush=True)
    print(f"== {name}: exit {rc} in {seconds:.0f} s (limit {limit_s} s)", flush=True)
    return {"command": " ".join(cmd), "exit": rc, "seconds": round(seconds, 1), "limit_s": limit_s,
            **({"tail": tail} if rc != 0 else {})}  # fmt: skip


def junit(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    bad = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
    return {
        "tests": int(suite.get("tests", 0)),
        "failures": int(suite.get("failures", 0)),
        "errors": int(suite.get("errors", 0)),
        "skipped": int(suite.get("skipped", 0)),
        "seconds": float(suite.get("time", 0.0)),
        "passed": [f"{c.get('classname')}::{c.get('name')}" for c in cases if c not in bad and c.find("skipped") is None],
        "failed": [f"{c.get('classname')}::{c.get('name')}" for c in bad],
    }  # fmt: skip


def decode_summary(data: dict[str, Any]) -> dict[str, Any]:
    entry = next(iter(data.get("decode", {}).values()), None)
    if entry is None:
        return {}
    out = {k: entry[k] for k in ("model", "dtype", "tokens", "device", "copy_bandwidth_GBps", "gemm_GFLOPps")}
    grids = []
    for g in entry["grids"]:
        for label, cur in g["impls"].items():
            if label.startswith("baseline"):
                continue
            grids.append({
                "grid": g["grid"], "rows": g["rows"], "impl": label, "steps_per_s": cur["steps_per_s"],
                "tokens_per_s": cur["tokens_per_s"], "bound_bandwidth_steps_per_s": g["bound_bandwidth_steps_per_s"],
                "fraction_of_bandwidth_bound": cur["fraction_of_bandwidth_bound"],
                "goal_fraction_of_bandwidth_bound": BANDWIDTH_GOAL,
                "goal_met": cur["fraction_of_bandwidth_bound"] >= BANDWIDTH_GOAL,
                **{k: g.get(k) for k in ("gemms_alone_steps_per_s", "gemms_graphed_steps_per_s", "gemms_fused_steps_per_s")},
                "speedup_over_baseline": cur.get("speedup_median_per_round"),
                "identical_ids_to_baseline": cur.get("identical_ids_to_baseline"),
            })  # fmt: skip
    return {**out, "grids": grids, "full": entry}


def write_record(record: dict[str, Any], out: Path, copy_to: str | None) -> None:
    """The record at ``out`` and, on a lent machine, a copy in ``copy_to`` ($OUT), unless ``out`` is there
    already (``--out $OUT/gpu.json``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    if copy_to and (target := Path(copy_to) / out.name).resolve() != out.resolve():
        shutil.copy(out, target)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "gpu.json"))
    parser.add_argument(
        "--decode-baseline", default="0bbda19", help="bench_sampler --baseline (a commit, a folder or none)"
    )
    parser.add_argument(
        "--runs", default="smollm2-135m:main:gpu,qwen2.5-3b:paper_short:gpu", help="bench_gpu --runs"
    )
    parser.add_argument(
        "--skip", default="", help="steps to leave out, comma-separated (tests,decode,eval,bench_gpu)"
    )
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_check.py needs a CUDA device: torch.cuda.is_available() is False here")
    skip = {s for s in args.skip.split(",") if s}
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="gpu_check-"))
    import lightning
    import transformers

    record: dict[str, Any] = {
        **provenance(),
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "lightning": lightning.__version__,
        },
        "steps": {},
    }
    out = Path(args.out)

    def save() -> None:
        write_record(record, out, os.environ.get("OUT"))

    steps: list[tuple[str, list[str], int]] = [
        ("tests", [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--durations=10",
                   f"--junitxml={work / 'tests.xml'}", *gpu_test_files()], 240),
        ("decode", [py, "bench/bench_sampler.py", "decode", "--device", "cuda", "--shape", "qwen2.5-3b",
                    "--grid", "8x16", "--tokens", "64", "--rounds", "3", "--baseline", args.decode_baseline, "--compile",
                    "--fuse", "--out", str(work / "sampler.json")], 270),
        ("eval", [py, "-m", "ragen2.eval", "model=tiny", "env=frozenlake", "trainer.accelerator=gpu",
                  "trainer.precision=bf16-mixed", "num_seeds=16", "samples=4", "ks=[1,4]",
                  f"output={work / 'eval.json'}", f"hydra.run.dir={work / 'eval'}"], 90),
        ("bench_gpu", [py, "bench/bench_gpu.py", "--runs", args.runs, "--out", str(work / "bench_gpu.json")], 330),
    ]  # fmt: skip
    for name, cmd, limit in steps:
        if name in skip:
            continue
        step = run_step(name, cmd, limit, work / f"{name}.log")
        if name == "tests":
            step["results"] = junit(work / "tests.xml")
        elif name == "decode" and (work / "sampler.json").is_file():
            step["results"] = decode_summary(json.loads((work / "sampler.json").read_text()))
        elif name == "eval" and (work / "eval.json").is_file():
            step["results"] = json.loads((work / "eval.json").read_text())
        elif name == "bench_gpu" and (work / "bench_gpu.json").is_file():
            step["results"] = json.loads((work / "bench_gpu.json").read_text())
        record["steps"][name] = step
        save()
    print(f"\nGPU check on {record['machine'].get('gpu')} at {record['commit'][:10]}: wrote {out}")
    for name, step in record["steps"].items():
        print(f"  {name:<10} exit {step['exit']!s:<8} {step['seconds']:>6.0f} s")
    tests = record["steps"].get("tests", {}).get("results", {})
    if tests:
        print(
            f"  tests: {len(tests['passed'])} passed, {len(tests['failed'])} failed, {tests['skipped']} skipped"
        )
    for g in record["steps"].get("decode", {}).get("results", {}).get("grids", []):
        print(f"  decode {g['grid']} {g['impl']}: {g['steps_per_s']:.1f} steps/s, {g['fraction_of_bandwidth_bound']:.0%} of the "
              f"bandwidth bound (goal {BANDWIDTH_GOAL:.0%}: {'met' if g['goal_met'] else 'NOT met'})")  # fmt: skip
    failed = [n for n, s in record["steps"].items() if s["exit"] != 0]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
