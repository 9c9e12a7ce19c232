"""The write-ups say what the files show: every number of the README's results table links the file behind
it (a result JSON under ``bench/results/``, a file or run folder under ``results/``, or the test that checks
it, said to be a test result); every ``bench/results`` file records the commit, the machine and the command
that wrote it, and every benchmark writes that record; and the study numbers the write-ups quote are
recomputed from the committed runs and the environment. Fast: files and the FrozenLake env, no model."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import ragen2_envs
import yaml
from ragen2_envs.frozenlake.env import FrozenLakeEnv
from ragen2_envs.frozenlake.solver import shortest_path

from ragen2.config import CONF_DIR
from ragen2.grids.runs import Run, read_grid

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
STUDIES = ROOT / "results" / "README.md"
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")
CELL = re.compile(r"(?<!\\)\|")  # a table cell's border; "\|" inside a cell is text
RECORD = ("commit", "date", "command", "machine")
MACHINE = ("cpu", "threads", "load_average")
MAPS = 2000  # random FrozenLake maps the baselines are measured on


# ---- the README's results table ---------------------------------------------------------------------------
def results_table(readme: str) -> list[tuple[str, str]]:
    """(what, number) for each row of the table under the README's ``## Results`` heading."""
    section = readme.partition("\n## Results\n")[2].partition("\n## ")[0]
    lines = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and rule
    return [(cells[1].strip(), cells[2].strip()) for cells in map(CELL.split, lines)]


def is_result(target: str, root: Path) -> bool:
    """A link to a result: a JSON under bench/results/, a CSV or JSON under results/, or a results/ folder
    of runs (each ``*/csv/metrics.csv``)."""
    path = PurePosixPath(target)
    if path.parts[:2] == ("bench", "results"):
        return path.suffix == ".json"
    folder = root / path
    return path.parts[:1] == ("results",) and (
        path.suffix in {".csv", ".json"} or (folder.is_dir() and any(folder.glob("*/csv/metrics.csv")))
    )


def is_test(target: str) -> bool:
    path = PurePosixPath(target)
    return path.parts[:1] == ("tests",) and path.name.startswith("test_") and path.suffix == ".py"


def table_problems(readme: str, root: Path) -> list[str]:
    """What the results table lacks: a row whose number links no result file and is no test result
    linking its test, or a link to a file that does not exist."""
    problems = []
    for what, number in results_table(readme):
        links = [target.partition("#")[0] for target in LINK.findall(number)]
        problems += [
            f"README results row {what!r} links {target}, which does not exist: fix the link"
            for target in links
            if not (root / target).exists()
        ]
        tested = "test result" in number and any(map(is_test, links))
        if not tested and not any(is_result(target, root) for target in links):
            problems.append(
                f"README results row {what!r} links no file behind its number: link the bench/results/*.json "
                "or results/<study>/ file it comes from, or say it is a test result and link the test"
            )
    return problems


# ---- the result files' provenance -------------------------------------------------------------------------
def records(data: dict[str, Any], where: str) -> list[tuple[str, dict[str, Any] | None]]:
    """(where, record) for a result file's provenance: its own (a ``provenance`` key, or the record's keys at
    its top as bench/gpu_check.py writes them), else one per entry of a file that keeps several runs'
    results; None for a part where none is found."""
    if "provenance" in data:
        return [(where, data["provenance"])]
    if "commit" in data:
        return [(where, data)]
    entries = [(key, value) for key, value in data.items() if isinstance(value, dict)]
    found = [f for key, value in entries for f in records(value, f"{where}: {key}")]
    return found if any(record is not None for _, record in found) else [(where, None)]


def record_problems(data: dict[str, Any], where: str) -> list[str]:
    problems = []
    for place, record in records(data, where):
        if record is None:
            problems.append(f"{place} records no provenance: write provenance() from bench/provenance.py")
            continue
        machine = record.get("machine") or {}
        missing = [key for key in RECORD if not record.get(key)] + [
            key for key in MACHINE if key not in machine
        ]
        if missing:
            problems.append(
                f"{place}: provenance lacks {', '.join(missing)} (write 'unknown' where nothing says)"
            )
    return problems


