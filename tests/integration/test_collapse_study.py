"""The collapse study's own script (results/collapse_study/run.sh) at tiny scale: the warm start, then one run
of one iteration with the protocol's logging (the MI pass's schedule, gradient buckets, every episode, the
end's validation); a second call finds the run done and starts nothing; analyze.py reads it and collect.sh
copies what is committed of it. The second study's script (results/collapse_study_2/run.sh) on the same warm
start: refused for its hash, then its pilot's one iteration with the held-out curve."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

STUDY = Path(__file__).parents[2] / "results" / "collapse_study"
SCRIPT = STUDY / "run.sh"
TINY = {
    "MODEL": "tiny",
    "FILTERS": "top_p",
    "SEEDS": "0",
    "ITERATIONS": "1",
    "MI_EVERY": "1",
    "DEMO_STEPS": "2",
    "DEMO_EPISODES": "8",
    "EXTRA": "rollout.groups=2 rollout.group_size=4 diagnostics.num_samples=8 val.num_seeds=2 max_turns_cap=1",
}


def _study(folder: Path, **settings: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **TINY, "STUDY": str(folder), "PYTHON": sys.executable, **settings}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study folder holding only its warm start (2 steps on the tiny model)."""
    folder = tmp_path_factory.mktemp("study")
    alone = _study(folder, FILTERS="")  # set and empty: the warm start, and no run
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert (folder / "warmstart" / "model" / "warmstart.json").is_file()
    assert not (folder / "runs").exists()
    return folder


