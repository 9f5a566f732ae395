"""Checkpoint directories: layout, atomic write, checksums, discovery of the latest valid
one, retention.

Layout (verl's names, so its tooling and habits carry over)::

    <checkpoint_dir>/global_step_<N>/
        manifest.json          written last: the completion marker (format, step, every
                               file with its size and checksum)
        ...                    the parts the pipeline writes (actor/, trainer_state.pt, …)
    <checkpoint_dir>/latest_checkpointed_iteration.txt   verl's pointer (informational)

Why a manifest with sizes and checksums rather than a bare marker: a directory can be
damaged *after* it was complete (a truncated copy, a full disk on a file system whose
rename is not atomic, a flipped bit on a disk or in a copy). Two levels of checking,
chosen by the caller:

- sizes (:func:`read_manifest`, :func:`find_latest`): a stat per file, so cheap enough for
  ``temper check`` and for every look-up; finds missing and truncated files;
- checksums (``verify=True``): every byte read and hashed (xxh3-128, which costs about as
  much as reading the files), so corruption that keeps a file's size — which would load
  as garbage weights — is found too. Resume verifies the checkpoint it loads.

Manifests of format 1 (before checksums) hold sizes only and are checked by size.

Atomicity: parts go into a hidden sibling temp directory; every file is fsynced and then
hashed (the checksum describes the bytes the disk holds), the manifest is written and
fsynced, and the directory renamed into place. A crash at any moment leaves either a
``.global_step_N.tmp-*`` directory (ignored, cleaned by the next save) or a complete
checkpoint; a write that fails (a full disk) removes its temp directory and raises
:class:`WriteFailed`. Deletion removes the manifest first, so a half-deleted directory
never looks complete either. :func:`write_sealed` is the same for any directory (the
run's final export).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xxhash

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STEP_PREFIX = "global_step_"
LATEST_POINTER = "latest_checkpointed_iteration.txt"
FORMAT_VERSION = 2
#: The checksum of format 2: fast (its cost is that of reading the file) and 128 bits
#: wide, so a damaged file matches its recorded sum by chance with probability 2**-128.
CHECKSUM = "xxh3_128"
_CHUNK = 8 << 20


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint declares about itself."""

    step: int
    files: dict[str, int]  # relative path -> size in bytes
    created: float
    meta: dict[str, Any]
    checksums: dict[str, str] = field(default_factory=dict)  # relative path -> CHECKSUM hex
    format: int = FORMAT_VERSION


class WriteFailed(Exception):
    """A checkpoint (or sealed directory) could not be written: the disk refused a write
    (full, over quota, a file-size limit, an I/O error). Nothing of it was kept.
    ``target``: the directory that was being written; ``reason``: the system's words;
    ``free``: the bytes free on its disk when the write failed (before the partial write
    was removed), None if unknown."""

    def __init__(self, target: Path, reason: str, free: int | None) -> None:
        super().__init__(f"{target} could not be written: {reason}")
        self.target = target
        self.reason = reason
        self.free = free


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step}"


def _step_of(path: Path) -> int | None:
    if not path.name.startswith(STEP_PREFIX):
        return None
    try:
        return int(path.name[len(STEP_PREFIX) :])
    except ValueError:
        return None


def _seal_files(root: Path) -> tuple[dict[str, int], dict[str, str]]:
    """Flush every file under ``root`` to disk, then read it back and hash it: the sizes
    and checksums of the bytes on disk, by relative path. Directories are flushed too."""
    sizes: dict[str, int] = {}
    sums: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            with open(full, "rb") as f:
                os.fsync(f.fileno())
                sizes[rel], sums[rel] = _digest(f)
        _fsync_dir(Path(dirpath))
    return dict(sorted(sizes.items())), dict(sorted(sums.items()))


def _digest(f: Any) -> tuple[int, str]:
    """Bytes read from the open binary file ``f`` and their :data:`CHECKSUM`."""
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    total = 0
    while n := f.readinto(buf):
        h.update(view[:n])
        total += n
    return total, h.hexdigest()


