"""Upstream verl and ROLL files train 2 steps on CPU, as ``temper train`` runs them.

One verl GRPO command line, one verl PPO command line with a critic, two verl 0.9 command
lines (GRPO on `model_engine: dp` and on `model_engine: megatron`), two asynchronous verl
runs (the GRPO line as ``trainer_mode=separate_async``, and a one-step-off recipe
script), two verl multi-turn configs (Search-R1's ``format: qwen``, geo3k's
``custom_chat_template``), one ROLL RLVR file (PPO with a critic), one ROLL agentic
file, ROLL's SokobanSandbox file (the game in temper's sandbox), ROLL's GiGPO Sokoban
file (step-wise env manager), its VL Sokoban file (a tiny Qwen2-VL; states as images),
agent-runner and agent-native Sokoban files, and ROLL's asynchronous RLVR and agentic
files (one-step-off), each with only these overrides:

- model: the tiny test model in place of the author's;
- data: ``task:`` data (and, for ROLL, the column that holds its prompts); for the two
  files that take 512 prompts a step, one mini-batch's worth of prompts a step instead
  (128 for verl's, 64 for ROLL's), and 2 validation episodes instead of 16 for the
  agentic one, so the suite stays fast — the mini-batch arithmetic is the file's own;
- length: short prompts, responses and (agentic) episodes, and 2 steps;
- device: one device (``n_gpus_per_node=1`` / every ``device_mapping`` on device 0; the
  asynchronous runs' rollout pool: one more device) and the rollout engine that runs on
  this CPU (``hf``, generating a batch at a time; the files
  name vLLM, whose CPU build takes a minute to start and is tested on its own);
- where outputs go.

Every other setting — batch sizes, estimators, losses, KL, clipping, optimizer — is the
file's own (the separate_async line adds that mode's settings, which verl asserts).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from upstream_command import UPSTREAM, script_command  # tests/ is on the path

from temper.cli.main import main
from temper.pipelines.catalog import load_config

TRAIN = "task:arithmetic?n=256&seed=5"
VAL = "task:arithmetic?n=8&seed=6&split=test"


def _train(config: Path, overrides: list[str], out: Path) -> list[dict]:
    assert main(["train", str(config), *overrides]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    return train


def _verl(tiny: Path, out: Path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={tiny}",  # model
        f"critic.model.path={tiny}",
        f"data.train_files={TRAIN}",  # data
        f"data.val_files={VAL}",
        "data.max_prompt_length=96",  # length
        "data.max_response_length=8",
        "trainer.total_training_steps=2",
        "trainer.n_gpus_per_node=1",  # device
        "trainer.nnodes=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={out}",  # outputs
    ]


@pytest.mark.slow
def test_verl_grpo_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl's GRPO example (2026-01) with a KL loss: 32 prompts × 4 responses a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(
        "verl-2026-01-b178a3c/examples/grpo_trainer/run_qwen2_5_7b_grpo_discrete_prof_npu.sh"
    )
    out = tmp_path / "verl-grpo"
    train = _train(config, overrides + _verl(tiny_model_dir, out), out)
    assert all("actor/kl_loss" in r or "actor/kl" in r for r in train)


@pytest.mark.slow
def test_verl_ppo_with_critic_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl's PPO example (2026-01, GAE with a critic): 512 prompts a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command("verl-2026-01-b178a3c/examples/ppo_trainer/run_gemma.sh")
    out = tmp_path / "verl-ppo"
    data = ["data.train_batch_size=128"]  # one mini-batch (ppo_mini_batch_size=128) a step
    train = _train(config, overrides + _verl(tiny_model_dir, out) + data, out)
    assert all("critic/value_loss" in r for r in train)


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    [
        "verl-2026-01-b178a3c/examples/otb_trainer/run_qwen2_5-7b.sh",
        "verl-2026-08-1dda039/examples/otb_trainer/run_qwen3_8b_fsdp.sh",
    ],
    ids=["2026-01", "2026-08"],
)
def test_verl_optimal_token_baseline_scripts_train(script, tmp_path, tiny_model_dir, monkeypatch):
    """verl's two OTB examples (optimal_token_baseline with calculate_sum_pi_squared:
    128 prompts × 8 a step, one mini-batch): the actor's log-prob pass returns Σπ², the
    estimator reads it, the policy trains."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(script)
    out = tmp_path / "verl-otb"
    cfg = load_config(config, overrides + _verl(tiny_model_dir, out)).config
    assert cfg.algorithm.adv_estimator == "optimal_token_baseline"
    assert cfg.actor.calculate_sum_pi_squared is True
    train = _train(config, overrides + _verl(tiny_model_dir, out), out)
    assert all("actor/pg_loss" in r and "train/advantage_mean" in r for r in train)


