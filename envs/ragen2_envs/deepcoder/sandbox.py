"""Run untrusted Python in a separate, isolated, resource-limited process.

Two ways to isolate; :func:`isolation_status` probes once and takes the first that works here.
Either way one launcher (``_launcher.py``) runs a batch of inputs one after another, each in a
fresh process with a fresh ``/tmp``, and its files reach it as inherited descriptors only.

``bwrap`` (bubblewrap >= 0.8 on x86_64; works without root), one sandbox per batch:

* new user, PID, network, IPC, UTS and cgroup namespaces; no capabilities; nested user namespaces
  disabled (``--disable-userns``); a seccomp filter (:mod:`ragen2_envs.deepcoder.seccomp`) that
  refuses namespace, mount, ptrace, keyring, bpf, io_uring and non-Unix socket calls, among others;
* no host filesystem: a read-only root that holds only the interpreter, its standard library and
  the shared libraries these load (found with ``ldd``), each bound read-only at its own path, a
  fresh ``/proc`` of the sandbox's processes, a minimal read-only ``/dev``, and size-limited tmpfs
  on ``/tmp`` and ``/dev/shm``, emptied before every run. No ``/etc``, ``/home``, ``/root`` or
  project files: no host file, world-writable folder or Unix socket is reachable by path;
* as root, bubblewrap itself runs under a dedicated unprivileged uid per batch (random, above any
  real account), so a process that left the namespaces would still own nothing; without root it
  runs as the caller, and the sandbox's uid maps to the caller's;
* the launcher is the sandbox's PID 1, of the programs' uid: signals from them are dropped, it is
  not dumpable, and after each run ``kill(-1)`` ends whatever the run left behind.

``unshare`` (the fallback; needs root and util-linux ``unshare``), one namespace per batch:

* fresh PID, mount and network namespaces: the program sees only its own processes, has no
  network (not even the host's loopback), and cannot signal the caller;
* a dedicated unprivileged uid per run, so every host file is "other" to it, and runs cannot touch
  each other; the host filesystem stays readable wherever "other" may read;
* fresh size-limited tmpfs over ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock`` (the
  world-writable folders) for every run; the working folder lives there.

Only bubblewrap keeps the host's files out of sight: under ``unshare`` a program reads whatever "other"
may (``/etc/passwd``, a world-readable checkout). So a result says ``isolated=True`` under bubblewrap only,
and the automatic fallback to ``unshare`` logs a warning once per process, naming why bubblewrap is unusable.

Both: rlimits on CPU time, address space, file size (bounds its output too), open files and
processes (``max_procs`` counts every process of the run, the program included); a scrubbed
environment (``PATH``, ``LANG``, ``HOME`` only), ``python -I``, no new privileges; a wall-clock
timeout, after which every process left from the run is killed.

The interpreter: the unprivileged uid (bubblewrap's, as root) must be able to execute it and read
its library. The venv's Python lives under ``/root`` (mode 700 on these machines), so the probe
tries ``sys.executable`` first and falls back to a system ``python3`` (``/usr/bin/python3``);
solutions only need the standard library. Under bubblewrap it runs from its real path, outside
any venv, with its own standard library only.

With neither method, nothing above holds but the rlimits: :func:`run_python` then refuses unless
``allow_unisolated=True``, which logs a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ragen2_envs.deepcoder import seccomp

log = logging.getLogger(__name__)

LAUNCHER = Path(__file__).with_name("_launcher.py")
METHODS = ("bwrap", "unshare")
UNSHARE_ARGS = ("--net", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child")
BWRAP_MIN_VERSION = (0, 8, 0)  # --disable-userns and --assert-userns-disabled
LAUNCHER_INSIDE = "/sandbox/launcher.py"  # where bubblewrap shows the launcher
# cases per launcher process: each holds three descriptors, well inside the usual 1024 open files
CASES_PER_LAUNCH = 64
# uids for sandboxed runs: far above any account, below 2**31 - 1; one per case (unshare) or batch (bwrap)
UID_LOW, UID_HIGH = 1_000_000, 2_000_000_000
FALLBACK_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
PROBE_CODE = "import sys; print(sys.version_info[0])"
# a library line of `ldd`: "\tlibz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "\t/lib64/ld-linux-x86-64.so.2 (0x...)"
LDD_PATH = re.compile(r"^\s+(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$", re.MULTILINE)


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
    """Whether sandboxed runs are possible, why not, which method and which interpreter they use."""

    available: bool
    reason: str
    python: str | None
    method: str | None = None  # "bwrap" or "unshare" when available

    @property
    def isolated(self) -> bool:
        """Whether runs are isolated from the host's files too (bubblewrap; ``unshare`` leaves them readable)."""
        return self.available and self.method == "bwrap"


