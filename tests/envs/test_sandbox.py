"""The sandbox contains hostile programs: each test runs one for real, with short limits.

Tests that take the ``method`` fixture run once per isolation method available here (bubblewrap,
and the ``unshare`` fallback as root); the ``bwrap_only`` ones check what only bubblewrap gives.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from ragen2_envs.deepcoder import sandbox, seccomp
from ragen2_envs.deepcoder.sandbox import (
    METHODS,
    UID_HIGH,
    UID_LOW,
    SandboxLimits,
    interpreter_mounts,
    isolation_status,
    probe,
    run_python,
    run_python_batch,
)

DEEPCODER = Path(__file__).parents[2] / "envs" / "ragen2_envs" / "deepcoder"
REPO = Path(__file__).parents[2]

isolated = pytest.mark.skipif(not isolation_status().available, reason=isolation_status().reason)
bwrap_only = pytest.mark.skipif(
    not probe("bwrap").available, reason=f"the bubblewrap sandbox is unavailable: {probe('bwrap').reason}"
)
x86_64_only = pytest.mark.skipif(
    seccomp.unsupported_reason() is not None, reason=str(seccomp.unsupported_reason())
)


@pytest.fixture(params=METHODS)
def method(request: pytest.FixtureRequest) -> str:
    status = probe(request.param)
    if not status.available:
        pytest.skip(f"the {request.param} sandbox is unavailable: {status.reason}")
    return request.param


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A world-writable folder outside /tmp (which every sandbox replaces), where /run/lock or /var/tmp sit."""
    base = Path("/run") if os.access("/run", os.W_OK) else Path.home()
    folder = Path(tempfile.mkdtemp(prefix="ragen2-sandbox-test-", dir=base))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


@pytest.fixture
def own_uids(monkeypatch: pytest.MonkeyPatch) -> list[range]:
    """The uids of the sandboxes this test starts, as each run draws them (``uid_base`` and one per case):
    sandboxes that other tests run at the same time (pytest-xdist) hold uids of their own."""
    drawn: list[range] = []

    class Recorded:
        @staticmethod
        def randbelow(n: int) -> int:
            offset = secrets.randbelow(n)
            cases = UID_HIGH - UID_LOW - n  # sandbox.py draws below UID_HIGH - UID_LOW - len(cases)
            drawn.append(range(UID_LOW + offset, UID_LOW + offset + cases))
            return offset

    monkeypatch.setattr(sandbox, "secrets", Recorded)
    return drawn


def _sandbox_uid_processes(uids: list[range]) -> list[int]:
    """Host pids owned by these sandbox uids (there must be none once a run returns)."""
    assert uids, "no sandbox drew its uids through sandbox.secrets: the check would look at nothing"
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except FileNotFoundError:
                continue
            if any(uid in drawn for drawn in uids):
                pids.append(int(entry))
    return pids


