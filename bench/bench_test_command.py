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
writing to that disk in the meantime), and the most memory (``memory_peak_gib``: the processes' own memory on
the machine, AnonPages + Shmem, read every 2 s, above the start; anything else running counts too).

Each test's seconds (setup, call and teardown) come from a junit report (``PYTEST_ADDOPTS`` adds it; the
command is otherwise as written). Summed by the unit pytest-xdist runs on one worker (a file, or one of
tests/conftest.py's ``SHARED_UNITS``), they give ``units`` and ``projected_s``: the suite's time on 1 to 16
workers, replaying xdist's scheduling (tests/conftest.py's order, a worker taking its next unit when two of
its tests are left) with each test as long as it took here. That is a projection, not a measurement: on
more cores a test that starts processes or a vLLM engine shares fewer cores and runs faster, and faster or
slower cores scale everything. ``overhead_s`` (the suite's time less the replay on this run's own workers:
start-up and collection) is added to every projection.

Where the CPU time goes (``census``): a ``sitecustomize`` put on ``PYTHONPATH`` appends, as each Python process
of the command exits, its own CPU seconds (user and system), its peak resident memory, the test that was
running when it started (``PYTEST_CURRENT_TEST``, which children inherit) and whether it imported Lightning.
Summed into the xdist workers (the tests run in them), the processes the tests start (by unit) and the rest
(the install, stage 1, pytest's own process). Each record names its process and parent (pid, ppid, the first
arguments). Processes that end by ``os._exit`` or a signal write nothing, nor do those started with an
environment of their own; the SLURM jobs, which are no children of the command, are in it (and not in
``user_s``). Where a worker's memory goes (``worker_peaks``): a pytest plugin (``PYTEST_PLUGINS``) reads the
peak resident size of the process that ran each test, after it: each worker's peak and the tests at which it
rose by 0.25 GiB or more.

The machine's state (``machine_probe``, before and after the command): these machines' speed moves by 2× within
hours, and not for every kind of work alike, so each run records, from fresh processes, the CPU seconds of a
fixed set of small matrix products (arithmetic), one thread's copy rate over 256 MiB (memory bandwidth), the
seconds per GiB to fault fresh memory in, and the wall and CPU seconds of ``import lightning.pytorch`` (what
each test process that trains pays first).

``--alone UNIT ...`` runs, instead of the whole suite, each named unit by itself in the clone (``bash
scripts/test.sh -m "not gpu" FILE ...``, the install first): with the other workers idle, the unit's tests
have the cores a machine with more of them would give it, so its time (``alone``) is measured, not
projected, and no number of workers makes the suite shorter than the longest unit.

  python bench/bench_test_command.py [--label NAME] [--log FILE] [--keep] [--warm-model-cache] [--alone UNIT ...]
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
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from importlib.util import module_from_spec, spec_from_file_location
from pathlib import Path
from typing import Any

from provenance import ROOT, provenance

