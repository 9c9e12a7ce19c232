"""ragen2 from outside its repository: an environment registered in the user's own package, the user's configs in
a folder of theirs, and ragen2 installed without -e (docs/extending.md).

The user's package is tests/envs/outside, installed for the session by the ``outside_envs`` fixture (a
folder on sys.path holding the package and its dist-info, as site-packages would); its env passes the shared
env contract tests in tests/envs/test_all_envs.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from helpers import OUTSIDE_ENTRY_POINT_ID, OUTSIDE_GYM_ID

from ragen2.config import compose, validate
from ragen2.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _program(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, cwd=cwd, env={**os.environ, **env}, timeout=300
    )


def test_an_env_of_its_own_runs_by_its_config_through_ragen2_conf(
    outside_envs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _, conf = outside_envs
    monkeypatch.setenv("RAGEN2_CONF", str(conf))
    cfg = compose(["env=guess"], run_dir=str(tmp_path))
    assert cfg.env.id == OUTSIDE_ENTRY_POINT_ID and cfg.env.max_turns == 3  # capped by max_turns_cap
    validate(cfg)  # env.kwargs checked against what GuessEnv's constructor declares
    with pytest.raises(
        ConfigError,
        match=r"^env\.kwargs\.hi=8 is not an option of outside/Guess-v0\. Fix: env\.kwargs\.high=8$",
    ):
        validate(compose(["env=guess", "+env.kwargs.hi=8"], run_dir=str(tmp_path)))
    # env.id names it too, by gymnasium's registration (the module is imported first)
    validate(compose(["env=guess", f"env.id={OUTSIDE_GYM_ID}"], run_dir=str(tmp_path)))


def test_an_id_no_package_registers_is_one_line(outside_envs: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^env\.id='outside/Chess-v0' is not a ragen2 environment\. Fix: env=<name>"
    ):
        validate(compose(["env.id=outside/Chess-v0"], run_dir=str(tmp_path)))
    with pytest.raises(
        ConfigError, match=r"^env\.id='no_such_pkg:x/Y-v0': its module 'no_such_pkg' does not import"
    ):
        validate(compose(["env.id=no_such_pkg:x/Y-v0"], run_dir=str(tmp_path)))
    # a registered id that is not a TextEnv: the agent could not play it
    with pytest.raises(
        ConfigError, match=r"^env\.id='CartPole-v1' names .* which is not a ragen2_envs\.TextEnv"
    ):
        validate(compose(["env.id=CartPole-v1"], run_dir=str(tmp_path)))


def test_the_programs_find_a_users_config_folder(outside_envs: tuple[Path, Path], tmp_path: Path) -> None:
    site, conf = outside_envs
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    # RAGEN2_CONF, or Hydra's own search path on the command line
    by_env = _program(
        [str(BIN / "ragen2-train"), "env=guess", "--cfg", "job"],
        tmp_path,
        RAGEN2_CONF=str(conf),
        PYTHONPATH=path,
    )
    assert by_env.returncode == 0, by_env.stderr
    assert f"env:\n  id: {OUTSIDE_ENTRY_POINT_ID}\n" in by_env.stdout
    searched = f"hydra.searchpath=[file://{conf}]"
    by_flag = _program(
        [str(BIN / "ragen2-eval"), searched, "env=guess", "--cfg", "job"], tmp_path, PYTHONPATH=path
    )
    assert by_flag.returncode == 0, by_flag.stderr
    assert f"env:\n  id: {OUTSIDE_ENTRY_POINT_ID}\n" in by_flag.stdout
    # a folder that is not there is one line, before Hydra
    missing = tmp_path / "missing"
    refused = _program([str(BIN / "ragen2-diagnose"), "--cfg", "job"], tmp_path, RAGEN2_CONF=str(missing))
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"ragen2-diagnose: RAGEN2_CONF={missing}: {missing} is not a folder. Fix: RAGEN2_CONF=<the folder holding "
        "your config groups, e.g. <folder>/env/<name>.yaml>, or unset RAGEN2_CONF"
    ]


@pytest.mark.slow
def test_an_env_of_its_own_trains_one_iteration(
    outside_envs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, train
) -> None:
    monkeypatch.setenv("RAGEN2_CONF", str(outside_envs[1]))
    metrics, cfg = train(
        ["env=guess", "iterations=1", "rollout.groups=2", "rollout.group_size=3", "algo.mini_batch_size=6"]
    )
    assert cfg.env.id == OUTSIDE_ENTRY_POINT_ID
    assert metrics["rollout/format_valid_rate"] > 0  # the oracle's guesses are well-formed
    assert metrics["filter/kept"] >= 1 and metrics["train/optimizer_steps"] >= 1, metrics
    assert (Path(cfg.run_dir) / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_an_install_without_editable_mode_composes_the_same_config(tmp_path: Path) -> None:
    # a fresh virtualenv that sees this one's packages (torch, hydra, …) but not its ragen2 (editable, or on
    # PYTHONPATH), and ragen2 built from a copy of the source and installed into it as a wheel
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = tmp_path / "source"
    for folder in ("src", "envs"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAGEN2_CONF")}
    install = [
        str(python),
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        str(source),
    ]
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    where = subprocess.run(
        [str(python), "-c", "import ragen2.config as c; print(c.CONF_DIR)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert where.stdout.strip() == f"{purelib}/ragen2/conf", where.stderr
    installed = subprocess.run(
        [str(venv / "bin" / "ragen2-train"), "--cfg", "job"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    here = _program([str(BIN / "ragen2-train"), "--cfg", "job"], tmp_path)
    assert installed.stdout == here.stdout and "env:\n  id: ragen2/FrozenLake-v0\n" in installed.stdout