def _usable_by_unprivileged(path: str) -> bool:
    """Every folder on the way is searchable and the file executable by "other"."""
    resolved = Path(os.path.realpath(path))
    if not resolved.is_file() or not os.stat(resolved).st_mode & 0o001:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in resolved.parents)


def _candidate_pythons() -> list[str]:
    return list(
        dict.fromkeys([sys.executable, getattr(sys, "_base_executable", sys.executable), *FALLBACK_PYTHONS])
    )


@functools.cache
def isolation_status() -> Isolation:
    """The best isolation here: bubblewrap, else ``unshare`` as root, else none (saying why)."""
    bwrap = probe("bwrap")
    if bwrap.available:
        return bwrap
    unshare = probe("unshare")
    if unshare.available:
        return dataclasses.replace(unshare, reason=f"{unshare.reason} (bubblewrap unusable: {bwrap.reason})")
    return Isolation(False, f"bubblewrap: {bwrap.reason}; unshare: {unshare.reason}", None)


@functools.cache
def probe(method: str) -> Isolation:
    """Whether ``method`` ("bwrap" or "unshare") isolates runs here, and with which interpreter."""
    if method == "bwrap":
        return _probe_bwrap()
    if method == "unshare":
        return _probe_unshare()
    raise ValueError(f"method={method!r} is not a sandbox method; use one of {METHODS}, or None for the best")


def _probe_unshare() -> Isolation:
    if os.geteuid() != 0:
        return Isolation(False, "not running as root: cannot switch to an unprivileged uid", None)
    unshare = shutil.which("unshare")
    if unshare is None:
        return Isolation(False, "the `unshare` tool (util-linux) is not installed", None)
    probe_run = subprocess.run([unshare, *UNSHARE_ARGS, "true"], capture_output=True, text=True, timeout=30)
    if probe_run.returncode != 0:
        return Isolation(
            False, f"`unshare {' '.join(UNSHARE_ARGS)}` failed: {probe_run.stderr.strip()}", None
        )
    for python in _candidate_pythons():
        if not _usable_by_unprivileged(python):
            continue
        run = _run_batch(PROBE_CODE, [""], SandboxLimits(5.0), python, "unshare")[0]
        if run.ok and run.stdout.strip() == "3":
            reason = (
                f"partly isolated: namespaces + unprivileged uid, host files readable, interpreter {python}"
            )
            return Isolation(True, reason, python, "unshare")
    tried = ", ".join(_candidate_pythons())
    return Isolation(False, f"no Python 3 an unprivileged uid can execute (tried {tried})", None)


def _bwrap_version(bwrap: str) -> tuple[int, ...]:
    out = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(part) for part in match.groups()) if match else (0, 0, 0)


def _probe_bwrap() -> Isolation:
    unsupported = seccomp.unsupported_reason()
    if unsupported is not None:
        return Isolation(False, unsupported, None)
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return Isolation(
            False, "bubblewrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)", None
        )
    version = _bwrap_version(bwrap)
    if version < BWRAP_MIN_VERSION:
        found = ".".join(map(str, version))
        return Isolation(False, f"bubblewrap {found} is too old; --disable-userns needs >= 0.8.0", None)
    failures = []
    for python in _candidate_pythons():
        # as root, bubblewrap runs as the run's uid: it must reach the interpreter as "other"
        usable = _usable_by_unprivileged(python) if os.geteuid() == 0 else os.access(python, os.X_OK)
        if not usable:
            continue
        try:
            run = _run_batch(PROBE_CODE, [""], SandboxLimits(5.0), python, "bwrap")[0]
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            failures.append(f"{python}: {exc}")
            continue
        if run.ok and run.stdout.strip() == "3":
            reason = f"isolated: bubblewrap (namespaces, no host filesystem, seccomp), interpreter {python}"
            return Isolation(True, reason, python, "bwrap")
        failures.append(f"{python}: exit {run.returncode}, signal {run.signal}: {run.stderr.strip()[-300:]}")
    tried = "; ".join(failures) or f"none usable among {', '.join(_candidate_pythons())}"
    return Isolation(False, f"no Python 3 runs under bubblewrap here ({tried})", None)