def file_checksum(path: str | Path) -> str:
    """The :data:`CHECKSUM` of one file (what a manifest records for it)."""
    with open(path, "rb") as f:
        return _digest(f)[1]


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on directories
    finally:
        os.close(fd)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _remove_tree(path: Path) -> None:
    """Delete a checkpoint so that no intermediate state looks complete — or damaged: it
    is first renamed to a hidden ``.old-`` sibling (atomic), so a crash mid-delete leaves
    only what the next save cleans, not a ``global_step_N`` without its manifest."""
    if not path.name.startswith("."):
        trash = path.with_name(f".{path.name}.old-{os.getpid()}")
        try:
            path.rename(trash)
            path = trash
        except OSError:
            pass  # delete in place: the manifest still goes first
    (path / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


def _clean_stale_temps(parent: Path, name: str) -> None:
    """Remove the temp and set-aside siblings of ``parent/name`` that earlier (killed)
    writes left (``name`` may be a prefix: ``global_step_`` covers every step)."""
    for p in parent.glob(f".{name}*"):
        if p.is_dir() and (".tmp-" in p.name or ".old-" in p.name):
            shutil.rmtree(p, ignore_errors=True)


# Errors that mean "the disk refused the write" rather than a bug: errno values, and the
# words libraries use when they wrap them (torch's zip writer reports a failed write as an
# iostream error or a position mismatch; safetensors as "I/O error: … (os error N)").
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}
_DISK_WORDS = re.compile(
    r"No space left|Disk quota|File too large|Input/output error|Read-only file system|"
    r"os error \d+|iostream error|file write failed|unexpected pos \d+ vs \d+",
    re.IGNORECASE,
)
_OS_ERROR = re.compile(r"os error (\d+)")
_ENFORCE = re.compile(r"^\[enforce fail at [^\]]*\][ .]*")  # c10's prefix: a source line


def disk_failure(err: BaseException) -> str | None:
    """The system's words when ``err`` (or an exception it was raised from or during) is a
    refused write — a full disk, a quota, a file-size limit, an I/O error —, else None.
    torch's own file writer reports no errno (a position mismatch): its words are given."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [err]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
            return f"{e.strerror or os.strerror(e.errno)} (errno {e.errno})"
        text = _ENFORCE.sub("", " ".join(str(e).split()))
        if not isinstance(e, OSError) and _DISK_WORDS.search(text):
            code = _OS_ERROR.search(text)  # Rust's (safetensors) spelling of an errno
            if code is not None:
                return f"{os.strerror(int(code[1]))} (errno {code[1]})"
            return f"a write failed: {text[:200]}"
        todo += [e.__cause__, e.__context__]
    return None


@contextmanager
def write_sealed(
    target: str | Path, step: int, meta: dict[str, Any] | None = None
) -> Iterator[Path]:
    """Yield a temp directory to fill; on exit it becomes ``target``, atomically, with a
    manifest of every file's size and checksum (an existing ``target`` is replaced).

    If the body or the sealing raises, the temp directory is removed and nothing changes;
    a refused write (:func:`disk_failure`) is raised as :class:`WriteFailed`.
    """
    target = Path(target)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    prefix = STEP_PREFIX if target.name.startswith(STEP_PREFIX) else target.name
    _clean_stale_temps(parent, prefix)
    tmp = parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        yield tmp
        sizes, sums = _seal_files(tmp)
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "created": time.time(),
            "meta": meta or {},
            "files": sizes,
            "checksum": CHECKSUM,
            "checksums": sums,
        }
        with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
            f.write(json.dumps(manifest, indent=1))
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if target.exists():  # re-saving: move the old one aside, then drop it
            old = parent / f".{target.name}.old-{os.getpid()}"
            target.rename(old)
            _remove_tree(old)
        tmp.rename(target)
        _fsync_dir(parent)
    except BaseException as err:
        reason = disk_failure(err) if isinstance(err, Exception) else None
        free = _free_bytes(parent) if reason is not None else None  # before the clean-up
        shutil.rmtree(tmp, ignore_errors=True)
        if reason is not None:
            raise WriteFailed(target, reason, free) from err
        raise


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


@contextmanager
def write_checkpoint(
    root: str | Path, step: int, meta: dict[str, Any] | None = None
) -> Iterator[Path]:
    """Yield a temp directory to fill; on exit it becomes ``global_step_<step>`` atomically
    (:func:`write_sealed`), and verl's pointer names it."""
    root = Path(root)
    with write_sealed(step_dir(root, step), step, meta) as tmp:
        yield tmp
    _write_text_atomic(root / LATEST_POINTER, str(step))


