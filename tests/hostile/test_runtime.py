"""Hostile input at run time (issue 29's smaller defects): data files, the run's record,
reward functions and stop signals.

- Data: a UTF-8 byte-order mark keeps every row (jsonl, json, csv); ``prompt: null`` is a
  bad row (reported, and skipped or fatal per ``data.bad_rows``), not a missing column;
  an empty file is said to be empty by ``check`` and ``train`` alike.
- ``reward.num_workers: 0`` (rewards in the trainer's process, where no deadline can be
  kept) is refused while ``reward.timeout_s`` sets one; ``timeout_s: null`` says none is
  wanted, and is refused for workers.
- ``temper report`` of a ``metrics.jsonl`` holding two runs' rows (interleaved, or steps
  a resumed run logged again) warns in one line and draws each step once, its last
  value, in step order; an interrupt while a resume rewrites that file loses no row.
- Runs (``temper train`` in a process of its own where signals are sent): two SIGINTs —
  SIGINT inherited as default or as ignored — stop at once in one line, exit 130, the
  checkpoint saved before intact; a reward that SIGTERMs its trainer and the trainer's
  process group cannot stop the run; what reward functions print is capped per step.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from temper.cli.main import main
from temper.config.schema import DataConfig
from temper.data import DataError, build_dataset
from temper.data.sources import read_rows

ROW_A = {"prompt": "1+1=", "ground_truth": "2", "data_source": "arith"}
ROW_B = {"prompt": "2+2=", "ground_truth": "4", "data_source": "arith"}
BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from temper.utils.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tiny_tok"))


@pytest.fixture
def no_run(monkeypatch):
    """``train`` must stop before the run: reaching the pipeline fails the test."""

    def run_pipeline(cfg, plan=None):
        raise AssertionError("train started a run although it should refuse the config")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)


def refused(args: list[str], capsys) -> str:
    """The one-line refusal of ``check`` and of ``train`` (the same), exit 2, no
    traceback; the message without its ``config error:`` prefix."""
    messages = []
    for command in ("check", "train"):
        assert main([command, *args]) == 2, command
        out, err = capsys.readouterr()
        err = err.strip()
        assert err.startswith("config error: ") and "\n" not in err, err
        assert "Traceback" not in err + out
        messages.append(err)
    assert messages[0] == messages[1]
    return messages[0].removeprefix("config error: ")


def native(tmp_path: Path, model_dir: Path | str, **sections) -> Path:
    """A small native RLVR config on ``model_dir`` (sections update its defaults)."""
    data: dict = {
        "model": {"path": str(model_dir)},
        "data": {"train_batch_size": 2, "max_prompt_length": 96},
        "rollout": {"n": 2, "response_length": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4},
        "reward": {"function": "format", "num_workers": 1},
        "experiment": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- data files


def _csv(rows: list[dict]) -> str:
    columns = list(rows[0])
    return "\n".join([",".join(columns), *(",".join(r[c] for c in columns) for r in rows)]) + "\n"


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".jsonl", "".join(json.dumps(r) + "\n" for r in (ROW_A, ROW_B))),
        (".json", json.dumps([ROW_A, ROW_B])),
        (".csv", _csv([ROW_A, ROW_B])),
    ],
    ids=["jsonl", "json", "csv"],
)
def test_a_byte_order_mark_keeps_the_first_row(tmp_path, suffix, text):
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(BOM + text.encode())
    rows = list(read_rows(path))
    assert [r.problem for r in rows] == [None, None]
    assert [r.row for r in rows] == [ROW_A, ROW_B]


def test_a_byte_order_mark_file_trains_on_all_its_prompts(tmp_path, tokenizer):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(BOM + "".join(json.dumps(r) + "\n" for r in (ROW_A, ROW_B)).encode())
    ds = build_dataset(path, DataConfig(max_prompt_length=64, bad_rows="error"), tokenizer)
    assert len(ds) == 2 and ds.skipped_rows == 0


def test_a_null_prompt_is_a_bad_row_not_a_missing_column(tmp_path, tokenizer, caplog):
    path = tmp_path / "null.jsonl"
    rows = [{**ROW_A, "prompt": None}, ROW_B]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = build_dataset(path, DataConfig(max_prompt_length=64), tokenizer)  # bad_rows: skip
    assert len(ds) == 1 and ds.skipped_rows == 1
    assert (
        str(ds.skip_reasons[0]) == f"{path}:line 1: column 'prompt' is null: the row has no prompt"
    )
    assert "missing column" not in caplog.text
    with pytest.raises(DataError) as err:
        build_dataset(path, DataConfig(max_prompt_length=64, bad_rows="error"), tokenizer)
    assert str(err.value).startswith(
        f"data.train_files: malformed row {path}:line 1: column 'prompt' is null"
    )


@pytest.mark.parametrize("content", [b"", b"\n\n", BOM + b"\n"], ids=["empty", "blank", "bom"])
def test_an_empty_data_file_is_said_to_be_empty(tmp_path, tiny_path, capsys, no_run, content):
    data = tmp_path / "empty.jsonl"
    data.write_bytes(content)
    config = native(tmp_path, tiny_path, data={"train_files": [str(data)]})
    assert refused([str(config)], capsys) == (
        f"data.train_files: {data} is empty (no rows). "
        "Fix: point data.train_files at a file that holds prompts"
    )


def test_an_empty_file_fails_the_loader_as_empty(tmp_path, tokenizer):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl is empty \(no rows\)"):
        build_dataset(path, DataConfig(), tokenizer)


# --------------------------------------------------------------------------- reward deadline

IN_PROCESS = (
    "reward.num_workers: 0 runs reward functions in the trainer's process, where nothing can "
    "stop a call at its deadline (reward.timeout_s, 10 s): a reward that hangs would hang the "
    "run. Fix: set reward.num_workers=1 or more to keep the deadline; or, in a native config, "
    "reward.timeout_s=null as well, to run rewards in this process without one (debugging)"
)


def test_in_process_rewards_are_refused_while_a_deadline_is_set(
    tmp_path, tiny_path, capsys, no_run
):
    config = native(tmp_path, tiny_path, data={"train_files": ["task:arithmetic?n=8"]})
    assert refused([str(config), "reward.num_workers=0"], capsys) == IN_PROCESS


def test_in_process_rewards_without_a_deadline_are_what_the_user_said(tmp_path, tiny_path):
    from temper.pipelines.catalog import load_config

    config = native(tmp_path, tiny_path, data={"train_files": ["task:arithmetic?n=8"]})
    loaded = load_config(str(config), ["reward.num_workers=0", "reward.timeout_s=null"])
    assert loaded.config.reward.num_workers == 0 and loaded.config.reward.timeout_s is None


def test_no_deadline_is_refused_for_reward_workers(tmp_path, tiny_path, capsys, no_run):
    config = native(tmp_path, tiny_path, data={"train_files": ["task:arithmetic?n=8"]})
    assert refused([str(config), "reward.timeout_s=null"], capsys) == (
        "reward.timeout_s: null (no deadline) is for rewards run in the trainer's process "
        "(reward.num_workers=0, debugging); in workers a reward that hangs is stopped at its "
        "deadline. Fix: set reward.timeout_s to the seconds a sample's reward may take, e.g. 10"
    )


def test_a_verl_file_with_in_process_rewards_is_told_in_verl_keys(
    tmp_path, tiny_path, capsys, no_run
):
    verl = str(Path(__file__).resolve().parents[2] / "examples" / "verl_gsm8k_ppo.yaml")
    args = [verl, f"actor_rollout_ref.model.path={tiny_path}", f"critic.model.path={tiny_path}"]
    message = refused([*args, "reward_model.num_workers=0"], capsys)
    assert message.startswith("reward_model.num_workers (temper: reward.num_workers): 0 runs ")
    assert "Fix: set reward_model.num_workers=1 or more to keep the deadline" in message


# --------------------------------------------------------------------------- temper report


def _metrics(out: Path, rows: list[dict]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_report_of_two_interleaved_runs_warns_and_draws_each_step_once(tmp_path, capsys):
    # two runs in one directory: the second restarted at step 3 and wrote 3, 5, 4 between
    # the first's 4 and its end; the last value of each step is the one drawn
    steps = [1, 2, 3, 4, 3, 5, 4]
    rows = [{"step": s, "train/reward_mean": k / 10} for k, s in enumerate(steps)]
    out = _metrics(tmp_path / "run", rows)
    drawn: list[tuple[list[int], list[float]]] = []

    def plot(rows, png, title=""):
        from temper.report.dashboard import series

        drawn.append(series(rows, "train/reward_mean"))
        Path(png).write_bytes(b"")
        return Path(png)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("temper.report.dashboard.plot_dashboard", plot)
        assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (
        f"warning: {out / 'metrics.jsonl'}: steps out of order (step 3 after step 4) and 2 "
        "step(s) logged more than once (3, 4): it holds more than one run's rows (two runs in "
        "one output directory, or steps a resumed run logged again); drawing the last value "
        "of each step, in step order"
    )
    assert drawn == [([1, 2, 3, 4, 5], [0.0, 0.1, 0.4, 0.6, 0.5])]
    md = (out / "report.md").read_text()
    assert "steps logged: 5 (last step 5)" in md and "> warning: " in md


def test_report_of_a_resumed_runs_relogged_steps_warns(tmp_path, capsys):
    # steps 3 and 4 again after a resume from step 2, the old rows not dropped
    rows = [{"step": s, "train/reward_mean": float(s)} for s in (1, 2, 3, 4, 3, 4, 5)]
    out = _metrics(tmp_path / "run", rows)
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("warning: ") and "\n" not in err
    assert "step 3 after step 4" in err and "2 step(s) logged more than once (3, 4)" in err


def test_report_of_one_clean_run_does_not_warn(tmp_path, capsys):
    # a step's training row and its validation row (other keys) are one step, not two
    rows = [
        {"step": 0, "val/reward_mean": 0.1},
        {"step": 1, "train/reward_mean": 0.2},
        {"step": 2, "train/reward_mean": 0.3},
        {"step": 2, "val/reward_mean": 0.4},
    ]
    out = _metrics(tmp_path / "run", rows)
    assert main(["report", str(out)]) == 0
    assert capsys.readouterr().err == ""
    assert "warning" not in (out / "report.md").read_text()


def test_an_interrupt_while_a_resumed_run_rewrites_its_record_loses_no_row(tmp_path, monkeypatch):
    # a resume keeps the rows before its checkpoint and rewrites the file; a Ctrl-C there
    # (before the run's signal guard) must leave the file as it was, not cut short
    from temper.tracking import JsonlTracker

    out = _metrics(tmp_path / "run", [{"step": s, "train/reward_mean": 1.0} for s in (1, 2, 3)])
    before = (out / "metrics.jsonl").read_text()
    write_text = Path.write_text

    def interrupted(self, data, *args, **kwargs):
        write_text(self, data[: len(data) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        JsonlTracker(out, start_step=3)
    monkeypatch.undo()
    assert (out / "metrics.jsonl").read_text() == before


# --------------------------------------------------------------------------- runs


def _reward(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "reward.py"
    path.write_text(
        "import os, signal, sys, time\n\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        + "".join(f"    {line}\n" for line in textwrap.dedent(body).strip().splitlines())
    )
    return path


def _run_config(tmp_path: Path, model_dir: Path, reward: Path, **experiment) -> Path:
    """A native RLVR run of ``max_steps`` steps on 2 prompts × 2, scored by ``reward``."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1 = ?"}) + "\n" for i in range(8)))
    return native(
        tmp_path,
        model_dir,
        data={"train_files": [str(data)], "max_prompt_length": 64},
        rollout={"n": 2, "response_length": 6},
        reward={
            "function": "custom",
            "num_workers": 1,
            "custom_function": {"path": str(reward)},
            "timeout_s": 30.0,
            "max_failure_fraction": 1.0,  # failed samples are recorded, never fatal here
        },
        experiment={
            "output_dir": str(tmp_path / "run"),
            "max_steps": 2,
            "save_freq": 1,
            "trackers": ["jsonl"],
            **experiment,
        },
    )