def _resolve(path: str) -> tuple[dict[str, str], str]:
    """``path``'s real location, and every symlink met on the way (link path -> its text).

    Each link path has a real parent folder, so recreating the links over the real files rebuilds
    ``path`` itself: ``/lib64`` -> ``usr/lib64``, ``/usr/lib64/ld-linux-x86-64.so.2`` -> ``../lib/...``.
    """
    links: dict[str, str] = {}
    pending = [part for part in reversed(path.split("/")) if part]
    current = "/"
    hops = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        if not os.path.islink(candidate):
            current = candidate
            continue
        hops += 1
        if hops > 40:
            raise RuntimeError(f"too many levels of symbolic links in {path}")
        target = os.readlink(candidate)
        links[candidate] = target
        if target.startswith("/"):
            current = "/"
        pending.extend(part for part in reversed(target.split("/")) if part)
    return links, current


def _shared_libraries(files: list[str]) -> list[str]:
    """Every shared library ``files`` load, as the dynamic loader finds them (via ``ldd``)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        raise RuntimeError(
            "`ldd` (glibc) is not installed: cannot tell which libraries the interpreter needs"
        )
    # exit 1 when one of several files is not dynamic: the others' lines are still printed
    out = subprocess.run([ldd, *files], capture_output=True, text=True, timeout=120)
    return sorted(set(LDD_PATH.findall(out.stdout)))


@functools.cache
def check_interpreter(python: str) -> None:
    """``python`` starts as an isolated Python interpreter (``-I -S``), or a ``ValueError`` that says why."""
    try:
        out = subprocess.run(
            [python, "-I", "-S", "-c", "import sys"], capture_output=True, text=True, timeout=60
        )
    except OSError as err:
        raise ValueError(f"python={python} cannot be run ({err.strerror})") from None
    if out.returncode != 0:
        said = out.stderr.strip()[-300:] or f"exit status {out.returncode}, nothing on stderr"
        raise ValueError(f"python={python} does not run as a Python interpreter ({said})")


@functools.cache
def interpreter_mounts(python: str) -> tuple[str, ...]:
    """bubblewrap arguments that show ``python``, its standard library and their shared libraries.

    All read-only, each at its own host path, symlinks on the way recreated; nothing else of the host.
    ``python`` is a real path (no venv): its ``sys.path`` under ``-I -S`` is its own library only.
    """
    query = "import json, sys; print(json.dumps(sys.path))"
    out = subprocess.run([python, "-I", "-S", "-c", query], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{python} -I -S failed: {out.stderr.strip()[-300:]}")
    folders = [os.path.realpath(p) for p in json.loads(out.stdout) if os.path.isdir(p)]
    extensions, linked = [], []
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                if name.endswith(".so"):
                    extensions.append(path)
                # a link out of the library (Debian: sitecustomize.py -> /etc/python3.11/): keep its target
                if os.path.islink(path) and os.path.isfile(path):
                    linked.append(path)
    binds: dict[str, None] = {}
    links: dict[str, str] = {}
    for path in [*folders, python, *linked, *_shared_libraries([python, *extensions])]:
        chain, real = _resolve(path)
        links.update(chain)
        if os.path.exists(real):
            binds[real] = None

    def inside_folder(path: str) -> bool:  # already visible through a bound folder
        return any(path.startswith(folder.rstrip("/") + "/") for folder in folders)

    args: list[str] = []
    for real in sorted(binds):
        if not inside_folder(real):
            args += ["--ro-bind", real, real]
    for link, target in sorted(links.items()):
        if not inside_folder(link):
            args += ["--symlink", target, link]
    return tuple(args)


def _bwrap_command(
    python: str, limits: SandboxLimits, uid: int, seccomp_fd: int, launcher_fd: int
) -> list[str]:
    """bubblewrap's command line up to ``--``: namespaces, the interpreter's files, fresh tmpfs, seccomp."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is no longer on PATH")
    tmpfs = str(limits.tmpfs_mb << 20)
    return [
        bwrap,
        *("--unshare-all", "--unshare-user", "--disable-userns", "--assert-userns-disabled"),
        *("--as-pid-1", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "sandbox"),
        *("--uid", str(uid), "--gid", str(uid), "--clearenv", "--chdir", "/"),
        *interpreter_mounts(python),
        *("--proc", "/proc", "--dev", "/dev"),
        *("--size", tmpfs, "--perms", "1777", "--tmpfs", "/dev/shm", "--remount-ro", "/dev"),
        *("--size", tmpfs, "--perms", "1777", "--tmpfs", "/tmp"),
        *("--ro-bind-data", str(launcher_fd), LAUNCHER_INSIDE, "--seccomp", str(seccomp_fd)),
        *("--remount-ro", "/"),  # last: everything but the tmpfs is read-only
        "--",
    ]


