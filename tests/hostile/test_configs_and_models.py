"""Hostile configs and model directories: each is refused by ``temper check`` and by
``temper train`` alike, in one line naming the key (or file), the reason and the fix —
never a traceback, and never "valid" from ``check`` followed by a crash in ``train``
(``train`` must stop before the run starts: reaching the pipeline fails the test)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from temper.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VERL = str(EXAMPLES / "verl_gsm8k_ppo.yaml")
TASK = "task:arithmetic?n=16&seed=3"


@pytest.fixture
def no_run(monkeypatch):
    """``train`` must stop before the run: reaching the pipeline fails the test."""

    def run_pipeline(cfg, plan=None):
        raise AssertionError("train started a run although it should refuse the config")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)


def refused(args: list[str], capsys) -> str:
    """The one-line refusal of ``check`` and of ``train`` (the same), exit 2, no
    traceback on stderr or stdout; the message without its ``config error:`` prefix."""
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


def native(tmp_path: Path, model: Path | str, **sections) -> Path:
    """A small native RLVR config on ``model`` (sections update its defaults)."""
    data: dict = {
        "model": {"path": str(model)},
        "data": {"train_files": [TASK], "train_batch_size": 4, "max_prompt_length": 96},
        "rollout": {"n": 2, "response_length": 8},
        "experiment": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- verl units


ACTOR_MINI = "actor_rollout_ref.actor.ppo_mini_batch_size (temper: actor.mini_batch_size): "


@pytest.mark.parametrize(
    ("overrides", "start", "fix"),
    [
        # 16 prompts × n=2 per step: a mini-batch of 32 prompts is 64 samples > 32
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=32"],
            ACTOR_MINI + "64 samples per mini-batch exceed the 32 samples of a step",
            "set actor_rollout_ref.actor.ppo_mini_batch_size (in prompts: temper's samples ÷ "
            "rollout.n) ≤ 16 or raise data.train_batch_size",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=7"],
            ACTOR_MINI + "32 samples per step",
            "to a divisor of 16, e.g. 8",
        ),
        (
            ["critic.ppo_mini_batch_size=32"],
            "critic.ppo_mini_batch_size (temper: critic.mini_batch_size): ",
            "set critic.ppo_mini_batch_size (in prompts: temper's samples ÷ rollout.n) ≤ 16",
        ),
        # 4 data-parallel ranks: 2 prompts × n=2 are 4 samples, so any even count of prompts
        (
            [
                "trainer.n_gpus_per_node=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            ],
            ACTOR_MINI + "2 samples cannot be split evenly over 4 data-parallel ranks",
            "to a multiple of 2",
        ),
    ],
)
def test_verl_mini_batch_fix_counts_prompts(overrides, start, fix, capsys, no_run):
    """verl's ppo_mini_batch_size counts prompts: the fix's numbers do too (and the reason
    says what the refused value is in prompts), not the samples those prompts make."""
    msg = refused([VERL, *overrides], capsys)
    assert msg.startswith(start), msg
    assert fix in msg, msg
    assert "prompts × rollout.n 2)" in msg
    assert "≤ 32" not in msg and "divisor of 32" not in msg


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("overrides", "start"),
    [
        (
            ["experiment.trackers=[console,mlflow]"],
            "experiment.trackers: unknown value 'mlflow'. Fix: use one of: console, jsonl, "
            "tensorboard, wandb",
        ),
        (["actor.optim.lr=nan"], "actor.optim.lr: must be a finite number, got nan. Fix: "),
        (["actor.optim.lr=inf"], "actor.optim.lr: must be a finite number, got inf"),
        (["critic.optim.eps=-inf"], "critic.optim.eps: must be a finite number, got -inf"),
        (["actor.entropy_coeff=nan"], "actor.entropy_coeff: must be a finite number"),
        (["algorithm.kl_ctrl.kl_coef=inf"], "algorithm.kl_ctrl.kl_coef: must be a finite"),
        (["reward.failure_score=nan"], "reward.failure_score: must be a finite number"),
        (["actor.optim.betas=[0.9]"], "actor.optim.betas: Adam takes two betas"),
        (["actor.optim.betas=[0.9,1.0]"], "actor.optim.betas: Adam takes two betas"),
        (["actor.optim.betas=[0.9,0.99,0.999]"], "actor.optim.betas: Adam takes two betas"),
        (["actor.optim.weight_decay=-0.1"], "actor.optim.weight_decay: must be ≥ 0"),
        (["experiment.seed=-1"], "experiment.seed: -1 is not a seed numpy takes"),
        (["experiment.seed=4294967296"], "experiment.seed: 4294967296 is not a seed"),
    ],
)
def test_values_that_would_crash_train_are_refused_at_load(
    tmp_path, tiny_model_dir, overrides, start, capsys, no_run
):
    msg = refused([str(native(tmp_path, tiny_model_dir)), *overrides], capsys)
    assert msg.startswith(start), msg
    assert "Fix: " in msg


def test_unknown_tracker_in_verl_terms(capsys, no_run):
    """A verl file cannot name temper's trackers; its logger list is checked by its own
    table, in its own key."""
    msg = refused([VERL, "trainer.logger=[console,mlflow]"], capsys)
    assert msg.startswith("trainer.logger: logger 'mlflow' is not supported")


def test_nan_lr_in_verl_terms(capsys, no_run):
    msg = refused([VERL, "actor_rollout_ref.actor.optim.lr=nan"], capsys)
    assert msg.startswith(
        "actor_rollout_ref.actor.optim.lr (temper: actor.optim.lr): must be a finite number"
    )


# --------------------------------------------------------------------------- config files


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"model:\n  path: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 18)"),  # Latin-1
        (bytes(range(256)) * 4, "not UTF-8 text (byte 0x80 at offset 128)"),  # binary
        (b"\x00\x01\x02model: x\n", "not valid YAML"),  # UTF-8, but no text
    ],
)
def test_a_config_file_that_is_not_text(tmp_path, content, reason, capsys, no_run):
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    msg = refused([str(path)], capsys)
    assert msg.startswith(f"{path}: {reason}"), msg


def test_a_defaults_file_that_is_not_text(tmp_path, tiny_model_dir, capsys, no_run):
    (tmp_path / "base.yaml").write_bytes(b"data:\n  prompt_key: caf\xe9\n")
    top = tmp_path / "top.yaml"
    top.write_text(f"defaults:\n  - base\n  - _self_\nmodel:\n  path: {tiny_model_dir}\n")
    msg = refused([str(top)], capsys)
    assert msg.startswith(f"{tmp_path / 'base.yaml'}: not UTF-8 text"), msg
