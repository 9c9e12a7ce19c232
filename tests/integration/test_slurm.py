"""SLURM support: the launcher and sweep configs compose; a real sweep runs as SLURM jobs on a local cluster
(debug=fast jobs, one cell failing on purpose), and ragen2-aggregate reads that grid. The sweep runs once for
both checks (a module fixture), so they share a file."""

from __future__ import annotations

import csv
import itertools
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import free_ports
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from ragen2.config import CONF_DIR, build, validate
from ragen2.config import compose as ragen2_compose

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))
SWEEPS = sorted(p.stem for p in (CONF_DIR / "sweep").glob("*.yaml"))
#: each sweep's scale (the accelerator, groups an iteration) and its smoke variant: the paper's on a GPU, shrunk
#: to the tiny model; the organism's on a CPU thread, already small (its sampler settings are the HF sampler's)
SCALE = {"organism_pilot": (("cpu", 16), ["iterations=1"])}
PAPER_SCALE = (("gpu", 8), ["debug=fast", "model.name_or_path=tiny"])
CLUSTER = ROOT / "slurm" / "local_cluster.sh"
#: a sweep's jobs as CPU jobs on the local cluster (slurm/local_cluster.sh)
SLURM_JOBS = [
    "hydra/launcher=slurm",
    "hydra.launcher.partition=debug",
    "hydra.launcher.cpus_per_task=1",  # two jobs side by side on a 2-core machine
    "hydra.launcher.mem_gb=2",
    "hydra.launcher.gpus_per_node=null",
    "hydra.launcher.timeout_min=10",
]