def _select(method: str | None, allow_unisolated: bool) -> Isolation | None:
    """The isolation runs will use (``method``, or the best here); None for opted-in unisolated runs."""
    if method is not None and method not in METHODS:
        raise ValueError(
            f"method={method!r} is not a sandbox method; use one of {METHODS}, or None for the best"
        )
    status = isolation_status() if method is None else probe(method)
    if status.available:
        if method is None and not status.isolated:
            _warn_fallback(status.reason)
        return status
    if not allow_unisolated:
        raise SandboxUnavailable(
            f"cannot sandbox untrusted code here ({status.reason}); install bubblewrap >= 0.8 "
            "(apt-get install bubblewrap), or run as root on Linux with util-linux `unshare`, or pass "
            "allow_unisolated=True to run it with rlimits only"
        )
    _warn_unisolated(status.reason)
    return None


@functools.cache
def _warn_unisolated(reason: str) -> None:
    """Once per process: every env and every run checks, so a per-call warning repeats each iteration."""
    log.warning("running untrusted code WITHOUT isolation (%s): rlimits only", reason)


@functools.cache
def _warn_fallback(reason: str) -> None:
    """Once per process: the sandbox fell back to ``unshare``, which leaves the host's files readable."""
    log.warning(
        "sandboxing untrusted code with unshare, which leaves host files readable to it (/etc/passwd, a "
        "world-readable checkout): %s. Fix: install bubblewrap >= 0.8 (apt-get install bubblewrap)",
        reason,
    )


def require_isolation(allow_unisolated: bool, method: str | None = None) -> bool:
    """True when runs will be isolated, host files included (bubblewrap); False for the ``unshare`` fallback
    (host files readable) and for opted-in unisolated runs, with a warning; raises when nothing can sandbox
    and the caller did not opt in."""
    selected = _select(method, allow_unisolated)
    return selected is not None and selected.isolated


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
    method: str | None = None,
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
    return run_python_batch(
        code, [stdin], limits, python=python, allow_unisolated=allow_unisolated, method=method
    )[0]


