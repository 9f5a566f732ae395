"""Issue 12's list, one test each: keys of the verl and ROLL versions users pin, Hydra's
composition and override grammar, pipelines temper has no loop for, and fixes written in
the dialect of the file they fix. Refusals are asserted as the one line ``temper check``
and ``temper train`` print (both load the config the same way; the CLI tests show it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference_paths import UPSTREAM  # next to this file

from temper.algorithms import grouped_reward_normalization
from temper.config import ConfigError
from temper.config.loader import load_yaml
from temper.data.sampler import domains_of
from temper.pipelines.catalog import load_config

V0625 = UPSTREAM / "verl-2025-06-38d9a88"
V2601 = UPSTREAM / "verl-2026-01-b178a3c"
R2508 = UPSTREAM / "roll-2026-08-8eb27cc/examples"
R0 = UPSTREAM / "roll-v0"
FLAT = UPSTREAM / "verl-0.8/ppo_trainer_flat.yaml"


def load(path: Path, *overrides: str):
    return load_config(path, list(overrides))


def refusal(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load(path, *overrides)
    text = str(err.value)
    assert "\n" not in text
    return text


def noted(loaded, key: str) -> bool:
    return any(key in note for note in loaded.notes)


# ------------------------------------------------------------------ verl versions


@pytest.mark.parametrize(
    "override, key",
    [
        ("+actor_rollout_ref.actor.tis_imp_ratio_cap=-1", "tis_imp_ratio_cap"),
        ("+actor_rollout_ref.ref.model=null", "actor_rollout_ref.ref.model"),
        ("trainer.resume_from_path=False", None),
        ("+trainer.remove_previous_ckpt_in_save=False", "remove_previous_ckpt_in_save"),
    ],
)
def test_verl_keys_of_other_versions_at_inert_values(override, key):
    loaded = load(FLAT, override)
    assert loaded.config.experiment.resume_from_path is None
    assert key is None or noted(loaded, key)


def test_weight_sync_bucket_size_is_honoured_in_either_verl_spelling():
    """verl's bucket size (before and after it moved under checkpoint_engine) sets the
    vLLM engine's weight-sync bucket."""
    old = load(
        FLAT,
        "~actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes",
        "+actor_rollout_ref.rollout.update_weights_bucket_megabytes=512",
    )
    assert old.config.rollout.update_weights_bucket_megabytes == 512
    new = load(
        FLAT, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=64"
    )
    assert new.config.rollout.update_weights_bucket_megabytes == 64


def test_verl_renamed_keys_map_to_their_new_meaning():
    cfg = load(
        FLAT,
        "~trainer.log_val_generations",  # as in a verl version that has only the old name
        "+trainer.val_generations_to_log_to_wandb=7",
        "+actor_rollout_ref.actor.tis_imp_ratio_cap=2.5",
        "+trainer.remove_previous_ckpt_in_save=True",
        "+actor_rollout_ref.actor.checkpoint.contents=[model,optimizer,extra,hf_model]",
        "~actor_rollout_ref.actor.checkpoint.load_contents",
        "~actor_rollout_ref.actor.checkpoint.save_contents",
    ).config
    assert cfg.experiment.log_val_generations == 7
    assert (cfg.actor.rollout_is, cfg.actor.rollout_is_threshold) == ("token", 2.5)
    assert cfg.experiment.max_actor_ckpt_to_keep == 1
    assert cfg.actor.checkpoint_contents == ["model", "optimizer", "extra", "hf_model"]


def test_tis_cap_no_longer_suggests_clip_ratio_c():
    """The hint used to send the user to clip_ratio_c; the key is known now, and a real
    typo still gets its did-you-mean."""
    assert "clip_ratio_c" not in str(
        load(FLAT, "+actor_rollout_ref.actor.tis_imp_ratio_cap=-1").notes
    )
    msg = refusal(FLAT, "+actor_rollout_ref.actor.tis_imp_ratio_cpa=2")
    assert msg.startswith("actor_rollout_ref.actor.tis_imp_ratio_cpa: unknown verl key")


@pytest.mark.parametrize("version", [V0625, V2601])
def test_verl_megatron_trainer_keys(version):
    """optim.optimizer adam (Megatron's, decoupled weight decay = AdamW), the Megatron lr
    schedule, gradient_checkpointing_kwargs and the megatron sections."""
    loaded = load(
        version / "verl/trainer/config/ppo_megatron_trainer.yaml",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.lr_decay_style=cosine",
        "actor_rollout_ref.actor.optim.lr_decay_steps=100",
        "actor_rollout_ref.actor.optim.min_lr=1e-7",
    )
    optim = loaded.config.actor.optim
    assert optim.optimizer == "adamw" and optim.lr_scheduler == "cosine"
    assert optim.total_training_steps == 100
    assert optim.min_lr_ratio == pytest.approx(0.1)
    assert loaded.config.actor.strategy == "megatron"
    assert noted(loaded, "gradient_checkpointing_kwargs") or version == V2601
    assert noted(loaded, "actor_rollout_ref.actor.megatron")


