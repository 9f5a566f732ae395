"""Whole runs and ``check`` with MoE models on the megatron engine: ROLL's megatron
example trains the tiny Qwen3-MoE at EP = 2 on Ray (the HF rollout following the
trainer's weights), and ``check`` refuses EP on a dense model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    return {
        "qwen3_moe": make_tiny_moe_model(tmp_path_factory.mktemp("moe-runs") / "q3", "qwen3_moe")
    }


def test_check_refuses_expert_parallelism_on_a_dense_model(tiny_path: str, moe_models) -> None:
    """``temper check``'s megatron step reads the local model's config: the ROLL example
    at EP = 2 is refused on the dense tiny Llama, naming the key, and passes on the tiny
    Qwen3-MoE."""
    from temper.config.errors import ConfigError
    from temper.pipelines.catalog import load_config
    from temper.training.megatron_check import check_megatron

    root = Path(__file__).resolve().parents[2]
    ep = {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 2}

    def loaded(path: str) -> Any:
        overrides = [
            f"pretrain={path}",
            f"reward_pretrain={path}",
            "actor_train.training_args.gradient_accumulation_steps=2",
            *(f"actor_train.strategy_args.strategy_config.{k}={v}" for k, v in ep.items()),
            *(f"reference.strategy_args.strategy_config.{k}={v}" for k, v in ep.items()),
        ]
        return load_config(root / "examples" / "roll_megatron.yaml", overrides)

    dense = loaded(tiny_path)
    with pytest.raises(ConfigError) as err:
        check_megatron(dense.config, dense.plan, "cpu")
    assert err.value.key == "actor.megatron.expert_model_parallel_size"
    assert "dense" in err.value.reason
    moe = loaded(moe_models["qwen3_moe"])
    check_megatron(moe.config, moe.plan, "cpu")


# ----------------------------------------------------------------------- a whole run


@pytest.mark.ray
def test_roll_megatron_example_trains_an_moe_model_with_expert_parallelism(
    tmp_path, moe_models, monkeypatch, ray_session
):
    """examples/roll_megatron.yaml on the tiny Qwen3-MoE with the actor and reference at
    TP = 1, EP = 2 (each rank two of the four experts) and the auxiliary loss on: 2 GRPO
    steps on Ray; the HF rollout's log-probs equal the trainer's (experts gathered from
    both EP ranks and synced into transformers' fused expert tensors every step); every
    tensor of the final HF directory moved."""
    from safetensors.torch import load_file

    from temper.pipelines import run_pipeline
    from temper.pipelines.catalog import load_config

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    path = moe_models["qwen3_moe"]
    task = "task:arithmetic?n=64&seed=5"
    out = tmp_path / "roll-moe"
    ep = {"tensor_model_parallel_size": 1, "expert_model_parallel_size": 2}
    overrides = [
        f"pretrain={path}",
        f"reward_pretrain={path}",
        f"actor_train.data_args.file_name=[{task}]",
        f"validation.data_args.file_name={task}",
        "prompt_length=96",
        "response_length=12",
        "rollout_batch_size=2",
        "actor_train.training_args.per_device_train_batch_size=2",
        "actor_train.training_args.gradient_accumulation_steps=2",  # × DP 2
        "max_steps=2",
        "eval_steps=2",
        f"output_dir={out}",
        "actor_train.model_args.dtype=fp32",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "+actor_train.strategy_args.strategy_config.moe_aux_loss_coeff=0.01",
        # the math rule scores a tiny random model 0 almost everywhere (no GRPO gradient):
        # an entropy bonus gives every expert a gradient whatever the seed's rewards
        "entropy_loss_coef=0.01",
        *(f"actor_train.strategy_args.strategy_config.{k}={v}" for k, v in ep.items()),
        *(f"reference.strategy_args.strategy_config.{k}={v}" for k, v in ep.items()),
    ]
    root = Path(__file__).resolve().parents[2]
    loaded = load_config(root / "examples" / "roll_megatron.yaml", overrides)
    assert loaded.config.actor.megatron.expert_model_parallel_size == 2
    assert loaded.config.actor.megatron.extra["moe_aux_loss_coeff"] == 0.01
    run_pipeline(loaded.config)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in train)
    before = load_file(str(Path(path) / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))
    assert set(after) == set(before)
    assert all(not torch.equal(before[k], after[k]) for k in after)
