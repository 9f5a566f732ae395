"""The save cadence (issue 29, defect 4): besides ``save_freq``, a native run saves a
recovery checkpoint every ``save_every_minutes`` (default 10), so a SIGKILL loses at
most that; each recovery checkpoint replaces the previous one and does not count
towards ``max_*_ckpt_to_keep``. verl and ROLL files keep their own cadence exactly."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

from temper.config.errors import ConfigError
from temper.pipelines.catalog import build_config, load_config
from temper.pipelines.checkpointing import Checkpointer, Progress
from temper.pipelines.run import Run

ROOT = Path(__file__).resolve().parents[3]


def native(**experiment):
    return build_config(
        {
            "model": {"path": "some/model"},
            "data": {"train_files": ["task:arithmetic"]},
            "experiment": experiment,
        }
    )


def steps(root: Path) -> list[int]:
    return sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob("global_step_*"))


def checkpointer(root: Path, keep: int | None) -> Checkpointer:
    return Checkpointer(root=root, roles={}, states={"progress": Progress()}, config={}, keep=keep)


def test_each_recovery_checkpoint_replaces_the_previous_one(tmp_path):
    ck = checkpointer(tmp_path, keep=None)
    ck.save(1)
    ck.save(2, recovery=True)
    assert steps(tmp_path) == [1, 2]
    ck.save(3, recovery=True)
    assert steps(tmp_path) == [1, 3]
    ck.save(4)
    assert steps(tmp_path) == [1, 4]  # the last recovery one goes once a newer one is whole


def test_recovery_checkpoints_do_not_count_towards_keep(tmp_path):
    ck = checkpointer(tmp_path, keep=2)
    for step in (10, 20):
        ck.save(step)
    ck.save(25, recovery=True)
    assert steps(tmp_path) == [10, 20, 25]  # keep=2 counts save_freq's checkpoints only
    ck.save(30)
    assert steps(tmp_path) == [20, 30]


def run_like(cfg, step: int, total: int, since_save_s: float) -> types.SimpleNamespace:
    """The parts of a :class:`Run` its save decision reads."""
    return types.SimpleNamespace(
        cfg=cfg, step=step, total_steps=total, last_save=time.monotonic() - since_save_s
    )


@pytest.mark.parametrize(
    ("minutes", "since_s", "step", "due", "recovery"),
    [
        (10.0, 599.0, 3, False, False),  # not yet
        (10.0, 601.0, 3, True, True),  # ten minutes since the last save: a recovery one
        (10.0, 601.0, 5, True, False),  # save_freq's step: kept, whatever the clock says
        (10.0, 1.0, 8, True, False),  # the last step
        (None, 1e9, 3, False, False),  # off
        (0.0, 1e9, 3, False, False),  # off
    ],
)
def test_what_is_saved_when(minutes, since_s, step, due, recovery):
    cfg = native(save_freq=5, save_every_minutes=minutes)
    run = run_like(cfg, step, total=8, since_save_s=since_s)
    run._kept_save_due = lambda: Run._kept_save_due(run)
    run._recovery_due = lambda: Run._recovery_due(run)
    assert Run.should_save(run, stopping=False) is due
    assert (due and not Run._kept_save_due(run)) is recovery


def test_the_native_default_saves_every_ten_minutes():
    assert native().experiment.save_every_minutes == 10.0


@pytest.mark.parametrize("name", ["verl_gsm8k_ppo.yaml", "roll_rlvr.yaml"])
def test_verl_and_roll_files_keep_their_own_cadence(name):
    """verl saves every trainer.save_freq steps (-1: never periodically) and ROLL every
    save_steps, and nothing else: no time-based save is added to their files."""
    cfg = load_config(ROOT / "examples" / name).config
    assert cfg.experiment.save_every_minutes is None


@pytest.mark.parametrize("value", [-1.0, float("nan")])
def test_a_negative_or_nan_cadence_is_refused(value):
    with pytest.raises(ConfigError) as err:
        native(save_every_minutes=value)
    assert err.value.key == "experiment.save_every_minutes"


def test_a_kill_while_a_replaced_checkpoint_is_deleted_leaves_no_damaged_one(tmp_path, monkeypatch):
    """Recovery checkpoints are deleted at every save: one cut short mid-delete must not
    stay as a ``global_step_N`` without its manifest (a damaged checkpoint the next run
    would list, and no save would ever clean)."""
    import shutil

    from temper.checkpoint import store

    ck = checkpointer(tmp_path, keep=None)
    ck.save(1, recovery=True)
    rmtree = shutil.rmtree

    def killed(path, ignore_errors=False):
        if "global_step_1" in str(path):
            raise KeyboardInterrupt  # the process dies inside step 1's delete
        rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(store.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        ck.save(2, recovery=True)
    monkeypatch.setattr(store.shutil, "rmtree", rmtree)
    assert steps(tmp_path) == [2]  # what is left of step 1 is a hidden .old- directory
    ck.save(3)  # the next save cleans it
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step_3",
        "latest_checkpointed_iteration.txt",
    ]
