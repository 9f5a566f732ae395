"""mlflow, swanlab and trackio: each logs every metric per step (and text) to a local
store under the run's output dir, which the test reads back through the library's own
reader; their tracker_kwargs are checked, and a missing package is named by the check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from temper.config.errors import ConfigError
from temper.tracking import TRACKERS, build_trackers, check_trackers, tracker_args
from temper.tracking.mlflow_sink import sanitize_key

ROWS = [{"train/reward_mean": 0.1 * s, "actor/kl": 0.01 * s} for s in range(1, 5)]


@pytest.fixture
def no_tracking_env(monkeypatch):
    """The user's own settings would send the test's runs elsewhere."""
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "SWANLAB_MODE", "SWANLAB_LOG_DIR"):
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------- mlflow


def test_mlflow_key_sanitizing_as_verl_and_the_paths_mlflow_refuses():
    assert sanitize_key("val/acc@8/mean") == "val/acc_at_8/mean"  # verl's @ rule
    assert sanitize_key("a//b") == "a/b"
    assert sanitize_key("a(b)[c]") == "a_b__c_"
    assert sanitize_key("timing/step_s: gen") == "timing/step_s: gen"  # allowed as is
    assert sanitize_key("/lead/trail/") == "lead/trail"
    assert sanitize_key("a/../b/./c") == "a/_/b/_/c"
    long = sanitize_key("x" * 300)
    assert len(long) == 250 and long != sanitize_key("x" * 299)


@pytest.mark.slow  # the library's store: seconds to create
def test_mlflow_logs_metrics_and_text_to_a_sqlite_store_and_resume_continues(
    tmp_path, no_tracking_env
):
    from mlflow.tracking import MlflowClient

    trackers = build_trackers(["mlflow"], tmp_path, project="proj", name="exp")
    for step, row in enumerate(ROWS, 1):
        # a numpy scalar is logged as its number, a string left out (jsonl keeps it)
        trackers.log({**row, "pass@k/x": float(step), "n": np.int64(step), "tag": "t"}, step)
    trackers.log_text("val/generations/0", "prompt: 1+1=\nresponse: 2", 4)
    trackers.close()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    run_id = (tmp_path / "mlflow_run_id").read_text()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "exp"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    history = client.get_metric_history(run_id, "train/reward_mean")
    assert [(m.step, m.value) for m in history] == [
        (s, pytest.approx(0.1 * s)) for s in range(1, 5)
    ]
    assert [m.value for m in client.get_metric_history(run_id, "pass_at_k/x")] == [1, 2, 3, 4]
    assert [m.value for m in client.get_metric_history(run_id, "n")] == [1, 2, 3, 4]
    assert "tag" not in run.data.metrics
    (text,) = client.list_artifacts(run_id, "val/generations/0")
    local = client.download_artifacts(run_id, text.path, str(tmp_path / "dl"))
    assert Path(local).read_text() == "prompt: 1+1=\nresponse: 2"
    assert str(tmp_path / "mlflow" / "artifacts") in run.info.artifact_uri  # not ./mlruns

    resumed = build_trackers(["mlflow"], tmp_path, project="proj", name="exp", start_step=5)
    resumed.log({"train/reward_mean": 9.0}, 5)
    resumed.close()
    assert (tmp_path / "mlflow_run_id").read_text() == run_id  # the same run goes on
    assert client.get_metric_history(run_id, "train/reward_mean")[-1].step == 5


@pytest.mark.slow  # the library's store: seconds to create
def test_mlflow_tracking_uri_from_the_environment_wins(tmp_path, monkeypatch, no_tracking_env):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = tmp_path / "out"
    kwargs = {"mlflow": {"tracking_uri": "sqlite:////nowhere/x.db", "run_name": "r"}}
    trackers = build_trackers(["mlflow"], out, kwargs=kwargs, project="p", name="e")
    trackers.log({"a": 1.0}, 1)
    trackers.close()
    assert not (out / "mlflow").exists()
    run = MlflowClient(uri).get_run((out / "mlflow_run_id").read_text())
    assert run.info.run_name == "r" and run.data.metrics == {"a": 1.0}


# --------------------------------------------------------------------------- trackio

# trackio reads TRACKIO_DIR once, when imported: the sink sets it to the output dir
# before that import, so the test runs in a fresh interpreter
TRACKIO_RUN = """
import json, sys
from temper.tracking import build_trackers
out = sys.argv[1]
rows = json.loads(sys.argv[2])
trackers = build_trackers(["trackio"], out, project="proj", name="exp",
                          kwargs={"group": "g", "auto_log_gpu": False})
for step, row in enumerate(rows, 1):
    trackers.log(row, step)
