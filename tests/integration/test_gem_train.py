"""ROLL's GEM files train 2 steps on CPU, as ``temper train`` runs them, with only model,
data, length, device and output overrides (as in ``test_upstream_train``):

- Guess-the-Number (``gem_game_guess_the_number.yaml``): StepConcatEnvManager, one sample
  per guess, step_reinforce's return-to-go scores;
- DAPO math with the Python tool (``gem_math_dapo_python_code.yaml``): the trajectory env
  manager, the tool wrapper running the model's ``<code>`` blocks in the bubblewrap
  sandbox; its dataset is a hub id this machine cannot download, so the test ships a
  tiny equivalent (the same ``prompt`` / ``solution`` columns).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from temper.cli.main import main
from temper.pipelines.catalog import load_config

GEM = (
    Path(__file__).resolve().parents[1]
    / "data/upstream/roll-2026-08-8eb27cc/examples/qwen3_agentic_gem"
)
ROLES = ["actor_train", "actor_infer", "reference"]


def _overrides(tiny: Path, out: Path, tag: str) -> list[str]:
    return [
        f"pretrain={tiny}",  # model
        f"reward_pretrain={tiny}",
        "max_steps=2",  # length
        "max_tokens_per_step=16",
        "actor_infer.generating_args.max_new_tokens=16",
        "sequence_length=1024",  # the tiny model's context
        # data: one mini-batch (2 per device × 8 accumulation) of episodes a step, and 2
        # validation episodes (the files' 128 each)
        "rollout_batch_size=16",
        "train_env_manager.num_env_groups=16",
        "train_env_manager.num_groups_partition=[16]",
        "val_batch_size=2",
        "val_env_manager.num_env_groups=2",
        "val_env_manager.num_groups_partition=[2]",
        "num_gpus_per_node=1",  # device
        *[f"{role}.device_mapping=list(range(0,1))" for role in ROLES],
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "actor_infer.infer_batch_size=16",
        "track_with=stdout",  # outputs
        f"output_dir={out}",
        f"logging_dir={out / 'logs'}",
        f"checkpoint_config.output_dir={out / 'ckpt'}",
    ]


def _train(config: Path, overrides: list[str], out: Path) -> list[dict]:
    assert main(["train", str(config), *overrides]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    return train


@pytest.mark.slow
def test_gem_guess_the_number_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = GEM / "gem_game_guess_the_number.yaml"
    out = tmp_path / "gem-game"
    overrides = [*_overrides(tiny_model_dir, out, "GuessTheNumber"), "max_actions_per_traj=2"]
    loaded = load_config(config, overrides).config
    assert loaded.agentic.env_manager == "step_concat"
    assert loaded.agentic.step_score == "return_to_go"
    train = _train(config, overrides, out)
    for r in train:
        assert r["env/step_samples"] >= 16  # at least one guess per episode
        assert "actor/pg_loss" in r


@pytest.mark.slow
def test_gem_math_python_tool_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "dapo_tiny.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "solution": str(a + b)} for a, b in [(2, 3), (7, 5)]]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    config = GEM / "gem_math_dapo_python_code.yaml"
    out = tmp_path / "gem-math"
    overrides = [
        *_overrides(tiny_model_dir, out, "dapo_17k_with_python_code"),
        f"gem_math.dapo_17k_with_python_code.env_config.dataset_name={data}",  # data
        "max_actions_per_traj=2",  # length
        "prompt_length=512",
    ]
    loaded = load_config(config, overrides).config
    wrapper = loaded.agentic.custom_envs["dapo_17k_with_python_code"].tool_wrapper
    assert wrapper.tools["python_code"]["sandbox"] == "bwrap"
    train = _train(config, overrides, out)
    assert all("actor/pg_loss" in r for r in train)
