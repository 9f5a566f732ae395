"""The verl-style and ROLL-style example configs, pointed at the tiny model, train for 2
steps unchanged apart from command-line overrides (model, data, lengths, engines) — in
one process, and scaled out on the Ray backend with CPU process slots as devices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from temper.cluster.placement import placement_rows
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TASK = "task:arithmetic?n=64&seed=5"


def run(path: Path, overrides: list[str], placement: dict | None = None) -> list[dict]:
    loaded = load_config(path, overrides)
    if placement is not None:  # what `temper check` prints, role -> (devices, ranks, engine)
        rows = placement_rows(loaded.config, loaded.plan)[1:]
        assert {r[0]: (r[1], r[3], r[5]) for r in rows} == placement
    run_pipeline(loaded.config)
    out = Path(loaded.config.experiment.output_dir)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def verl_overrides(tmp_path, tiny_model_dir) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"critic.model.path={tiny_model_dir}",
        f"data.train_files={TASK}",
        f"data.val_files={TASK}",
        "data.max_prompt_length=96",
        "data.max_response_length=12",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'verl'}",
    ]


@pytest.mark.slow
def test_verl_example_trains_two_steps(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    rows = run(EXAMPLES / "verl_gsm8k_ppo.yaml", verl_overrides(tmp_path, tiny_model_dir))
    assert [r["step"] for r in rows if "train/reward_mean" in r] == [1, 2]
    assert all("critic/value_loss" in r for r in rows if "train/reward_mean" in r)
    assert any("val/reward_mean" in r for r in rows)


def roll_overrides(tmp_path, tiny_model_dir) -> list[str]:
    return [
        f"pretrain={tiny_model_dir}",
        f"reward_pretrain={tiny_model_dir}",
        f"actor_train.data_args.file_name=[{TASK}]",
        f"validation.data_args.file_name={TASK}",
        "prompt_length=96",
        "response_length=12",
        "rollout_batch_size=4",
        "actor_train.training_args.per_device_train_batch_size=2",
        "actor_train.training_args.gradient_accumulation_steps=4",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "max_steps=2",
        "eval_steps=2",
        f"output_dir={tmp_path / 'roll'}",
    ]


@pytest.mark.slow
def test_roll_example_trains_two_steps(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    rows = run(EXAMPLES / "roll_rlvr.yaml", roll_overrides(tmp_path, tiny_model_dir))
    assert [r["step"] for r in rows if "train/reward_mean" in r] == [1, 2]
    assert all("actor/kl" in r for r in rows if "train/reward_mean" in r)


@pytest.fixture
def ray_shutdown():
    ray = pytest.importorskip("ray")
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.ray
def test_roll_example_on_ray_with_a_device_mapping_per_role(
    tmp_path, tiny_model_dir, monkeypatch, ray_shutdown
):
    """ROLL's device_mapping for every worker, 4 CPU slots: actor_train on 2 DeepSpeed
    ranks (the file's deepspeed_train with ${deepspeed_zero2}, as written), actor_infer
    and reference on one slot each."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    overrides = [
        *roll_overrides(tmp_path, tiny_model_dir),
        "num_gpus_per_node=4",
        "actor_train.device_mapping=list(range(0,2))",
        "actor_infer.device_mapping=list(range(2,3))",
        "reference.device_mapping=list(range(3,4))",
        "actor_train.training_args.gradient_accumulation_steps=2",
    ]
    placement = {
        "actor": ("0,1", "2", "deepspeed"),
        "rollout": ("2", "1", "hf"),
        "reference": ("3", "1", "torch"),
    }
    rows = run(EXAMPLES / "roll_rlvr.yaml", overrides, placement)
    assert [r["step"] for r in rows if "train/reward_mean" in r] == [1, 2]
    assert all("actor/kl" in r for r in rows if "train/reward_mean" in r)


@pytest.mark.slow
@pytest.mark.ray
def test_verl_example_on_ray_with_two_devices_per_node(
    tmp_path, tiny_model_dir, monkeypatch, ray_shutdown
):
    """verl's trainer.n_gpus_per_node=2: the hybrid engine (actor, rollout) and the critic
    colocated on 2 CPU slots, FSDP2 over both; ray_kwargs.timeline_json_file gets Ray's
    timeline of the run when the workers are released."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    timeline = tmp_path / "timeline.json"
    overrides = [
        *verl_overrides(tmp_path, tiny_model_dir),
        "trainer.n_gpus_per_node=2",
        f"+ray_kwargs.timeline_json_file={timeline}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "critic.ppo_micro_batch_size_per_gpu=1",
    ]
    placement = {
        "actor": ("0,1", "2", "fsdp2"),
        "rollout": ("0,1", "2", "hf"),
        "critic": ("0,1", "2", "fsdp2"),
    }
    rows = run(EXAMPLES / "verl_gsm8k_ppo.yaml", overrides, placement)
    assert [r["step"] for r in rows if "train/reward_mean" in r] == [1, 2]
    assert all("critic/value_loss" in r for r in rows if "train/reward_mean" in r)
    events = json.loads(timeline.read_text())
    assert any("actor" in str(e.get("name", "")) or e.get("cat") for e in events)