trackers.log_text("val/generations/0", "prompt: 1+1=\\nresponse: 2", 4)
trackers.close()
# resumed after step 4's checkpoint: the same run goes on
resumed = build_trackers(["trackio"], out, project="proj", name="exp", start_step=5)
resumed.log({"train/reward_mean": 0.5}, 5)
resumed.close()
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("proj", "exp")
print("LOGS" + json.dumps(logs, default=str))
print("RUNS" + json.dumps(SQLiteStorage.get_runs("proj")))
"""


@pytest.mark.slow  # the library's store: seconds to create
def test_trackio_logs_every_step_to_a_local_database_in_the_output_dir(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRACKIO_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TRACKIO_RUN), str(tmp_path), json.dumps(ROWS)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = {
        line[:4]: line[4:] for line in done.stdout.splitlines() if line[:4] in ("LOGS", "RUNS")
    }
    assert (tmp_path / "trackio" / "proj.db").is_file()
    assert json.loads(lines["RUNS"]) == ["exp"]
    logs = json.loads(lines["LOGS"])
    scalars = [row for row in logs if "train/reward_mean" in row]
    assert [row["step"] for row in scalars] == [1, 2, 3, 4, 5]
    assert [row["train/reward_mean"] for row in scalars] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert scalars[3]["actor/kl"] == pytest.approx(0.04)
    (text,) = [row["val/generations/0"] for row in logs if "val/generations/0" in row]
    assert "response: 2" in text["_value"]


# --------------------------------------------------------------------------- swanlab


def _swanlab_records(log_dir):
    """(kind, key, step, value) of the one offline SwanLab run under ``log_dir``, read
    with SwanLab's own record reader."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = log_dir.glob("run-*/*.swanlab")
    reader = DataStoreReader()
    reader.open(path)
    out = []
    for raw in reader:
        record = Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "scalar":
            out.append((kind, record.scalar.key, record.scalar.step, record.scalar.value.number))
        elif kind in ("media", "start", "finish"):
            out.append((kind, getattr(record, kind), None, None))
    reader.close()
    return out


@pytest.mark.slow  # the library's store: seconds to create
def test_swanlab_offline_run_under_the_output_dir(tmp_path, no_tracking_env):
    pytest.importorskip(
        "swanlab", reason="swanlab is not installed (pip install 'temper-rl[swanlab]')"
    )
    kwargs = {"tags": ["rl"], "description": "tiny"}
    trackers = build_trackers(["swanlab"], tmp_path, kwargs=kwargs, project="proj", name="exp")
    for step, row in enumerate(ROWS, 1):
        trackers.log(row, step)
    trackers.log_text("val/generations/0", "prompt: 1+1=\nresponse: 2", 4)
    trackers.close()
    records = _swanlab_records(tmp_path / "swanlog")
    start = next(r[1] for r in records if r[0] == "start")
    assert (start.project, start.name) == ("proj", "exp")
    assert start.id == (tmp_path / "swanlab_run_id").read_text()
    reward = [(step, value) for kind, key, step, value in records if key == "train/reward_mean"]
    assert reward == [(s, pytest.approx(0.1 * s)) for s in range(1, 5)]
    assert [r for r in records if r[0] == "scalar" and r[1] == "actor/kl"][-1][3] == 0.04
    (media,) = [r[1] for r in records if r[0] == "media"]
    assert media.key == "val/generations/0" and media.step == 4
    assert records[-1][0] == "finish"


# --------------------------------------------------------------------------- checks


def test_tracker_kwargs_each_tracker_does_not_read_are_refused():
    # ROLL's trackio tags: trackio.init takes none
    with pytest.raises(ConfigError) as err:
        check_trackers(["trackio", "jsonl"], {"project": "p", "tags": ["a"]})
    assert str(err.value).startswith(
        "experiment.tracker_kwargs.tags: the trackio tracker does not read it"
    )
    with pytest.raises(ConfigError, match=r"tracker_kwargs\.mlflow\.log_dir: the mlflow"):
        check_trackers(["mlflow"], {"mlflow": {"log_dir": "/x"}})
    # flat keys are shared: tensorboard's log_dir is not mlflow's, but tensorboard reads it
    check_trackers(["mlflow", "tensorboard"], {"log_dir": "/x"})
    args = tracker_args("swanlab", ["swanlab"], {"logdir": "/l", "mode": "offline"})
    assert (args.logdir, args.mode, args.project) == ("/l", "offline", None)
    nested = tracker_args("trackio", ["trackio"], {"trackio": {"group": "g"}, "log_dir": "/x"})
    assert nested.group == "g"


def test_a_missing_tracker_package_is_named_with_what_to_install(monkeypatch):
    import importlib.util

    from temper import tracking

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "swanlab" else real(n, *a)
    )
    with pytest.raises(ConfigError) as err:
        tracking.check_trackers(["console", "swanlab"], {})
    assert str(err.value) == (
        "experiment.trackers: 'swanlab' needs the swanlab package, which is not installed. "
        "Fix: pip install 'temper-rl[swanlab]'"
    )
    assert TRACKERS.get("mlflow").install == "pip install 'temper-rl[tracking]'"