def run_python_batch(
    code: str,
    stdins: Sequence[str],
    limits: SandboxLimits = SandboxLimits(),  # frozen, so sharing the default is safe
    *,
    python: str | None = None,
    allow_unisolated: bool = False,
    method: str | None = None,
) -> list[Result]:
    """Run ``code`` once per input, each in its own fresh process with a fresh ``/tmp``.

    ``method`` picks the isolation ("bwrap" or "unshare"); None takes the best available here.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if isinstance(stdins, str) or not all(isinstance(s, str) for s in stdins):
        raise TypeError("stdins must be a sequence of str (one program input per run)")
    if not stdins:
        return []
    isolation = _select(method, allow_unisolated)
    chosen = isolation.method if isolation is not None else None
    interpreter = python or (isolation.python if isolation is not None else None) or sys.executable
    return _run_batch(code, list(stdins), limits, interpreter, chosen)


def _decode(path: Path, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def _run_batch(
    code: str, stdins: list[str], limits: SandboxLimits, python: str, method: str | None
) -> list[Result]:
    if method == "bwrap":
        python = os.path.realpath(python)  # run outside any venv, from the path bound in the sandbox
    io_dir = Path(tempfile.mkdtemp(prefix="ragen2-sandbox-"))
    try:
        (io_dir / "solution.py").write_text(code, encoding="utf-8", errors="surrogatepass")
        if method == "bwrap":
            (io_dir / "seccomp.bpf").write_bytes(seccomp.program())
        for i, text in enumerate(stdins):
            (io_dir / f"stdin_{i}").write_text(text, encoding="utf-8", errors="surrogatepass")
        statuses = []
        for first in range(0, len(stdins), CASES_PER_LAUNCH):
            cases = range(first, min(first + CASES_PER_LAUNCH, len(stdins)))
            statuses += _launch_cases(io_dir, cases, limits, python, method)
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
                    isolated=method == "bwrap",  # unshare leaves host files readable
                )
            )
        return results
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)


def _launch_cases(
    io_dir: Path, cases: range, limits: SandboxLimits, python: str, method: str | None
) -> list[dict]:
    """One launcher process (in one sandbox) for ``cases``; their files are handed over as descriptors."""
    with contextlib.ExitStack() as opened:

        def descriptor(name: str, flags: int) -> int:
            fd = os.open(io_dir / name, flags, 0o600)
            opened.callback(os.close, fd)
            return fd

        write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        case_fds = [
            [
                descriptor(f"stdin_{i}", os.O_RDONLY),
                descriptor(f"stdout_{i}", write),
                descriptor(f"stderr_{i}", write),
            ]
            for i in cases
        ]
        status_fd = descriptor("status.json", write)
        config = {
            "method": method,
            "python": python,
            "code_fd": descriptor("solution.py", os.O_RDONLY),
            "status_fd": status_fd,
            "cases": case_fds,
            "io_dir": str(io_dir),
            "uid_base": UID_LOW + secrets.randbelow(UID_HIGH - UID_LOW - len(cases)),
            "timeout_s": limits.timeout_s,
            "cpu_s": limits.cpu_limit_s,
            "memory_mb": limits.memory_mb,
            "max_procs": limits.max_procs,
            "max_open_files": limits.max_open_files,
            "max_file_mb": limits.max_file_mb,
            "tmpfs_mb": limits.tmpfs_mb,
        }
        pass_fds = [config["code_fd"], status_fd, *(fd for fds in case_fds for fd in fds)]
        # the launcher is stdlib-only: the (fast-starting) solution interpreter runs it too
        launcher = [python, "-I", "-S", str(LAUNCHER)]
        user = None
        if method == "bwrap":
            seccomp_fd = descriptor("seccomp.bpf", os.O_RDONLY)
            launcher_fd = os.open(LAUNCHER, os.O_RDONLY)
            opened.callback(os.close, launcher_fd)
            pass_fds += [seccomp_fd, launcher_fd]
            bwrap = _bwrap_command(python, limits, config["uid_base"], seccomp_fd, launcher_fd)
            launcher = [*bwrap, python, "-I", "-S", LAUNCHER_INSIDE]
            # as root, bubblewrap runs as the batch's own unprivileged uid
            user = config["uid_base"] if os.geteuid() == 0 else None
        elif method == "unshare":
            launcher = [shutil.which("unshare") or "unshare", *UNSHARE_ARGS, *launcher]
        _launch(
            [*launcher, json.dumps(config)],
            pass_fds,
            user,
            backstop_s=len(cases) * (limits.timeout_s + 1.0) + 10.0,
        )
        return json.loads((io_dir / "status.json").read_text())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the launcher's whole group and reap it. The launcher is namespace init, killed with this group
    (under bubblewrap, by --die-with-parent): the kernel then kills everything inside."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def _launch(cmd: list[str], pass_fds: list[int], user: int | None, backstop_s: float) -> None:
    """Run the launcher with a minimal environment; kill its whole group if it overruns."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    proc = subprocess.Popen(
        cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=pass_fds, start_new_session=True, user=user, group=user,
        extra_groups=None if user is None else [],
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=backstop_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise RuntimeError(
            f"sandbox launcher overran its {backstop_s:.0f} s backstop and was killed"
        ) from None
    except BaseException:
        # interrupted from outside (Ctrl-C, the runner's env.step_timeout_s): the program must not run on
        _kill_group(proc)
        raise
    if proc.returncode != 0:
        raise RuntimeError(
            f"sandbox launcher failed (exit {proc.returncode}): {err.decode(errors='replace')}"
        )