def test_hydra_searchpath_of_the_multiturn_example_and_the_dapo_recipe(tmp_path, monkeypatch):
    """defaults: [ppo_trainer] found through hydra.searchpath (file://verl/trainer/config,
    relative to a verl checkout's root), from any working directory."""
    monkeypatch.chdir(tmp_path)
    for path in (
        V2601 / "examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml",
        V0625 / "recipe/dapo/config/dapo_trainer.yaml",
    ):
        raw = load_yaml(path)
        assert "actor_rollout_ref" in raw.data and "trainer" in raw.data
        assert any(
            "hydra.searchpath: 'file://verl/trainer/config' found at" in n for n in raw.notes
        )
    assert load_yaml(V2601 / "examples/sglang_multiturn/config/gsm8k_multiturn_grpo.yaml").data[
        "actor_rollout_ref"
    ]["rollout"]["multi_turn"]["enable"]


def test_reward_kwargs_configure_the_overlong_buffer():
    cfg = load(
        V0625 / "verl/trainer/config/ppo_trainer.yaml",
        "data.max_response_length=512",
        "reward_model.reward_manager=dapo",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=128",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
        "+reward_model.reward_kwargs.max_resp_len=512",
    ).config
    ob = cfg.algorithm.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 128, 1.0)
    msg = refusal(
        V0625 / "verl/trainer/config/ppo_trainer.yaml",
        "data.max_response_length=512",
        "+reward_model.reward_kwargs.max_resp_len=1024",
    )
    assert msg.startswith("reward_model.reward_kwargs.max_resp_len: 1024 differs")


def test_hydra_dict_and_list_literals():
    cfg = load(
        FLAT,
        "actor_rollout_ref.model.override_config={max_position_embeddings:32768}",
        "trainer.logger=[console,wandb]",
    ).config
    assert cfg.model.override_config == {"max_position_embeddings": 32768}
    assert cfg.experiment.trackers == ["console", "wandb", "jsonl"]


def test_seq_classification_reward_model_served_by_vllm():
    """verl's reward loop serves a sequence classifier with rollout.name; it is not a
    generative reward model (that needs a custom reward function prompting it)."""
    loaded = load(
        FLAT,
        "reward_model.enable=True",
        "reward_model.model.path=/rm",
        "reward_model.rollout.name=vllm",
    )
    assert loaded.config.reward.model.enable and loaded.config.reward.model.path == "/rm"
    assert any(
        "sequence-classification reward model is scored in process" in n for n in loaded.notes
    )
    msg = refusal(
        FLAT,
        "reward_model.enable=True",
        "reward_model.rollout.name=vllm",
        "custom_reward_function.path=/f.py",
    )
    assert msg.startswith(
        "reward_model.rollout.name: a generative reward model (the served model prompted by "
        "custom_reward_function) is not supported"
    )


def test_fix_hints_are_in_the_files_dialect():
    """A verl file's fix names verl keys: 'resources.backend=local' was refused as an
    unknown verl key when the user followed it."""
    msg = refusal(
        FLAT,
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_type=full",
    )
    assert msg.startswith("actor_rollout_ref.actor.kl_loss_type (temper: actor.kl_loss_type)")
    fix = msg.split("Fix: ")[1]
    assert "resources.backend" not in fix and "trainer.n_gpus_per_node=1" in fix


def test_roll_rollout_files_are_the_agentic_rollout_pipeline_or_named(tmp_path):
    """ROLL's agentic rollout file plays episodes (pipeline agentic_rollout); an RLVR file
    without actor_train is a rollout-only run temper has no loop for."""
    loaded = load(R2508 / "qwen2.5-0.5B-agentic/agentic_rollout_sokoban.yaml")
    assert loaded.config.pipeline == "agentic_rollout"
    rlvr = tmp_path / "rlvr_rollout.yaml"
    rlvr.write_text("pretrain: /m\nactor_infer:\n  generating_args: {max_new_tokens: 8}\n")
    msg = refusal(rlvr)
    assert msg.startswith("actor_infer: this is a ROLL RLVR rollout pipeline")