def test_every_number_of_the_results_table_links_the_file_behind_it() -> None:
    rows = results_table(README.read_text())
    assert len(rows) >= 8, "the README's ## Results table was not found"
    assert table_problems(README.read_text(), ROOT) == []


def test_a_number_without_its_file_is_caught() -> None:
    head = "# x\n\n## Results\n\n| what | number |\n|---|---|\n"
    assert table_problems(head + "| a | 1 s ([f](bench/results/vs_trl.json)) |\n", ROOT) == []
    assert (
        table_problems(head + "| a | 2 ranks agree: a test result ([t](tests/test_docs.py)) |\n", ROOT) == []
    )
    assert (
        table_problems(head + "| runs | 0.07 ([runs](results/frozenlake_filter_gpu/runs/)) |\n", ROOT) == []
    )
    unlinked = table_problems(head + "| a | 1.5\\|2 s, see [docs](docs/benchmarks.md) |\n", ROOT)
    assert unlinked and "'a' links no file behind its number" in unlinked[0]
    untested = table_problems(head + "| a | holds ([t](tests/test_docs.py)) |\n", ROOT)
    assert untested and "say it is a test result" in untested[0]
    gone = table_problems(head + "| a | 1 s ([f](bench/results/gone.json)) |\n", ROOT)
    assert gone and "bench/results/gone.json, which does not exist" in gone[0]


def test_every_bench_result_records_its_commit_machine_and_command() -> None:
    files = sorted((ROOT / "bench" / "results").glob("*.json"))
    assert len(files) >= 10
    problems = [p for path in files for p in record_problems(json.loads(path.read_text()), path.name)]
    assert problems == []


def test_a_result_without_its_record_is_caught() -> None:
    machine = {"cpu": "AMD EPYC", "threads": 2, "load_average": "unknown"}
    record = {"commit": "abc", "date": "2026-11-25", "command": "python bench/x.py", "machine": machine}
    assert record_problems({"provenance": record, "results": {}}, "x.json") == []
    assert record_problems({**record, "steps": {}}, "gpu.json") == []  # bench/gpu_check.py's form
    assert (
        record_problems({"settings": {"a": {"provenance": record}, "b": {"provenance": record}}}, "x") == []
    )
    assert record_problems({"args": {"model": "builtin"}, "results": {}}, "x.json") == [
        "x.json records no provenance: write provenance() from bench/provenance.py"
    ]
    one_missing = {"settings": {"a": {"provenance": record}, "b": {"setup": {}}}}
    assert record_problems(one_missing, "x") == [
        "x: settings: b records no provenance: write provenance() from bench/provenance.py"
    ]
    bare = {**record, "machine": {"cpu": "AMD EPYC"}, "command": ""}
    assert record_problems({"provenance": bare}, "x.json") == [
        "x.json: provenance lacks command, threads, load_average (write 'unknown' where nothing says)"
    ]


def test_every_benchmark_writes_its_provenance() -> None:
    shared = {"provenance.py", "workers.py"}  # what the benchmarks import, not benchmarks
    scripts = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name not in shared)
    assert len(scripts) >= 8
    assert [p.name for p in scripts if "provenance()" not in p.read_text()] == []


# ---- the study numbers the write-ups quote ----------------------------------------------------------------
def complete_runs(study: str, iterations: int) -> list[Run]:
    runs = read_grid(ROOT / "results" / study / "runs", upto=iterations)
    return [run for run in runs if run.problem is None]


def values(run: Run, key: str, first: int = 0, last: int | None = None) -> list[float]:
    """The run's ``key`` at iterations first … last (inclusive)."""
    return [v for x, v in run.series[key] if x >= first and (last is None or x <= last)]


