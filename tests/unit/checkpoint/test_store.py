"""Checkpoint directories: atomic write, damaged ones skipped, retention."""

from __future__ import annotations

import json

import pytest

from temper.checkpoint import find_latest, list_checkpoints, prune, read_manifest, write_checkpoint
from temper.checkpoint.store import LATEST_POINTER


def _save(root, step, payload=b"x" * 100):
    with write_checkpoint(root, step) as tmp:
        (tmp / "actor").mkdir()
        (tmp / "actor" / "model.safetensors").write_bytes(payload)
        (tmp / "trainer_state.pt").write_bytes(b"state")
    return root / f"global_step_{step}"


def test_write_makes_a_complete_checkpoint_with_manifest(tmp_path):
    path = _save(tmp_path, 3)
    manifest = read_manifest(path)
    assert manifest is not None and manifest.step == 3
    assert manifest.files == {"actor/model.safetensors": 100, "trainer_state.pt": 5}
    assert (tmp_path / LATEST_POINTER).read_text() == "3"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_crash_inside_the_write_leaves_nothing_that_looks_complete(tmp_path):
    _save(tmp_path, 2)
    with pytest.raises(RuntimeError), write_checkpoint(tmp_path, 4) as tmp:
        (tmp / "half").write_bytes(b"partial")
        raise RuntimeError("killed")
    assert find_latest(tmp_path) == tmp_path / "global_step_2"
    assert not (tmp_path / "global_step_4").exists()


def test_truncated_or_unmarked_checkpoints_are_skipped(tmp_path):
    _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    weights = newest / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:40])  # truncated mid-write / bad copy
    assert find_latest(tmp_path) == tmp_path / "global_step_2"
    unmarked = tmp_path / "global_step_6"  # a SIGKILL before the manifest (non-atomic FS)
    unmarked.mkdir()
    (unmarked / "trainer_state.pt").write_bytes(b"state")
    assert find_latest(tmp_path) == tmp_path / "global_step_2"
    (tmp_path / "global_step_8").mkdir()
    (tmp_path / "global_step_8" / "manifest.json").write_text("{not json")
    assert find_latest(tmp_path) == tmp_path / "global_step_2"
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 4, 6, 8]


def test_stale_temp_dirs_are_ignored_and_cleaned(tmp_path):
    stale = tmp_path / ".global_step_5.tmp-999999"
    stale.mkdir(parents=True)
    (stale / "manifest.json").write_text(json.dumps({"step": 5, "files": {}}))
    assert find_latest(tmp_path) is None
    _save(tmp_path, 6)
    assert not stale.exists()


def test_resaving_a_step_replaces_it(tmp_path):
    _save(tmp_path, 3, b"a" * 10)
    path = _save(tmp_path, 3, b"b" * 20)
    assert read_manifest(path).files["actor/model.safetensors"] == 20


def test_prune_keeps_the_newest_n(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step)
    removed = prune(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["global_step_1", "global_step_2"]
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4]
    assert prune(tmp_path, None) == [] and prune(tmp_path, 0) == []


def _flip_byte(path, offset=None):
    """Corrupt one byte of ``path`` in place, keeping its size."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_manifest_records_a_checksum_per_file_of_the_bytes_on_disk(tmp_path):
    from temper.checkpoint.store import CHECKSUM, file_checksum

    path = _save(tmp_path, 3)
    manifest = read_manifest(path)
    assert manifest.format == 2
    assert set(manifest.checksums) == set(manifest.files)
    for rel, digest in manifest.checksums.items():
        assert digest == file_checksum(path / rel)
    data = json.loads((path / "manifest.json").read_text())
    assert data["checksum"] == CHECKSUM


def test_same_size_corruption_is_found_by_checksums_only(tmp_path):
    from temper.checkpoint import checkpoint_problem, newest_valid

    older = _save(tmp_path, 2)
    newest = _save(tmp_path, 4)
    _flip_byte(newest / "actor" / "model.safetensors")
    assert checkpoint_problem(newest) is None  # sizes: unchanged
    assert checkpoint_problem(newest, verify=True) == "actor/model.safetensors: checksum mismatch"
    assert find_latest(tmp_path) == newest
    assert find_latest(tmp_path, verify=True) == older
    path, skipped = newest_valid(tmp_path, verify=True)
    assert path == older
    assert skipped == [(newest, "actor/model.safetensors: checksum mismatch")]
    assert newest_valid(tmp_path, verify=True, below=2) == (None, [])


def test_format_1_manifests_without_checksums_are_checked_by_size(tmp_path):
    from temper.checkpoint import checkpoint_problem

    path = _save(tmp_path, 2)
    data = json.loads((path / "manifest.json").read_text())
    old = {k: data[k] for k in ("step", "created", "meta", "files")}
    (path / "manifest.json").write_text(json.dumps({"format": 1, **old}))
    manifest = read_manifest(path)
    assert manifest is not None and manifest.format == 1 and manifest.checksums == {}
    assert checkpoint_problem(path, verify=True) is None
    _flip_byte(path / "trainer_state.pt")
    assert checkpoint_problem(path, verify=True) is None  # nothing to compare against
    (path / "trainer_state.pt").write_bytes(b"st")
    assert checkpoint_problem(path, verify=True) == "trainer_state.pt: 2 bytes, the manifest says 5"


_WRITE_UNDER_A_LIMIT = """
import resource, signal, sys
from pathlib import Path
import torch
from temper.checkpoint import WriteFailed, write_checkpoint

root = Path(sys.argv[1])
with write_checkpoint(root, 1) as tmp:
    torch.save({"w": torch.zeros(8)}, tmp / "small.pt")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
writer = sys.argv[2]
try:
    with write_checkpoint(root, 2) as tmp:
        if writer == "torch":
            torch.save({"w": torch.zeros(100_000)}, tmp / "big.pt")
        else:
            (tmp / "big.bin").write_bytes(bytes(200_000))
except WriteFailed as err:
    print("REASON", err.reason)
"""


@pytest.mark.parametrize("writer", ["torch", "python"])
def test_a_write_the_disk_refuses_raises_write_failed_and_leaves_nothing(tmp_path, writer):
    """A real refused write (RLIMIT_FSIZE: the kernel fails it with EFBIG, as a full disk
    fails it with ENOSPC), through torch's zip writer and through Python's own."""
    import subprocess
    import sys

    script = tmp_path / "w.py"
    script.write_text(_WRITE_UNDER_A_LIMIT)
    root = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, str(script), str(root), writer], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "REASON" in done.stdout, done.stdout
    if writer == "python":
        assert "File too large" in done.stdout
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", LATEST_POINTER]
    assert find_latest(root, verify=True) == root / "global_step_1"
