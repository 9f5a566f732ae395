"""One run per directory: an advisory lock held for a run's whole life.

``temper train`` takes :class:`DirLock` on its output directory (and on a checkpoint
directory outside it) before it writes anything there. A second run into the same
directory — a scheduler's requeue while the first still runs, a double submit — finds
the lock taken and stops at once, naming the holder (pid, host, since when), instead of
interleaving its checkpoints and metrics with the first one's.

Why ``flock`` on a file inside the directory: the kernel drops the lock when the holding
process dies however it dies (SIGKILL, OOM kill, power loss on a local disk), so a
killed run never leaves a stale lock for a human to delete; the file's content (who
holds it) is only read to word the refusal, never trusted as the lock itself. A child
that ``fork``s without ``exec`` would share the lock, and keep it after a SIGKILLed parent
while it lives: forked children close their copy at once (``os.register_at_fork``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_NAME = ".temper-run.lock"

#: How long ``acquire`` retries a taken lock before it reports it: ``temper check``
#: probes the lock by taking it for an instant, and a run starting in that instant must
#: not mistake the probe for a live run.
GRACE_S = 1.0

_HELD: set[int] = set()  # descriptors of the locks this process holds


def _close_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a directory's lock, as its holder wrote it (empty if not yet written)."""

    pid: int | None = None
    host: str = ""
    since: str = ""

    def __str__(self) -> str:
        if self.pid is None:
            return "another process (it has not written its name yet)"
        return f"pid {self.pid} on {self.host or '?'}, since {self.since or '?'}"


class DirLocked(Exception):
    """The directory's lock is held by a live process (:attr:`holder`)."""

    def __init__(self, directory: Path, holder: Holder) -> None:
        super().__init__(f"{directory} is locked by {holder}")
        self.directory = directory
        self.holder = holder


def read_holder(directory: str | Path) -> Holder:
    """What the lock file of ``directory`` says about its holder (no lock taken)."""
    try:
        data = json.loads((Path(directory) / LOCK_NAME).read_text(encoding="utf-8"))
        return Holder(int(data["pid"]), str(data.get("host", "")), str(data.get("since", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return Holder()


def _try_lock(fd: int, flags: int) -> bool:
    try:
        fcntl.flock(fd, flags | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def probe(directory: str | Path) -> Holder | None:
    """The holder of ``directory``'s lock, or None when no live process holds it.

    Takes a shared lock for an instant (never blocks, creates nothing): ``acquire``
    retries for :data:`GRACE_S`, so a run starting meanwhile is not refused for it.
    """
    path = Path(directory) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # no lock file: no run has ever held the directory (or unreadable)
    try:
        if _try_lock(fd, fcntl.LOCK_SH):
            return None
        return read_holder(directory)
    finally:
        os.close(fd)  # also drops the shared lock


class DirLock:
    """An exclusive advisory lock on ``directory``, held until :meth:`release` (or the
    process's death). The directory must exist."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`DirLocked` naming the live holder."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + GRACE_S
        while not _try_lock(fd, fcntl.LOCK_EX):
            if time.monotonic() >= deadline:
                os.close(fd)
                raise DirLocked(self.directory, read_holder(self.directory))
            time.sleep(0.05)
        _HELD.add(fd)
        self._fd = fd
        since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since}
        data = (json.dumps(record) + "\n").encode()
        os.ftruncate(fd, 0)  # a killed holder's record may be longer
        os.pwrite(fd, data, 0)

    def release(self) -> None:
        """Drop the lock. The file stays (deleting it would race with a new holder)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _HELD.discard(fd)
        os.close(fd)


@dataclasses.dataclass
class RunLock:
    """The locks of one run: its output directory and a checkpoint directory outside it."""

    locks: list[DirLock] = dataclasses.field(default_factory=list)

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_dirs(directories: list[Path]) -> RunLock:
    """Lock each of ``directories`` (created if missing), all or none."""
    held = RunLock()
    try:
        for directory in directories:
            directory.mkdir(parents=True, exist_ok=True)
            lock = DirLock(directory)
            lock.acquire()
            held.locks.append(lock)
    except BaseException:
        held.release()
        raise
    return held
