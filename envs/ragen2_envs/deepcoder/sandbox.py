"""Run untrusted Python in a separate, isolated, resource-limited process.

Isolation (needs root and ``unshare`` from util-linux; checked once by :func:`isolation_status`):

* fresh PID, mount and network namespaces: the program sees only its own processes, has no
  network (not even the host's loopback), and cannot signal the caller;
* a dedicated unprivileged uid per run (random, above any real account), so RLIMIT_NPROC stops a
  fork bomb, every host file is "other" to it, and concurrent runs cannot touch each other;
* fresh size-limited tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` (the
  world-writable folders); its working folder lives there and vanishes with the namespace;
* rlimits on CPU time, address space, file size (bounds its output too), open files, processes;
* a scrubbed environment (``PATH``, ``LANG``, ``HOME`` only), ``python -I``, no new privileges;
* a wall-clock timeout; every leftover process of the uid is killed, and the namespace dies with
  its init.

The interpreter: the unprivileged uid must be able to execute it. The venv's Python lives under
``/root`` (mode 700 on these machines), so :func:`isolation_status` tries ``sys.executable`` first
and falls back to a system ``python3`` (``/usr/bin/python3``) that the uid can run; solutions only
need the standard library.

Without root or namespaces nothing above holds but the rlimits: :func:`run_python` then refuses
unless ``allow_unisolated=True``, which logs a warning.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("_launcher.py")
UNSHARE_ARGS = ("--net", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child")
# uids for sandboxed runs: far above any account, below 2**31 - 1; one per case
UID_LOW, UID_HIGH = 1_000_000, 2_000_000_000
FALLBACK_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")


class SandboxUnavailable(RuntimeError):
    """Isolation is impossible here and the caller did not opt in to running unisolated."""


@dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. ``cpu_s`` defaults to the wall-clock timeout rounded up."""

    timeout_s: float = 2.0
    memory_mb: int = 512
    cpu_s: int | None = None
    max_procs: int = 16
    max_open_files: int = 64
    max_file_mb: int = 16
    max_output_bytes: int = 1 << 20
    tmpfs_mb: int = 16

    def __post_init__(self) -> None:
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"timeout_s={self.timeout_s!r} must be a positive number of seconds")
        ints = {
            "memory_mb": self.memory_mb,
            "max_procs": self.max_procs,
            "max_open_files": self.max_open_files,
            "max_file_mb": self.max_file_mb,
            "max_output_bytes": self.max_output_bytes,
            "tmpfs_mb": self.tmpfs_mb,
        }
        if self.cpu_s is not None:
            ints["cpu_s"] = self.cpu_s
        for key, value in ints.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{key}={value!r} must be a positive integer")
        if self.memory_mb < 64:
            raise ValueError(f"memory_mb={self.memory_mb} is too small to start Python; use >= 64")
        if self.max_open_files < 8:
            raise ValueError(f"max_open_files={self.max_open_files} is too small; use >= 8")

    @property
    def cpu_limit_s(self) -> int:
        return self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s)


@dataclass(frozen=True)
class Result:
    """What one run produced. ``returncode`` is None when a signal ended it (see ``signal``)."""

    stdout: str
    stderr: str
    returncode: int | None
    signal: int | None
    timed_out: bool  # the wall clock or the CPU-time limit (SIGXCPU) ended it: both are a time budget spent
    wall_s: float
    output_truncated: bool
    isolated: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@dataclass(frozen=True)
class Isolation:
    """Whether isolated runs are possible, why not, and which interpreter they use."""

    available: bool
    reason: str
    python: str | None


def _usable_by_unprivileged(path: str) -> bool:
    """Every folder on the way is searchable and the file executable by "other"."""
    resolved = Path(os.path.realpath(path))
    if not resolved.is_file() or not os.stat(resolved).st_mode & 0o001:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in resolved.parents)