@pytest.mark.slow
def test_verl_bypass_rejection_sampling_script_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 2026-08's multi_rs example (bypass mode: the rollout's log-probs as the old
    ones, rejection sampling on top): the filters compare the current policy with the
    rollout's before each mini-batch's update, and the run trains."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(
        "verl-2026-08-1dda039/examples/rollout_correction/run_qwen2_5_7b_fsdp_multi_rs.sh"
    )
    out = tmp_path / "verl-rs"
    cfg = load_config(config, overrides + _verl(tiny_model_dir, out)).config
    assert cfg.actor.recompute_old_log_prob is False and cfg.actor.rollout_rs
    train = _train(config, overrides + _verl(tiny_model_dir, out), out)
    for r in train:
        assert 0 <= r["actor/rollout_rs_masked_fraction"] <= 1
        assert "actor/pg_loss" in r


def _roll(tiny: Path, out: Path, roles: list[str]) -> list[str]:
    return [
        f"pretrain={tiny}",  # model
        f"reward_pretrain={tiny}",
        "max_steps=2",  # length
        "prompt_length=96",
        "num_gpus_per_node=1",  # device
        *[f"{role}.device_mapping=list(range(0,1))" for role in roles],
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "track_with=stdout",
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out / 'ckpt'}",
    ]


@pytest.mark.slow
def test_roll_rlvr_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's RLVR PPO example (2026-08 docs): GAE with a critic, 512 prompts a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = UPSTREAM / "roll-2026-08-8eb27cc/examples/docs_examples/example_ppo.yaml"
    out = tmp_path / "roll-rlvr"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference", "critic"]),
        "response_length=8",
        f"actor_train.data_args.file_name=[{TRAIN}]",  # data
        "rollout_batch_size=64",  # one mini-batch (2 per device × 32 accumulation) a step
        "actor_train.data_args.messages=prompt",
        f"validation.data_args.file_name=[{VAL}]",
        "validation.data_args.messages=prompt",
    ]
    train = _train(config, overrides, out)
    assert all("critic/value_loss" in r for r in train)
    # its megatron roles ran in this process on a one-rank world the run made: the run's
    # end ends it, with Megatron's groups (a later run here starts as this one did)
    import torch.distributed as dist
    from megatron.core import parallel_state

    assert not dist.is_initialized() and not parallel_state.model_parallel_is_initialized()


@pytest.mark.slow
def test_roll_rollout_mock_dump_file_trains_and_dumps(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's RLVR rollout-dump example (2026-08, rollout_mock mode dump): it trains as
    usual and writes every step's generations under <dump_dir>/train."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM
        / "roll-2026-08-8eb27cc/examples/qwen2.5-7B-rlvr_megatron/rlvr_rollout_mock_dump.yaml"
    )
    out = tmp_path / "roll-rlvr-dump"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        "response_length=8",
        f"actor_train.data_args.file_name=[{TRAIN}]",  # data
        "actor_train.data_args.messages=prompt",
        f"validation.data_args.file_name=[{VAL}]",
        "validation.data_args.messages=prompt",
        f"rollout_mock.dump_dir={out / 'dumps'}",  # outputs
    ]
    _train(config, overrides, out)
    for step in (1, 2):
        rows = (out / "dumps" / "train" / f"{step}.jsonl").read_text().splitlines()
        assert len(rows) == 8 * 8  # rollout_batch_size prompts × 8 responses
        assert {"prompt", "response", "score", "advantage"} <= set(json.loads(rows[0]))