class Train:
    """``python -m temper train CONFIG`` in its own process (signals reach it alone),
    stdout and stderr in files; ``sigint`` ``ignored``: it inherits SIGINT ignored, as a
    background job of a non-interactive shell does."""

    def __init__(self, tmp_path: Path, config: Path, sigint: str = "default") -> None:
        import os
        import signal
        import subprocess
        import sys

        self.out, self.err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}

        def start() -> None:
            if sigint == "ignored":
                signal.signal(signal.SIGINT, signal.SIG_IGN)

        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "temper", "train", str(config)],
                stdout=out,
                stderr=err,
                env=env,
                preexec_fn=start,
                start_new_session=True,  # signals to its group reach no test process
            )

    def text(self) -> tuple[str, str]:
        return self.out.read_text(errors="replace"), self.err.read_text(errors="replace")

    def wait_for(self, stream: str, needle: str, timeout: float = 240.0) -> None:
        import time

        end = time.monotonic() + timeout
        while needle not in self.text()[stream == "stderr"]:
            assert self.proc.poll() is None, f"ended before {needle!r}: {self.text()}"
            assert time.monotonic() < end, f"no {needle!r} in {timeout} s: {self.text()}"
            time.sleep(0.05)

    def finish(self, timeout: float = 240.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@pytest.mark.slow
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_two_sigints_stop_at_once_in_one_line_and_keep_the_checkpoint(
    tmp_path, tiny_model_dir, sigint
):
    import signal

    from temper.checkpoint.store import checkpoint_problem

    slow = _reward(tmp_path, "time.sleep(1.5)\nreturn 1.0")  # a step of several seconds
    train = Train(tmp_path, _run_config(tmp_path, tiny_model_dir, slow, max_steps=3), sigint)
    step1 = tmp_path / "run" / "checkpoints" / "global_step_1"
    train.wait_for("stdout", f"checkpoint: {step1}")
    train.proc.send_signal(signal.SIGINT)
    train.wait_for("stderr", "SIGINT: finishing this step")
    train.proc.send_signal(signal.SIGINT)
    assert train.finish(timeout=60) == 130
    out, err = train.text()
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == (
        "interrupted: a second SIGINT stopped the run at once at step 2; the same command "
        f"resumes from {step1}"
    )
    assert checkpoint_problem(step1, verify=True) is None
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]


