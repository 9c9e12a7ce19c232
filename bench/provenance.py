"""What every bench/results file records beside its numbers: the commit, the machine and the command.

``provenance()`` returns ``{"commit", "dirty", "date", "command", "machine"}``; the machine holds the CPU
model, its cores, torch's threads, the load average when the benchmark started, and the GPU if one is
present. Where the checkout has no git history (a copy of the tree on another machine), ``RAGEN2_COMMIT``
names the commit.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def cpu_name() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "CPU"


def machine() -> dict[str, Any]:
    out: dict[str, Any] = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
    }
    try:
        import torch

        out |= {"torch": torch.__version__, "threads": torch.get_num_threads()}
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            out |= {
                "gpu": torch.cuda.get_device_name(0),
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            }
    except ImportError:
        pass
    return out


def provenance(argv: list[str] | None = None) -> dict[str, Any]:
    commit = os.environ.get("RAGEN2_COMMIT") or _git("rev-parse", "HEAD") or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([Path(sys.executable).name, *(sys.argv if argv is None else argv)]),
        "machine": machine(),
    }