RESULTS = ROOT / "bench" / "results" / "test_command.json"
WHAT = (
    "the README's test command (command 2) from a fresh clone of the commit (bench/bench_test_command.py); "
    "suite_s is pytest's own time for the suite, with_install_s the whole command; a run with alone ran only "
    "the work units it names, each by itself (--alone)"
)
STAGE_2 = "\nstage 2: "  # scripts/test.sh's line before the suite; stage 1's type check prints a summary too
SUMMARY = re.compile(r"^=+ (?P<counts>.*?) in (?P<seconds>[\d.]+)s(?: \([\d:]+\))? =+$", re.M)
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)")
SLOWEST = re.compile(r"^(?P<seconds>[\d.]+)s (?:call|setup|teardown) +(?P<test>\S+)$", re.M)
JUNIT = "test_command.xml"  # in the clone; xunit1 names each test's file
PROJECTED_WORKERS = (1, 2, 4, 8, 16)
CENSUS_ENV = "RAGEN2_TEST_CENSUS"  # the file the hook appends to
#: the census's sitecustomize: one JSON line per Python process, written at its exit
CENSUS_HOOK = f"""import atexit, json, os, resource, sys


def _peak_gib():
    # VmHWM, the largest resident size of this program: not ru_maxrss, which a process keeps from its parent
    # across exec (a child of a worker at 8 GiB said 8 GiB)
    try:
        with open("/proc/self/status") as f:
            hwm = next(line for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return round(int(hwm.split()[1]) / 2**20, 3)


# the test running when this program started: a pytest that a test runs unsets it by its exit; a process
# forked during a test (no start of its own) has it at its exit
_STARTED_IN = os.environ.get("PYTEST_CURRENT_TEST", "")


def _census():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    test = (_STARTED_IN or os.environ.get("PYTEST_CURRENT_TEST", "")).split("::")[0]
    record = {{
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": sys.argv[:3],
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "peak_gib": _peak_gib(),
        "test": test,
        # an xdist worker between tests; a copy forked from one during a test counts as that test's
        "worker": "execnet" in sys.modules and "PYTEST_XDIST_WORKER" in os.environ and not test,
        "lightning": "lightning" in sys.modules,
    }}
    with open(os.environ["{CENSUS_ENV}"], "a") as f:
        f.write(json.dumps(record) + "\\n")


if os.environ.get("{CENSUS_ENV}"):
    atexit.register(_census)
"""
STEPS_ENV = "RAGEN2_TEST_STEPS"  # the file the steps plugin appends to
STEPS_PLUGIN = "ragen2_census_steps"  # its module, beside the sitecustomize (PYTEST_PLUGINS names it)
#: the steps plugin: after each test, the peak resident size of the process that ran it (an xdist worker)
STEPS_CODE = f"""import json, os

import pytest
from sitecustomize import _peak_gib  # the census hook's, beside this file


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield
    peak = _peak_gib()
    if peak is not None and os.environ.get("{STEPS_ENV}"):
        record = {{"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", ""), "peak_gib": peak}}
        with open(os.environ["{STEPS_ENV}"], "a") as f:
            f.write(json.dumps(record) + "\\n")
"""
WORKERS = re.compile(r"^created: \d+/(?P<workers>\d+) workers$", re.M)  # pytest-xdist's line


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


def unit_times(junit: Path, shared: Mapping[str, str]) -> dict[str, list[float]]:
    """Each xdist work unit's tests' seconds, in the order they ran, from a junit report (xunit1): a unit is
    the test's file, or its name in ``shared``."""
    units: dict[str, list[float]] = {}
    for case in ET.parse(junit).iter("testcase"):
        file = case.get("file")
        if file is None:
            raise ValueError(f"{junit}: a testcase without a file attribute (the report must be xunit1)")
        units.setdefault(shared.get(file, file), []).append(float(case.get("time", 0)))
    return units


def replay(units: Mapping[str, Sequence[float]], workers: int, first: Sequence[str] = ()) -> float:
    """When the last of ``workers`` would finish ``units`` under tests/conftest.py's scheduler: units queued
    by their number of tests, most first (xdist's reorder; ties keep ``units``' order), the ``first`` of them
    that are still waiting handed out before any other; each worker gets one unit at the start, and another
    whenever at most two of its tests are left (xdist's ``_reschedule``), including at the start."""
    queue = sorted(units, key=lambda unit: -len(units[unit]))
    pending: list[list[float]] = [[] for _ in range(workers)]
    clock = [0.0] * workers

    def assign(worker: int) -> None:
        unit = next((unit for unit in first if unit in queue), queue[0])
        queue.remove(unit)
        pending[worker].extend(units[unit])

    for worker in range(workers):
        if queue:
            assign(worker)
    for worker in range(workers):
        if queue and len(pending[worker]) <= 2:
            assign(worker)
    while any(pending):
        worker = min((w for w in range(workers) if pending[w]), key=lambda w: clock[w] + pending[w][0])
        clock[worker] += pending[worker].pop(0)
        if queue and len(pending[worker]) <= 2:
            assign(worker)
    return max(clock)