def _parse(path: Path) -> Manifest | str:
    """The manifest of ``path``, or why there is none that can be read."""
    try:
        data = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = {str(k): int(v) for k, v in data["files"].items()}
        step = int(data["step"])
        sums = {str(k): str(v) for k, v in (data.get("checksums") or {}).items()}
        fmt = int(data.get("format", 1))
        if sums and data.get("checksum") != CHECKSUM:
            raise ValueError(f"unknown checksum {data.get('checksum')!r}")
    except FileNotFoundError:
        return f"no {MANIFEST}: an interrupted save"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"unreadable {MANIFEST}: {err}"
    created = float(data.get("created", 0.0))
    return Manifest(step, files, created, dict(data.get("meta", {})), sums, fmt)


def _size_problem(path: Path, manifest: Manifest) -> str | None:
    for rel, size in manifest.files.items():
        f = path / rel
        actual = f.stat().st_size if f.is_file() else None
        if actual is None:
            return f"{rel}: missing"
        if actual != size:
            return f"{rel}: {actual} bytes, the manifest says {size}"
    return None


def _checksum_problem(path: Path, manifest: Manifest) -> str | None:
    for rel, expected in manifest.checksums.items():
        try:
            actual = file_checksum(path / rel)
        except OSError as err:
            return f"{rel}: unreadable ({err.strerror or err})"
        if actual != expected:
            return f"{rel}: checksum mismatch"
    return None


def checkpoint_problem(path: str | Path, verify: bool = False) -> str | None:
    """Why the checkpoint (or sealed directory) at ``path`` is not usable, in a few words
    naming the file (``actor/model.safetensors: checksum mismatch``), or None if it is.

    Sizes always; ``verify``: checksums too (reads every byte; manifests of format 1 have
    none, so sizes are all there is to check for them).
    """
    path = Path(path)
    manifest = _parse(path)
    if isinstance(manifest, str):
        return manifest
    problem = _size_problem(path, manifest)
    if problem is None and verify:
        problem = _checksum_problem(path, manifest)
    return problem


def read_manifest(path: str | Path) -> Manifest | None:
    """The manifest of a *complete* checkpoint whose files have their recorded sizes, else
    None (reason logged). Checksums are not read here: see :func:`checkpoint_problem`."""
    path = Path(path)
    manifest = _parse(path)
    if isinstance(manifest, str):
        problem: str | None = manifest
    else:
        problem = _size_problem(path, manifest)
    if problem is not None or isinstance(manifest, str):
        log.warning("checkpoint %s is not usable (%s): skipped", path, problem)
        return None
    return manifest


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``global_step_*`` directory, oldest first (valid or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if p.is_dir() and (s := _step_of(p)) is not None]
    return sorted(found)


def newest_valid(
    root: str | Path, verify: bool = False, below: int | None = None
) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest usable checkpoint under ``root`` (of a step below ``below``, if given),
    and the newer ones passed over with the reason of each (:func:`checkpoint_problem`)."""
    skipped: list[tuple[Path, str]] = []
    for step, path in reversed(list_checkpoints(root)):
        if below is not None and step >= below:
            continue
        problem = checkpoint_problem(path, verify)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def find_latest(root: str | Path, verify: bool = False) -> Path | None:
    """The newest checkpoint under ``root`` whose manifest and file sizes (``verify``: and
    checksums) check out; the ones passed over are logged."""
    path, skipped = newest_valid(root, verify)
    for bad, problem in skipped:
        log.warning("checkpoint %s is not usable (%s): skipped", bad, problem)
    return path


def prune(
    root: str | Path, keep: int | None, protect: Path | None = None, transient: str | None = None
) -> list[Path]:
    """Delete complete checkpoints beyond the newest ``keep`` (None or ≤ 0: keep all).

    ``transient``: a key of the manifest's ``meta``; checkpoints where it is true were
    written only to recover from (a time-based save) — every one but ``protect`` is
    deleted, and they do not count towards ``keep``. Damaged directories are left for a
    human to look at (they are skipped on resume).
    """
    limited = keep is not None and keep > 0
    if not limited and transient is None:
        return []
    complete = [(p, m) for _s, p in list_checkpoints(root) if (m := read_manifest(p)) is not None]
    passing = [p for p, m in complete if transient is not None and m.meta.get(transient)]
    kept = [p for p, m in complete if p not in passing]
    doomed = passing + (kept[: -int(keep or 0)] if limited else [])
    removed = []
    for path in doomed:
        if protect is not None and path.resolve() == protect.resolve():
            continue
        _remove_tree(path)
        removed.append(path)
    return removed
