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
