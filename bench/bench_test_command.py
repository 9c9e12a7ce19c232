"""The README's test command (command 2) from a fresh clone, timed; adds a run to bench/results/test_command.json.

Clones this checkout's HEAD into a temporary folder (nothing installed or built here travels; uncommitted
changes do not either, so a dirty checkout is refused), runs ``bash scripts/test.sh`` there as the README
writes it, and records: pytest's counts and its own time for the suite (``suite_s``, the summary line after
"stage 2"), the whole command's wall time with the install (``with_install_s``), the command's CPU time (user
and system, every child process), whether pip's download cache held anything before the start (a cold cache
downloads some GB first), the exit status and the slowest tests pytest listed. As on CI's fresh machine, the
built-in and tiny models are built again: ``RAGEN2_CACHE`` is an empty temporary folder (``--warm-model-cache``
uses the usual one, which skips those builds). Time it on an otherwise idle machine: the load average at the
start is in the record. So is the most disk the command took at once (``disk_peak_gb``: the filesystem's used
space, read every 2 s, above what it was at the start; venv and test folders together, and anything else
writing to that disk in the meantime).

  python bench/bench_test_command.py [--label NAME] [--log FILE] [--keep] [--warm-model-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from provenance import ROOT, provenance

RESULTS = ROOT / "bench" / "results" / "test_command.json"
WHAT = (
    "the README's test command (command 2) from a fresh clone of the commit (bench/bench_test_command.py); "
    "suite_s is pytest's own time for the suite, with_install_s the whole command"
)
STAGE_2 = "\nstage 2: "  # scripts/test.sh's line before the suite; stage 1's type check prints a summary too
SUMMARY = re.compile(r"^=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s(?: \([\d:]+\))? =+$", re.M)
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")
SLOWEST = re.compile(r"^(?P<seconds>[\d.]+)s (?:call|setup|teardown) +(?P<test>\S+)$", re.M)


def pytest_summary(output: str) -> dict[str, Any]:
    """The counts and seconds of the last summary line in pytest's ``output`` (``error`` counted as
    ``errors``), and the tests of the last "slowest durations" list, slowest first."""
    lines = list(SUMMARY.finditer(output))
    if not lines:
        raise ValueError("no pytest summary line in the output (the command ended before the suite did)")
    last = lines[-1]
    counts = {name if name != "error" else "errors": int(n) for n, name in COUNT.findall(last["counts"])}
    durations = output.rsplit("slowest", 1)[-1] if "slowest" in output else ""
    slowest = [[float(m["seconds"]), m["test"]] for m in SLOWEST.finditer(durations)]
    return {"counts": counts, "suite_s": float(last["seconds"]), "slowest": slowest}


def _pip_cache_warm() -> bool:
    found = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, timeout=60
    )
    folder = Path(found.stdout.strip()) if found.returncode == 0 else None
    return folder is not None and folder.is_dir() and any(folder.iterdir())


class DiskPeak(threading.Thread):
    """The most of ``folder``'s filesystem in use while running, above its use at the start, in bytes."""

    def __init__(self, folder: Path, every_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.folder, self.every_s, self.done = folder, every_s, threading.Event()
        self.start_used = self.peak_used = shutil.disk_usage(folder).used

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            self.peak_used = max(self.peak_used, shutil.disk_usage(self.folder).used)

    def stop(self) -> int:
        self.done.set()
        self.join()
        return self.peak_used - self.start_used


def time_command(clone: Path, log: Path, env: dict[str, str]) -> dict[str, Any]:
    """``bash scripts/test.sh`` in ``clone``, its output in ``log``: wall and CPU seconds, exit status, the
    disk's peak use above the start."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    disk = DiskPeak(clone)
    disk.start()
    start = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(
            ["bash", "scripts/test.sh"], cwd=clone, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "exit_status": status.returncode,
        "with_install_s": round(wall, 3),
        "disk_peak_gb": round(disk.stop() / 1e9, 2),
        "user_s": round(after.ru_utime - before.ru_utime, 3),
        "sys_s": round(after.ru_stime - before.ru_stime, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", help="the run's name in the JSON (default: the date, the commit)")
    parser.add_argument(
        "--log", type=Path, help="the command's output (default: test_command.log in the clone)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    parser.add_argument(
        "--warm-model-cache", action="store_true", help="use the usual RAGEN2_CACHE, not an empty folder"
    )
    args = parser.parse_args()
    record = provenance()
    if record["dirty"]:
        sys.exit(
            "bench_test_command: the checkout has uncommitted changes, which a clone would not test. Fix: commit"
        )
    warm = _pip_cache_warm()
    clone = Path(tempfile.mkdtemp(prefix="ragen2-test-command-"))
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    log = args.log or clone / "test_command.log"
    cache = None if args.warm_model_cache else tempfile.mkdtemp(prefix="ragen2-model-cache-")
    env = {**os.environ, **({"RAGEN2_CACHE": cache} if cache else {})}
    print(f"bash scripts/test.sh in {clone} (output: {log})", flush=True)
    timed = time_command(clone, log, env)
    output = log.read_text(errors="replace")
    if STAGE_2 not in output:
        sys.exit(f"bench_test_command: stage 1 (lint, format, types) failed, no suite ran: {log}")
    summary = pytest_summary(output.split(STAGE_2, 1)[1])
    run = {
        "provenance": record,
        "pip_cache_warm": warm,
        "model_cache": "warm" if args.warm_model_cache else "empty",
        **summary["counts"],
        **timed,
        "suite_s": summary["suite_s"],
        "slowest": summary["slowest"],
    }
    label = args.label or f"{record['date'][:10]} fresh clone {record['commit'][:7]}"
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"runs": {}}
    results = {"what": WHAT, "runs": {**results["runs"], label: run}}
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(clone, ignore_errors=True)
    print(f"{'':<4}{'passed':>7}{'failed':>7}{'errors':>7}{'suite s':>9}{'with install s':>16}{'exit':>6}")
    print(
        f"{'':<4}{run.get('passed', 0):>7}{run.get('failed', 0):>7}{run.get('errors', 0):>7}"
        f"{run['suite_s']:>9.1f}{run['with_install_s']:>16.1f}{run['exit_status']:>6}"
    )
    for seconds, test in summary["slowest"][:8]:
        print(f"{seconds:>8.1f} s  {test}")
    print(f"{RESULTS} ({label})")


if __name__ == "__main__":
    main()
