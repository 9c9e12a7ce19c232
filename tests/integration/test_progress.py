"""Progress bars show in an interactive terminal and nowhere else; the summary line shows in both."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

CMD = [
    sys.executable,
    "-m",
    "ragen2.train",
    "debug=fast",
    "val.every_n_iterations=1",
    "val.num_seeds=1",
    "val.samples=2",
    "val.k=2",
    "trainer.limit_val_batches=1.0",
]
BARS = ("rollout", "update", "MI cross-scoring", "eval greedy", "eval sampled")


def _run(tmp_path: Path, tty: bool) -> tuple[str, str]:
    """(stdout, stderr) of one debug run, stderr to a pseudo-terminal when ``tty``."""
    env = {k: v for k, v in os.environ.items() if k != "RAGEN2_PROGRESS"}
    cmd = [*CMD, f"hydra.run.dir={tmp_path / ('tty' if tty else 'pipe')}"]
    if not tty:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a terminal has a size
    chunks: list[bytes] = []

    def drain() -> None:  # the terminal must be read as it is written, or the child blocks
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, env=env, cwd=tmp_path, text=True)
    os.close(slave)
    stdout, _ = proc.communicate(timeout=600)
    reader.join(timeout=10)
    os.close(master)
    assert proc.returncode == 0
    return stdout, b"".join(chunks).decode(errors="replace")


@pytest.mark.slow
def test_bars_only_in_an_interactive_terminal(tmp_path: Path) -> None:
    out_tty, err_tty = _run(tmp_path, tty=True)
    out_pipe, err_pipe = _run(tmp_path, tty=False)
    for name in BARS:
        assert f"{name}:" in err_tty, f"no {name} bar in the terminal"
        assert f"{name}:" not in err_pipe, f"a {name} bar in redirected output"
    assert "episodes done" in err_tty
    for out in (out_tty, out_pipe):
        assert "[ragen2] iteration 0: success" in out and "[ragen2] run folder:" in out
