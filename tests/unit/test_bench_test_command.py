"""bench/bench_test_command.py reads pytest's own summary: the counts and seconds of the suite's line, the
slowest tests (the output below is the shape pytest-xdist prints, cut); it sums a junit report by xdist's work
units and replays the scheduler on other numbers of workers (times derived by hand below); its census hook
records real Python processes, and the census sums them; its steps plugin records a real pytest run's peaks, and
they are read as each worker's rises; its machine probe runs real processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_test_command import (
    CENSUS_ENV,
    CENSUS_HOOK,
    STAGE_2,
    STEPS_CODE,
    STEPS_ENV,
    STEPS_PLUGIN,
    WORKERS,
    Peak,
    census,
    machine_probe,
    memory_used,
    peak_steps,
    projection,
    pytest_summary,
    replay,
    unit_files,
    unit_times,
)

OUTPUT = """ragen2 installed: torch 2.13.0+cpu
stage 1: ruff check, ruff format --check, the type check
All checks passed!
.                                                                        [100%]
1 passed in 226.66s (0:03:46)
stage 2: every test but the gpu-marked ones
created: 2/2 workers
........F...E....                                                        [100%]
============================= slowest 25 durations =============================
106.74s call     tests/integration/test_main_job.py::test_main_job_config_one_iteration_with_the_builtin_model
100.28s call     tests/integration/test_vllm_rollout.py::test_one_iteration_with_vllm_rollouts
0.50s setup    tests/unit/test_x.py::test_y[a-b]
=========================== short test summary info ============================
FAILED tests/unit/test_x.py::test_z - assert 1 == 2
ERROR tests/integration/test_multirank.py::test_two_ranks_update_exactly_as_one[full-ddp]
= 1455 passed, 1 failed, 32 skipped, 3 deselected, 5 errors, 1 warning in 914.31s (0:15:14) =
"""


def test_the_suites_counts_seconds_and_slowest_tests() -> None:
    summary = pytest_summary(OUTPUT.split(STAGE_2, 1)[1])
    assert summary["counts"] == {"passed": 1455, "failed": 1, "skipped": 32, "deselected": 3, "errors": 5}
    assert summary["suite_s"] == 914.31
    assert summary["slowest"] == [
        [
            106.74,
            "tests/integration/test_main_job.py::test_main_job_config_one_iteration_with_the_builtin_model",
        ],
        [100.28, "tests/integration/test_vllm_rollout.py::test_one_iteration_with_vllm_rollouts"],
        [0.5, "tests/unit/test_x.py::test_y[a-b]"],
    ]


def test_one_error_and_a_line_without_the_hour() -> None:
    summary = pytest_summary("== 3 passed, 1 error in 2.50s ==\n")
    assert summary == {"counts": {"passed": 3, "errors": 1}, "suite_s": 2.5, "slowest": []}


def test_output_without_a_summary_is_refused() -> None:
    with pytest.raises(ValueError, match="no pytest summary line"):
        pytest_summary("stage 2: every test\nKilled\n")


def test_the_disk_peak_sees_a_file_that_came_and_went(tmp_path: Path) -> None:
    """64 MB written, held across several reads, then removed: the peak keeps it (the disk is shared, so other
    writers can only add to what is seen, by a little in this short a window)."""
    disk = Peak(lambda: shutil.disk_usage(tmp_path).used, every_s=0.05)
    disk.start()
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.write(b"\1" * 64 * 2**20)
        f.flush()
        os.fsync(f.fileno())
    time.sleep(0.5)
    big.unlink()
    time.sleep(0.2)
    assert 60 * 2**20 <= disk.stop() < 1 * 2**30


def test_the_memory_in_use_is_the_processes_anonymous_and_shared_pages(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       24684092 kB\nMemAvailable:   23614888 kB\nAnonPages:  1000 kB\nShmem: 24 kB\n"
    )
    assert memory_used(meminfo) == (1000 + 24) * 1024
    assert memory_used() > 0  # this machine's own


def test_the_peak_is_the_highest_reading_above_the_first() -> None:
    # the machine-wide reading moves with every other process, so the sampler is checked on readings of its own
    readings = iter([10, 50, 30, 20])
    read_all = threading.Event()

    def used() -> int:
        value = next(readings, None)
        if value is None:
            read_all.set()
            return 20
        return value

    peak = Peak(used, every_s=0.01)
    peak.start()
    assert read_all.wait(5)
    assert peak.stop() == 40


def test_the_workers_line() -> None:
    found = WORKERS.search(OUTPUT.split(STAGE_2, 1)[1])
    assert found is not None and found["workers"] == "2"


#: four units of three tests each (12, 9, 6 and 3 s), in collection order
UNITS = {"x": [3.0, 3.0, 3.0], "y": [2.0, 2.0, 2.0], "w": [1.0, 1.0, 1.0], "z": [4.0, 4.0, 4.0]}


def test_replay_hands_out_a_unit_when_two_tests_are_left() -> None:
    """Two workers, in order: worker 0 takes x, worker 1 y; at 2 s worker 1 has two tests left and takes w; at
    3 s worker 0 takes z and ends at 3 + 3 + 3 + 12 = 21 s (worker 1 at 9 s)."""
    assert replay(UNITS, 2) == 21.0


def test_replay_hands_out_the_longest_units_first() -> None:
    """z first: worker 0 takes z, worker 1 x; at 3 s worker 1 takes y (ends 9 + 6 = 15 s), at 4 s worker 0 takes
    w (ends 12 + 3 = 15 s)."""
    assert replay(UNITS, 2, first=("z",)) == 15.0


def test_replay_on_one_worker_and_on_one_per_unit() -> None:
    assert replay(UNITS, 1) == 30.0  # everything in a row
    assert replay(UNITS, 4) == 12.0  # each unit alone: the longest
    assert replay(UNITS, 16) == 12.0  # the workers beyond the units idle


def test_replay_takes_units_of_fewer_tests_last_and_prefetches_at_the_start() -> None:
    """xdist queues the unit of most tests first: worker 0 takes b (three 1 s tests), worker 1 a (one 10 s
    test), which leaves worker 1 with under three tests at the start, so it takes c too: 10 + 5 = 15 s, where
    worker 0 is idle from 3 s."""
    assert replay({"a": [10.0], "b": [1.0, 1.0, 1.0], "c": [5.0]}, 2) == 15.0


def test_the_projection_adds_the_runs_overhead() -> None:
    """A run on 2 workers that took 20 s, where the replay gives 15 s: 5 s of overhead on every projection."""
    projected = projection(UNITS, 2, 20.0, first=("z",))
    assert projected["units"] == {"z": [12.0, 3], "x": [9.0, 3], "y": [6.0, 3], "w": [3.0, 3]}
    assert projected["overhead_s"] == 5.0
    assert projected["projected_s"] == {1: 35.0, 2: 20.0, 4: 17.0, 8: 17.0, 16: 17.0}


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
 errors="0" failures="0" skipped="0" tests="4" time="9.1" hostname="vm">
<testcase classname="tests.a" name="test_one" file="tests/a.py" line="2" time="1.5" />
<testcase classname="tests.ranks_one" name="test_r[ddp]" file="tests/ranks_one.py" line="3" time="4.0" />
<testcase classname="tests.a.TestB" name="test_two" file="tests/a.py" line="9" time="0.25" />
<testcase classname="tests.ranks_two" name="test_s" file="tests/ranks_two.py" line="3" time="3.0" />
</testsuite></testsuites>"""


