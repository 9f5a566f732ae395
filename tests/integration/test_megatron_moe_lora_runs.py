"""A whole run of LoRA on a mixture-of-experts model on the megatron engine: verl
2026-08's ``tuning/lora/run_qwen3_30b_a3b_megatron.sh`` (GRPO, MoE LoRA on Megatron:
attention and every expert adapted) trains the tiny Qwen3-MoE 2 steps on one CPU device
with only model, data, length, device and output settings changed (the script's own
variables where it has them, as its user sets them).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

from temper.pipelines import run_pipeline
from temper.pipelines.catalog import load_config
from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
SNAP = UPSTREAM / "verl-2026-08-1dda039"
SCRIPT = SNAP / "examples/tuning/lora/run_qwen3_30b_a3b_megatron.sh"
TASK = "task:arithmetic?n=64&seed=5"


@pytest.fixture
def megatron_in_process():
    """The run makes a one-rank process group and Megatron's parallel state in this
    process: torn down afterwards, so later forked tests start clean."""
    yield
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_verl_moe_lora_script_trains_two_steps(tmp_path, monkeypatch, megatron_in_process):
    """2 GRPO steps: the reference is the actor with its adapters off (step 1 starts at
    the base model: no KL), the HF rollout gets the merged weights (its log-probs are the
    trainer's); the final directory holds the merged model (embedding and router as they
    were) and peft's adapter with an adapter pair per expert."""
    from safetensors.torch import load_file

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "config"))
    from upstream_scripts import script_commands

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    model = make_tiny_moe_model(tmp_path / "qwen3_moe", "qwen3_moe")
    env = {  # the script's own variables: model, lengths, batch, devices and layout
        "MODEL_PATH": model,
        "NGPUS_PER_NODE": "1",
        "MAX_PROMPT_LENGTH": "96",
        "MAX_RESPONSE_LENGTH": "12",
        "TRAIN_BATCH_SIZE": "2",
        "PPO_MINI_BATCH_SIZE": "2",
        "ACTOR_TP": "1",
        "ACTOR_PP": "1",
        "ACTOR_EP": "1",
        "ACTOR_CP": "1",
        "ROLLOUT_TP": "1",
        "VERL_USE_UV": "0",
    }
    (cmd,) = script_commands(SCRIPT, SNAP, env=env)
    out = tmp_path / "run"
    overrides = [
        *cmd.overrides,
        f"data.train_files=[{TASK}]",
        f"data.val_files=[{TASK}]",
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={out}",
    ]
    loaded = load_config(cmd.config, overrides)
    assert loaded.config.model.lora.rank == 32 and loaded.config.actor.strategy == "megatron"
    run_pipeline(loaded.config)
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/logprob_diff"] < 1e-4 for r in rows)
    assert rows[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)
    final = out / "final" / "actor"
    adapter = load_file(str(final / "lora_adapter" / "adapter_model.safetensors"))
    for e in range(4):
        assert f"base_model.model.model.layers.1.mlp.experts.{e}.down_proj.lora_B.weight" in adapter
    before = load_file(str(Path(model) / "model.safetensors"))
    after = load_file(str(final / "model.safetensors"))
    assert torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])
    assert torch.equal(
        before["model.layers.1.mlp.gate.weight"], after["model.layers.1.mlp.gate.weight"]
    )
    # the random tiny model scores 0 on every sample, so GRPO's advantages (and the
    # update) are 0: the adapters' training is test_megatron_moe_lora's
    assert set(after) == set(before)
