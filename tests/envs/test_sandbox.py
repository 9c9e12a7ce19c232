"""The sandbox contains hostile programs: each test runs one for real, with short limits."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from ragen2_envs.deepcoder.sandbox import (
    UID_LOW,
    SandboxLimits,
    isolation_status,
    run_python,
    run_python_batch,
)

SANDBOX_PY = Path(__file__).parents[2] / "envs" / "ragen2_envs" / "deepcoder" / "sandbox.py"
REPO = Path(__file__).parents[2]

isolated = pytest.mark.skipif(not isolation_status().available, reason=isolation_status().reason)


def _sandbox_uid_processes() -> list[int]:
    """Host pids owned by sandbox uids (there must be none once a run returns)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid >= UID_LOW:
                    pids.append(int(entry))
            except FileNotFoundError:
                continue
    return pids


@isolated
def test_roundtrip_runs_as_unprivileged_uid_with_scrubbed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEN2_SECRET", "hunter2")
    code = (
        "import os, sys\n"
        "print(sys.stdin.read().upper(), end='')\n"
        "print(os.getuid() >= 1_000_000, sorted(os.environ), os.environ.get('RAGEN2_SECRET'))\n"
    )
    r = run_python(code, "abc\n", timeout_s=2.0)
    assert r.ok and r.isolated and not r.timed_out
    assert r.stdout == "ABC\nTrue ['HOME', 'LANG', 'PATH'] None\n"


@isolated
def test_batch_gives_each_input_its_own_process() -> None:
    # each case doubles its input; the file written by case 0 must be gone for case 1 (fresh tmpfs)
    code = "import os\nprint(int(input()) * 2, os.path.exists('/tmp/mark'))\nopen('/tmp/mark', 'w').close()"
    results = run_python_batch(code, ["1\n", "21\n"], SandboxLimits(timeout_s=2.0))
    assert [r.stdout for r in results] == ["2 False\n", "42 False\n"]


@isolated
def test_cpu_time_limit_counts_as_a_timeout() -> None:
    # 1 s of CPU, 20 s of wall clock: RLIMIT_CPU ends the busy loop with SIGXCPU, and that is a timeout
    r = run_python("while True:\n    pass", timeout_s=20.0, cpu_s=1)
    assert r.signal == signal.SIGXCPU and r.timed_out and not r.ok
    assert r.wall_s < 15.0


def test_infinite_loop_is_killed_at_the_wall_clock_timeout() -> None:
    start = time.monotonic()
    r = run_python("while True:\n    pass", timeout_s=1.0)
    assert r.timed_out and not r.ok
    assert time.monotonic() - start < 5.0


@isolated
def test_fork_bomb_is_capped_by_the_process_limit() -> None:
    # max_procs counts every process of the sandbox uid, the parent included: 8 - 1 = 7 forks succeed
    code = (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)"
    )
    r = run_python(code, timeout_s=2.0, max_procs=8)
    assert r.stdout == "7\n"
    assert _sandbox_uid_processes() == []  # the sleeping children died with the run


@isolated
def test_endless_fork_bomb_times_out_and_leaves_nothing_behind() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    r = run_python(code, timeout_s=1.0, max_procs=16)
    assert r.timed_out
    assert _sandbox_uid_processes() == []


@isolated
def test_detached_daemon_is_killed_when_the_program_exits() -> None:
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('done')"
    start = time.monotonic()
    r = run_python(code, timeout_s=2.0)
    assert r.ok and r.stdout == "done\n"
    assert time.monotonic() - start < 3.0
    assert _sandbox_uid_processes() == []


@isolated
def test_huge_allocation_fails_inside_the_address_space_limit() -> None:
    r = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", timeout_s=2.0, memory_mb=256)
    assert r.returncode == 1 and "MemoryError" in r.stderr and r.stdout == ""


@isolated
def test_output_beyond_the_file_size_limit_stops_the_program() -> None:
    # Python ignores SIGXFSZ, so the write past RLIMIT_FSIZE fails with EFBIG and the program exits 1
    r = run_python("import sys\nsys.stdout.write('x' * (3 << 20))", timeout_s=2.0, max_file_mb=1)
    assert r.returncode == 1 and "File too large" in r.stderr
    assert len(r.stdout) <= 1 << 20