@pytest.mark.slow
def test_roll_agentic_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's single-node FrozenLake agentic demo (2026-08): FrozenLake episodes, scored
    per trajectory, trained with grpo (reinforce over reward_normalization)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM
        / "roll-2026-08-8eb27cc/examples/agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"
    )
    out = tmp_path / "roll-agentic"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        "max_actions_per_traj=3",  # length
        "max_tokens_per_step=16",
        "sequence_length=1024",  # the tiny model's context (the file's 4096 is Qwen's)
        "actor_infer.generating_args.max_new_tokens=16",
        "val_batch_size=2",  # data: 2 validation episodes (16 in the file)
        "actor_infer.infer_batch_size=16",  # device: generate the 16 episodes at once
        f"render_save_dir={out / 'render'}",
    ]
    train = _train(config, overrides, out)
    assert all("actor/pg_loss" in r for r in train)


@pytest.mark.slow
def test_roll_sokoban_sandbox_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's SokobanSandbox demo (2026-08): its training tag plays Sokoban in temper's
    bubblewrap sandbox (one sandboxed run per reset and step; the file's ROCK service url
    is noted), 32 episodes a step; validation plays the in-process Sokoban tags."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = UPSTREAM / "roll-2026-08-8eb27cc/examples/agentic_demo/agent_val_sokoban_sandbox.yaml"
    out = tmp_path / "roll-sokoban-sandbox"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        "max_actions_per_traj=2",  # length
        "max_tokens_per_step=16",
        "sequence_length=1024",  # the tiny model's context (the file's 4096 is Qwen's)
        "actor_infer.generating_args.max_new_tokens=16",
        "val_batch_size=2",  # data: 2 validation episodes (32 in the file)
        "actor_infer.infer_batch_size=32",  # device: generate the 32 episodes at once
        f"render_save_dir={out / 'render'}",
    ]
    loaded = load_config(config, overrides).config
    tag = loaded.agentic.custom_envs["SokobanSandbox"]
    assert (tag.env_type, tag.env_config, loaded.reward.sandbox) == ("sokoban_sandbox", {}, "bwrap")
    train = _train(config, overrides, out)
    for r in train:
        assert r["env/env_errors"] == 0  # every sandboxed run replied
        assert "env/SokobanSandbox/success_rate" in r
        assert "actor/pg_loss" in r


@pytest.mark.slow
def test_roll_async_rlvr_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's asynchronous RLVR example (2026-08, async_generation_ratio 1): one-step-off
    on Megatron, 64 prompts × 8 a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-7B-rlvr_megatron/rlvr_config_async.yaml"
    )
    out = tmp_path / "roll-rlvr-async"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        # device: one device holds no tensor-parallel pair (the file's TP is 2)
        "actor_train.strategy_args.strategy_config.tensor_model_parallel_size=1",
        "actor_train.strategy_args.strategy_config.sequence_parallel=false",
        "response_length=8",
        f"actor_train.data_args.file_name=[{TRAIN}]",  # data
        "rollout_batch_size=8",  # one mini-batch (1 per device × 64 accumulation) a step
        "actor_train.data_args.messages=prompt",
    ]
    train = _train(config, overrides, out)
    assert [r["async/policy_version"] for r in train] == [0, 0]  # batch 2: generated ahead
    assert [r["async/staleness_max"] for r in train] == [0, 1]