def projection(
    units: Mapping[str, Sequence[float]], workers: int, suite_s: float, first: Sequence[str]
) -> dict[str, Any]:
    """``units`` (their seconds and test counts, longest first), the overhead of a run on ``workers`` that took
    ``suite_s``, and the projected suite time on each of ``PROJECTED_WORKERS``."""
    overhead = suite_s - replay(units, workers, first)
    return {
        "units": {
            unit: [round(sum(times), 2), len(times)]
            for unit, times in sorted(units.items(), key=lambda item: -sum(item[1]))
        },
        "overhead_s": round(overhead, 2),
        "projected_s": {n: round(replay(units, n, first) + overhead, 1) for n in PROJECTED_WORKERS},
    }


MEMBER = ("pid", "ppid", "argv", "cpu_s", "peak_gib")  # what the census keeps of each worker's record


def census(lines: Sequence[str], shared: Mapping[str, str]) -> dict[str, Any]:
    """The census's records (JSON lines) summed: all processes, the xdist workers (each one's record too), the
    processes the tests started (all, those that imported Lightning, and by unit, most CPU first) and the
    rest; each group's CPU seconds and the largest peak resident size (GiB) of one of its processes."""
    records = [json.loads(line) for line in lines if line.strip()]
    workers = [r for r in records if r["worker"]]
    started = [r for r in records if r["test"] and not r["worker"]]
    rest = [r for r in records if not r["test"] and not r["worker"]]
    by_unit: dict[str, list[dict[str, Any]]] = {}
    for r in started:
        by_unit.setdefault(shared.get(r["test"], r["test"]), []).append(r)

    def summed(group: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "processes": len(group),
            "cpu_s": round(sum(r["cpu_s"] for r in group), 1),
            "peak_gib": max((r["peak_gib"] for r in group if r["peak_gib"] is not None), default=None),
        }

    units = {unit: summed(group) for unit, group in by_unit.items()}
    return {
        **summed(records),
        # each by name: xdist starts one per -n, and a process of a worker's kind beside them is worth finding
        "workers": {**summed(workers), "members": [{k: r.get(k) for k in MEMBER} for r in workers]},
        "started_by_tests": {
            **summed(started),
            "with_lightning": summed([r for r in started if r["lightning"]]),
            "by_unit": dict(sorted(units.items(), key=lambda kv: -kv[1]["cpu_s"])),
        },
        "rest": summed(rest),
    }


def peak_steps(lines: Sequence[str], least_gib: float = 0.25) -> dict[str, Any]:
    """The steps plugin's records (JSON lines, in each worker's order) read as each worker's peak resident
    size (GiB) and the tests at which it rose by at least ``least_gib``: [rise, peak after, test], the
    largest rise first. A worker keeps what its tests freed (glibc's heap, the tunables of scripts/test.sh),
    so its peak is where its costliest tests push it, not one test's own size."""
    seen: dict[str, float] = {}
    rises: dict[str, list[list[Any]]] = {}
    for record in (json.loads(line) for line in lines if line.strip()):
        worker, peak = record["worker"], record["peak_gib"]
        rise = peak - seen.get(worker, 0.0)
        seen[worker] = max(peak, seen.get(worker, 0.0))
        if rise >= least_gib:
            rises.setdefault(worker, []).append([round(rise, 2), round(peak, 2), record["test"]])
    return {
        worker: {"peak_gib": round(peak, 2), "rises": sorted(rises.get(worker, []), key=lambda r: -r[0])}
        for worker, peak in sorted(seen.items())
    }