def test_roundtrip_runs_as_unprivileged_uid_with_scrubbed_env(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEN2_SECRET", "hunter2")
    code = (
        "import os, sys\n"
        "print(sys.stdin.read().upper(), end='')\n"
        "print(os.getuid() >= 1_000_000, sorted(os.environ), os.environ.get('RAGEN2_SECRET'))\n"
    )
    r = run_python(code, "abc\n", timeout_s=2.0, method=method)
    assert r.ok and not r.timed_out
    assert r.isolated == (method == "bwrap")  # unshare leaves host files readable: not isolated from them
    assert r.stdout == "ABC\nTrue ['HOME', 'LANG', 'PATH'] None\n"


def test_batch_gives_each_input_its_own_process_and_fresh_tmp(method: str) -> None:
    # each case doubles its input; what case 0 leaves in /tmp and /dev/shm, a folder it locked with
    # chmod 0 included, must be gone for case 1
    code = (
        "import os\nprint(int(input()) * 2, sorted(os.listdir('/tmp')), os.listdir('/dev/shm'))\n"
        "open('/tmp/mark', 'w').close()\nopen('/dev/shm/mark', 'w').close()\n"
        "os.makedirs('/tmp/locked/deep')\nopen('/tmp/locked/deep/file', 'w').close()\nos.chmod('/tmp/locked', 0)"
    )
    results = run_python_batch(code, ["1\n", "21\n"], SandboxLimits(timeout_s=2.0), method=method)
    assert [r.stdout for r in results] == ["2 ['work'] []\n", "42 ['work'] []\n"]


@isolated
def test_a_long_batch_is_split_across_launchers_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # five inputs, two cases per launcher: three launchers, results still in input order
    monkeypatch.setattr(sandbox, "CASES_PER_LAUNCH", 2)
    results = run_python_batch("print(int(input()) ** 2)", [f"{i}\n" for i in range(5)], SandboxLimits(2.0))
    assert [r.stdout for r in results] == ["0\n", "1\n", "4\n", "9\n", "16\n"]


def test_a_process_left_by_one_case_is_gone_before_the_next(method: str) -> None:
    # case 0 leaves a detached child that keeps writing to /dev/shm; case 1 waits and looks
    code = (
        "import os, time\nif input() == 'leave':\n    if os.fork() == 0:\n        os.setsid()\n"
        "        while True:\n            open(f'/dev/shm/{time.monotonic()}', 'w').close()\n"
        "            time.sleep(0.02)\n    time.sleep(0.1)\nelse:\n    time.sleep(0.3)\n"
        "    print(os.listdir('/dev/shm'))"
    )
    first, second = run_python_batch(code, ["leave\n", "look\n"], SandboxLimits(timeout_s=2.0), method=method)
    assert first.ok and second.stdout == "[]\n"


def test_cpu_time_limit_counts_as_a_timeout(method: str) -> None:
    # 1 s of CPU, 20 s of wall clock: RLIMIT_CPU ends the busy loop with SIGXCPU, and that is a timeout
    r = run_python("while True:\n    pass", timeout_s=20.0, cpu_s=1, method=method)
    assert r.signal == signal.SIGXCPU and r.timed_out and not r.ok
    assert r.wall_s < 15.0


def test_infinite_loop_is_killed_at_the_wall_clock_timeout() -> None:
    start = time.monotonic()
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.timed_out and not r.ok
    assert time.monotonic() - start < 5.0


def test_fork_bomb_is_capped_by_the_process_limit(method: str, own_uids: list[range]) -> None:
    # max_procs counts every process of the sandbox uid, the parent included: 8 - 1 = 7 forks succeed
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)"
    )
    r = run_python(code, timeout_s=2.0, max_procs=8, method=method)
    assert r.stdout == "7\n"
    assert _sandbox_uid_processes(own_uids) == []  # the sleeping children died with the run


def test_endless_fork_bomb_times_out_and_leaves_nothing_behind(method: str, own_uids: list[range]) -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = run_python(code, timeout_s=1.0, max_procs=16, method=method)
    assert r.timed_out
    assert _sandbox_uid_processes(own_uids) == []


def test_detached_daemon_is_killed_when_the_program_exits(method: str, own_uids: list[range]) -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('done')"
    start = time.monotonic()
    r = run_python(code, timeout_s=2.0, method=method)
    assert r.ok and r.stdout == "done\n"
    assert time.monotonic() - start < 3.0
    assert _sandbox_uid_processes(own_uids) == []


class _Interrupted(BaseException):
    pass