@pytest.mark.slow
def test_roll_async_agentic_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's asynchronous FrozenLake example (2026-08, async_generation_ratio 1): the
    episodes of step 2 are played with the weights of step 0 while step 1 trains."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM
        / "roll-2026-08-8eb27cc/examples/qwen2.5-0.5B-agentic/agent_val_frozen_lake_async.yaml"
    )
    out = tmp_path / "roll-agentic-async"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        "max_actions_per_traj=3",  # length
        "max_tokens_per_step=16",
        "sequence_length=1024",  # the tiny model's context (the file's is Qwen's)
        "actor_infer.generating_args.max_new_tokens=16",
        # data: one mini-batch (2 per device × 128 accumulation) of episodes a step, 32
        # groups of 8 (the file's 1024 are 128 groups), and one validation episode per tag
        "rollout_batch_size=256",
        "train_env_manager.num_env_groups=32",
        "train_env_manager.num_groups_partition=[32]",
        "val_batch_size=4",
        "val_env_manager.num_env_groups=4",
        "val_env_manager.num_groups_partition=[1,1,1,1]",
        "actor_infer.infer_batch_size=256",  # device: generate the episodes at once
    ]
    train = _train(config, overrides, out)
    assert [r["async/staleness_max"] for r in train] == [0, 1]
    assert all("actor/pg_loss" in r for r in train)


V0_9 = "verl-2026-08-1dda039"


@pytest.mark.slow
def test_verl_09_grpo_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 0.9's GRPO example: the V1 sync trainer, the new ``reward`` section and
    ``model_engine: dp`` (all the 2026-08 defaults), 256 prompts × 5 responses a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(f"{V0_9}/examples/grpo_trainer/run_qwen3_4b_fsdp.sh")
    out = tmp_path / "verl09-grpo"
    data = ["data.train_batch_size=256"]  # one mini-batch (ppo_mini_batch_size=256) a step
    train = _train(config, overrides + _verl(tiny_model_dir, out) + data, out)
    assert all("actor/kl_loss" in r for r in train)


@pytest.mark.slow
def test_verl_09_megatron_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 0.9's ``model_engine=megatron`` GRPO example on one device (TP = PP = 1 for
    actor and reference), 256 prompts × 5 responses a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(f"{V0_9}/examples/grpo_trainer/run_qwen3_8b_megatron.sh")
    out = tmp_path / "verl09-megatron"
    device = [
        f"actor_rollout_ref.{role}.megatron.{degree}_model_parallel_size=1"
        for role in ("actor", "ref")
        for degree in ("tensor", "pipeline")
    ]
    data = ["data.train_batch_size=256"]  # one mini-batch (ppo_mini_batch_size=256) a step
    line = overrides + _verl(tiny_model_dir, out) + device + data
    resolved = load_config(config, line).config
    assert (resolved.actor.strategy, resolved.reference.strategy) == ("megatron", "megatron")
    train = _train(config, line, out)
    assert all("actor/kl_loss" in r for r in train)


def _rollout_pool(train: list[dict]) -> None:
    """One version behind: step 1 trains on the initial weights' batch, step 2 on a batch
    generated with the initial weights while step 1 trained."""
    assert [r["async/staleness_max"] for r in train] == [0, 1]


@pytest.mark.slow
def test_verl_09_separate_async_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 0.9's GRPO example run as ``trainer.v1.trainer_mode=separate_async`` (verl's
    default num_warmup_batches 1: one version behind), with the mode's own settings —
    ``parameter_sync_step`` = train_batch_size / ppo_mini_batch_size, as verl asserts, and
    a weight-sync backend — and its rollout on a pool of its own: one device beside the
    trainer's (Ray)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(f"{V0_9}/examples/grpo_trainer/run_qwen3_4b_fsdp.sh")
    out = tmp_path / "verl09-separate-async"
    data = ["data.train_batch_size=256"]  # one mini-batch (ppo_mini_batch_size=256) a step
    mode = [
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.parameter_sync_step=1",  # 256 = 1 × 256
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    ]
    device = ["actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1"]
    line = overrides + _verl(tiny_model_dir, out) + data + mode + device
    resolved = load_config(config, line).config
    assert resolved.async_training.staleness == 1
    assert (resolved.resources.actor_train, resolved.resources.actor_infer) == ([0], [1])
    train = _train(config, line, out)
    _rollout_pool(train)


