"""Whole runs with the actor on DeepSpeed: GRPO on two ZeRO-3 ranks (Ray) whose rollout
engine samples with the trained weights; a ZeRO-3 + CPU offload run on the local
backend (one rank) killed after step 2's checkpoint and resumed equals the run that was
never interrupted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from killed_runs import kill_at, metric_rows, start_train  # tests/ is on the path
from safetensors.torch import load_file

from temper.pipelines.catalog import build_config

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

# differs between any two responses, so GRPO advantages are never all 0
REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return (sum(map(ord, solution_str)) % 101) / 100
"""


def grpo_config(tmp: Path, model_dir: Path, zero: dict[str, Any], **over: Any) -> dict:
    """A tiny GRPO run, 3 steps, a checkpoint at step 2; ``over`` replaces sections."""
    reward_file = tmp / "reward.py"
    reward_file.write_text(REWARD)
    cfg: dict[str, Any] = {
        "experiment": {
            "output_dir": str(tmp / "run"),
            "max_steps": 3,
            "save_freq": 2,
            "seed": 1,
            "device": "cpu",
            "trackers": ["jsonl"],
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=16&seed=3"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"engine": "hf", "n": 2, "response_length": 8},
        "actor": {
            "strategy": "deepspeed",
            "mini_batch_size": 4,
            "micro_batch_size_per_device": 2,
            "optim": {"lr": 3e-3, "weight_decay": 0.0},
            "deepspeed": {"zero_optimization": zero},
        },
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {
            "function": "custom",
            "custom_function": {"path": str(reward_file)},
            "num_workers": 1,
        },
    }
    cfg.update(over)
    return cfg


def comparable(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))}
        for r in metric_rows(run)
    ]