@pytest.mark.slow
def test_a_reward_that_signals_the_trainer_cannot_stop_the_run(tmp_path, tiny_model_dir):
    # every call sends SIGTERM to its parent and to its parent's process group: were they
    # delivered, two of them would read as the user's "stop now" and lose the step. (Not
    # kill(-1), which the shield refuses too: unshielded, it would reach every process
    # this user may signal. The trainer leads a session of its own: its group is its.)
    killer = _reward(
        tmp_path,
        """
        for target in (os.getppid(), -os.getpgid(os.getppid())):
            try:
                os.kill(target, signal.SIGTERM)
            except PermissionError:
                print(f"refused: kill({target})", file=sys.stderr)
        return 1.0
        """,
    )
    train = Train(tmp_path, _run_config(tmp_path, tiny_model_dir, killer))
    assert train.finish() == 0
    out, err = train.text()
    assert "SIGTERM" not in err and "Traceback" not in out + err
    assert "refused: kill(" in err  # the reward saw why, in its own output
    assert "done: 2 steps" in out
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train/reward_failures"] == 0.0 and r["train/score_mean"] == 1.0 for r in rows)


def test_a_reward_worker_may_not_signal_its_trainer():
    # signal 0 only asks whether the process is there: harmless to this test process
    # were it delivered, refused by the worker's shield
    from temper.rewards.executor import RewardCall, RewardExecutor
    from temper.rewards.worker import FunctionSpec

    probe = "import os\n\ndef compute_score(**_):\n    os.kill(os.getppid(), 0)\n    return 1.0\n"
    with _tmp_file(probe) as path, RewardExecutor(num_workers=1, preload=()) as executor:
        (result,) = executor.run([RewardCall(FunctionSpec("compute_score", path), {}, 30.0)])
    assert result.kind == "error"
    assert result.reason == "PermissionError: [Errno 1] Operation not permitted"
    assert executor.unshielded is None


@contextlib.contextmanager
def _tmp_file(text: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.py"
        path.write_text(text)
        yield str(path)


@pytest.mark.slow
def test_what_a_reward_prints_is_capped_per_step(tmp_path, tiny_model_dir, capfd):
    # 100 lines of 1,000 characters per call, 4 calls a step: 400 KB a step uncapped
    chatty = _reward(
        tmp_path,
        """
        for i in range(100):
            print(f"reward line {i} " + "x" * 984)
        print("a line on stderr", file=sys.stderr)
        return 1.0
        """,
    )
    assert main(["train", str(_run_config(tmp_path, tiny_model_dir, chatty))]) == 0
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    assert out.count("reward line 0 ") >= 2  # the first lines of each step are shown
    assert len(out) < 2 * 40_000 + 10_000  # a 32 KiB cap a step, and the trainer's own lines
    notes = [line for line in err.splitlines() if line.startswith("reward output: ")]
    assert len(notes) == 2, err  # one line per step
    assert notes[0].endswith(
        "more that reward functions printed in this batch of calls not shown (the first "
        "32.0 KiB of each batch are)"
    )