@pytest.mark.slow
def test_verl_one_step_off_script_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl's one-step-off recipe (GRPO, 2 rollout devices beside 6 trainer devices in
    the script; one beside one here), 192 prompts × 5 responses a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(
        f"{V0_9}/verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh"
    )
    out = tmp_path / "verl-one-step-off"
    data = ["data.train_batch_size=192"]  # one mini-batch (ppo_mini_batch_size=192) a step
    device = ["rollout.nnodes=1", "rollout.n_gpus_per_node=1"]
    line = overrides + _verl(tiny_model_dir, out) + data + device
    resolved = load_config(config, line).config
    assert resolved.async_training.staleness == 1 and not resolved.actor.recompute_old_log_prob
    train = _train(config, line, out)
    _rollout_pool(train)


@pytest.mark.slow
def test_verl_fully_async_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl's fully-async config (PPO with a critic, its defaults), streaming: a step is
    one push cycle of 4 mini-batch updates (trigger_parameter_sync_step 4 × require_batches
    1), staleness_threshold 0.1 at most one version behind, partial rollout continuing
    generations in 2-token segments (a quarter of the 8-token responses) with the newest
    weights. Its scripts' settings that verl asserts (hybrid_engine false, train_batch_size
    0); data: 16-prompt mini-batches (the file's 256), so a step is 64 prompts; length: 2
    steps of prompts (rollout.total_rollout_steps, which verl counts in prompts)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = UPSTREAM / V0_9 / "verl/experimental/fully_async_policy/config"
    config = config / "fully_async_ppo_trainer.yaml"
    out = tmp_path / "verl-fully-async"
    verl = [o for o in _verl(tiny_model_dir, out) if "total_training_steps" not in o]
    mode = ["actor_rollout_ref.hybrid_engine=false", "data.train_batch_size=0"]
    data = ["actor_rollout_ref.actor.ppo_mini_batch_size=16"]
    length = ["rollout.total_rollout_steps=128"]  # 2 steps of 4 × 1 × 16 prompts
    device = ["rollout.nnodes=1", "rollout.n_gpus_per_node=1"]
    line = verl + mode + data + length + device
    resolved = load_config(config, line).config
    at = resolved.async_training
    assert (at.mode, at.staleness, at.partial_rollout_segment) == ("streaming", 1, 2)
    assert (resolved.data.train_batch_size, resolved.experiment.max_steps) == (64, 2)
    assert (resolved.resources.actor_train, resolved.resources.actor_infer) == ([0], [1])
    train = _train(config, line, out)
    assert all(r["async/staleness_max"] <= at.staleness for r in train)
    assert all("async/token_staleness_mean" in r for r in train)  # partial rollout ran


@pytest.mark.slow
def test_roll_gigpo_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's GiGPO Sokoban example (2026-08): StepEnvManager, one sample per env step,
    gigpo's step groups formed on identical states, and the policy updated."""
    import torch
    from transformers import AutoModelForCausalLM

    before = {
        n: p.detach().clone()
        for n, p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()
    }
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM
        / "roll-2026-08-8eb27cc/examples/qwen2.5-0.5B-agentic/agentic_val_sokoban_gigpo.yaml"
    )
    out = tmp_path / "roll-gigpo"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        "max_actions_per_traj=2",  # length
        "max_tokens_per_step=16",
        "actor_infer.generating_args.max_new_tokens=16",
        # the tiny tokenizer spends about 800 of sequence_length's 1024 tokens on the
        # file's first prompt: no room for a window of past steps (the file's 5)
        "default_history_length=1",
        # data: one mini-batch (16 per device × 8 accumulation) of episodes a step, 16
        # groups of 8 (the file's 1024 are 128 groups), one validation episode per tag
        "rollout_batch_size=128",
        "train_env_manager.num_env_groups=16",
        "train_env_manager.num_groups_partition=[16]",
        "val_batch_size=4",
        "val_env_manager.num_env_groups=4",
        "val_env_manager.num_groups_partition=[1,1,1,1]",
        "actor_infer.infer_batch_size=128",  # device: generate the episodes at once
    ]
    loaded = load_config(config, overrides)
    assert loaded.config.agentic.env_manager == "step"
    assert loaded.config.algorithm.adv_estimator == "gigpo"
    train = _train(config, overrides, out)
    for r in train:
        assert r["env/step_samples"] >= 128  # at least one step per episode
        assert r["env/anchor_group_size_max"] > 1  # some step group has peers
        # the step level gives signal even where every episode of a group scores alike
        assert r["train/advantage_abs_max"] > 0
        assert "actor/pg_loss" in r
    after = AutoModelForCausalLM.from_pretrained(out / "final" / "actor")
    moved = [n for n, p in after.named_parameters() if not torch.equal(p, before[n])]
    assert moved, "no parameter changed"