def test_an_interrupted_run_leaves_nothing_running(method: str, own_uids: list[range]) -> None:
    # a caller's deadline (the runner's env.step_timeout_s raises from a SIGALRM handler) or Ctrl-C cuts the
    # run short: the program must die with it, not run out its own timeout_s
    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(_Interrupted):
            run_python("import time\ntime.sleep(30)", timeout_s=30.0, method=method)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    deadline = time.monotonic() + 5.0  # the kernel tears a killed namespace down asynchronously
    while _sandbox_uid_processes(own_uids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_uid_processes(own_uids) == []


def test_huge_allocation_fails_inside_the_address_space_limit(method: str) -> None:
    r = run_python(
        "x = bytearray(2 * 1024**3)\nprint('allocated')", timeout_s=2.0, memory_mb=256, method=method
    )
    assert r.returncode == 1 and "MemoryError" in r.stderr and r.stdout == ""


def test_output_beyond_the_file_size_limit_stops_the_program(method: str) -> None:
    # Python ignores SIGXFSZ, so the write past RLIMIT_FSIZE fails with EFBIG and the program exits 1
    code = "import sys\nsys.stdout.write('x' * (3 << 20))"
    r = run_python(code, timeout_s=2.0, max_file_mb=1, method=method)
    assert r.returncode == 1 and "File too large" in r.stderr
    assert len(r.stdout) <= 1 << 20


def test_writes_outside_the_working_folder_do_not_reach_the_host(method: str) -> None:
    tag = uuid.uuid4().hex
    targets = [Path(f"/tmp/pwned-{tag}"), Path(f"/var/tmp/pwned-{tag}"), REPO / f"pwned-{tag}"]
    code = "import sys\nfor p in sys.argv[1:] or %r:\n" % [str(t) for t in targets]
    code += "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n    except OSError as e:\n        print(type(e).__name__)\n"
    code += "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())"
    r = run_python(code, timeout_s=2.0, method=method)
    assert r.ok
    # /tmp and /var/tmp are private tmpfs (writable, thrown away); the repo is not writable at all, or,
    # for a checkout under /tmp, not even visible behind the private /tmp
    assert r.stdout.splitlines()[-2] in ("PermissionError", "FileNotFoundError")
    assert r.stdout.splitlines()[-1] == "ok"
    assert not any(t.exists() for t in targets)


def test_no_network_even_to_a_host_loopback_listener(method: str) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
            "except OSError as e:\n    print('blocked', e.errno)"
        )
        r = run_python(code, timeout_s=2.0, method=method)
    assert r.stdout.startswith("blocked")


def test_cannot_kill_the_parent_or_its_group(method: str) -> None:
    code = (
        "import os, signal\nwhat = input()\n"
        "if what == 'parent':\n    os.kill(os.getppid(), signal.SIGKILL)\n"
        "elif what == 'interrupt':\n    os.kill(os.getppid(), signal.SIGINT)\n"
        "elif what == 'group':\n    os.killpg(os.getpgid(0), signal.SIGKILL)\n"
        "else:\n    os.kill(-1, signal.SIGKILL)\nprint('alive')"
    )
    stdins = ["parent\n", "interrupt\n", "group\n", "all\n"]
    parent, interrupt, group, everyone = run_python_batch(code, stdins, SandboxLimits(2.0), method=method)
    if method == "unshare":
        # the parent is the namespace's root-owned init: EPERM
        assert parent.returncode == 1 and "PermissionError" in parent.stderr
        assert interrupt.returncode == 1 and "PermissionError" in interrupt.stderr
    else:
        # the parent is the sandbox's init, of the same uid: the kernel drops signals it has no handler
        # for, and it keeps none (not even Python's SIGINT handler)
        assert parent.ok and parent.stdout == "alive\n"
        assert interrupt.ok and interrupt.stdout == "alive\n"
    # its process group holds only itself: it kills itself, nothing else
    assert group.signal == 9
    # kill(-1) reaches only processes of its own uid but init; there are none but itself: ESRCH
    assert everyone.returncode == 1 and "ProcessLookupError" in everyone.stderr
    # had any signal escaped, this process (and the launcher running the later cases) would be dead


def test_cannot_read_root_only_files(method: str) -> None:
    code = (
        "for p in ('/etc/shadow', '/root/.bashrc', '/proc/1/environ'):\n    try:\n"
        "        open(p, 'rb').read()\n        print('read', p)\n    except OSError as e:\n"
        "        print(type(e).__name__)\n"
    )
    r = run_python(code, timeout_s=2.0, method=method)
    if method == "unshare":
        assert r.stdout.split() == ["PermissionError"] * 3
    else:
        # no /etc/shadow or /root inside; the sandbox's init (the launcher) is not dumpable
        assert r.stdout.split() == ["FileNotFoundError", "FileNotFoundError", "PermissionError"]