@functools.cache
def isolation_status() -> Isolation:
    """Probe once: root, ``unshare`` with PID/mount/net namespaces, an interpreter a plain uid can run."""
    if os.geteuid() != 0:
        return Isolation(False, "not running as root: cannot switch to an unprivileged uid", None)
    unshare = shutil.which("unshare")
    if unshare is None:
        return Isolation(False, "the `unshare` tool (util-linux) is not installed", None)
    probe = subprocess.run([unshare, *UNSHARE_ARGS, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return Isolation(False, f"`unshare {' '.join(UNSHARE_ARGS)}` failed: {probe.stderr.strip()}", None)
    candidates = [sys.executable, getattr(sys, "_base_executable", sys.executable), *FALLBACK_PYTHONS]
    for python in dict.fromkeys(candidates):
        if not _usable_by_unprivileged(python):
            continue
        run = _run_batch("import sys; print(sys.version_info[0])", [""], SandboxLimits(5.0), python, True)
        if run[0].ok and run[0].stdout.strip() == "3":
            return Isolation(True, f"isolated: namespaces + unprivileged uid, interpreter {python}", python)
    tried = ", ".join(dict.fromkeys(candidates))
    return Isolation(False, f"no Python 3 an unprivileged uid can execute (tried {tried})", None)


def require_isolation(allow_unisolated: bool) -> bool:
    """True when runs will be isolated; otherwise raise, or warn when the caller opted in."""
    status = isolation_status()
    if status.available:
        return True
    if not allow_unisolated:
        raise SandboxUnavailable(
            f"cannot sandbox untrusted code here ({status.reason}); run as root on Linux with "
            "util-linux `unshare`, or pass allow_unisolated=True to run it with rlimits only"
        )
    log.warning("running untrusted code WITHOUT isolation (%s): rlimits only", status.reason)
    return False


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 2.0,
    memory_mb: int = 512,
    cpu_s: int | None = None,
    max_procs: int = 16,
    max_open_files: int = 64,
    max_file_mb: int = 16,
    max_output_bytes: int = 1 << 20,
    python: str | None = None,
    allow_unisolated: bool = False,
) -> Result:
    """Run ``code`` as a Python program fed ``stdin``, in the sandbox (see the module docstring)."""
    limits = SandboxLimits(
        timeout_s=timeout_s,
        memory_mb=memory_mb,
        cpu_s=cpu_s,
        max_procs=max_procs,
        max_open_files=max_open_files,
        max_file_mb=max_file_mb,
        max_output_bytes=max_output_bytes,
    )
    return run_python_batch(code, [stdin], limits, python=python, allow_unisolated=allow_unisolated)[0]


def run_python_batch(
    code: str,
    stdins: Sequence[str],
    limits: SandboxLimits = SandboxLimits(),  # frozen, so sharing the default is safe
    *,
    python: str | None = None,
    allow_unisolated: bool = False,
) -> list[Result]:
    """Run ``code`` once per input, each in its own fresh process, uid and tmpfs; one namespace setup."""
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if isinstance(stdins, str) or not all(isinstance(s, str) for s in stdins):
        raise TypeError("stdins must be a sequence of str (one program input per run)")
    if not stdins:
        return []
    isolated = require_isolation(allow_unisolated)
    interpreter = python or isolation_status().python or sys.executable
    return _run_batch(code, list(stdins), limits, interpreter, isolated)


def _decode(path: Path, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def _run_batch(
    code: str, stdins: list[str], limits: SandboxLimits, python: str, isolated: bool
) -> list[Result]:
    io_dir = Path(tempfile.mkdtemp(prefix="ragen2-sandbox-"))
    try:
        config = {
            "python": python,
            "cases": len(stdins),
            "isolate": isolated,
            "uid_base": UID_LOW + secrets.randbelow(UID_HIGH - UID_LOW - len(stdins)),
            "timeout_s": limits.timeout_s,
            "cpu_s": limits.cpu_limit_s,
            "memory_mb": limits.memory_mb,
            "max_procs": limits.max_procs,
            "max_open_files": limits.max_open_files,
            "max_file_mb": limits.max_file_mb,
            "tmpfs_mb": limits.tmpfs_mb,
        }
        (io_dir / "config.json").write_text(json.dumps(config))
        (io_dir / "solution.py").write_text(code, encoding="utf-8", errors="surrogatepass")
        for i, text in enumerate(stdins):
            (io_dir / f"stdin_{i}").write_text(text, encoding="utf-8", errors="surrogatepass")
        # the launcher is stdlib-only: the (fast-starting) solution interpreter runs it too
        cmd = [python, "-I", "-S", str(LAUNCHER), str(io_dir)]
        if isolated:
            cmd = [shutil.which("unshare") or "unshare", *UNSHARE_ARGS, *cmd]
        _launch(cmd, backstop_s=len(stdins) * (limits.timeout_s + 1.0) + 10.0)
        statuses = json.loads((io_dir / "status.json").read_text())
        results = []
        for i, status in enumerate(statuses):
            stdout, cut_out = _decode(io_dir / f"stdout_{i}", limits.max_output_bytes)
            stderr, cut_err = _decode(io_dir / f"stderr_{i}", limits.max_output_bytes)
            results.append(
                Result(
                    stdout=stdout,
                    stderr=stderr,
                    returncode=status["returncode"],
                    signal=status["signal"],
                    # a CPU-bound program can hit RLIMIT_CPU a moment before the wall clock fires
                    timed_out=status["timed_out"] or status["signal"] == signal.SIGXCPU,
                    wall_s=status["wall_s"],
                    output_truncated=cut_out or cut_err,
                    isolated=isolated,
                )
            )
        return results
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)


def _launch(cmd: list[str], backstop_s: float) -> None:
    """Run the launcher with a minimal environment; kill its whole group if it overruns."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=backstop_s)
    except subprocess.TimeoutExpired:
        # the launcher is namespace init: killing it makes the kernel kill everything inside
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(
            f"sandbox launcher overran its {backstop_s:.0f} s backstop and was killed"
        ) from None
    if proc.returncode != 0:
        raise RuntimeError(
            f"sandbox launcher failed (exit {proc.returncode}): {err.decode(errors='replace')}"
        )
