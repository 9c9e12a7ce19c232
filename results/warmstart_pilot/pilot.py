"""One try of the warm-start pilot: warm-start, then measure the four readiness criteria with ragen2's programs.

    python results/warmstart_pilot/pilot.py <name> [shared overrides ...] [-- warm-start-only overrides ...]

The shared overrides (env, max_turns_cap, rollout.*) go to all three programs, so the warm start trains on
the prompts that evaluation and the MI diagnosis render. It runs, in order,

1. ``ragen2-warmstart <shared> <warm-start-only>`` into outputs/warmstart_pilot/<name>/ (the HF folder in
   model/, not committed: the command rebuilds it);
2. ``ragen2-eval`` on ``EVAL_SEEDS`` held-out seeds × ``EVAL_SAMPLES`` samples at the rollout temperature
   (format: ``sampled/format_valid_rate``, success: ``sampled/success``): 64 episodes, a study batch's
   worth (256 at once held 15 GB of keys and values on the CPU, more than this shared machine had free);
3. ``ragen2-diagnose`` on ``GROUPS`` held-out seeds × ``GROUP_SIZE`` first turns: the study's MI pass on one
   batch of 8 groups × 8 rollouts (retrieval and its chance, ``mi_est_seq`` against log C);

then appends the try (its commands, numbers, criteria, the commit and the machine) to pilot.json. A step
whose result is already there (a try cut off after it) is not run again; its seconds are kept.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from provenance import provenance  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "pilot.json"
GROUPS, GROUP_SIZE = 8, 8  # the study's rollout batch: the diagnosis reads one such batch's first turns
EVAL_SEEDS, EVAL_SAMPLES = 16, 4


def _run(args: list[str]) -> float:
    start = time.perf_counter()
    print("$", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=True)
    return time.perf_counter() - start


def criteria(
    format_rate: float, success: float, diag: dict[str, float]
) -> dict[str, dict[str, float | bool]]:
    """The four readiness checks: format ≥ 0.9, success in [0.3, 0.8], retrieval above chance by more
    than 2 binomial SEs over the rows, mi_est_seq ≥ 30 % of log C."""
    acc, chance, rows = diag["retrieval_acc"], diag["retrieval_chance"], diag["rows"]
    se = math.sqrt(max(acc * (1 - acc), 1e-12) / rows)
    mi, log_c = diag["mi_est_seq"], diag["mi_upper_bound"]
    return {
        "format": {"value": format_rate, "ok": format_rate >= 0.9},
        "success": {"value": success, "ok": 0.3 <= success <= 0.8},
        "retrieval": {
            "value": acc,
            "chance": chance,
            "se": se,
            "z": (acc - chance) / se,
            "ok": acc - chance > 2 * se,
        },
        "mi_est_seq": {"value": mi, "log_c": log_c, "fraction": mi / log_c, "ok": mi >= 0.3 * log_c},
    }


def main(argv: list[str]) -> None:
    name, rest = argv[0], argv[1:]
    shared, own = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    out = ROOT / "outputs" / "warmstart_pilot" / name
    folder = out / "model"
    commands = {
        "warmstart": ["ragen2.warmstart", *shared, *own, f"hydra.run.dir={out}"],
        "eval": [
            "ragen2.eval",
            f"model.name_or_path={folder}",
            *shared,
            f"num_seeds={EVAL_SEEDS}",
            f"samples={EVAL_SAMPLES}",
            f"ks=[1,{EVAL_SAMPLES}]",
            f"hydra.run.dir={out / 'eval'}",
        ],
        "diagnose": [
            "ragen2.diagnose",
            f"model.name_or_path={folder}",
            *shared,
            f"num_seeds={GROUPS}",
            f"samples={GROUP_SIZE}",
            f"hydra.run.dir={out / 'diagnose'}",
        ],
    }
    results = {
        "warmstart": folder / "warmstart.json",
        "eval": out / "eval" / "eval.json",
        "diagnose": out / "diagnose" / "diagnose" / "metrics.json",
    }
    started = provenance()  # the commit and the machine's load as the try starts
    timing = out / "seconds.json"
    seconds = json.loads(timing.read_text()) if timing.is_file() else {}
    for step, args in commands.items():
        if not results[step].is_file():
            seconds[step] = _run(args)
            timing.write_text(json.dumps(seconds))
    warm, evaluation, report = (json.loads(results[step].read_text()) for step in commands)
    diag = report["metrics"]
    fmt, success = evaluation["sampled/format_valid_rate"], evaluation["sampled/success"]
    record = {
        "name": name,
        "commands": {step: " ".join(["python -m", *args]) for step, args in commands.items()},
        "seconds": seconds,
        "warmstart": {k: warm[k] for k in ("demonstrations", "reply_tokens", "loss_first", "loss_last")},
        "eval": evaluation,
        "diagnose": diag,
        "criteria": criteria(fmt, success, diag),
        "provenance": started,
    }
    record["ready"] = all(c["ok"] for c in record["criteria"].values())
    tries = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    tries = [t for t in tries if t["name"] != name] + [record]
    RESULTS.write_text(json.dumps(tries, indent=2) + "\n")
    print(json.dumps({"name": name, "ready": record["ready"], **record["criteria"]}, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
