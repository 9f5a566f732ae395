"""Each tracker writes what it should: jsonl rows, TensorBoard events, a W&B offline run."""

from __future__ import annotations

import contextlib
import io
import json
import struct
import time

import pytest

from temper.tracking import ConsoleTracker, JsonlTracker, build_trackers, should_log

ROWS = [{"train/reward_mean": 0.1 * s, "actor/kl": 0.01 * s} for s in range(1, 5)]


def test_jsonl_resume_drops_rows_from_the_resume_step_on(tmp_path):
    t = JsonlTracker(tmp_path)
    for step, row in enumerate(ROWS, 1):
        t.log(row, step)
    t.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "train/rew')  # a line cut by SIGKILL
    t = JsonlTracker(tmp_path, start_step=3)  # resumed after step 2's checkpoint
    t.log({"train/reward_mean": 9.0}, 3)
    t.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["train/reward_mean"] == 9.0


def test_console_prints_progress_eta_and_headline_metrics():
    out = io.StringIO()
    t = ConsoleTracker(total_steps=4, stream=out)
    t.log({"train/reward_mean": 0.5, "timing/step_s": 1.0, "other/x": 3.0}, 1)
    line = out.getvalue().strip()
    assert line.startswith("step 1/4 |  25% eta ")
    assert "reward_mean=0.5000" in line and "step_s=1.0000" in line and "other" not in line
    t.log({"train/reward_mean": 0.5, "val/reward_mean": 0.75}, 2)  # both: told apart
    assert "| reward_mean=0.5000 | val_reward_mean=0.7500" in out.getvalue().splitlines()[1]


def test_sinks_without_text_take_it_as_a_no_op(tmp_path):
    out = io.StringIO()
    trackers = build_trackers(["console"], tmp_path, every=2)  # console behind EveryNSteps
    trackers.trackers[0].tracker.stream = out
    trackers.log(ROWS[0], 2)
    trackers.log_text("val/generations/0", "prompt: 1+1=\nresponse: 2", 2)
    trackers.close()
    assert out.getvalue().count("\n") == 1 and "response" not in out.getvalue()
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [2]


@pytest.mark.slow
def test_tensorboard_events_are_readable_and_purged_on_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = build_trackers(["tensorboard"], tmp_path)
    for step, row in enumerate(ROWS, 1):
        trackers.log(row, step)
    trackers.log_text("val/generations/0", "prompt: 1+1=\nresponse: 2", 4)
    trackers.close()
    resumed = build_trackers(["tensorboard"], tmp_path, start_step=3)
    resumed.log({"train/reward_mean": 9.0, "actor/kl": 9.0}, 3)
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert {"train/reward_mean", "actor/kl"} <= set(acc.Tags()["scalars"])
    events = acc.Scalars("train/reward_mean")
    assert [e.step for e in events] == [1, 2, 3]
    assert events[-1].value == pytest.approx(9.0)
    assert any(t.startswith("val/generations") for t in acc.Tags()["tensors"])


def _wandb_records(path) -> list[bytes]:
    """Records of a ``.wandb`` file: W&B's LevelDB-log framing (32 KiB blocks, 7-byte
    record headers: crc, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte header."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, buf, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind in (2, 3):
            buf = (b"" if kind == 2 else buf) + chunk
        elif kind == 4:
            records.append(buf + chunk)
    return records


def _wandb_history(tmp_path) -> list[dict]:
    """History rows of the one offline W&B run under ``tmp_path`` (once it is closed)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    assert run_dir.name.endswith((tmp_path / "wandb_run_id").read_text())
    (wandb_file,) = run_dir.glob("*.wandb")
    records: list = []
    deadline = time.monotonic() + 30
    while not records or records[-1].WhichOneof("record_type") != "exit":
        assert time.monotonic() < deadline, "the offline run was never closed"
        time.sleep(0.1)  # wandb-core writes the file asynchronously after finish()
        records = []
        for raw in _wandb_records(wandb_file):
            records.append(wandb_internal_pb2.Record())
            with contextlib.suppress(DecodeError):  # a record still being written
                records[-1].ParseFromString(raw)
    history = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = record.history.item
            history.append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
            )
    return history


