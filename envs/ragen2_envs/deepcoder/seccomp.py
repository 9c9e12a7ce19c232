"""The seccomp filter bubblewrap installs on every sandboxed program (x86_64 only).

A deny-list in classic BPF, assembled here with ``struct`` (no libseccomp): bubblewrap reads the
raw ``struct sock_filter`` array from a file descriptor (``--seccomp FD``) and loads it after its
own set-up, with ``PR_SET_NO_NEW_PRIVS``, so the filter binds the program and all its children.

Policy (what a competitive-programming solution never needs, and the kernel's usual attack surface):

* another ABI: a call made with a foreign audit arch (32-bit ``int 0x80``) kills the process; x32
  numbers (bit 30 set) fail with ENOSYS, so no syscall slips past under another number;
* namespaces: ``unshare``, ``setns`` and a ``clone`` with any ``CLONE_NEW*`` flag fail with EPERM;
  ``clone3`` fails with ENOSYS (its flags sit in memory a filter cannot read), which makes glibc
  fall back to ``clone`` for threads and processes, where the flags are checked;
* other processes' memory: ``ptrace``, ``process_vm_readv``/``writev``, ``kcmp`` (EPERM);
* mounts and file handles: ``mount``, ``umount2``, ``pivot_root``, ``chroot``, the new mount API
  (``open_tree`` … ``mount_setattr``), ``name_to_handle_at``, ``open_by_handle_at`` (EPERM);
* kernel interfaces with a record of exploits or root-only uses: ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``io_uring_*``, the key syscalls, ``kexec_*``, module loading, ``reboot``,
  swap, ``acct``, quotas, ``syslog``, ``fanotify_init``, ``lookup_dcookie``, ``personality``,
  ``uselib``, ``vhangup``, ``iopl``/``ioperm``, setting the clock or the host name, and the
  obsolete ``_sysctl``, ``create_module``, ``get_kernel_syms``, ``query_module``, ``nfsservctl``
  (EPERM);
* sockets of any family but ``AF_UNIX`` (EAFNOSUPPORT): no TCP/IP stack, netlink, packet or
  crypto sockets, even inside the empty network namespace;
* the terminal-injection ioctls ``TIOCSTI`` and ``TIOCLINUX`` (EPERM).

Everything else is allowed. Arguments are compared on their low 32 bits: the kernel itself reads
``clone``'s flags, ``socket``'s family and ``ioctl``'s request as 32-bit values.
"""

from __future__ import annotations

import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E  # EM_X86_64 (62) | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes (linux/bpf_common.h) and seccomp return actions (linux/seccomp.h)
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = 32-bit word at offset k of struct seccomp_data
JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
RET = 0x06  # BPF_RET | BPF_K
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian)
OFFSET_NR, OFFSET_ARCH = 0, 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


AF_UNIX = 1
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (NEWTIME exists for unshare/clone3 only)
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# x86_64 numbers, from asm/unistd_64.h
SYS_IOCTL, SYS_SOCKET, SYS_SOCKETPAIR, SYS_CLONE, SYS_CLONE3 = 16, 41, 53, 56, 435
DENIED: dict[str, int] = {
    "ptrace": 101,
    "syslog": 103,
    "uselib": 134,
    "personality": 135,
    "vhangup": 153,
    "pivot_root": 155,
    "_sysctl": 156,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "create_module": 174,
    "init_module": 175,
    "delete_module": 176,
    "get_kernel_syms": 177,
    "query_module": 178,
    "quotactl": 179,
    "nfsservctl": 180,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "quotactl_fd": 443,
}

# an instruction: (code, jump-if-true label, jump-if-false label, k); a label names a later instruction
Instruction = tuple[int, str | None, str | None, int]


def unsupported_reason() -> str | None:
    """Why the filter cannot guard this machine (its syscall numbers are x86_64's), or None."""
    machine = platform.machine()
    if machine != "x86_64":
        return f"the seccomp filter is written for x86_64 syscall numbers; this machine is {machine!r}"
    return None


def _policy() -> tuple[list[Instruction], dict[str, int]]:
    """The program with symbolic jumps, and where each label sits."""
    code: list[Instruction] = [
        (LD_W_ABS, None, None, OFFSET_ARCH),
        (JEQ, "native", None, AUDIT_ARCH_X86_64),
        (RET, None, None, RET_KILL_PROCESS),
    ]
    labels = {"native": len(code)}
    code += [
        (LD_W_ABS, None, None, OFFSET_NR),
        (JGE, "enosys", None, X32_SYSCALL_BIT),
        (JEQ, "clone", None, SYS_CLONE),
        (JEQ, "enosys", None, SYS_CLONE3),
        (JEQ, "socket", None, SYS_SOCKET),
        (JEQ, "socket", None, SYS_SOCKETPAIR),
        (JEQ, "ioctl", None, SYS_IOCTL),
    ]
    code += [(JEQ, "eperm", None, nr) for nr in DENIED.values()]
    code.append((RET, None, None, RET_ALLOW))
    labels["clone"] = len(code)
    code += [
        (LD_W_ABS, None, None, _arg_low(0)),
        (JSET, "eperm", None, CLONE_NEW_FLAGS),
        (RET, None, None, RET_ALLOW),
    ]
    labels["socket"] = len(code)
    code += [
        (LD_W_ABS, None, None, _arg_low(0)),
        (JEQ, "allow", None, AF_UNIX),
        (RET, None, None, RET_ERRNO | errno.EAFNOSUPPORT),
    ]
    labels["ioctl"] = len(code)
    code += [
        (LD_W_ABS, None, None, _arg_low(1)),
        (JEQ, "eperm", None, TIOCSTI),
        (JEQ, "eperm", None, TIOCLINUX),
    ]
    labels["allow"] = len(code)
    code.append((RET, None, None, RET_ALLOW))
    labels["eperm"] = len(code)
    code.append((RET, None, None, RET_ERRNO | errno.EPERM))
    labels["enosys"] = len(code)
    code.append((RET, None, None, RET_ERRNO | errno.ENOSYS))
    return code, labels


def program() -> bytes:
    """The filter as bubblewrap's ``--seccomp`` reads it: ``struct sock_filter`` (u16, u8, u8, u32) × n."""
    code, labels = _policy()
    out = bytearray()
    for index, (op, true_label, false_label, k) in enumerate(code):
        # jump offsets count the instructions skipped after this one; BPF only jumps forward, ≤ 255
        jt, jf = (0 if label is None else labels[label] - index - 1 for label in (true_label, false_label))
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise ValueError(f"seccomp jump out of range at instruction {index}: jt={jt}, jf={jf}")
        out += struct.pack("<HBBI", op, jt, jf, k)
    return bytes(out)