@pytest.mark.slow  # one RL iteration on the tiny model
def test_the_study_script_warm_starts_and_runs_an_iteration_with_the_protocols_logging(warm: Path) -> None:
    done = _study(warm)
    assert done.returncode == 0, done.stderr[-3000:]
    run = warm / "runs" / "0"
    assert (run / "done").is_file()
    with (run / "csv" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    columns = set(rows[0])
    assert {"grad/all/task", "grad/all/entropy", "val/sampled_success", "rollout/groups_mixed"} <= columns
    assert (run / "rollouts.rank0.jsonl").stat().st_size > 0  # every episode
    overrides = (run / ".hydra" / "overrides.yaml").read_text()
    assert "algo.entropy_coef=0.01" in overrides and "filter=top_p" in overrides
    again = _study(warm)  # the run is done: nothing trains again
    assert again.returncode == 0 and "every run is done" in again.stderr
    assert not (warm / "runs" / "1").exists()
    out = warm / "criteria"
    out.mkdir()
    analyzed = subprocess.run(
        [sys.executable, str(STUDY / "analyze.py"), str(warm / "runs"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert analyzed.returncode == 0, analyzed.stderr
    (row,) = json.loads((out / "criteria.json").read_text())["runs"]
    assert (row["filter"], row["seed"], row["iterations"]) == ("top_p", 0, 1)

    # collect.sh copies what is committed of the finished run, and nothing of a run its stage cut
    (warm / "runs" / "1").mkdir()
    committed = warm / "committed"
    env = {**os.environ, "STUDY": str(warm), "OUT": str(committed)}
    for _ in range(2):  # the second call finds run 0 collected and copies nothing
        collected = subprocess.run(
            ["bash", str(STUDY / "collect.sh")], env=env, capture_output=True, text=True
        )
        assert collected.returncode == 0, collected.stderr
    assert sorted(p.name for p in committed.iterdir()) == ["0"]
    names = {p.name for p in (committed / "0").iterdir()}
    assert names == {".hydra", "csv", "train.log", "curves.png", "gradients", "rollouts.rank0.jsonl.gz"}
    with gzip.open(committed / "0" / "rollouts.rank0.jsonl.gz", "rt") as f:
        assert f.read() == (run / "rollouts.rank0.jsonl").read_text()


@pytest.mark.slow  # one RL iteration on the tiny model
def test_the_second_study_runs_from_the_named_warm_start_with_the_held_out_curve(
    warm: Path, tmp_path: Path
) -> None:
    script = STUDY.parent / "collapse_study_2" / "run.sh"
    env = {
        **os.environ,
        **TINY,
        "PYTHON": sys.executable,
        "STUDY": str(tmp_path),
        "WARMSTART": str(warm / "warmstart"),
    }
    # the tiny warm start is not the weights PROTOCOL.md names: refused before any run, in one line
    refused = subprocess.run(["bash", str(script)], env={**env, "LR": "5e-5"}, capture_output=True, text=True)
    assert refused.returncode == 1 and "is not the warm start PROTOCOL.md names" in refused.stderr
    assert not (tmp_path / "runs").exists()
    unset = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert unset.returncode != 0 and "set LR" in unset.stderr
    # the pilot (seed 0, none), the held-out curve at tiny scale (the study's 16 x 4 overridden after it)
    tiny = f"{TINY['EXTRA']} diagnostics.heldout.num_seeds=2 diagnostics.heldout.samples=2"
    pilot = {**env, "LR": "5e-5", "PILOT": "1", "SHA256": "", "EXTRA": tiny}
    done = subprocess.run(["bash", str(script)], env=pilot, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "0"
    overrides = (run / ".hydra" / "overrides.yaml").read_text()
    for override in ("algo.optim.lr=5e-5", "filter=none", "seed=0", "algo.entropy_coef=0.01"):
        assert override in overrides, override
    with (run / "csv" / "metrics.csv").open() as f:
        (row,) = [r for r in csv.DictReader(f) if r.get("diag/heldout/valid_rows")]  # the curve's pass ran
    assert 0 <= float(row["diag/heldout/valid_rows"]) <= 4  # 2 instances x 2 (the random tiny model's rows)
    assert not (tmp_path / "runs" / "1").exists()
    # pilot.py on it: one pass only (1 iteration), refused in one line naming the run
    read = [
        sys.executable,
        str(STUDY.parent / "collapse_study_2" / "pilot.py"),
        str(run),
        "--out",
        str(tmp_path),
    ]
    early = subprocess.run(read, capture_output=True, text=True)
    assert early.returncode == 1 and early.stderr.startswith("pilot.py: 0: held-out passes at iterations [0]")


def _script(path: Path):  # results/ is no package: a script's module, loaded from its file
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _analysis():
    return _script(STUDY / "analyze.py")


def test_the_second_studys_pilot_rule_by_hand() -> None:
    pilot = _script(STUDY.parent / "collapse_study_2" / "pilot.py")

    def run(
        lr: float, mi: tuple[float | None, float | None], valid: float, seed: int = 0
    ) -> dict[str, object]:
        its: dict[int, dict[str, float]] = {i: {"train/iteration": float(i)} for i in range(17)}
        for i, m in zip((0, 16), mi, strict=True):
            its[i] |= {pilot.VALID: 64.0 if i == 0 else valid, pilot.H: 1.0}
            if m is not None:  # too few valid rows: no MI logged
                its[i][pilot.MI] = m
        its[16]["val/success"] = 0.5
        return {"folder": f"lr{lr}", "lr": lr, "seed": seed, "filter": "none", "iterations": its}

    # 2.5 -> 1.25 is exactly half, with 32 of 64 rows valid: collapses; 1.26 holds; 31 valid rows: breaks
    assert pilot.reading(run(5e-5, (2.5, 1.25), 32.0))["verdict"] == "collapses"
    assert pilot.reading(run(5e-5, (2.5, 1.26), 64.0))["verdict"] == "holds"
    assert pilot.reading(run(5e-5, (2.5, 0.1), 31.0))["verdict"] == "breaks"
    assert pilot.reading(run(5e-5, (2.5, None), 1.0))["verdict"] == "breaks"
    collapses, holds, breaks = (
        run(5e-5, (2.5, 1.0), 60.0),
        run(5e-5, (2.5, 2.4), 64.0),
        run(5e-5, (2.5, None), 0.0),
    )

    def decide(*runs: dict[str, object]) -> dict[str, object]:
        return pilot.decide([pilot.reading(r) for r in runs])

    assert decide(collapses)["study_lr"] == 5e-5
    table = pilot.markdown({"outcome": "o", "pilots": [pilot.reading(collapses), pilot.reading(breaks)]})
    assert "| lr5e-05 | 5e-05 | 0, 16 | 2.500 → 1.000 | 1.000 → 1.000 | 64 → 60 | collapses |" in table
    assert "| 2.500 → – | 1.000 → 1.000 | 64 → 0 | breaks |" in table
    assert decide(holds) == {
        "study_lr": None,
        "next_pilot": 1e-4,
        "outcome": "pilot 1 holds: pilot 2 at lr 0.0001",
    }
    assert decide(breaks)["next_pilot"] == 2e-5
    assert decide(holds, run(1e-4, (2.5, 1.0), 50.0))["study_lr"] == 1e-4
    assert decide(breaks, run(2e-5, (2.5, 1.0), 50.0))["study_lr"] == 2e-5
    assert decide(holds, run(1e-4, (2.5, 2.0), 64.0))["study_lr"] is None  # no study
    for wrong in (
        [run(1e-4, (2.5, 1.0), 60.0)],
        [holds, run(2e-5, (2.5, 1.0), 60.0)],
        [run(5e-5, (2.5, 1.0), 60.0, 1)],
    ):
        with pytest.raises(ValueError):
            pilot.decide([pilot.reading(r) for r in wrong])
    unfinished = run(5e-5, (2.5, 1.0), 60.0)
    del unfinished["iterations"][16]["val/success"]  # type: ignore[index]
    with pytest.raises(ValueError, match="validation not run"):
        pilot.reading(unfinished)


def _run(filter_: str, seed: int, its: dict[int, dict[str, float]]) -> dict[str, object]:
    return {"folder": f"{filter_}{seed}", "filter": filter_, "seed": seed, "algo": "grpo", "iterations": its}


def test_the_criteria_by_hand() -> None:
    analyze = _analysis()
    mi, h = analyze.MI, analyze.H

    def passes(
        mi_h: list[tuple[float, float]], zero: list[int], success: float, steps: float
    ) -> dict[int, dict[str, float]]:
        its: dict[int, dict[str, float]] = {}
        for i, z in enumerate(zero):  # 4 groups an iteration, z of them zero-RV, `steps` optimizer steps
            its[i] = {  # as metrics.csv holds them: the all-fail and all-success groups as shares of the 4
                "rollout/groups": 4.0,
                "rollout/groups_all_fail": (z // 2) / 4,
                "rollout/groups_all_success": (z - z // 2) / 4,
                "train/optimizer_steps": steps,
                "train/iteration": float(i),
            }
        for i, (m, e) in zip((0, 2, 4), mi_h, strict=True):
            its[i].update({mi: m, h: e, "grad/q1/entropy_per_sample": 1.0, "grad/q2/entropy_per_sample": 1.5})
        its[4]["val/sampled_success"] = success
        return its

    # MI 2.0 -> 0.8 (≤ half) with H 1.0 -> 0.9: template collapse; H falling to 0.4: full collapse
    # (none runs take 3 steps an iteration, top_p runs 1)
    template = passes([(2.0, 1.0), (1.5, 1.0), (0.8, 0.9)], [0, 1, 3, 4, 0], 0.25, 3.0)
    full = passes([(2.0, 1.0), (1.9, 0.8), (0.9, 0.4)], [0, 0, 4, 2, 0], 0.5, 3.0)
    kept = passes([(2.0, 1.0), (1.8, 1.0), (1.9, 1.0)], [2, 1, 0, 0, 0], 0.5, 1.0)
    runs = [_run("none", 0, template), _run("none", 1, full), _run("none", 2, template)]
    runs += [_run("top_p", 0, kept), _run("top_p", 1, kept), _run("top_p", 2, kept)]
    result = analyze.analyze(runs)
    assert result["pairs"] == {"finished": 3, "planned": 3, "interim": False}
    # one pair's top_p run without its validation: two pairs finished, every verdict interim
    partial = [*runs[:3], _run("top_p", 0, kept), _run("top_p", 1, kept)]
    partial[-1]["iterations"] = {i: {} for i in range(5)}
    assert analyze.analyze(partial)["pairs"] == {"finished": 1, "planned": 3, "interim": True}
    assert "Interim: 1 of 3 pairs" in analyze.markdown(analyze.analyze(partial))
    # the PPO pair (one planned) read the same way, from the same folder's runs; GRPO's criteria ignore it
    ppo = [{**_run("none", 0, template), "algo": "ppo"}, {**_run("top_p", 0, kept), "algo": "ppo"}]
    assert analyze.analyze([*runs, *ppo]) == result
    alone = analyze.analyze([*runs, *ppo], "ppo")
    assert [r["algo"] for r in alone["runs"]] == ["ppo", "ppo"] and alone["algo"] == "ppo"
    assert alone["pairs"] == {"finished": 1, "planned": 1, "interim": False}
    # the same numbers on the held-out curve: read with --curve heldout, absent for the registered curve
    moved = {mi: "diag/heldout/mi_est_seq", h: "diag/heldout/cond_entropy_seq"}
    heldout = [
        {
            **r,
            "iterations": {i: {moved.get(k, k): v for k, v in m.items()} for i, m in r["iterations"].items()},
        }
        for r in runs
    ]
    assert analyze.analyze(heldout, curve="heldout") == {**result, "curve": "heldout"}
    assert {r["outcome"] for r in analyze.analyze(heldout)["runs"]} == {"too few passes"}
    assert alone["a"]["none_outcomes"] == ["template collapse"]
    # one pair: its difference (0.5 - 0.25), no interval
    c1 = alone["c1 val/sampled_success"]
    assert (c1["per_seed"], c1["low"], c1["verdict"]) == ({0: 0.25}, None, "inconclusive")
    assert result["a"]["none_outcomes"] == ["template collapse", "full collapse", "template collapse"]
    assert result["a"]["verdict"] == "supported"
    # every pass: log(1.5 / 1.0) = 0.405 < log 2, no spread: the interval is the point
    assert result["b2"]["n"] == 18 and math.isclose(result["b2"]["mean"], math.log(1.5))
    assert result["b2"]["verdict"] == "supported"
    # none runs' (share, ΔMI), the share the mean of (all-success + all-fail) over the iterations between two
    # passes: template zero-RV groups 0, 1 | 3, 4 of 4 -> (0 + 0.25) / 2 = 0.125 with 1.5 - 2.0 = -0.5, and
    # (0.75 + 1.0) / 2 = 0.875 with 0.8 - 1.5 = -0.7; full 0, 0 | 4, 2 -> (0, -0.1), (0.75, -1.0)
    for run, expected in ((runs[0], [0.125, -0.5, 0.875, -0.7]), (runs[1], [0.0, -0.1, 0.75, -1.0])):
        points = analyze.zero_share_vs_mi_change(run)
        assert [x for point in points for x in point] == pytest.approx(expected)
    # Mid-ranks x: 2.5, 5.5, 1, 4, 2.5, 5.5; y: 4.5, 2.5, 6, 1, 4.5, 2.5: ρ = -13.5 / 16.5
    assert result["b3"]["n"] == 6 and math.isclose(result["b3"]["rho"], -13.5 / 16.5)
    # top_p - none: 0.25, 0.0, 0.25 -> mean 1/6, t(2) = 4.303, sd 0.1443 -> ±0.3586
    c1 = result["c1 val/sampled_success"]
    assert math.isclose(c1["mean"], 1 / 6) and math.isclose(c1["high"] - c1["mean"], 0.35856, rel_tol=1e-4)
    assert c1["verdict"] == "no difference shown"
    # (c2) top_p's passes at 0, 2, 4 steps, none's at 0, 6, 12: matched at 4, top_p's last pass (1.9) against
    # none's between 0 and 6: 2.0 + (1.5 - 2.0) * 4/6 = 1.6667 (template), 2.0 + (1.9 - 2.0) * 4/6 = 1.9333
    # (full): 0.2333, -0.0333, 0.2333 -> mean 0.1444, sd 0.1540, t(2) = 4.303 -> ±0.3825
    c2 = result["c2"]
    assert {s: m["steps"] for s, m in c2["per_seed"].items()} == {0: 4.0, 1: 4.0, 2: 4.0}
    diffs = [c2["per_seed"][s]["diff"] for s in range(3)]
    assert diffs == pytest.approx([0.7 / 3, -0.1 / 3, 0.7 / 3])
    assert math.isclose(c2["mean"], 1.3 / 9) and math.isclose(c2["high"] - c2["mean"], 0.38246, rel_tol=1e-4)
    assert c2["verdict"] == "no difference shown"


def test_the_endpoint_criteria_by_hand(tmp_path: Path) -> None:
    """endpoints/criteria.py (the 64-row supplement) on hand-made passes and arms, through its command line."""

    def write(model: str, seed: int, mi: float, h: float, retrieval: float = 0.9) -> None:
        folder = tmp_path / "passes" / model / f"seed{seed}"
        folder.mkdir(parents=True)
        metrics = {"mi_est_seq": mi, "cond_entropy_seq": h, "retrieval_acc": retrieval}
        metrics |= {"mi_upper_bound": math.log(16), "rows": 64.0}
        (folder / "metrics.json").write_text(json.dumps({"metrics": metrics, "region": "healthy"}))

    # the warm start: I = (2.0 + 2.2) / 2 = 2.1, H = 1.1; its retrieval 0.9 < 0.95: not saturated
    write("warmstart", 0, 2.0, 1.0)
    write("warmstart", 1, 2.2, 1.2)
    # none runs (I ≤ 1.05 each): H 0.6 ≥ 0.55 template, 0.5 < 0.55 full, 0.7 template; top_p runs keep I
    for run, filter_, seed, mis, h in (
        ("1", "none", 0, (1.0, 1.0), 0.6),
        ("3", "none", 1, (0.9, 1.1), 0.5),
        ("5", "none", 2, (0.8, 1.0), 0.7),
        ("0", "top_p", 0, (2.0, 2.0), 1.0),
        ("2", "top_p", 1, (1.8, 2.0), 1.0),
        ("4", "top_p", 2, (2.1, 2.1), 1.0),
    ):
        for seed_, mi in enumerate(mis):
            write(run, seed_, mi, h)
        hydra = tmp_path / "runs" / run / ".hydra"
        hydra.mkdir(parents=True)
        (hydra / "overrides.yaml").write_text(f"- filter={filter_}\n- seed={seed}\n")
    script = STUDY / "endpoints" / "criteria.py"
    args = [str(tmp_path / "passes"), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "endpoints.json").read_text())
    assert (
        result["provenance"]["command"] and "| run 5 | none | 2 |" in (tmp_path / "endpoints.md").read_text()
    )
    assert math.isclose(result["warmstart"]["I"], 2.1) and math.isclose(result["warmstart"]["H"], 1.1)
    assert result["warmstart"]["passes"][0] == {"I": 2.0, "H": 1.0, "retrieval": 0.9, "C": 16, "rows": 64}
    assert not result["saturated"]
    outcomes = {r: v["outcome"] for r, v in result["runs"].items()}
    assert outcomes == {
        "0": "no collapse",
        "1": "template collapse",
        "2": "no collapse",
        "3": "full collapse",
        "4": "no collapse",
        "5": "template collapse",
    }
    assert result["a-64"]["verdict"] == "supported"
    # none: I_r − I_W = −1.1, −1.1, −1.2 -> mean −1.1333, sd 0.05774, t(2) 4.303 -> ±0.14343: lost
    loss = result["a-loss none"]
    assert math.isclose(loss["mean"], -3.4 / 3) and math.isclose(
        loss["high"] - loss["mean"], 0.14343, rel_tol=1e-3
    )
    assert loss["verdict"] == "lost"
    # top_p: −0.1, −0.2, 0.0 -> mean −0.1, sd 0.1 -> ±0.2484: no difference shown
    assert result["a-loss top_p"]["verdict"] == "no difference shown"
    # top_p − none per seed: 1.0, 0.9, 1.2 -> mean 1.0333, sd 0.15275 -> ±0.37947: higher under the filter
    end = result["c-end"]
    assert end["per_seed"] == pytest.approx({"0": 1.0, "1": 0.9, "2": 1.2})
    assert (
        math.isclose(end["low"], 3.1 / 3 - 0.37947, rel_tol=1e-3)
        and end["verdict"] == "higher under the filter"
    )


def test_the_endpoint_saturation_check() -> None:
    criteria = _script(STUDY / "endpoints" / "criteria.py")
    ceiling = math.log(16)
    at = {"retrieval_acc": 0.96, "mi_est_seq": 0.9 * ceiling, "mi_upper_bound": ceiling}
    assert criteria.saturated([at, at])
    # either pass below either threshold: not saturated
    assert not criteria.saturated([at, at | {"retrieval_acc": 0.94}])
    assert not criteria.saturated([at | {"mi_est_seq": 0.89 * ceiling}, at])


def test_the_reading_ceiling_by_hand() -> None:
    """Post hoc: the MI a pass shows when the reasoning reads exactly the player's and the goal's cells."""
    criteria = _script(STUDY / "endpoints" / "criteria.py")

    def row(column: int, player: str, goal: str) -> dict[str, object]:
        return {"column": column, "reasoning": f"I am at ({player}). The goal is at ({goal}). Go Right."}

    # prompts 0 and 1 share their cells (k = 2), prompts 2 and 3 stand alone (k = 1); prompt 0's third row
    # names other cells, outvoted by its first two: log(4/2) for 4 rows, log 4 for 2 -> (4 ln 2 + 2 ln 4) / 6
    rows = [
        row(0, "0, 0", "2, 2"),
        row(0, "0, 0", "2, 2"),
        row(0, "1, 0", "2, 2"),
        row(1, "0, 0", "2, 2"),
        row(2, "0, 1", "2, 2"),
        row(3, "1, 1", "2, 2"),
    ]
    assert math.isclose(criteria.reading_ceiling(rows), (4 * math.log(2) + 2 * math.log(4)) / 6)
    # a prompt none of whose rows names its cells: no ceiling
    assert criteria.reading_ceiling([*rows, {"column": 4, "reasoning": "Let me think."}]) is None