def _compose(overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_launcher_config_composes(launcher: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEN2_ROOT", str(ROOT))
    cfg = _compose([f"hydra/launcher={launcher}", "trainer.devices=2"])
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert params["_target_"].startswith("hydra_plugins.hydra_submitit_launcher.")
    # Lightning needs one SLURM task per device
    assert params["tasks_per_node"] == (2 if launcher == "slurm" else 1)
    for line in params.get("setup") or []:
        script = Path(line.split()[-1])
        assert script.is_file(), f"setup line {line!r} sources a missing file"


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_config_composes_into_a_grid_of_existing_options(sweep: str) -> None:
    cfg = _compose([f"+sweep={sweep}", "hydra/launcher=local"])
    params = cfg.hydra.sweeper.params
    assert params, f"conf/sweep/{sweep}.yaml sets no hydra.sweeper.params"
    choices = {key: str(value).split(",") for key, value in params.items()}
    for group, options in choices.items():
        if (CONF_DIR / group).is_dir():  # a config group: every option is a file
            for option in options:
                assert (CONF_DIR / group / f"{option}.yaml").is_file(), (
                    f"{sweep}: no conf/{group}/{option}.yaml"
                )
    grid = list(itertools.product(*choices.values()))
    assert len(grid) == len(set(grid)) > 1
    # that each option composes with the sweep's other settings, test_every_cell_of_a_sweep_... shows cell by cell


def _grid(sweep: str) -> dict[str, list[str]]:
    return {k: str(v).split(",") for k, v in _compose([f"+sweep={sweep}"]).hydra.sweeper.params.items()}


def test_main_table_grid() -> None:
    assert _grid("main_table") == {
        "experiment": ["paper_sokoban", "paper_frozenlake", "paper_metamathqa", "paper_countdown"],
        "algo": ["ppo", "dapo", "grpo", "drgrpo"],
        "filter": ["top_p", "none"],
        "seed": ["0", "1", "2"],
    }


@pytest.mark.parametrize("sweep", SWEEPS)
def test_sweep_counts_match_the_docs(sweep: str) -> None:
    """Each sweep file's header and slurm/README.md state its run count; both match the grid."""
    runs = len(list(itertools.product(*_grid(sweep).values())))
    header = (CONF_DIR / "sweep" / f"{sweep}.yaml").read_text().split("hydra:")[0]
    assert re.search(rf"= {runs} runs", header), f"conf/sweep/{sweep}.yaml does not say '= {runs} runs'"
    row = next(
        line for line in (ROOT / "slurm" / "README.md").read_text().splitlines() if f"+sweep={sweep}`" in line
    )
    assert f"| {runs} |" in row, row


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_cell_of_a_sweep_builds_with_the_tiny_model(sweep: str) -> None:
    """Each cell (every swept value but the seed) composes at its scale (the paper's, or the organism's), and
    its CPU smoke variant (the paper's: debug=fast, the model's weights replaced by the tiny model's) builds the
    data and policy modules."""
    grid = _grid(sweep)
    grid.pop("seed")
    for cell in itertools.product(*grid.values()):
        chosen = [f"+sweep={sweep}", *(f"{key}={value}" for key, value in zip(grid, cell))]
        paper = ragen2_compose(chosen)
        scale, smoke = SCALE.get(sweep, PAPER_SCALE)
        assert (paper.trainer.get("accelerator"), paper.rollout.groups) == scale, chosen
        cfg = ragen2_compose([*chosen, *smoke])
        validate(cfg)
        build(cfg.data)
        module = build(cfg.module)
        assert module.algo is not None


def _start_cluster(folder: Path, ctld_port: int, slurmd_port: int) -> subprocess.CompletedProcess[str]:
    """``slurm/local_cluster.sh start <folder>`` with the daemons on these ports."""
    return subprocess.run(
        ["bash", str(CLUSTER), "start", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAGEN2_SLURM_PORT": str(ctld_port), "RAGEN2_SLURMD_PORT": str(slurmd_port)},
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[dict[str, str]]:
    """A one-node cluster on localhost (slurm/local_cluster.sh); yields the environment that reaches it."""
    if shutil.which("slurmctld") is None:
        pytest.skip("slurmctld not installed: apt-get install -y slurm-wlm (see slurm/README.md)")
    if os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (slurmd, munged)")
    for attempt in range(1, 4):
        # not under pytest's tmp_path: its parents are private to root, and munged runs as the munge user
        folder = Path(tempfile.mkdtemp(prefix="ragen2-slurm."))
        # two ports the OS chose free (never the default 6817/6818 of a cluster someone else runs); one taken
        # in the instant before a daemon binds it ends `start` at once, and another pair is tried
        started = _start_cluster(folder, *free_ports(2))
        if started.returncode == 0:
            break
        shutil.rmtree(folder, ignore_errors=True)
        assert attempt < 3, f"the cluster did not start in 3 attempts; the last: {started.stderr}"
    env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf"), "RAGEN2_ROOT": str(ROOT)}
    try:
        yield env
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(folder)], timeout=60, check=False)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_taken_port_ends_the_cluster_start_at_once(tmp_path: Path) -> None:
    """What the fixture's retry relies on: a daemon that cannot bind its port fails ``start`` in seconds,
    saying why, and leaves no daemon behind (it used to wait for the node, and then hang the next test)."""
    if shutil.which("slurmctld") is None or os.geteuid() != 0:
        pytest.skip("needs slurm-wlm and root")
    folder = Path(tempfile.mkdtemp(prefix="ragen2-slurm."))
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        ctld, slurmd = taken.getsockname()[1], free_ports(1)[0]
        try:
            start = time.monotonic()
            done = _start_cluster(folder, ctld, slurmd)
            took = time.monotonic() - start
        finally:
            subprocess.run(
                ["bash", str(CLUSTER), "stop", str(folder)], timeout=60, check=False, capture_output=True
            )
            shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 1 and took < 60, (took, done.stderr)
    assert "local_cluster.sh: slurmctld exited: " in done.stderr and "Address already in use" in done.stderr
    assert not [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if _in_cluster(pid, folder)]


def _in_cluster(pid: int, folder: Path) -> bool:
    """Whether process ``pid`` is a daemon of the local cluster in ``folder`` (its command line names it)."""
    try:
        return str(folder) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


T_975_DF1 = 12.706204736174707  # t_{0.975, 1}: two seeds per cell

# each cell's jobs are its seeds; algo.optim.lr=-1 is accepted by the sweep (Hydra composes it) and refused
# at start-up inside its SLURM job, so that cell's two jobs fail before their first iteration
LRS = ("0.001", "-1")


def _wait_for_queue(env: dict[str, str], timeout: float = 180) -> None:
    """The submitting process returns at the first failed job; the others may still be queued or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queue = subprocess.run(
            ["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=30
        )
        if queue.returncode == 0 and not queue.stdout.strip():
            return
        time.sleep(1)
    pytest.fail(f"SLURM jobs still queued after {timeout} s: {queue.stdout}")


@pytest.fixture(scope="module")
def slurm_grid(slurm_cluster: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lr {0.001, -1} × seed {0, 1} of debug=fast jobs through the launcher, one job array; its sweep folder."""
    sweep_dir = tmp_path_factory.mktemp("slurm-grid") / "sweep"
    overrides = [
        *SLURM_JOBS,
        f"hydra.sweep.dir={sweep_dir}",
        f"algo.optim.lr={','.join(LRS)}",
        "seed=0,1",
        "debug=fast",  # one iteration (the unit tests cover longer runs, best vs final, incomplete runs)
        "trainer.limit_val_batches=1.0",  # validate after it: success is read from val/success
        "~callbacks.curves",
    ]
    subprocess.run(
        [sys.executable, "-m", "ragen2.train", "--multirun", *overrides],
        cwd=sweep_dir.parent,
        env=slurm_cluster,
        capture_output=True,
        text=True,
        timeout=300,
    )  # exits non-zero: two jobs fail on purpose
    _wait_for_queue(slurm_cluster)
    return sweep_dir


@pytest.mark.slow
def test_sweep_runs_as_slurm_jobs(slurm_grid: Path) -> None:
    # one job array: .submitit/<array>_<task>/ holds each job's pickles and log
    job_dirs = sorted(p for p in (slurm_grid / ".submitit").iterdir() if re.fullmatch(r"\d+_\d+", p.name))
    assert [p.name.split("_")[1] for p in job_dirs] == ["0", "1", "2", "3"]
    assert len({p.name.split("_")[0] for p in job_dirs}) == 1
    for job_dir in job_dirs[:2]:  # the lr=0.001 cell's (lr is the outer loop)
        log = "\n".join(p.read_text() for p in job_dir.glob("*_log.out"))
        assert re.search(r"\[ragen2\] SLURM_JOB_ID=\d+ ", log), log[-2000:]  # printed by slurm/env.sh
        assert f"JobEnvironment(job_id={job_dir.name}," in log  # submitit saw the SLURM job
        assert "Job completed successfully" in log
    for num in ("0", "1"):
        run = slurm_grid / num
        assert (run / "checkpoints" / "last.ckpt").is_file()
        assert (run / "csv" / "metrics.csv").stat().st_size > 0
        hydra_cfg = OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra
        assert hydra_cfg.job.id == job_dirs[int(num)].name
        assert f"seed={num}" in hydra_cfg.overrides.task


def _expected(run: Path) -> dict[str, float]:
    """The run's numbers straight from its metrics.csv: validation rows carry val/success, iteration rows the rest."""
    with (run / "csv" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    val = [float(r["val/success"]) for r in rows if r.get("val/success")]
    iteration = [r for r in rows if r.get("train/iteration")]

    def last(key: str) -> float:
        return float([r[key] for r in iteration if r.get(key)][-1])

    return {
        "final_success": val[-1],
        "best_success": max(val),
        "final_mi_zscore_ema": last("diag/first_turn/mi_zscore_ema"),
        "final_retrieval_above_chance": last("diag/first_turn/retrieval_above_chance"),
        "final_cond_entropy": last("diag/first_turn/cond_entropy"),
        "final_reasoning_length": last("rollout/reasoning_length"),
    }


@pytest.mark.slow
def test_aggregate_a_slurm_grid(slurm_grid: Path) -> None:
    sweep_dir = slurm_grid
    jobs = {num: sweep_dir / str(num) for num in range(4)}  # lr outermost: jobs 2 and 3 are lr=-1
    for num in range(2):
        assert (jobs[num] / "checkpoints" / "last.ckpt").is_file(), f"job {num} did not finish"

    done = subprocess.run(
        [sys.executable, "-m", "ragen2.aggregate", str(sweep_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("aggregate.csv", "aggregate.md", "aggregate_metrics.png", "aggregate_curves.png"):
        assert (sweep_dir / name).stat().st_size > 0, name

    with (sweep_dir / "aggregate.csv").open() as f:
        table = {row["algo.optim.lr"]: row for row in csv.DictReader(f)}
    assert list(table) == list(LRS)  # one row per cell, in job order; seed is not a cell key
    row = table["0.001"]  # its two seeds, jobs 0 and 1
    assert (row["n"], row["seeds"], row["failed"]) == ("2", "0, 1", "0")
    per_run = [_expected(jobs[num]) for num in (0, 1)]
    for metric in per_run[0]:
        values = [r[metric] for r in per_run]
        mean, half = statistics.fmean(values), T_975_DF1 * statistics.stdev(values) / math.sqrt(2)
        assert float(row[f"{metric}_mean"]) == pytest.approx(mean, rel=1e-9, abs=1e-12), metric
        assert float(row[f"{metric}_ci_low"]) == pytest.approx(mean - half, rel=1e-9, abs=1e-12), metric
        assert float(row[f"{metric}_ci_high"]) == pytest.approx(mean + half, rel=1e-9, abs=1e-12), metric
        assert row[f"{metric}_n"] == "2"
    assert row["final_success_key"] == row["best_success_key"] == "val/success"
    failed = table["-1"]
    assert (failed["n"], failed["failed"], failed["final_success_mean"]) == ("0", "2", "")

    # the failed jobs, with the error submitit kept of each, in aggregate.md and on stdout
    markdown = (sweep_dir / "aggregate.md").read_text()
    section = markdown.split("## Failed or incomplete")[1]
    for num, seed in ((2, 0), (3, 1)):
        line = re.search(rf"^\| job {num} \| algo\.optim\.lr=-1 seed={seed} \| (.*) \|$", section, re.M)
        assert line, section
        assert "no csv/metrics.csv" in line[1] and "ConfigError: algo.optim.lr=-1" in line[1], line[1]
        assert re.search(
            rf"^  job {num} \(algo\.optim\.lr=-1 seed={seed}\): no csv/metrics.csv", done.stdout, re.M
        )
    assert "| 0.001 | 2 | 0, 1 | val/success |" in markdown
