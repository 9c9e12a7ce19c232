"""A benchmark's worker process, released one step at a time: the parent writes ``go``, the worker runs one
step and prints ``<mark><json>``; everything else it prints goes to its log. Side-by-side benchmarks
(bench_vs_trl, bench_trl_callback) interleave two such workers so that both see the same machine."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


class Worker:
    def __init__(self, name: str, command: list[str], log: Path, mark: str) -> None:
        self.name, self.log, self.mark = name, log.open("w"), mark
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, bufsize=1
        )

    def step(self) -> dict[str, float]:
        """Release one step; its measurements."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(self.mark):
                return json.loads(line[len(self.mark) :])
            self.log.write(line)
        raise SystemExit(f"the {self.name} worker exited early (rc {self.proc.wait()}); see {self.log.name}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()
