"""Sandbox launcher: runs one program on several inputs, each as its own process with rlimits.

Executed by :mod:`ragen2_envs.deepcoder.sandbox` as ``python -I -S _launcher.py <config json>``,
never imported. Stdlib only, Python >= 3.9 (``os.pidfd_open``). Everything it reads or writes
arrives as inherited descriptors named in the config: the program's code, each case's stdin,
stdout and stderr, and where the statuses go; so sandboxed programs only ever hold their own.
One case after another it prepares a fresh ``/tmp``, forks a child that becomes the program
(rlimits, scrubbed environment, no new privileges), waits with a wall-clock timeout, then kills
every process the case left behind. How depends on the config's method:

* ``bwrap``: it runs inside bubblewrap as the sandbox's PID 1, unprivileged and without
  capabilities, with the same uid as the programs. It cannot be signalled from inside (the kernel
  drops signals to a namespace's init that has no handler, so it drops Python's SIGINT handler)
  and it is not dumpable (no ``/proc/1/fd`` reach into the other cases' descriptors). Between
  cases ``kill(-1)`` ends every other process in the namespace and it empties ``/tmp`` and
  ``/dev/shm`` (bubblewrap's private tmpfs, owned by the sandbox's uid).
* ``unshare``: it is PID 1 of fresh PID, mount and network namespaces and still root; for every
  case it mounts fresh tmpfs over the world-writable folders, the child drops to a dedicated
  uid, and afterwards every process of that uid is killed.
* none (opt-in unisolated runs): only the rlimits and the process-group kill.

When it exits, the kernel kills whatever remains in the namespace.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import sys
import time

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MNT_DETACH = 2
PR_SET_DUMPABLE = 4
PR_SET_NO_NEW_PRIVS = 38
# where an unprivileged user could otherwise leave files behind on the host (unshare)
WRITABLE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# bubblewrap's private tmpfs (bwrap)
BWRAP_TMPFS = ("/tmp", "/dev/shm")
WORKDIR = "/tmp/work"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount_tmpfs(target: str, size_mb: int) -> None:
    opts = f"size={size_mb}m,mode=1777".encode()
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    _check(_libc.mount(b"tmpfs", target.encode(), b"tmpfs", flags, opts), f"mount tmpfs on {target}")


def _umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


def _empty(folder: str) -> None:
    """Delete everything in ``folder``, even what the program locked with chmod (all of it is our uid's)."""
    os.chmod(folder, 0o1777)
    pending, folders = [folder], []
    while pending:
        path = pending.pop()
        folders.append(path)
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                os.chmod(entry.path, 0o700)
                pending.append(entry.path)
            else:
                os.unlink(entry.path)
    # each folder was listed after its parent: reversed, children go first
    for path in reversed(folders[1:]):
        os.rmdir(path)


def _set_limits(cfg: dict, extra_procs: int) -> None:
    mb = 1024 * 1024
    cpu = int(cfg["cpu_s"])
    # hard CPU limit one second above the soft one: SIGXCPU first, SIGKILL if it is ignored
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["max_file_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (cfg["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (cfg["max_procs"] + extra_procs,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _child(cfg: dict, fds: list[int], uid: int | None, workdir: str) -> None:
    """Become the sandboxed program; never returns."""
    try:
        os.setsid()  # its own group, so the unisolated kill reaches its descendants
        # the case's descriptors are all above 2 (0-2 are the launcher's own), so none is overwritten early
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        os.chdir(workdir)
        # under bubblewrap the launcher (PID 1) shares the program's uid and counts towards RLIMIT_NPROC
        _set_limits(cfg, extra_procs=1 if cfg["method"] == "bwrap" else 0)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir}
        os.execve(cfg["python"], [cfg["python"], "-I", "solution.py"], env)
    except BaseException as exc:  # report anything to the case's stderr, then fail
        os.write(2, f"sandbox: cannot start {cfg['python']}: {exc!r}\n".encode())
    os._exit(127)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid``: kill(-1) runs under the tasklist lock, so no fork escapes it."""
    pid = os.fork()
    if pid == 0:
        os.setgid(uid)
        os.setuid(uid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        os._exit(0)
    os.waitpid(pid, 0)


def _reap_all() -> None:
    """As PID 1 every orphan is ours: wait until none is left."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _wait(pid: int, timeout_s: float) -> tuple[int, bool]:
    """Wait for ``pid`` up to ``timeout_s``; SIGKILL it on expiry. Returns (wait status, timed_out)."""
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout_s)
    finally:
        os.close(pidfd)
    timed_out = not ready
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return status, timed_out


def _run_case(cfg: dict, code: bytes, index: int) -> dict:
    method = cfg["method"]
    uid = cfg["uid_base"] + index if method == "unshare" else None
    mounted = [d for d in WRITABLE_DIRS if os.path.isdir(d)] if method == "unshare" else []
    for d in mounted:
        _mount_tmpfs(d, cfg["tmpfs_mb"])
    if method == "bwrap":
        for d in BWRAP_TMPFS:
            _empty(d)
    workdir = os.path.join(cfg["io_dir"], f"work_{index}") if method is None else WORKDIR
    os.mkdir(workdir, 0o700)
    with open(os.path.join(workdir, "solution.py"), "wb") as f:
        f.write(code)
    if uid is not None:
        os.chown(workdir, uid, uid)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(cfg, cfg["cases"][index], uid, workdir)
    status, timed_out = _wait(pid, cfg["timeout_s"])
    wall = time.monotonic() - start
    if method == "unshare":
        _kill_uid(uid)
        _reap_all()
        for d in mounted:
            _umount(d)
    elif method == "bwrap":
        # from PID 1, kill(-1) reaches every other process in the namespace: all the case left behind
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        _reap_all()
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)
    for fd in cfg["cases"][index]:
        os.close(fd)
    return {
        "returncode": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "timed_out": timed_out,
        "wall_s": wall,
    }


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg["method"] == "bwrap":
        # PID 1 of the sandbox, same uid as the programs: with no handler, their signals are dropped;
        # not dumpable, so they cannot open its descriptors through /proc/1/fd
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(DUMPABLE)")
    with os.fdopen(cfg["code_fd"], "rb") as f:
        code = f.read()
    statuses = [_run_case(cfg, code, i) for i in range(len(cfg["cases"]))]
    with os.fdopen(cfg["status_fd"], "w") as f:
        json.dump(statuses, f)


if __name__ == "__main__":
    main()