def mean_sd(numbers: Sequence[float], digits: int) -> str:
    return f"{statistics.mean(numbers):.{digits}f} ± {statistics.stdev(numbers):.{digits}f}"


def prose(path: Path) -> str:
    return " ".join(path.read_text().split())  # line breaks fall anywhere in a paragraph


def test_the_study_numbers_are_the_runs_numbers() -> None:
    gpu = complete_runs("frozenlake_filter_gpu", 40)
    assert len(gpu) == 6
    late = {
        arm: mean_sd(
            [
                statistics.mean(values(r, "rollout/success", 20, 39))
                for r in gpu
                if r.overrides["filter"] == arm
            ],
            3,
        )
        for arm in ("top_p", "none")
    }
    cpu = complete_runs("frozenlake_filter_cpu", 8)
    first_pass = {r.overrides["seed"]: values(r, "diag/first_turn/mi_est_seq", 0, 0)[0] for r in cpu}
    assert len(first_pass) == 5  # the arms share iteration 0: one value per seed
    # late rollout success per arm (iterations 20-39, mean ± sd over seeds), and MI at the first pass
    quoted = [late["top_p"], late["none"], mean_sd(list(first_pass.values()), 3)]
    for doc in (README, STUDIES, ROOT / "docs" / "studies.md"):
        missing = [number for number in quoted if number not in prose(doc)]
        assert not missing, f"{doc.relative_to(ROOT)} does not quote {missing}, what the runs give"
    # no gradient-bucket columns in either study: the write-ups say the mechanism is untested
    assert not any(key.startswith("grad/") for r in gpu + cpu for key in r.series)


@pytest.fixture(scope="module")
def frozenlake() -> FrozenLakeEnv:
    """The studies' FrozenLake (conf/env/frozenlake.yaml's constructor arguments: deterministic moves)."""
    kwargs = yaml.safe_load((CONF_DIR / "env" / "frozenlake.yaml").read_text())["kwargs"]
    env = ragen2_envs.make("ragen2/FrozenLake-v0", **kwargs)
    assert isinstance(env, FrozenLakeEnv)
    return env


def one_direction_wins(env: FrozenLakeEnv, direction: str, moves: int) -> float:
    """The share of the first MAPS maps that playing ``direction`` again and again wins within ``moves``."""
    won = 0
    for seed in range(MAPS):
        env.reset(seed=seed)
        for _ in range(moves):
            _, _, terminated, _, info = env.step(direction)
            if terminated:
                won += bool(info["success"])
                break
    return won / MAPS


def map_reader_wins(env: FrozenLakeEnv, moves: int) -> float:
    """The share of the first MAPS maps whose shortest path to the goal takes at most ``moves``."""
    won = 0
    for seed in range(MAPS):
        env.reset(seed=seed)
        path = shortest_path(env.desc, env.pos)
        assert path is not None  # the generator makes only maps with a path
        won += len(path) <= moves
    return won / MAPS


def percent(rates: Sequence[float]) -> str:
    low, high = round(100 * min(rates)), round(100 * max(rates))
    return f"{low} %" if low == high else f"{low}–{high} %"


def test_the_fixed_direction_baseline_the_write_ups_quote(frozenlake: FrozenLakeEnv) -> None:
    # the template answers one move per turn: 2 moves in the studies' 2 turns, which allow 4
    fixed = {
        m: [one_direction_wins(frozenlake, d, m) for d in ("Left", "Down", "Right", "Up")] for m in (2, 4)
    }
    reader = {m: map_reader_wins(frozenlake, m) for m in (2, 4)}
    studies = prose(STUDIES)
    assert f"wins {percent(fixed[2])} in the template's 2 moves" in studies
    assert f"and {percent(fixed[4])} in the 4 moves" in studies
    assert f"shortest path wins {percent([reader[2]])} in 2 moves and {percent([reader[4]])} in 4" in studies
    assert f"always playing one direction wins ({percent(fixed[2] + fixed[4])} of maps" in prose(README)
