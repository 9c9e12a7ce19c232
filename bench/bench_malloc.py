"""The test command's malloc setting, on and off: test files timed in one process each, alternating.

``scripts/test.sh`` exports ``GLIBC_TUNABLES`` so that glibc keeps freed memory in the process instead of
handing large blocks back to the kernel and faulting them in again at the next step. This runs the given
test files with pytest (one process, ``OMP_NUM_THREADS=1`` as under two workers) with and without that
setting, ``--rounds`` times each, interleaved so that the machine's drift hits both, and records each run's
wall time, user and system CPU time, minor page faults and peak memory (of the pytest process and the
children it waited for) into ``bench/results/malloc.json``. Prints a table of the medians.

  python bench/bench_malloc.py [FILE ...] [--rounds 2] [--out bench/results/malloc.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from provenance import ROOT, provenance

FILES = ("tests/integration/test_loop.py",)
TUNABLES = re.compile(
    r'^export GLIBC_TUNABLES="\$\{GLIBC_TUNABLES:\+\$GLIBC_TUNABLES:\}(?P<value>[^"]+)"$', re.M
)


def command_tunables(script: Path = ROOT / "scripts" / "test.sh") -> str:
    """The ``GLIBC_TUNABLES`` value that the test command exports."""
    found = TUNABLES.search(script.read_text())
    if found is None:
        raise ValueError(f"{script} exports no GLIBC_TUNABLES line of the expected form")
    return found["value"]


def timed(files: list[str], tunables: str | None) -> dict[str, Any]:
    """One pytest process over ``files``: its exit status, wall and CPU seconds, page faults, peak memory."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["OMP_NUM_THREADS"] = "1"
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own usage, not every child's so far
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit": proc.returncode,
        "wall_s": round(time.perf_counter() - start, 2),
        "user_s": round(usage.ru_utime, 2),
        "system_s": round(usage.ru_stime, 2),
        "minor_faults": usage.ru_minflt,
        "peak_rss_gib": round(usage.ru_maxrss / 2**20, 3),  # kilobytes on Linux
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", default=list(FILES), help="test files (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each setting, interleaved")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "malloc.json")
    args = parser.parse_args(argv)
    setting = {"glibc default": None, "test command": command_tunables()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in setting}
    for round_ in range(args.rounds):
        for name, tunables in setting.items():
            runs[name].append(timed(args.files, tunables))
            print(f"round {round_ + 1}, {name}: {runs[name][-1]}", flush=True)
    median = {
        name: {key: statistics.median(r[key] for r in done) for key in done[0] if key != "exit"}
        for name, done in runs.items()
    }
    result = {
        "provenance": provenance(),
        "what": "pytest over the files in one process, OMP_NUM_THREADS=1, with and without the test "
        "command's GLIBC_TUNABLES; medians over the rounds (bench/bench_malloc.py)",
        "files": args.files,
        "tunables": setting["test command"],
        "runs": runs,
        "median": median,
        "ratio_wall": round(median["test command"]["wall_s"] / median["glibc default"]["wall_s"], 3),
        "ratio_cpu": round(
            (median["test command"]["user_s"] + median["test command"]["system_s"])
            / (median["glibc default"]["user_s"] + median["glibc default"]["system_s"]),
            3,
        ),
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("\n| setting | wall s | user s | system s | minor faults | peak GiB |\n|---|---|---|---|---|---|")
    for name, m in median.items():
        print(
            f"| {name} | {m['wall_s']:.1f} | {m['user_s']:.1f} | {m['system_s']:.1f} | "
            f"{m['minor_faults']:,.0f} | {m['peak_rss_gib']:.2f} |"
        )
    print(f"wall {result['ratio_wall']}x, CPU {result['ratio_cpu']}x; wrote {args.out}")
    failed = [r for done in runs.values() for r in done if r["exit"] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