def _moved(before: dict, after_dir: Path, loader) -> list[str]:
    import torch

    after = loader.from_pretrained(after_dir)
    return [n for n, p in after.named_parameters() if not torch.equal(p, before[n])]


def _agentic_sokoban(out: Path, context: int) -> list[str]:
    """Length and data overrides of ROLL's Sokoban agentic files (1024 episodes a step)."""
    return [
        "max_actions_per_traj=2",  # length
        "max_tokens_per_step=16",
        "actor_infer.generating_args.max_new_tokens=16",
        f"sequence_length={context}",  # the tiny model's context (the files' 8192 is Qwen's)
        # data: one mini-batch (2 per device × 64 accumulation) of episodes a step, 16
        # groups of 8 (the files' 128), one validation episode per tag
        "rollout_batch_size=128",
        "train_env_manager.num_env_groups=16",
        "train_env_manager.num_groups_partition=[16]",
        "val_batch_size=4",
        "val_env_manager.num_env_groups=4",
        "val_env_manager.num_groups_partition=[1,1,1,1]",
        "actor_infer.infer_batch_size=128",  # device: generate the episodes at once
        f"render_save_dir={out / 'render'}",  # outputs
    ]


@pytest.mark.slow
def test_roll_vl_sokoban_file_trains(tmp_path, tiny_vlm_dir, monkeypatch):
    """ROLL's VL Sokoban example (2026-08, VLTrajEnvManager): each state shown as an
    image, one sample per episode, and the policy updated. Device: the file trains on
    megatron, which has no Qwen2-VL conversion here, so actor_train runs on hf_train."""
    from transformers import AutoModelForImageTextToText

    before = {
        n: p.detach().clone()
        for n, p in AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir).named_parameters()
    }
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-vl-3B-agentic/agentic_val_sokoban.yaml"
    )
    out = tmp_path / "roll-vl-sokoban"
    overrides = [
        *_roll(tiny_vlm_dir, out, ["actor_train", "actor_infer", "reference"]),
        "actor_train.strategy_args.strategy_name=hf_train",  # device (docstring)
        "~actor_train.strategy_args.strategy_config",
        *_agentic_sokoban(out, 2048),
    ]
    assert load_config(config, overrides).config.agentic.env_manager == "vl_trajectory"
    train = _train(config, overrides, out)
    for r in train:
        assert r["rollout/images_per_episode"] > 1  # later turns show new states
        assert "actor/pg_loss" in r
    assert list((out / "render" / "step_00002").glob("SimpleSokoban_*_dialog.txt"))
    assert _moved(before, out / "final" / "actor", AutoModelForImageTextToText)


