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
