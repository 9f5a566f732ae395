"""Checkpoint directories: layout, atomic write, discovery of the latest valid one, retention.

Layout (verl's names, so its tooling and habits carry over)::

    <checkpoint_dir>/global_step_<N>/
        manifest.json          written last: the completion marker (format, step, every
                               file with its size)
        ...                    the parts the pipeline writes (actor/, trainer_state.pt, …)
    <checkpoint_dir>/latest_checkpointed_iteration.txt   verl's pointer (informational)

Why a manifest with sizes rather than a bare marker: a directory can be damaged *after*
it was complete (a truncated copy, a full disk on a file system whose rename is not
atomic). Discovery re-checks every listed size, so such a directory is skipped too and
``auto`` resume falls back to the previous good one.

Atomicity: parts go into a hidden sibling temp directory; the manifest is written,
everything fsynced, and the directory renamed into place. A crash at any moment leaves
either a ``.global_step_N.tmp-*`` directory (ignored, cleaned by the next save) or a
complete checkpoint. Deletion removes the manifest first, so a half-deleted directory
never looks complete either.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
STEP_PREFIX = "global_step_"
LATEST_POINTER = "latest_checkpointed_iteration.txt"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Manifest:
    """What a complete checkpoint declares about itself."""

    step: int
    files: dict[str, int]  # relative path -> size in bytes
    created: float
    meta: dict[str, Any]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"{STEP_PREFIX}{step}"


def _step_of(path: Path) -> int | None:
    if not path.name.startswith(STEP_PREFIX):
        return None
    try:
        return int(path.name[len(STEP_PREFIX) :])
    except ValueError:
        return None


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` to disk (before the rename)."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(dirpath))


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


def _list_files(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = Path(dirpath) / name
            out[full.relative_to(root).as_posix()] = full.stat().st_size
    return dict(sorted(out.items()))


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


def _clean_stale_temps(root: Path) -> None:
    for p in root.glob(f".{STEP_PREFIX}*"):
        if p.is_dir() and (".tmp-" in p.name or ".old-" in p.name):
            shutil.rmtree(p, ignore_errors=True)


@contextmanager
def write_checkpoint(
    root: str | Path, step: int, meta: dict[str, Any] | None = None
) -> Iterator[Path]:
    """Yield a temp directory to fill; on exit it becomes ``global_step_<step>`` atomically.

    If the body raises, the temp directory is removed and nothing changes.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    _clean_stale_temps(root)
    tmp = root / f".{STEP_PREFIX}{step}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        manifest = {
            "format": FORMAT_VERSION,
            "step": step,
            "created": time.time(),
            "meta": meta or {},
            "files": _list_files(tmp),
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        _fsync_tree(tmp)
        final = step_dir(root, step)
        if final.exists():  # re-saving a step: move the old one aside, then drop it
            old = root / f".{final.name}.old-{os.getpid()}"
            final.rename(old)
            _remove_tree(old)
        tmp.rename(final)
        _fsync_dir(root)
        _write_text_atomic(root / LATEST_POINTER, str(step))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_manifest(path: str | Path) -> Manifest | None:
    """The manifest of a *complete, undamaged* checkpoint, else None (reason logged)."""
    path = Path(path)
    try:
        data = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        files = {str(k): int(v) for k, v in data["files"].items()}
        step = int(data["step"])
    except FileNotFoundError:
        log.warning("checkpoint %s has no %s (incomplete write): skipped", path, MANIFEST)
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        log.warning("checkpoint %s has an unreadable manifest (%s): skipped", path, err)
        return None
    for rel, size in files.items():
        f = path / rel
        actual = f.stat().st_size if f.is_file() else None
        if actual != size:
            log.warning(
                "checkpoint %s is damaged: %s has %s bytes, the manifest says %d: skipped",
                path,
                rel,
                "no" if actual is None else actual,
                size,
            )
            return None
    return Manifest(step, files, float(data.get("created", 0.0)), dict(data.get("meta", {})))


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``global_step_*`` directory, oldest first (valid or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(s, p) for p in root.iterdir() if p.is_dir() and (s := _step_of(p)) is not None]
    return sorted(found)


def find_latest(root: str | Path) -> Path | None:
    """The newest checkpoint under ``root`` whose manifest and files check out."""
    for _step, path in reversed(list_checkpoints(root)):
        if read_manifest(path) is not None:
            return path
    return None


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