def _conftest(clone: Path) -> Any:
    """The clone's tests/conftest.py, for its ``SHARED_UNITS`` and ``LONGEST_UNITS``."""
    spec = spec_from_file_location("ragen2_tests_conftest", clone / "tests" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: the machine probe, run in a fresh process: timings that tell what state the machine is in
PROBE_CODE = """import json, mmap, resource, subprocess, sys, time
import torch

size, module = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
a = torch.randn(512, 512)
start = time.process_time()
for _ in range(200):
    a @ a
compute = time.process_time() - start
source, target = torch.ones(2**26), torch.empty(2**26)  # 256 MiB each, far over any cache
target.copy_(source)
start = time.perf_counter()
for _ in range(10):
    target.copy_(source)
copy = 10 * 2 * source.numel() * 4 / (time.perf_counter() - start) / 1e9  # bytes read and written
block = mmap.mmap(-1, size)
passes = []
for _ in range(2):  # the first pass faults every page in, the second only walks them
    start = time.perf_counter()
    for i in range(0, size, 4096):
        block[i] = 1
    passes.append(time.perf_counter() - start)
before = resource.getrusage(resource.RUSAGE_CHILDREN)
start = time.perf_counter()
subprocess.run([sys.executable, "-c", "import " + module], check=True)
wall = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "matmul_cpu_s": round(compute, 3),
    "copy_gb_s": round(copy, 2),
    "first_touch_s_per_gib": round((passes[0] - passes[1]) * 2**30 / size, 3),
    "import_s": round(wall, 3),
    "import_cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 3),
}))
"""


def machine_probe(size: int = 2**30, module: str = "lightning.pytorch") -> dict[str, float]:
    """What state the machine is in, beside a run's times (these machines' speed moves within an hour), in a
    fresh process of this interpreter: the CPU seconds of 200 products of 512×512 float32 matrices on one
    thread (arithmetic on data that fits in the cache); the GB/s of one thread copying 256 MiB (memory
    bandwidth: the built-in model's weights stream so through every forward); the seconds per GiB to fault
    fresh memory in (on a virtual machine the host's faults too); and a fresh ``python -c "import MODULE"``,
    wall and CPU seconds, which every test process that trains pays (Lightning brings torch, torchmetrics and
    transformers)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE_CODE, str(size), module], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        raise RuntimeError(f"the machine probe failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _pip_cache_warm() -> bool:
    found = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, timeout=60
    )
    folder = Path(found.stdout.strip()) if found.returncode == 0 else None
    return folder is not None and folder.is_dir() and any(folder.iterdir())


def memory_used(meminfo: Path = Path("/proc/meminfo")) -> int:
    """The processes' own memory on the machine, in bytes: AnonPages + Shmem (/proc/meminfo), their heaps and
    stacks and the shared memory they made. Not MemTotal less MemAvailable: on these virtual machines that
    moved by 0 to 75 % of a block a process wrote, where AnonPages moved by all of it."""
    fields = dict(line.split(":", 1) for line in meminfo.read_text().splitlines())
    return (int(fields["AnonPages"].split()[0]) + int(fields["Shmem"].split()[0])) * 1024


class Peak(threading.Thread):
    """The most of ``used()`` (bytes) seen while running, read every ``every_s``, above its value at the start."""

    def __init__(self, used: Callable[[], int], every_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.used, self.every_s, self.done = used, every_s, threading.Event()
        self.start_used = self.peak_used = used()

    def run(self) -> None:
        while not self.done.wait(self.every_s):
            self.peak_used = max(self.peak_used, self.used())

    def stop(self) -> int:
        self.done.set()
        self.join()
        return self.peak_used - self.start_used


def time_command(clone: Path, log: Path, env: dict[str, str], args: Sequence[str] = ()) -> dict[str, Any]:
    """``bash scripts/test.sh [args]`` in ``clone``, its output in ``log``: wall and CPU seconds, exit status,
    the disk's and the memory's peak use above the start."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    disk = Peak(lambda: shutil.disk_usage(clone).used)
    memory = Peak(memory_used)
    disk.start()
    memory.start()
    start = time.monotonic()
    with log.open("w") as out:
        status = subprocess.run(
            ["bash", "scripts/test.sh", *args], cwd=clone, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "exit_status": status.returncode,
        "with_install_s": round(wall, 3),
        "disk_peak_gb": round(disk.stop() / 1e9, 2),
        "memory_peak_gib": round(memory.stop() / 2**30, 2),
        "user_s": round(after.ru_utime - before.ru_utime, 3),
        "sys_s": round(after.ru_stime - before.ru_stime, 3),
    }


def unit_files(unit: str, shared: Mapping[str, str]) -> list[str]:
    """The test files of ``unit``: a name of ``shared`` (tests/conftest.py's SHARED_UNITS), or a file."""
    files = [file for file, name in shared.items() if name == unit]
    if files or Path(unit).suffix == ".py":
        return files or [unit]
    raise SystemExit(
        f"bench_test_command: --alone {unit!r} is neither a test file nor a unit of tests/conftest.py's "
        f"SHARED_UNITS ({', '.join(sorted(set(shared.values())))}). Fix: name one of those, or a file"
    )


def alone(clone: Path, units: Sequence[str], log: Path, env: dict[str, str]) -> dict[str, Any]:
    """Each of ``units`` run by itself in ``clone`` (the README's test command with the unit's files): its
    counts, pytest's time and the exit status; the outputs one after another in ``log``."""
    shared = _conftest(clone).SHARED_UNITS
    found = {}
    log.write_text("")
    for unit in units:
        part = log.with_suffix(f".{unit.replace('/', '_')}.log")
        timed = time_command(clone, part, env, ["-m", "not gpu", *unit_files(unit, shared)])
        output = part.read_text(errors="replace")
        with log.open("a") as out:
            out.write(output)
        # a unit that ended without pytest's summary (killed, or the install failed) keeps its exit status,
        # and the units after it still run
        summary = pytest_summary(output) if SUMMARY.search(output) else {"counts": {}, "suite_s": None}
        found[unit] = {
            **summary["counts"],
            "suite_s": summary["suite_s"],
            "exit_status": timed["exit_status"],
        }
    print(f"{'unit':<40}{'passed':>7}{'failed':>7}{'s alone':>9}{'exit':>6}")
    for unit, got in found.items():
        seconds = "-" if got["suite_s"] is None else f"{got['suite_s']:.1f}"
        print(
            f"{unit:<40}{got.get('passed', 0):>7}{got.get('failed', 0):>7}{seconds:>9}{got['exit_status']:>6}"
        )
    return {"alone": found}


def _save(label: str, run: dict[str, Any]) -> None:
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"runs": {}}
    results = {"what": WHAT, "runs": {**results["runs"], label: run}}
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