@bwrap_only
def test_host_files_are_out_of_sight(host_dir: Path) -> None:
    secret = host_dir / "secret.txt"
    secret.write_text("s3cret")
    secret.chmod(0o644)  # readable by anyone who can reach it
    targets = ["/etc/hostname", "/etc/passwd", str(REPO / "pyproject.toml"), str(secret)]
    code = (
        f"for p in {targets!r}:\n    try:\n        print('read', p, open(p).read()[:8])\n"
        "    except OSError as e:\n        print(type(e).__name__)\n"
    )
    r = run_python(code, timeout_s=2.0, method="bwrap")
    assert r.stdout.split() == ["FileNotFoundError"] * 4


@bwrap_only
def test_the_root_holds_only_the_interpreter_and_the_sandbox() -> None:
    # the interpreter's files sit at their host paths: their top folders, plus the sandbox's own
    mounts = interpreter_mounts(os.path.realpath(str(probe("bwrap").python)))
    tops = {Path(mounts[i + 2]).parts[1] for i in range(0, len(mounts), 3)}
    r = run_python("import os\nprint(sorted(os.listdir('/')))", timeout_s=2.0, method="bwrap")
    assert r.stdout == f"{sorted(tops | {'dev', 'proc', 'sandbox', 'tmp'})}\n"


@bwrap_only
def test_nothing_is_writable_but_the_private_tmpfs() -> None:
    # try to create a file in every folder of the sandbox outside /proc, /tmp and /dev/shm
    code = (
        "import os\ntried, written = 0, []\nfor root, dirs, _ in os.walk('/'):\n"
        "    if root.startswith(('/proc', '/tmp', '/dev/shm')):\n        dirs[:] = []\n        continue\n"
        "    tried += 1\n    try:\n        open(os.path.join(root, 'probe'), 'w').close()\n"
        "        written.append(root)\n    except OSError:\n        pass\n"
        "open('/tmp/probe', 'w').close()\nopen('/dev/shm/probe', 'w').close()\nprint(tried > 20, written)"
    )
    r = run_python(code, timeout_s=10.0, method="bwrap")
    assert r.ok and r.stdout == "True []\n", r.stderr


@bwrap_only
def test_world_writable_host_folder_is_out_of_reach(host_dir: Path) -> None:
    target = host_dir / "pwned"
    r = run_python(f"open({str(target)!r}, 'w').write('x')", timeout_s=2.0, method="bwrap")
    assert r.returncode == 1 and "FileNotFoundError" in r.stderr
    assert not target.exists()


@bwrap_only
def test_nested_user_namespace_is_refused() -> None:
    # unshare(CLONE_NEWUSER), then CLONE_NEWUSER | CLONE_NEWNS: user namespaces are how an unprivileged
    # process gains the capabilities that much of the kernel's attack surface needs
    code = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "for flags in (0x10000000, 0x10020000):\n"
        "    print(libc.unshare(flags), os.strerror(ctypes.get_errno()))\n"
    )
    r = run_python(code, timeout_s=2.0, method="bwrap")
    assert r.stdout == "-1 Operation not permitted\n" * 2


@bwrap_only
def test_host_unix_socket_is_out_of_reach(host_dir: Path) -> None:
    path = host_dir / "agent.sock"
    abstract = f"\0ragen2-sandbox-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as by_path, socket.socket(socket.AF_UNIX) as by_name:
        by_path.bind(str(path))
        path.chmod(0o777)  # connectable by any uid that reaches it, as /run/docker.sock-like sockets are
        by_name.bind(abstract)
        for server in (by_path, by_name):
            server.listen()
            server.setblocking(False)
        code = (
            f"import socket\nfor target in {[str(path), abstract]!r}:\n"
            "    try:\n        socket.socket(socket.AF_UNIX).connect(target)\n        print('connected')\n"
            "    except OSError as e:\n        print(type(e).__name__)\n"
        )
        r = run_python(code, timeout_s=2.0, method="bwrap")
        for server in (by_path, by_name):
            with pytest.raises(BlockingIOError):
                server.accept()
    # the path does not exist inside; abstract names live in the network namespace, which is the sandbox's
    assert r.stdout.split() == ["FileNotFoundError", "ConnectionRefusedError"]