def test_spin_recipe_is_the_spin_pipeline():
    """verl's SPIN file: online DPO with its β, loss and refresh cadence; the algorithm
    section its trainer never reads is noted, not translated; one optimizer step a step."""
    loaded = load(
        V0625 / "recipe/spin/config/spin_trainer.yaml",
        "+algorithm.dpo_loss_type=ipo",
        "trainer.ref_update_freq=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    )
    cfg = loaded.config
    assert cfg.pipeline == "spin"
    assert (cfg.spin.beta, cfg.spin.loss_type, cfg.spin.ref_update_freq) == (0.1, "ipo", 3)
    assert cfg.actor.mini_batch_size is None and cfg.actor.ppo_epochs == 1
    assert noted(loaded, "verl's SPIN trainer ranks responses by their reward")
    assert noted(loaded, "one optimizer step over all of a step's pairs")
    assert cfg.algorithm.adv_estimator == "grpo"  # the temper default: nothing read it
    # a reference that verl never refreshes (freq <= 0) is a fixed one here
    assert (
        load(
            V0625 / "recipe/spin/config/spin_trainer.yaml", "trainer.ref_update_freq=-1"
        ).config.spin.ref_update_freq
        == 0
    )


def test_prime_recipe_is_the_prime_pipeline():
    """verl's PRIME file: its reward_model section is the implicit PRM (prime.prm), its
    data filters and estimator weights the prime section; the algorithm and critic
    sections its trainer never reads are noted, not translated."""
    loaded = load(
        V0625 / "recipe/prime/config/prime_trainer.yaml",
        "reward_model.model.path=/models/prm",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "reward_model.prime_granularity=whole",
        "reward_model.model.update=after",
    )
    cfg, p = loaded.config, loaded.config.prime
    assert cfg.pipeline == "prime" and not cfg.reward.model.enable
    assert (p.filter_accuracy, p.accuracy_lower_bound, p.accuracy_upper_bound) == (True, 0.2, 0.8)
    assert (p.oversample_factor, p.filter_truncate) == (4.0, True)
    assert (p.granularity, p.norm, p.reward_dpo_coef, p.reward_gt_coef) == (
        "whole",
        "batch_norm",
        5.0,
        5.0,
    )
    prm = p.prm
    assert (prm.model_path, prm.ref_path) == ("/models/prm", "/models/prm")  # ${…path}
    assert (prm.beta_train, prm.loss_type, prm.update) == (0.05, "ce", "after")
    assert (prm.optim.lr, prm.optim.weight_decay, prm.grad_clip) == (1e-6, 0.0, 10.0)
    assert prm.mini_batch_size == 16  # ${actor ppo_mini_batch_size}, samples to the PRM
    assert cfg.reward.reward_manager == "naive"
    assert noted(loaded, "verl's PRIME trainer computes RLOO advantages per reward source")
    assert noted(loaded, "the PRIME recipe's reward model is its implicit PRM")
    assert cfg.algorithm.adv_estimator == "grpo"  # the temper default: nothing read it
    assert loaded.plan.use_prm and not loaded.plan.use_critic
    msg = refusal(
        V0625 / "recipe/prime/config/prime_trainer.yaml", "reward_model.model.ref_type=ema"
    )
    assert msg.startswith("reward_model.model.ref_type: only a frozen PRM reference")
    msg = refusal(V0625 / "recipe/prime/config/prime_trainer.yaml", "actor_rollout_ref.rollout.n=1")
    assert "leave-one-out baselines need 2 or more responses" in msg


def test_rollout_mock_dump_files_train_and_write_their_generations():
    """ROLL's rollout_mock dump mode trains as usual and writes every step's batch: here
    the generation dumps under <dump_dir>/train and /val; replaying a dump is refused."""
    loaded = load(R2508 / "qwen2.5-7B-rlvr_megatron/rlvr_rollout_mock_dump.yaml")
    exp = loaded.config.experiment
    assert loaded.config.pipeline == "rlvr"
    assert exp.rollout_data_dir == "./output/rollout_dumps/rlvr_baseline_v1/train"
    assert exp.validation_data_dir == "./output/rollout_dumps/rlvr_baseline_v1/val"
    assert noted(loaded, "not ROLL's pickled DataProto")
    msg = refusal(
        R2508 / "qwen2.5-7B-rlvr_megatron/rlvr_rollout_mock_dump.yaml", "rollout_mock.mode=mock"
    )
    assert msg.startswith("rollout_mock.mode: 'mock' replays ROLL's pickled batches")
    off = load(
        R2508 / "qwen2.5-7B-rlvr_megatron/rlvr_rollout_mock_dump.yaml", "rollout_mock.enable=false"
    )
    assert off.config.experiment.rollout_data_dir is None


def test_generation_and_evaluation_configs_are_their_pipelines():
    """verl's main_generation and main_eval configs translate into generate and eval."""
    loaded = load_config(V0625 / "verl/trainer/config/generation.yaml")
    assert loaded.config.pipeline == "generate" and loaded.config.rollout.n == 5
    assert loaded.config.generate.output_path == "/opt/tiger/math_Qwen2-7B-Instruct.parquet"
    loaded = load_config(V2601 / "verl/trainer/config/evaluation.yaml")
    assert loaded.config.pipeline == "eval" and loaded.config.evaluate.response_key == "responses"
    assert loaded.config.data.ground_truth_key == "reward_model.ground_truth"


def test_sft_configs_are_the_sft_pipeline():
    """verl's and ROLL's SFT configs translate (tests/unit/config/test_sft_dialects.py has
    their keys); the pre-flight refuses the ROLL megatron one for its pipeline parallelism."""
    loaded = load_config(V2601 / "verl/trainer/config/sft_trainer.yaml")
    assert loaded.config.pipeline == "sft" and loaded.dialect == "verl"
    loaded = load_config(R2508 / "qwen2.5-7B-sft_megatron/sft_config.yaml")
    assert loaded.config.pipeline == "sft" and loaded.dialect == "roll"
    assert loaded.config.actor.megatron.pipeline_model_parallel_size == 2


def test_reward_fl_is_named(tmp_path):
    path = tmp_path / "reward_fl.yaml"
    path.write_text(
        "exp_name: wan\ntrain_batch_size: 8\nactor_train:\n  model_args:\n"
        "    model_type: diffusion_module\n"
    )
    assert refusal(path).startswith(
        "actor_train.model_args.model_type: this is a ROLL Reward-FL pipeline config"
    )


def test_roll_dpo_file_is_the_dpo_pipeline():
    """ROLL's DPO file translates (tests/unit/config/test_dpo_dialect.py has its keys): the
    loss, the pair's columns, ROLL's instruction prompt, pairs per step over its 8
    devices, micro-batches of pairs as twice the rows, the megatron engines."""
    loaded = load_config(R2508 / "dpo_examples/qwen2.5-3B_dpo_megatron.yaml")
    cfg = loaded.config
    assert cfg.pipeline == "dpo" and loaded.dialect == "roll"
    assert (cfg.dpo.loss_type, cfg.dpo.beta, cfg.dpo.label_smoothing) == ("sigmoid", 0.1, 0.0)
    assert (cfg.dpo.chosen_key, cfg.dpo.rejected_key) == ("chosen", "rejected")
    assert cfg.data.prompt_key == "instruction" and cfg.dpo.max_length == 512
    assert cfg.data.train_batch_size == 16 * 1 * 8  # per device × accumulation × dp
    assert cfg.actor.micro_batch_size_per_device == 32  # 16 pairs
    assert cfg.reference.log_prob_micro_batch_size_per_device == 16  # 8 pairs
    assert cfg.actor.strategy == "megatron" and cfg.reference.strategy == "megatron"
    assert cfg.experiment.max_steps == 500


# ------------------------------------------------------------------ ROLL versions


def test_roll_2026_agentic_example_keys_are_honoured():
    """max_tokens_per_step (a top-level value the defaults fragment interpolates, and each
    tag's), the env templates, attn_implementation, reward_normalization's norm types."""
    cfg = load(
        R2508 / "qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml",
        "+reward_normalization.norm_mean_type=group",  # as agentic_val_sokoban_native.yaml
        "+reward_normalization.norm_std_type=batch",
    ).config
    norm = cfg.agentic.reward_normalization
    assert (norm.norm_mean_type, norm.norm_std_type) == ("group", "batch")
    sokoban = cfg.agentic.custom_envs["SimpleSokoban"]
    # ROLL's TrajEnvManager generates min(max_tokens_per_step, max_new_tokens) per turn
    assert sokoban.max_tokens_per_turn == 64 and sokoban.max_turns == 10
    assert sokoban.system_template.startswith("You're a helpful assistant.")
    assert "{observation}" in sokoban.turn_template
    assert cfg.model.attn_implementation == "flash_attention_2"


def test_roll_top_level_max_tokens_per_step_is_a_definition():
    """Removing it (the old hint) breaks ROLL's own fragment, which interpolates it."""
    path = R2508 / "qwen2.5-0.5B-agentic/agentic_val_sokoban.yaml"
    assert "max_tokens_per_step" in load_yaml(path).referenced
    load(path, "max_tokens_per_step=32")


def test_roll_rlvr_norm_types():
    path = R2508 / "docs_examples/example_ppo.yaml"
    for mean, std, expected in [
        ("batch", "batch", ("batch", False, False)),
        ("group", "null", ("group", True, False)),
        ("null", "running", ("running", False, True)),
    ]:
        cfg = load(
            path,
            "~reward_norm",
            "~reward_shift",
            "~reward_scale",
            f"+norm_mean_type={mean}",
            f"+norm_std_type={std}",
        ).config
        algo = cfg.algorithm
        assert (algo.reward_norm, algo.reward_shift, algo.reward_scale) == expected
    msg = refusal(path, "~reward_norm", "+norm_mean_type=group", "+norm_std_type=batch")
    assert msg.startswith("norm_std_type: a mean from 'group' with a std from 'batch'")


def test_roll_webshop_env_settings_known_and_env_refused_by_name():
    msg = refusal(R2508 / "qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml")
    assert "custom_envs.WebShopEnv" in msg
    assert "unknown ROLL key" not in msg


def test_roll_attn_implementation_and_lora_model_args():
    cfg = load(R2508 / "qwen2.5-0.5B-agentic/agentic_val_sokoban_lora.yaml").config
    assert cfg.model.lora.rank == 32 and cfg.model.lora.alpha == 32
    assert cfg.model.attn_implementation == "flash_attention_2"


def test_domain_interleave_probs_weights_reward_domains():
    """The keys of domain_interleave_probs are reward domains (rewards.<name>), whose
    tag_included lists their tags — not data tags; a row in no domain is math_rule's."""
    drop = [
        op
        for name in ("ifeval", "code_sandbox", "llm_judge")
        for op in (f"~rewards.{name}", f"actor_train.data_args.domain_interleave_probs.{name}=0")
    ]
    cfg = load(R0 / "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml", *drop).config
    assert cfg.data.source_domains["math_rule"] == ["deepmath_103k", "aime"]
    assert cfg.data.source_default_domain == "math_rule"
    assert set(cfg.data.source_weights) == {
        "math_rule",
        "crossthinkqa",
        "ifeval",
        "code_sandbox",
        "llm_judge",
    }
    tags = ["deepmath_103k", "arithmetic", "crossthinkqa"]
    assert domains_of(tags, cfg.data.source_domains, "math_rule") == [
        "math_rule",
        "math_rule",
        "crossthinkqa",
    ]


def test_critic_model_type_trl():
    """ROLL's PPO example builds its critic as trl's causal LM with a value head."""
    path = R2508 / "docs_examples/example_ppo.yaml"
    assert load_yaml(path).data["critic"]["model_args"]["model_type"] == "trl"
    cfg = load(path).config
    assert cfg.critic.enable is not False
    msg = refusal(R2508 / "docs_examples/example_ppo.yaml", "critic.model_args.model_type=rm")
    assert msg.startswith("critic.model_args.model_type: temper's critic is a causal LM")
    assert "(got 'rm'). Fix: remove critic.model_args.model_type, or set it to trl" in msg


# ------------------------------------------------------------------ honoured in code


def test_typed_group_normalization():
    """ROLL's agentic_reward_norm: mean from the group, std from the batch."""
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0])
    groups = ["a", "a", "b", "b"]
    out = grouped_reward_normalization(
        scores, groups, "identity", mean_type="group", std_type="batch"
    )
    std = scores.std()
    expected = torch.tensor([0.5, -0.5, 0.0, 0.0]) / (std + 1e-6)
    assert torch.allclose(out, expected)
    out = grouped_reward_normalization(scores, groups, "mean_std", mean_type="batch")
    assert torch.allclose(out, scores - scores.mean())


def test_env_turn_template_renders_roll_fields():
    from temper.config.schema import EnvManagerConfig, EnvTagConfig
    from temper.envs.manager import EnvManager

    tag = EnvTagConfig(
        env_type="frozen_lake",
        max_turns=4,
        max_tokens_per_turn=32,
        system_template="You play.",
        turn_template="Turn {turn_idx}: {observation} ({actions_left} left, {max_response_length} tokens) {unknown}",
    )
    mgr = EnvManager(
        EnvManagerConfig(num_env_groups=1, group_size=1, tags=["FL"]), {"FL": tag}, seed=0
    )
    (slot,) = mgr.reset(step=0)
    text = mgr.turn_text(slot.env_id, "OBS")
    assert text == "Turn 1: OBS (4 left, 32 tokens) {unknown}"
    assert mgr.system_message("FL") == "You play."
    assert "Reply in the format" not in slot.instruction  # the template states the format