def _clean(cache: str | None, clone: Path, keep: bool) -> None:
    if cache:
        shutil.rmtree(cache, ignore_errors=True)
    if not keep:
        shutil.rmtree(clone, ignore_errors=True)


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
    parser.add_argument(
        "--alone",
        nargs="+",
        metavar="UNIT",
        help="instead of the whole suite, run each unit by itself (a name of SHARED_UNITS, or a test file)",
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
    label = args.label or f"{record['date'][:10]} fresh clone {record['commit'][:7]}"
    model_cache = "warm" if args.warm_model_cache else "empty"
    if args.alone:
        run = {"provenance": record, "pip_cache_warm": warm, "model_cache": model_cache}
        _save(label, {**run, **alone(clone, args.alone, log, env)})
        _clean(cache, clone, args.keep)
        return
    # the junit report is for the projection of the whole suite; the units run alone need none
    junit = f"-o junit_family=xunit1 --junitxml={clone / JUNIT}"
    addopts = " ".join(filter(None, [os.environ.get("PYTEST_ADDOPTS"), junit]))
    hook = Path(tempfile.mkdtemp(prefix="ragen2-census-"))
    (hook / "sitecustomize.py").write_text(CENSUS_HOOK)
    (hook / f"{STEPS_PLUGIN}.py").write_text(STEPS_CODE)
    records, steps = hook / "processes.jsonl", hook / "steps.jsonl"
    path = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
    plugins = ",".join(filter(None, [env.get("PYTEST_PLUGINS"), STEPS_PLUGIN]))
    hooked = {CENSUS_ENV: str(records), STEPS_ENV: str(steps), "PYTEST_PLUGINS": plugins}
    probe = {"before": machine_probe()}
    timed = time_command(clone, log, {**env, "PYTEST_ADDOPTS": addopts, "PYTHONPATH": path, **hooked})
    probe["after"] = machine_probe()
    # read at once: a run whose stage 1 failed leaves no census folder behind
    lines = records.read_text().splitlines() if records.is_file() else []
    step_lines = steps.read_text().splitlines() if steps.is_file() else []
    shutil.rmtree(hook, ignore_errors=True)
    output = log.read_text(errors="replace")
    if STAGE_2 not in output:
        sys.exit(f"bench_test_command: stage 1 (lint, format, types) failed, no suite ran: {log}")
    suite = output.split(STAGE_2, 1)[1]
    summary = pytest_summary(suite)
    workers = WORKERS.search(suite)
    conftest = _conftest(clone)
    report = clone / JUNIT  # pytest writes it at the end, failures or not; a killed run leaves none
    projected = (
        projection(
            unit_times(report, conftest.SHARED_UNITS),
            int(workers["workers"]) if workers else 1,
            summary["suite_s"],
            conftest.LONGEST_UNITS,
        )
        if report.is_file()
        else {}
    )
    run = {
        "provenance": record,
        "pip_cache_warm": warm,
        "model_cache": model_cache,
        **summary["counts"],
        **timed,
        "machine_probe": probe,
        "suite_s": summary["suite_s"],
        "slowest": summary["slowest"],
        **projected,
        "census": census(lines, conftest.SHARED_UNITS),
        "worker_peaks": peak_steps(step_lines),
    }
    _save(label, run)
    _clean(cache, clone, args.keep)
    print(f"{'':<4}{'passed':>7}{'failed':>7}{'errors':>7}{'suite s':>9}{'with install s':>16}{'exit':>6}")
    print(
        f"{'':<4}{run.get('passed', 0):>7}{run.get('failed', 0):>7}{run.get('errors', 0):>7}"
        f"{run['suite_s']:>9.1f}{run['with_install_s']:>16.1f}{run['exit_status']:>6}"
    )
    print(
        f"{'machine probe':<14}{'matmul CPU s':>13}{'copy GB/s':>11}{'fault s/GiB':>13}{'import s':>10}"
        f"{'import CPU s':>14}"
    )
    for when, found in probe.items():
        print(
            f"{when:<14}{found['matmul_cpu_s']:>13.2f}{found['copy_gb_s']:>11.2f}"
            f"{found['first_touch_s_per_gib']:>13.2f}"
            f"{found['import_s']:>10.2f}{found['import_cpu_s']:>14.2f}"
        )
    for seconds, test in summary["slowest"][:8]:
        print(f"{seconds:>8.1f} s  {test}")
    if projected:
        print(f"projected suite s (each test as long as here; overhead {run['overhead_s']} s):")
        print("".join(f"{f'{n} workers':>12}" for n in PROJECTED_WORKERS))
        print("".join(f"{run['projected_s'][n]:>12.1f}" for n in PROJECTED_WORKERS))
    counted = run["census"]
    tests = counted["started_by_tests"]
    print(f"{'Python processes':<34}{'processes':>10}{'CPU s':>9}{'peak GiB':>10}")
    for name, group in (
        ("all", counted),
        ("the xdist workers", counted["workers"]),
        ("started by tests", tests),
        ("  of them with Lightning", tests["with_lightning"]),
        ("the rest (install, stage 1, pytest)", counted["rest"]),
    ):
        peak = "-" if group["peak_gib"] is None else f"{group['peak_gib']:.2f}"
        print(f"{name:<34}{group['processes']:>10}{group['cpu_s']:>9.0f}{peak:>10}")
    for worker, peaks in run["worker_peaks"].items():
        print(f"worker {worker or 'main'}: peak {peaks['peak_gib']:.2f} GiB, its largest rises:")
        for rise, after, test in peaks["rises"][:3]:
            print(f"{rise:>8.2f} GiB to {after:.2f}  {test}")
    print(f"{RESULTS} ({label})")


if __name__ == "__main__":
    main()
