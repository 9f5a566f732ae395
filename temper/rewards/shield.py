"""Keep a reward worker from signalling the trainer: a seccomp filter, no library needed.

The trainer stops at a step boundary on its first SIGTERM/SIGINT and at once on the
second (``temper.pipelines.signals``), and a signal does not say who sent it. A reward
function runs in a worker process the trainer started, so one that signals its parent
(``os.kill(os.getppid(), SIGTERM)``, ``os.killpg``, ``kill(-1)``) would stop the run —
twice from two samples, which reads as the user's "stop now", and loses the step. So
each worker, before it runs any reward, installs a seccomp filter (inherited by all it
starts, and not removable) under which the calls that send a signal to a pid —
``kill``, ``tkill``, ``tgkill``, ``rt_sigqueueinfo``, ``rt_tgsigqueueinfo``, and
``pidfd_open`` that would lead to ``pidfd_send_signal`` — fail with EPERM when aimed at
the trainer's pid, its process group (``-pgid``) or every process (``-1``); aimed
anywhere else they work as before. The worker leads its own session, so ``kill(0, …)``
and ``killpg(getpgrp(), …)`` reach only the worker's own group. The reward call that
tried sees ``PermissionError`` (a recorded failure if it does not catch it).

The classic-BPF program is built here for x86-64 and aarch64 (little-endian: a pid is
the low 32 bits of the first argument). Elsewhere, or where the kernel refuses a filter,
``install`` says why and the worker runs unshielded. Not covered: another trainer thread
signalled by its thread id, and the i386 syscall entry of x86-64 (unreachable from
Python without hand-written machine code).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Sequence

# classic BPF opcodes (linux/filter.h) and seccomp's (linux/seccomp.h)
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
# offsets in struct seccomp_data: nr, arch, then args[0] (its low 32 bits first)
_NR, _ARCH, _ARG0 = 0, 4, 16
_X32 = 0x40000000  # the x32 ABI's syscall-number bit on x86-64

#: per machine: (AUDIT_ARCH_*, the numbers of the syscalls whose first argument is the
#: pid, process group or thread group a signal goes to).
ARCHES: dict[str, tuple[int, tuple[int, ...]]] = {
    # kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_open (native), then
    # the x32 ABI's numbers of the same calls
    "x86_64": (
        0xC000003E,
        (62, 200, 234, 129, 297, 434, *(_X32 | n for n in (62, 200, 234, 524, 536, 434))),
    ),
    # asm-generic numbers
    "aarch64": (0xC00000B7, (129, 130, 131, 138, 240, 434)),
}


def program(arch: int, numbers: Sequence[int], targets: Sequence[int]) -> bytes:
    """The filter: ``numbers`` fail with EPERM when their first argument (as a 32-bit
    pid) is one of ``targets``; every other call, and any other ``arch``, is allowed."""
    n, t = len(numbers), len(targets)
    allow_nr, check = 3 + n, 4 + n  # indices of the first "allow" and of the argument load
    deny = 6 + n + t
    code: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 0, allow_nr - 2, arch),  # jumps count from the next instruction
        (_LD_W_ABS, 0, 0, _NR),
    ]
    code += [(_JEQ_K, check - (4 + i), 0, nr) for i, nr in enumerate(numbers)]
    code += [(_RET_K, 0, 0, _RET_ALLOW), (_LD_W_ABS, 0, 0, _ARG0)]
    code += [(_JEQ_K, deny - (6 + n + j), 0, p & 0xFFFFFFFF) for j, p in enumerate(targets)]
    code += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_EPERM)]
    assert len(code) == deny + 1 and all(0 <= j < 256 for _, jt, jf, _ in code for j in (jt, jf))
    return b"".join(struct.pack("=HBBI", *ins) for ins in code)


class _Fprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def install(trainer_pid: int, trainer_pgid: int) -> str | None:
    """Shield the trainer from this process and all it starts (see the module doc);
    None once installed, else why not (this process then runs unshielded)."""
    machine = platform.machine()
    if machine not in ARCHES:
        return f"no seccomp program for this machine ({machine})"
    arch, numbers = ARCHES[machine]
    code = program(arch, numbers, (trainer_pid, -trainer_pgid, -1))
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(code, len(code))
    prog = _Fprog(len(code) // 8, ctypes.addressof(buffer))

    def load() -> int:
        ok = libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) == 0
        return 0 if ok else ctypes.get_errno()

    failed = load()
    if failed == errno.EACCES:
        # without CAP_SYS_ADMIN the kernel takes a filter only under no_new_privs (exec
        # then grants no privileges: setuid binaries stop being so), so only then
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}"
        failed = load()
    if failed:
        return f"the kernel refused the seccomp filter: {os.strerror(failed)}"
    return None
