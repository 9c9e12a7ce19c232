"""scripts/install.sh skips pip when the virtualenv is up to date, and installs again when anything it was
installed from changed (a fake virtualenv whose python is this one: no pip runs either way)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"RAGEN2_DEVICE": "cpu", "RAGEN2_VLLM": "none"}


def _venv(folder: Path, stamp: str) -> Path:
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"  # this test's python, with its packages
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (folder / ".ragen2-install").write_text(stamp + "\n")
    return folder


def _install(venv: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SETTINGS, "RAGEN2_VENV": str(venv)}
    return subprocess.run(["bash", "scripts/install.sh"], cwd=ROOT, env=env, capture_output=True, text=True)


def _stamp(torch_spec: str = "torch==2.13.0") -> str:
    """What the script writes after an install: its inputs' hash, the settings, the checkout."""
    digest = hashlib.sha256(
        b"".join((ROOT / name).read_bytes() for name in ("pyproject.toml", "setup.py", "scripts/install.sh"))
    )
    return f"{digest.hexdigest()} cpu {torch_spec} none {ROOT}"


def test_an_up_to_date_virtualenv_is_left_alone(tmp_path: Path) -> None:
    venv = _venv(tmp_path / "venv", _stamp())
    done = _install(venv)
    assert done.returncode == 0, done.stderr
    assert "up to date" in done.stdout and "installing" not in done.stdout
    assert (venv / ".ragen2-install").read_text() == _stamp() + "\n"


def test_other_settings_install_again(tmp_path: Path) -> None:
    venv = _venv(tmp_path / "venv", _stamp("torch==2.12.0"))
    (venv / "bin" / "activate").write_text("return 1\n")  # the install stops there, before any pip
    done = _install(venv)
    assert "installing ragen2 for cpu" in done.stdout and "up to date" not in done.stdout
    assert done.returncode != 0 and not (venv / ".ragen2-install").exists()


def test_an_unfinished_virtualenv_is_built_again(tmp_path: Path) -> None:
    """``python -m venv`` cut short: bin/python, no pip. The script builds the virtualenv again (then, here,
    stops at a torch that does not exist, with no package index)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {
        **os.environ,
        **SETTINGS,
        "RAGEN2_VENV": str(venv),
        "RAGEN2_TORCH_SPEC": "ragen2-no-such-package==0",
        "PIP_NO_INDEX": "1",
    }
    done = subprocess.run(["bash", "scripts/install.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert f"{venv} is an unfinished virtualenv (no bin/activate or no pip): building it again" in done.stderr
    assert done.returncode != 0 and "ragen2-no-such-package" in done.stderr
    assert subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"]).returncode == 0