@pytest.mark.slow
def test_roll_agent_runner_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's Sokoban agent-runner example (2026-08, ProxyEnvManager + GEMRunner): the
    env instruction in the system message, one sample per episode, the policy updated."""
    from transformers import AutoModelForCausalLM

    before = {
        n: p.detach().clone()
        for n, p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()
    }
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM
        / "roll-2026-08-8eb27cc/examples/qwen2.5-0.5B-agentic/agentic_val_sokoban_agent_runner.yaml"
    )
    out = tmp_path / "roll-agent-runner"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        *_agentic_sokoban(out, 1024),
    ]
    assert load_config(config, overrides).config.agentic.env_manager == "gem_runner"
    train = _train(config, overrides, out)
    assert all("actor/pg_loss" in r for r in train)
    (dialog,) = (out / "render" / "step_00002").glob("SimpleSokoban_*_dialog.txt")
    system = dialog.read_text().split("=== user ===")[0]
    assert "You are solving the Sokoban puzzle" in system  # the instruction
    assert _moved(before, out / "final" / "actor", AutoModelForCausalLM)


@pytest.mark.slow
def test_roll_native_sokoban_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's agent-native Sokoban example (2026-08, AgentNativeStepEnvManager with
    SokobanNativeEnv): the env writes the conversation, each env step is a sample scored
    by its return-to-go (step_reinforce), the policy updated."""
    from transformers import AutoModelForCausalLM

    before = {
        n: p.detach().clone()
        for n, p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()
    }
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = (
        UPSTREAM
        / "roll-2026-08-8eb27cc/examples/qwen2.5-0.5B-agentic/agentic_val_sokoban_native.yaml"
    )
    out = tmp_path / "roll-native"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_train", "actor_infer", "reference"]),
        *_agentic_sokoban(out, 1024),
        "val_env_manager.num_groups_partition=[4]",  # data: its one validation tag
    ]
    loaded = load_config(config, overrides).config
    assert loaded.agentic.env_manager == "agent_native"
    assert loaded.agentic.step_score == "return_to_go"
    train = _train(config, overrides, out)
    for r in train:
        assert r["env/step_samples"] >= 128  # at least one step per episode
        assert "actor/pg_loss" in r
    dialogs = sorted((out / "render" / "step_00002").glob("SokobanNativeEnv_*_dialog.txt"))
    assert dialogs and "Here is the current state:" in dialogs[0].read_text()
    assert _moved(before, out / "final" / "actor", AutoModelForCausalLM)


@pytest.mark.slow
def test_roll_agentic_rollout_file_plays_episodes(tmp_path, tiny_model_dir, capsys):
    """ROLL's agentic rollout pipeline (no actor_train): ``temper generate`` plays the
    file's Sokoban env groups for max_steps, logs ROLL's val/score metrics and dumps every
    episode; ``temper train`` names the command that runs it."""
    config = (
        UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-0.5B-agentic/agentic_rollout_sokoban.yaml"
    )
    out = tmp_path / "roll-rollout"
    overrides = [
        *_roll(tiny_model_dir, out, ["actor_infer"]),
        "max_actions_per_traj=2",  # length
        "max_tokens_per_step=8",
        "actor_infer.generating_args.max_new_tokens=8",
        "sequence_length=1024",  # the tiny model's context
        "rollout_batch_size=4",  # 2 groups of 2 episodes (the file's: 64 episodes)
        "train_env_manager.num_env_groups=2",
        "train_env_manager.group_size=2",
        "train_env_manager.num_groups_partition=[2]",
        f"rollout_dump_dir={out / 'dumps'}",
    ]
    loaded = load_config(config, overrides)
    assert loaded.config.pipeline == "agentic_rollout"
    assert any("trains, validates and checkpoints nothing" in n for n in loaded.notes)
    assert main(["train", str(config), *overrides]) != 0
    assert "runs with temper generate" in capsys.readouterr().err
    assert main(["generate", str(config), *overrides]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["val/score/min"] - 1e-9 <= r["val/score/mean"] <= r["val/score/max"] + 1e-9
        assert "val/SimpleSokoban/score/mean" in r and 0 <= r["val/success_rate"] <= 1
    for step in (1, 2):
        dumped = (out / "dumps" / f"{step}.jsonl").read_text().splitlines()
        assert len(dumped) == 4


def _verl_multi_turn(rel: str, tiny: Path, out: Path, *extra: str) -> list[dict]:
    """A verl sglang_multiturn example config (256 prompts a step, one mini-batch) with
    the common overrides; its rollout names SGLang, which is not installed here:
    ``_verl``'s ``rollout.name=hf`` runs it."""
    return _train(UPSTREAM / rel, [*_verl(tiny, out), *extra], out)


@pytest.mark.slow
def test_verl_search_multiturn_config_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl's Search-R1-like multi-turn config (2026-01): ``multi_turn.format: qwen`` (tool
    results merged into one user turn), at most 2 assistant turns; no tools are named."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "verl-search"
    rel = "verl-2026-01-b178a3c/examples/sglang_multiturn/config/search_multiturn_grpo.yaml"
    train = _verl_multi_turn(rel, tiny_model_dir, out)
    assert all("tools/calls" in r for r in train)


