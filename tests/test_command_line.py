"""The console scripts themselves: --help, --version, and a config error or bad input as one line (a single run
and a grid)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
PROGRAMS = [
    "ragen2-train",
    "ragen2-eval",
    "ragen2-diagnose",
    "ragen2-export",
    "ragen2-export-rollouts",
    "ragen2-aggregate",
    "ragen2-warmstart",
]


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, cwd=cwd, env={**os.environ, **env}, timeout=300
    )


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_is_ragen2s(program: str, tmp_path: Path) -> None:
    done = _run([str(BIN / program), "--version"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{program} (ragen2) {importlib.metadata.version('ragen2')}"


@pytest.mark.parametrize("optimize", ["", "-OO"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_every_help_reads_the_same_way(program: str, optimize: str, tmp_path: Path) -> None:
    # what it does, Usage:, Examples:, in plain text (no ``code`` markup of docstrings); -OO strips docstrings,
    # which no help is built from
    module = "ragen2." + program.removeprefix("ragen2-").replace("-", "_")
    done = _run([sys.executable, *filter(None, [optimize]), "-m", module, "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith(f"{program}: ") and "Hydra" not in text.splitlines()[0]
    assert f"\n\nUsage: {program} " in text
    assert f"\nExamples:\n  {program} " in text
    assert text.index("Usage:") < text.index("Examples:")
    assert "``" not in text


def test_train_help_says_what_it_does_with_examples(tmp_path: Path) -> None:
    done = _run([str(BIN / "ragen2-train"), "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("ragen2-train: reinforcement learning of a multi-turn LLM agent")
    assert "Hydra" not in text.splitlines()[0]  # not Hydra's "train is powered by Hydra."
    # the groups and their options, as the config tree holds them
    assert "\nenv: bandit, countdown, deepcoder, frozenlake," in text
    assert "\nalgo: dapo, drgrpo, grpo, gspo, ppo," in text
    assert "  ragen2-train env=sokoban algo=ppo filter=none seed=1" in text
    assert "  ragen2-train --multirun seed=0,1,2 filter=top_p,none" in text
    assert "Run folder: outputs/<date>/<time>/" in text
    assert "ragen2-train --cfg job" in text and "--hydra-help" in text
    assert "\nseed: 0\n" not in text  # the full config dump stays behind --cfg job
    assert len(text.splitlines()) < 50


def test_a_config_error_is_one_line_unless_hydra_full_error(tmp_path: Path) -> None:
    args = [str(BIN / "ragen2-train"), "rollout.groups=abc", f"hydra.run.dir={tmp_path / 'run'}"]
    done = _run(args, tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "ragen2-train: rollout.groups='abc' is text, not an integer. Fix: rollout.groups=4"
    ]
    full = _run(args, tmp_path, HYDRA_FULL_ERROR="1")
    assert full.returncode == 1
    assert "Traceback (most recent call last)" in full.stderr
    assert full.stderr.rstrip().endswith(
        "ragen2.errors.ConfigError: rollout.groups='abc' is text, not an integer. Fix: rollout.groups=4"
    )


@pytest.mark.parametrize("program", ["ragen2-eval", "ragen2-diagnose", "ragen2-export"])
def test_bad_input_is_one_line_in_every_program(program: str, tmp_path: Path) -> None:
    not_json, taken = tmp_path / "rollouts.jsonl", tmp_path / "taken"
    not_json.write_text("not json\n")
    taken.write_text("a file")
    run_dir = f"hydra.run.dir={tmp_path / 'run'}"
    args, line = {
        "ragen2-eval": (
            ["num_seeds=abc", run_dir],
            "num_seeds='abc' is text, not an integer. Fix: num_seeds=16",
        ),
        "ragen2-diagnose": (
            [f"rollouts={not_json}", run_dir],
            f"rollouts={not_json}: line 1 is not JSON (Expecting value). Fix: rollouts=<a ragen2 "
            "rollouts.rank<r>.jsonl, an OpenAI chat messages JSONL, TRL's completions/ folder or verl's "
            "{step}.jsonl dump>, and format=<ragen2|messages|trl|verl> where it cannot be told",
        ),
        "ragen2-export": (
            [str(tmp_path / "last.ckpt"), str(taken / "exported")],
            f"out={taken / 'exported'} cannot be written: {taken} is a file, not a folder. Fix: out=<a folder in "
            "a writable place>",
        ),
    }[program]
    done = _run([str(BIN / program), *args], tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"{program}: {line}"]


@pytest.mark.parametrize("program", ["ragen2-eval", "ragen2-diagnose"])
def test_a_key_nothing_reads_is_refused_as_train_refuses_it(program: str, tmp_path: Path) -> None:
    done = _run([str(BIN / program), "+foo=1", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"{program}: foo=1 is not a key of {program}'s config. Fix: one of seed, ")
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("*.json"))


def test_a_failed_job_of_a_grid_leaves_the_others_running(tmp_path: Path) -> None:
    sweep = tmp_path / "grid"
    done = _run(
        [str(BIN / "ragen2-train"), "--multirun", "rollout.groups=abc,2.5", f"hydra.sweep.dir={sweep}"],
        tmp_path,
    )
    assert done.returncode == 1
    out = done.stdout + done.stderr
    first = "rollout.groups='abc' is text, not an integer. Fix: rollout.groups=4"
    second = "rollout.groups=2.5 is a float, not an integer. Fix: rollout.groups=2 or rollout.groups=3"
    # each job's error as it fails, also in its own log; job 1 ran after job 0 failed
    assert f"[ragen2] ERROR: job 0 (rollout.groups=abc) failed: {first}" in out
    assert f"[ragen2] ERROR: job 1 (rollout.groups=2.5) failed: {second}" in out
    assert second in (sweep / "1" / "train.log").read_text()
    # then Hydra raises the first failure, its message alone
    assert first in done.stderr.splitlines()
    assert "Traceback" not in out


def test_warmstart_help_says_what_it_does_with_examples(tmp_path: Path) -> None:
    done = _run([sys.executable, "-m", "ragen2.warmstart", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("ragen2-warmstart: supervised fine-tuning on the env solver's demonstrations")
    assert (
        "Envs with a solver that explains its moves: bandit, countdown, frozenlake, sokoban, sokoban_8x8."
        in text
    )
    assert "  ragen2-warmstart env=frozenlake env.kwargs.size=3 env.kwargs.observation=coord" in text
    assert "ragen2-train model.name_or_path=outputs/<date>/<time>/model" in text
    assert len(text.splitlines()) < 40


def test_a_warm_start_config_error_is_one_line(tmp_path: Path) -> None:
    done = _run(
        [sys.executable, "-m", "ragen2.warmstart", "env=metamathqa", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
    )
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "ragen2-warmstart: env.id=ragen2/MetaMathQA-v0 has no solver that explains its moves"
    )
    assert line.endswith(
        "Fix: one of env=bandit, env=countdown, env=frozenlake, env=sokoban, env=sokoban_8x8, env=twohop"
    )