def test_grpo_on_two_zero3_ranks_syncs_the_trained_weights(tmp_path, tiny_model_dir, monkeypatch):
    """actor_train on 2 ZeRO-3 ranks (one DeepSpeed group), actor_infer on a device of
    its own: after every step the gathered weights reach the rollout engine, whose
    log-probs then match the trainer's recompute on the same tokens."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    from temper.cluster.placement import placement_rows
    from temper.pipelines import run_pipeline
    from temper.pipelines.catalog import plan

    resources = {
        "backend": "ray",
        "devices_per_node": 3,
        "actor_train": [0, 1],
        "actor_infer": [2],
        "ray": {"num_cpus": 3, "rpc_timeout": 300},
    }
    zero3 = {"stage": 3, "stage3_param_persistence_threshold": "auto"}
    cfg = build_config(grpo_config(tmp_path, tiny_model_dir, zero3, resources=resources))
    placed = {r[0]: (r[1], r[3], r[5]) for r in placement_rows(cfg, plan(cfg))[1:]}
    assert placed == {"actor": ("0,1", "2", "deepspeed"), "rollout": ("2", "1", "hf")}
    try:
        run_pipeline(cfg)
    finally:
        ray.shutdown()
    got = metric_rows(tmp_path / "run")
    assert [r["step"] for r in got] == [1, 2, 3]
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in got), [
        r["rollout/logprob_diff"] for r in got
    ]
    assert all(r["actor/grad_norm"] > 0 for r in got)
    before = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor").state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in before)
    engine = tmp_path / "run" / "checkpoints" / "global_step_2" / "actor_train" / "engine"
    partitions = sorted(p.name for p in (engine / "deepspeed").glob("*optim_states.pt"))
    assert len(partitions) == 2, partitions  # one ZeRO partition per rank


def test_sigkill_after_step2_checkpoint_then_resume_equals_uninterrupted(
    tmp_path, tiny_model_dir, monkeypatch
):
    """ZeRO-3 with optimizer and parameter offload on the local backend (DeepSpeed with
    world size 1, not the torch engine): the resumed run's weights and metrics rows are
    bit-identical to the uninterrupted run's."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.pipelines import run_pipeline

    offload = {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu"},
    }
    cfg = grpo_config(tmp_path, tiny_model_dir, offload)

    def at(out: Path) -> dict:
        return {**cfg, "experiment": {**cfg["experiment"], "output_dir": str(out)}}

    killed = tmp_path / "killed"
    proc, log = start_train(at(killed), "killed", tmp_path)
    kill_at(killed / "checkpoints/global_step_2/manifest.json", proc, log)
    assert not (killed / "final").exists()

    full = tmp_path / "full"
    run_pipeline(build_config(at(full)))
    summary = run_pipeline(build_config(at(killed)))  # resume_mode auto: from global_step_2
    assert summary["steps"] == 3
    wa = load_file(str(full / "final" / "actor" / "model.safetensors"))
    wb = load_file(str(killed / "final" / "actor" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert [r["step"] for r in metric_rows(full)] == [1, 2, 3]
    assert comparable(full) == comparable(killed)


UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"  # in-repo copies
AGENTIC_2025_06 = (
    UPSTREAM / "roll-2025-06-70e9c6c/examples/qwen2.5-0.5B-agentic_ds/agentic_val_sokoban.yaml"
)


@pytest.mark.vllm
@pytest.mark.skipif(not AGENTIC_2025_06.is_file(), reason=f"no {AGENTIC_2025_06}")
def test_upstream_roll_agentic_file_trains_two_steps_on_deepspeed(tmp_path, monkeypatch):
    """ROLL's own agentic Sokoban file (2025-06): deepspeed_train with ${deepspeed_zero2},
    vLLM rollouts, as written. Overrides: the model (a tiny one whose head size vLLM's CPU
    build supports; sdpa, as FlashAttention-2 needs a GPU), the data and lengths (4
    episodes of 2 turns), this machine (1 device for 8) and where outputs go (the file
    writes under /data/oss_bucket_0)."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from temper.pipelines import run_pipeline
    from temper.pipelines.catalog import load_config
    from temper.utils.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "tiny128", hidden_size=128, seed=3)  # head size 32
    out = tmp_path / "out"
    overrides = [
        # the model
        f"pretrain={model}",
        f"reward_pretrain={model}",
        *(f"{w}.model_args.flash_attn=sdpa" for w in ("actor_train", "actor_infer", "reference")),
        # the data: 4 episodes a step, one optimizer step
        "rollout_batch_size=4",
        "val_batch_size=4",
        "train_env_manager.env_groups=4",
        "train_env_manager.n_groups=[4]",
        "val_env_manager.env_groups=4",
        "val_env_manager.n_groups=[1,1,1,1]",
        "actor_train.training_args.gradient_accumulation_steps=2",
        # the lengths
        "max_steps=2",
        "prompt_length=512",
        "sequence_length=1024",
        "max_actions_per_traj=2",
        "actor_infer.generating_args.max_new_tokens=8",
        # this machine: one device (the local backend) for the file's 8 GPUs
        "num_gpus_per_node=1",
        *(
            f"{w}.device_mapping=list(range(0,1))"
            for w in ("actor_train", "actor_infer", "reference")
        ),
        # outputs
        f"output_dir={out}",
        f"logging_dir={tmp_path / 'logs'}",
        f"render_save_dir={tmp_path / 'render'}",
        f"tracker_kwargs.log_dir={tmp_path / 'tb'}",
    ]
    cfg = load_config(AGENTIC_2025_06, overrides).config
    assert cfg.actor.strategy == "deepspeed" and cfg.rollout.engine == "vllm"
    assert cfg.actor.deepspeed["zero_optimization"]["stage"] == 2
    summary = run_pipeline(cfg)
    assert summary["steps"] == 2
    train = [r for r in metric_rows(out) if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all("actor/pg_loss" in r and "actor/grad_norm" in r for r in train)
    assert (out / "final" / "actor" / "config.json").is_file()