def test_unit_times_from_a_junit_report(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(JUNIT)
    shared = {"tests/ranks_one.py": "ranks", "tests/ranks_two.py": "ranks"}
    assert unit_times(report, shared) == {"tests/a.py": [1.5, 0.25], "ranks": [4.0, 3.0]}


def test_a_report_without_files_is_refused(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    report.write_text(JUNIT.replace(' file="tests/a.py"', ""))
    with pytest.raises(ValueError, match="without a file attribute"):
        unit_times(report, {})


def test_a_units_files() -> None:
    shared = {"tests/ranks_one.py": "ranks", "tests/ranks_two.py": "ranks", "tests/v.py": "vllm"}
    assert unit_files("ranks", shared) == ["tests/ranks_one.py", "tests/ranks_two.py"]
    assert unit_files("tests/integration/test_main_job.py", shared) == ["tests/integration/test_main_job.py"]
    with pytest.raises(SystemExit, match="'rank' is neither a test file nor a unit .* \\(ranks, vllm\\)"):
        unit_files("rank", shared)


def _python(hook: Path, code: str, **env: str) -> None:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", CENSUS_ENV, STEPS_ENV)}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "PYTHONPATH": str(hook), **env},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_the_census_hook_writes_a_line_per_python_process_at_its_exit(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(CENSUS_HOOK)
    records = tmp_path / "processes.jsonl"
    test = "tests/unit/test_x.py::test_y (call)"
    # this process holds more than the child will: the child's peak is its own, not its parent's
    ballast = b"\1" * 2**30
    _python(tmp_path, "sum(range(10**6))", **{CENSUS_ENV: str(records), "PYTEST_CURRENT_TEST": test})
    del ballast
    # a module of that name is what the hook looks for (the real import costs ~10 s)
    lightning = "import sys, types; sys.modules['lightning'] = types.ModuleType('lightning')"
    _python(tmp_path, lightning, **{CENSUS_ENV: str(records)})
    _python(tmp_path, "import os; os._exit(0)", **{CENSUS_ENV: str(records)})  # no exit handlers: no line
    _python(tmp_path, "pass")  # without the variable the hook does nothing
    # an xdist worker (execnet loaded, PYTEST_XDIST_WORKER set) between tests, and a copy of one during a test
    execnet = "import sys, types; sys.modules['execnet'] = types.ModuleType('execnet')"
    worker = {CENSUS_ENV: str(records), "PYTEST_XDIST_WORKER": "gw0"}
    _python(tmp_path, execnet, **worker)
    _python(tmp_path, execnet, **worker, PYTEST_CURRENT_TEST=test)
    # a pytest that a test runs in a worker: xdist's plugin loads execnet, and its own tests unset the variable
    inner = f"{execnet}; import os; del os.environ['PYTEST_CURRENT_TEST']"
    _python(tmp_path, inner, **worker, PYTEST_CURRENT_TEST=test)
    first, second, between, during, pytest_in_a_test = (
        json.loads(line) for line in records.read_text().splitlines()
    )
    assert not pytest_in_a_test["worker"] and pytest_in_a_test["test"] == "tests/unit/test_x.py"
    assert first["ppid"] == os.getpid() and first["pid"] != second["pid"] and first["argv"] == ["-c"]
    assert between["worker"] and not during["worker"] and during["test"] == "tests/unit/test_x.py"
    assert first["test"] == "tests/unit/test_x.py" and first["cpu_s"] > 0 and 0.001 < first["peak_gib"] < 0.5
    assert not first["lightning"] and not first["worker"]
    assert second["test"] == "" and second["lightning"] and not second["worker"]


def test_the_census_sums_workers_started_processes_by_unit_and_the_rest() -> None:
    def line(
        cpu_s: float, peak: float | None, test: str = "", worker: bool = False, lightning: bool = False
    ) -> str:
        record = {"cpu_s": cpu_s, "peak_gib": peak, "test": test, "worker": worker, "lightning": lightning}
        return json.dumps({"pid": int(cpu_s), "ppid": 1, "argv": ["-c"], **record})

    lines = [
        line(600.0, 5.5, worker=True),
        line(500.5, 3.0, worker=True),
        line(15.0, 1.5, "tests/ranks_one.py", lightning=True),
        line(12.5, 1.75, "tests/ranks_two.py", lightning=True),
        line(0.5, 0.1, "tests/a.py"),
        line(3.0, None),  # no /proc: no peak
        line(1.25, 0.5),  # pip
        "",
    ]
    got = census(lines, {"tests/ranks_one.py": "ranks", "tests/ranks_two.py": "ranks"})
    assert got == {
        "processes": 7,
        "cpu_s": 1132.8,  # 1132.75, rounded half to even
        "peak_gib": 5.5,
        "workers": {
            "processes": 2,
            "cpu_s": 1100.5,
            "peak_gib": 5.5,
            "members": [
                {"pid": 600, "ppid": 1, "argv": ["-c"], "cpu_s": 600.0, "peak_gib": 5.5},
                {"pid": 500, "ppid": 1, "argv": ["-c"], "cpu_s": 500.5, "peak_gib": 3.0},
            ],
        },
        "started_by_tests": {
            "processes": 3,
            "cpu_s": 28.0,
            "peak_gib": 1.75,
            "with_lightning": {"processes": 2, "cpu_s": 27.5, "peak_gib": 1.75},
            "by_unit": {
                "ranks": {"processes": 2, "cpu_s": 27.5, "peak_gib": 1.75},
                "tests/a.py": {"processes": 1, "cpu_s": 0.5, "peak_gib": 0.1},
            },
        },
        "rest": {"processes": 2, "cpu_s": 4.2, "peak_gib": 0.5},  # 4.25, to even
    }


def test_the_steps_plugin_reads_each_tests_peak_in_the_process_that_ran_it(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(CENSUS_HOOK)
    (tmp_path / f"{STEPS_PLUGIN}.py").write_text(STEPS_CODE)
    # the second test holds 0.5 GiB (written, so resident) until the process ends; the third adds nothing
    (tmp_path / "test_steps.py").write_text(
        "held = []\n"
        "def test_small(): pass\n"
        "def test_big(): held.append(b'\\1' * 2**29)\n"
        "def test_after(): pass\n"
    )
    steps = tmp_path / "steps.jsonl"
    env = {STEPS_ENV: str(steps), "PYTEST_PLUGINS": STEPS_PLUGIN, "PYTEST_XDIST_WORKER": "gw3"}
    _python(
        tmp_path,
        f"import pytest, sys; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {str(tmp_path)!r}]))",
        **env,
    )
    small, big, after = (json.loads(line) for line in steps.read_text().splitlines())
    assert [r["test"].rpartition("::")[2] for r in (small, big, after)] == [
        "test_small",
        "test_big",
        "test_after",
    ]
    assert small["worker"] == "gw3" and 0.45 < big["peak_gib"] - small["peak_gib"] < 0.6
    assert after["peak_gib"] == big["peak_gib"]
    read = peak_steps(steps.read_text().splitlines(), least_gib=0.4)["gw3"]
    assert read["peak_gib"] == round(big["peak_gib"], 2)
    assert [r[2].rpartition("::")[2] for r in read["rises"]] == ["test_big"]


def test_each_workers_peak_and_the_tests_that_raised_it() -> None:
    def line(worker: str, peak: float, test: str) -> str:
        return json.dumps({"test": test, "worker": worker, "peak_gib": peak})

    lines = [
        line("gw0", 1.5, "a"),  # the first test's rise counts from nothing: imports and all
        line("gw1", 0.5, "b"),
        line("gw0", 1.625, "c"),  # 0.125: under the threshold
        line("gw0", 4.0, "d"),  # 2.375
        line("gw1", 0.75, "e"),  # 0.25: just at it
        line("gw0", 4.0, "f"),
        "",
    ]
    assert peak_steps(lines) == {
        "gw0": {"peak_gib": 4.0, "rises": [[2.38, 4.0, "d"], [1.5, 1.5, "a"]]},  # 2.375 rounds to even
        "gw1": {"peak_gib": 0.75, "rises": [[0.5, 0.5, "b"], [0.25, 0.75, "e"]]},
    }


def test_the_machine_probe_times_arithmetic_page_faults_and_a_fresh_import() -> None:
    found = machine_probe(size=2**26, module="json")
    assert set(found) == {"matmul_cpu_s", "copy_gb_s", "first_touch_s_per_gib", "import_s", "import_cpu_s"}
    assert found["matmul_cpu_s"] > 0 and found["copy_gb_s"] > 0 and found["import_s"] > 0


def test_a_probe_that_cannot_import_says_why() -> None:
    with pytest.raises(
        RuntimeError, match=r"(?s)the machine probe failed.*ModuleNotFoundError.*no_such_module"
    ):
        machine_probe(size=2**20, module="no_such_module")