@isolated
def test_writes_outside_the_working_folder_do_not_reach_the_host() -> None:
    tag = uuid.uuid4().hex
    targets = [Path(f"/tmp/pwned-{tag}"), Path(f"/var/tmp/pwned-{tag}"), REPO / f"pwned-{tag}"]
    code = "import sys\nfor p in sys.argv[1:] or %r:\n" % [str(t) for t in targets]
    code += "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n    except OSError as e:\n        print(type(e).__name__)\n"
    code += "open('inside.txt', 'w').write('ok')\nprint(open('inside.txt').read())"
    r = run_python(code, timeout_s=2.0)
    assert r.ok
    # /tmp and /var/tmp are private tmpfs (writable, thrown away); the repo is not writable at all, or,
    # for a checkout under /tmp, not even visible behind the private /tmp
    assert r.stdout.splitlines()[-2] in ("PermissionError", "FileNotFoundError")
    assert r.stdout.splitlines()[-1] == "ok"
    assert not any(t.exists() for t in targets)


@isolated
def test_no_network_even_to_a_host_loopback_listener() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = (
            "import socket\ntry:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('connected')\n"
            "except OSError as e:\n    print('blocked', e.errno)"
        )
        r = run_python(code, timeout_s=2.0)
    assert r.stdout.startswith("blocked")


@isolated
def test_cannot_kill_the_parent_or_its_group() -> None:
    code = (
        "import os, signal\nwhat = input()\n"
        "if what == 'parent':\n    os.kill(os.getppid(), signal.SIGKILL)\n"
        "elif what == 'group':\n    os.killpg(os.getpgid(0), signal.SIGKILL)\n"
        "else:\n    os.kill(-1, signal.SIGKILL)\nprint('alive')"
    )
    parent, group, everyone = run_python_batch(code, ["parent\n", "group\n", "all\n"], SandboxLimits(2.0))
    # the parent is the namespace's root-owned init: EPERM
    assert parent.returncode == 1 and "PermissionError" in parent.stderr
    # its process group holds only itself: it kills itself, nothing else
    assert group.signal == 9
    # kill(-1) reaches only processes of its own uid; there are none but itself: ESRCH
    assert everyone.returncode == 1 and "ProcessLookupError" in everyone.stderr
    # had any signal escaped, this process (and the launcher running the later cases) would be dead


@isolated
def test_cannot_read_root_only_files() -> None:
    code = (
        "for p in ('/etc/shadow', '/root/.bashrc', '/proc/1/environ'):\n    try:\n"
        "        open(p, 'rb').read()\n        print('read', p)\n    except OSError as e:\n"
        "        print(type(e).__name__)\n"
    )
    r = run_python(code, timeout_s=2.0)
    assert r.stdout.split() == ["PermissionError"] * 3


def test_limits_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        SandboxLimits(memory_mb=16)
    with pytest.raises(ValueError, match="max_procs"):
        SandboxLimits(max_procs=0)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_unprivileged_caller_is_refused_unless_it_opts_in() -> None:
    # The sandbox module is stdlib-only: load it by path under a system Python run as `nobody`, from a
    # world-readable copy (the checkout itself may sit in a root-only folder, as a mktemp clone does).
    python = next((p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK)), None)
    folder = Path(tempfile.mkdtemp())
    folder.chmod(0o755)
    for source in SANDBOX_PY.parent.glob("*.py"):
        shutil.copy(source, folder / source.name)
        (folder / source.name).chmod(0o644)
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('sandbox', {str(folder / SANDBOX_PY.name)!r})\n"
        "sb = importlib.util.module_from_spec(spec)\nsys.modules['sandbox'] = sb\nspec.loader.exec_module(sb)\n"
        "try:\n    sb.run_python('print(1)')\nexcept sb.SandboxUnavailable as e:\n    print('refused:', e)\n"
        "r = sb.run_python('print(6 * 7)', allow_unisolated=True)\nprint(r.stdout.strip(), r.isolated)\n"
    )
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-I", "-c", probe]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd="/")
    finally:
        shutil.rmtree(folder)
    assert "refused: cannot sandbox untrusted code here (not running as root" in out.stdout, out.stderr
    assert out.stdout.strip().endswith("42 False")
    assert "WITHOUT isolation" in out.stderr