@bwrap_only
def test_seccomp_refuses_its_syscalls_and_lets_threads_and_processes_run() -> None:
    code = (
        "import ctypes, errno, os, socket, subprocess, sys, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(nr, *args):\n    rc = libc.syscall(nr, *args)\n"
        "    return errno.errorcode[ctypes.get_errno()] if rc == -1 else 'allowed'\n"
        "print(call(101, 0, 0, 0, 0))\n"  # ptrace(PTRACE_TRACEME)
        "print(call(250, 0, -3, 0))\n"  # keyctl(KEYCTL_GET_KEYRING_ID, session keyring)
        "for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_NETLINK, socket.SOCK_RAW)):\n"
        "    try:\n        socket.socket(family, kind)\n        print('allowed')\n"
        "    except OSError as e:\n        print(errno.errorcode[e.errno])\n"
        "t = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()\n"
        "print(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout.strip())\n"
        "socket.socketpair()\n"
        "status = dict(line.split(':\\t') for line in open('/proc/self/status').read().splitlines())\n"
        "print(status['Seccomp'], status['NoNewPrivs'], status['CapEff'])\n"
    )
    r = run_python(code, timeout_s=5.0, method="bwrap")
    assert r.ok, r.stderr
    assert r.stdout.split("\n") == [
        "EPERM",
        "EPERM",
        "EAFNOSUPPORT",
        "EAFNOSUPPORT",
        "thread",
        "7",
        "2 1 0000000000000000",
        "",
    ]


@bwrap_only
def test_every_extension_module_imports_as_on_the_host() -> None:
    # the mounts hold exactly the libraries the interpreter's C modules load: every one that imports on
    # the host imports inside
    code = (
        "import importlib, os, sys\n"
        "folders = [p for p in sys.path if os.path.isdir(p) and p.endswith('lib-dynload')]\n"
        "names = sorted({n.split('.')[0] for d in folders for n in os.listdir(d) if n.endswith('.so')})\n"
        "failed = []\nfor name in names:\n    try:\n        importlib.import_module(name)\n"
        "    except Exception:\n        failed.append(name)\nprint(len(names) > 20, failed)\n"
    )
    python = os.path.realpath(str(probe("bwrap").python))
    host = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    inside = run_python(code, timeout_s=20.0, memory_mb=1024, method="bwrap")
    assert host.stdout.startswith("True ")
    assert inside.stdout == host.stdout, inside.stderr