@pytest.mark.slow
def test_wandb_offline_run_dir_holds_the_history(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = build_trackers(
        ["wandb"], tmp_path, kwargs={"mode": "offline"}, project="p", name="tiny"
    )
    for step, row in enumerate(ROWS, 1):
        trackers.log(row, step)
    trackers.close()
    history = _wandb_history(tmp_path)
    assert [h["_step"] for h in history] == [1, 2, 3, 4]
    assert [h["train/reward_mean"] for h in history] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert history[-1]["actor/kl"] == pytest.approx(0.04)


# logging_steps: jsonl keeps every step; the viewing sinks get every N-th step, rows with
# validation metrics, and the last step. 7 steps, N=3, validation at step 5.
THINNED = [{"train/reward_mean": 0.1 * s, "actor/kl": 0.01 * s} for s in range(1, 8)]
THINNED[4] = {**THINNED[4], "val/reward_mean": 0.5}
SHOWN = [3, 5, 6, 7]


def test_should_log_every_n_validation_and_last_step():
    shown = [s for s, row in enumerate(THINNED, 1) if should_log(row, s, 3, total_steps=7)]
    assert shown == SHOWN
    assert should_log({"val/reward_mean": 0.1}, 0, 3)  # validation before training
    assert all(should_log({}, s, 1) for s in range(1, 8))
    assert [s for s in range(1, 8) if should_log({}, s, 3)] == [3, 6]  # no total: no last


def test_console_honours_logging_steps(tmp_path, capsys):
    trackers = build_trackers(["console"], tmp_path, total_steps=7, every=3)
    for step, row in enumerate(THINNED, 1):
        trackers.log(row, step)
    trackers.close()
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step ")]
    assert [int(line.split()[1].split("/")[0]) for line in lines] == SHOWN


@pytest.mark.slow
def test_logging_steps_thins_tensorboard_and_wandb_but_not_jsonl(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = build_trackers(
        ["tensorboard", "wandb"],
        tmp_path,
        total_steps=7,
        every=3,
        kwargs={"mode": "offline"},
        project="p",
        name="thin",
    )
    for step, row in enumerate(THINNED, 1):
        trackers.log(row, step)
    trackers.log_text("val/generations/0", "prompt: 1+1=\nresponse: 2", 5)
    trackers.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 8))
    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward_mean")] == SHOWN
    assert [e.step for e in acc.Scalars("val/reward_mean")] == [5]
    assert any(t.startswith("val/generations") for t in acc.Tags()["tensors"])
    history = _wandb_history(tmp_path)
    assert [h["_step"] for h in history] == SHOWN
    assert [h["train/reward_mean"] for h in history] == pytest.approx([0.3, 0.5, 0.6, 0.7])


def test_tracker_names_come_from_the_registry(monkeypatch):
    """``experiment.trackers`` is checked at load against the trackers' registry: a
    tracker registered in this process is valid at once, an unknown name is refused."""
    from temper import tracking
    from temper.config.errors import ConfigError
    from temper.pipelines.catalog import build_config

    mine = tracking.TRACKERS.copy()
    mine.add("mine", tracking.TrackerSpec(lambda output_dir, **_: tracking.ConsoleTracker()))
    monkeypatch.setattr(tracking, "TRACKERS", mine)
    base = {"model": {"path": "m"}, "data": {"train_files": ["task:arithmetic"]}}
    build_config({**base, "experiment": {"trackers": ["console", "mine"]}})
    with pytest.raises(ConfigError) as err:
        build_config({**base, "experiment": {"trackers": ["mien"]}})
    assert str(err.value).startswith(
        "experiment.trackers: unknown value 'mien' (did you mean 'mine'?)"
    )