@pytest.mark.slow
def test_verl_geo3k_multiturn_config_trains_with_its_chat_template(
    tmp_path, tiny_model_dir, monkeypatch
):
    """verl's geo3k multi-turn config (2026-01) with its ``custom_chat_template`` (Qwen2.5-VL's
    tool template, which renders text turns as ChatML with a default system message)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "verl-geo3k"
    rel = "verl-2026-01-b178a3c/examples/sglang_multiturn/config/geo3k_multiturn_grpo.yaml"
    length = "data.max_prompt_length=160"  # the template adds a default system message
    dump = f"trainer.rollout_data_dir={out / 'rollouts'}"
    cfg = load_config(UPSTREAM / rel, [*_verl(tiny_model_dir, out), length]).config
    assert cfg.data.chat_template.startswith("{% set image_count")
    _verl_multi_turn(rel, tiny_model_dir, out, length, dump)
    row = json.loads((out / "rollouts" / "1.jsonl").read_text().splitlines()[0])
    # the tiny model's own template writes no system message; the file's template does
    assert row["prompt"].startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>")


@pytest.mark.slow
def test_verl_09_veomni_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 0.9's ``model_engine=veomni`` GRPO example (VeOmni: FSDP2, parameters and
    optimizer offloaded, actor and reference), 16 prompts × 4 responses a step; it runs
    on temper's fsdp2 engine."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(f"{V0_9}/examples/grpo_trainer/run_qwen3_30b_veomni.sh")
    out = tmp_path / "verl09-veomni"
    length = ["actor_rollout_ref.rollout.max_model_len=104"]  # the script's is 10240
    line = overrides + _verl(tiny_model_dir, out) + length
    resolved = load_config(config, line).config
    assert (resolved.actor.strategy, resolved.reference.strategy) == ("fsdp2", "fsdp2")
    assert resolved.actor.fsdp.param_offload and resolved.actor.fsdp.optimizer_offload
    assert resolved.actor.optim.lr_scheduler == "cosine"  # optim/veomni.yaml's schedule
    train = _train(config, line, out)
    assert all("actor/kl_loss" in r for r in train)


@pytest.mark.slow
def test_verl_09_torchtitan_config_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 0.9's composed ``model_engine=torchtitan`` config (GRPO: TorchTitan has no value
    model), 16 prompts × 4 responses a step on temper's fsdp2 engine, with torchtitan's
    schedule (warmup counted from the update being taken, decay over its 10000 steps)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = UPSTREAM / V0_9 / "verl/trainer/config/_generated_ppo_torchtitan_trainer.yaml"
    out = tmp_path / "verl09-torchtitan"
    line = [
        *_verl(tiny_model_dir, out),
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
        "actor_rollout_ref.actor.optim.decay_type=cosine",
    ]
    resolved = load_config(config, line).config
    assert (resolved.actor.strategy, resolved.reference.strategy) == ("fsdp2", "fsdp2")
    assert resolved.actor.optim.warmup_from_one and resolved.actor.grad_clip == 1.0
    train = _train(config, line, out)
    assert [r["actor/lr"] for r in train] == pytest.approx([0.5e-6, 1e-6])