def _emulate(program: bytes, arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """Run a classic-BPF seccomp program on one struct seccomp_data (the kernel's semantics, in short)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    code = [struct.unpack_from("<HBBI", program, 8 * i) for i in range(len(program) // 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == seccomp.RET:
            return k
        if op == seccomp.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
            continue
        taken = {seccomp.JEQ: acc == k, seccomp.JGE: acc >= k, seccomp.JSET: bool(acc & k)}[op]
        pc += 1 + (jt if taken else jf)


def test_seccomp_program_decides_every_rule() -> None:
    program = seccomp.program()
    # 3 (arch check) + 7 (nr load, x32, clone, clone3, socket, socketpair, ioctl) + one test per denied
    # call + 1 (allow) + 3 (clone flags) + 3 (socket family) + 3 (ioctl request) + 3 (allow, EPERM, ENOSYS)
    assert len(program) == 8 * (3 + 7 + len(seccomp.DENIED) + 1 + 3 + 3 + 3 + 3)
    # load arch; if x86_64 skip one; else kill the process
    assert program[:24] == struct.pack(
        "<HBBIHBBIHBBI", 0x20, 0, 0, 4, 0x15, 1, 0, 0xC000003E, 0x06, 0, 0, 0x80000000
    )
    x86 = seccomp.AUDIT_ARCH_X86_64
    eperm, enosys = 0x50000 | errno.EPERM, 0x50000 | errno.ENOSYS
    allow, eafnosupport = 0x7FFF0000, 0x50000 | errno.EAFNOSUPPORT
    assert _emulate(program, 0x40000003, 0) == 0x80000000  # i386 (int 0x80): killed
    assert _emulate(program, x86, 0x40000000) == enosys  # x32 read
    for nr in seccomp.DENIED.values():
        assert _emulate(program, x86, nr) == eperm
    for nr in (0, 1, 2, 57, 59, 61, 231, 434):  # read write open fork execve wait4 exit_group pidfd_open
        assert _emulate(program, x86, nr) == allow
    # clone: a process (SIGCHLD) or a thread (glibc's flags) passes; any CLONE_NEW* flag does not
    assert _emulate(program, x86, 56, (17,)) == allow
    assert _emulate(program, x86, 56, (0x3D0F00,)) == allow
    assert _emulate(program, x86, 56, (0x10000000 | 17,)) == eperm
    assert _emulate(program, x86, 56, (0x40000000 | 17,)) == eperm
    assert _emulate(program, x86, 435) == enosys  # clone3: glibc falls back to clone
    assert _emulate(program, x86, 41, (1, 1)) == allow  # socket(AF_UNIX, SOCK_STREAM)
    assert _emulate(program, x86, 41, (2, 1)) == eafnosupport  # AF_INET
    assert _emulate(program, x86, 53, (10, 1)) == eafnosupport  # socketpair(AF_INET6)
    assert _emulate(program, x86, 16, (0, 0x5412)) == eperm  # ioctl(TIOCSTI)
    assert _emulate(program, x86, 16, (0, 0x541C)) == eperm  # ioctl(TIOCLINUX)
    assert _emulate(program, x86, 16, (0, 0x5401)) == allow  # ioctl(TCGETS)


@x86_64_only
def test_the_kernel_enforces_the_seccomp_program() -> None:
    # load the filter into a fresh interpreter (no bubblewrap needed) and try what it governs
    code = (
        "import ctypes, errno, os, socket, sys, threading\n"
        "class Prog(ctypes.Structure):\n"
        "    _fields_ = [('len', ctypes.c_ushort), ('filter', ctypes.c_char_p)]\n"
        "libc = ctypes.CDLL(None, use_errno=True)\nbpf = sys.stdin.buffer.read()\n"
        "prog = Prog(len(bpf) // 8, bpf)\n"
        "assert libc.prctl(38, 1, 0, 0, 0) == 0\n"  # PR_SET_NO_NEW_PRIVS
        "assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0\n"  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        "def call(nr, *args):\n    rc = libc.syscall(nr, *args)\n"
        "    return errno.errorcode[ctypes.get_errno()] if rc == -1 else 'allowed'\n"
        "print(call(272, 0x10000000), call(435, 0, 0), call(101, 0, 0, 0, 0), call(16, 0, 0x5412, 0))\n"
        "for family in (socket.AF_INET, socket.AF_UNIX):\n"
        "    try:\n        socket.socket(family).close()\n        print('allowed')\n"
        "    except OSError as e:\n        print(errno.errorcode[e.errno])\n"
        "t = threading.Thread(target=print, args=('thread',))\nt.start()\nt.join()\n"
        "pid = os.fork()\nif pid == 0:\n    os._exit(7)\nprint(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], input=seccomp.program(), capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    # unshare(CLONE_NEWUSER) EPERM, clone3 ENOSYS, ptrace EPERM, TIOCSTI EPERM (not ENOTTY: refused before
    # the kernel looks at the descriptor); AF_INET refused, AF_UNIX allowed; threads and fork still work
    assert out.stdout.decode().split() == [
        "EPERM",
        "ENOSYS",
        "EPERM",
        "EPERM",
        "EAFNOSUPPORT",
        "allowed",
        "thread",
        "7",
    ]


def test_limits_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=16)
    with pytest.raises(ValueError, match="max_procs"):
        SandboxLimits(max_procs=0)


def test_unknown_method_is_refused_with_the_choices() -> None:
    with pytest.raises(
        ValueError, match=r"method='docker' is not a sandbox method; use one of \('bwrap', 'unshare'\)"
    ):
        run_python("print(1)", method="docker")


@pytest.mark.skipif(
    not probe("unshare").available, reason=f"no unshare fallback here: {probe('unshare').reason}"
)
def test_without_bubblewrap_the_unshare_sandbox_takes_over_and_says_host_files_are_readable(
    tmp_path: Path,
) -> None:
    # a PATH with util-linux's unshare (and the `true` it probes with) but no bwrap: the probe falls back,
    # says why, still sandboxes (namespaces, its own uid) but calls no run isolated: host files are readable
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("unshare", "true"):
        (tools / tool).symlink_to(str(shutil.which(tool)))
    code = (
        "from ragen2_envs.deepcoder.sandbox import isolation_status, require_isolation, run_python\n"
        "status = isolation_status()\nprint(status.method)\nprint(status.reason)\n"
        "print(require_isolation(allow_unisolated=False))\n"
        "for _ in range(2):\n"
        "    r = run_python('import os; print(6 * 7, os.getuid() >= 1_000_000, len(open(\"/etc/passwd\").read()) > 0)')\n"
        "    print(r.stdout.strip(), r.isolated)\n"
    )
    env = {**os.environ, "PATH": str(tools)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    method, reason, required, *results = out.stdout.splitlines()
    assert method == "unshare", out.stderr
    assert reason.startswith("partly isolated: namespaces + unprivileged uid, host files readable")
    assert "bubblewrap unusable: bubblewrap is not installed" in reason
    assert required == "False"
    assert results == ["42 True True False"] * 2  # /etc/passwd read by the program: not isolated
    # one warning for the whole process, however many runs
    warnings = [line for line in out.stderr.splitlines() if "leaves host files readable" in line]
    assert len(warnings) == 1 and "Fix: install bubblewrap" in warnings[0], out.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unprivileged_caller_gets_bubblewrap_else_is_refused_unless_it_opts_in() -> None:
    # The sandbox modules are stdlib-only: import them under a system Python run as `nobody`, from a
    # world-readable copy of the package (the checkout may sit in a root-only folder, as a mktemp clone
    # does; the real package's __init__ needs gymnasium).
    python = next((p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK)), None)
    folder = Path(tempfile.mkdtemp())
    package = folder / "ragen2_envs" / "deepcoder"
    package.mkdir(parents=True)
    for path in (folder, folder / "ragen2_envs", package):
        path.chmod(0o755)
        (path / "__init__.py").write_text("")
    for name in ("sandbox.py", "seccomp.py", "_launcher.py"):
        shutil.copy(DEEPCODER / name, package / name)
    for path in folder.rglob("*.py"):
        path.chmod(0o644)
    probe_code = (
        f"import sys\nsys.path.insert(0, {str(folder)!r})\nfrom ragen2_envs.deepcoder import sandbox as sb\n"
        "try:\n    r = sb.run_python('import os; print(6 * 7)')\n    print(r.stdout.strip(), r.isolated, sb.isolation_status().method)\n"
        "    fork_bomb = 'import os, time\\nn = 0\\ntry:\\n    while True:\\n        if os.fork() == 0:\\n'\n"
        "    fork_bomb += '            time.sleep(30)\\n            os._exit(0)\\n        n += 1\\nexcept OSError:\\n    print(n)'\n"
        "    print(sb.run_python(fork_bomb, max_procs=8).stdout.strip())\n"
        "except sb.SandboxUnavailable as e:\n    print('refused:', e)\n"
        "    r = sb.run_python('print(6 * 7)', allow_unisolated=True)\n    print(r.stdout.strip(), r.isolated)\n"
    )
    cmd = [
        str(shutil.which("setpriv")),
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        str(python),
        "-I",
        "-c",
        probe_code,
    ]
    try:
        with_bwrap = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")
        no_tools = {"PATH": str(folder)}  # neither bwrap nor unshare
        without = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/", env=no_tools)
    finally:
        shutil.rmtree(folder)
    if probe("bwrap").available:
        # bubblewrap needs no root: isolated, and RLIMIT_NPROC counts the sandbox's processes only
        assert with_bwrap.stdout.splitlines() == ["42 True bwrap", "7"], with_bwrap.stderr
    assert (
        "refused: cannot sandbox untrusted code here (bubblewrap: bubblewrap is not installed"
        in without.stdout
    )
    assert "unshare: not running as root" in without.stdout, without.stderr
    assert without.stdout.strip().endswith("42 False")
    assert "WITHOUT isolation" in without.stderr
