"""The verl dialect: every verl key is mapped, noted, or rejected with its reason.

The expectations live in ``verl_keys.py`` (one row per key and value); the base config
is verl 0.8's fully expanded default PPO config with ``rollout.n=2``.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from key_rows import apply_row, get_native, noted, parse_rows, parse_value, set_key
from reference_paths import UPSTREAM, needs, params  # next to this file
from verl_keys import DOC_003, ROWS, SEED_KEYS  # the table next to this file

from temper.config.dialects import detect, translate_native
from temper.config.dialects.verl.translate import translate_verl
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict, to_dict
from temper.config.validate import check_names, validate
from temper.pipelines.catalog import CATALOG

REPO = Path(__file__).resolve().parents[3]
FLAT = UPSTREAM / "verl-0.8/ppo_trainer_flat.yaml"
EXAMPLE = REPO / "examples/verl_gsm8k_ppo.yaml"

needs_flat = needs(FLAT)


# ------------------------------------------------------------------ helpers


@cache
def _flat(*overrides: str) -> dict[str, Any]:
    return load_yaml(FLAT, list(overrides)).data


def base() -> dict[str, Any]:
    return copy.deepcopy(_flat("actor_rollout_ref.rollout.n=2"))


def translate(data: dict[str, Any]):
    return translate_verl(RawConfig(data=data, source="<test>"), CATALOG)


def build(data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    """Translated and typed, registry-backed values checked (the rest of validation is
    the whole-file tests')."""
    tr = translate(data)
    cfg = from_dict(TemperConfig, tr.native)
    check_names(cfg, CATALOG)
    return cfg, tr.notes


ROW_LIST = parse_rows(ROWS)
MAPPED_KEYS = {key for key, _v, _e, exp in ROW_LIST if exp.startswith("->")}
ROW_KEYS = {key for key, *_ in ROW_LIST}


# ------------------------------------------------------------------ the key table


@needs_flat
@pytest.mark.parametrize(
    ("key", "value", "extras", "expect"), ROW_LIST, ids=[f"{r[0]}={r[1]}" for r in ROW_LIST]
)
def test_key(key, value, extras, expect):
    data = apply_row(base(), key, value, extras)
    if expect.startswith("!!"):
        words = expect[2:].strip()
        with pytest.raises(ConfigError) as err:
            build(data)
        assert key in str(err.value)
        assert words.lower() in str(err.value).lower()
        return
    cfg, notes = build(data)
    if expect == "noted":
        assert noted(notes, key), notes
        return
    target, _, wanted = expect[2:].strip().partition(" = ")
    want = parse_value(wanted) if wanted else parse_value(value)
    got = get_native(cfg, target)
    if isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want)
    else:
        assert got == want


@needs_flat
def test_rollout_rs_modes_become_rejection_filters():
    """k1 keeps pi_rollout/pi_old in [lo, hi]: the ratio pi_old/pi_rollout in [1/hi, 1/lo]."""
    data = base()
    set_key(data, "algorithm.adv_estimator", "grpo")
    rc = "algorithm.rollout_correction"
    set_key(data, f"{rc}.rollout_rs", "token_k1,seq_sum_k1,seq_mean_k2,seq_max_k3,token_k1")
    set_key(data, f"{rc}.rollout_rs_threshold", "0.5_4.0,2.0,0.01,0.02")
    cfg, _ = build(data)
    assert [(f.stat, f.level, f.low, f.high) for f in cfg.actor.rollout_rs] == [
        ("ratio", "token", 0.25, 2.0),
        ("ratio", "sequence_sum", 0.5, 2.0),
        ("k2", "sequence_mean", None, 0.01),
        ("k3", "sequence_max", None, 0.02),
    ]  # a repeated option counts once, as in verl
    set_key(data, f"{rc}.rollout_rs", "seq_mean_k3")
    set_key(data, f"{rc}.rollout_rs_threshold", 0.05)
    cfg, _ = build(data)
    assert [(f.stat, f.level, f.high) for f in cfg.actor.rollout_rs] == [
        ("k3", "sequence_mean", 0.05)
    ]


def _leaves(value: Any, path: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [x for k, v in value.items() for x in _leaves(v, f"{path}.{k}")]
    return [path]


FLAT_LEAVES = [leaf for k, v in _flat().items() for leaf in _leaves(v, k)] if FLAT.is_file() else []


@cache
def _flat_notes() -> tuple[str, ...]:
    return tuple(translate(copy.deepcopy(_flat())).notes)


@needs_flat
@pytest.mark.parametrize("leaf", params(FLAT_LEAVES, FLAT))
def test_every_flat_leaf_is_mapped_or_noted(leaf):
    """Each leaf of verl's default config has a mapped row (tested above) or a note."""
    assert leaf in MAPPED_KEYS or noted(list(_flat_notes()), leaf)


@needs_flat  # some seed keys are covered by the flat file's leaves
@pytest.mark.parametrize("key", SEED_KEYS)
def test_every_seed_key_has_a_row(key):
    assert key in ROW_KEYS or key in FLAT_LEAVES


# ------------------------------------------------------------------ whole files


@needs_flat
def test_flat_file_loads_and_validates_unchanged():
    cfg, notes = build(copy.deepcopy(_flat()))
    validate(cfg, CATALOG)
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.actor.mini_batch_size == 256  # 256 prompts × n=1
    assert cfg.actor.strategy == "fsdp2"
    assert cfg.resources.backend == "ray" and cfg.resources.devices_per_node == 8
    assert cfg.resources.actor_infer is None  # hybrid engine: colocated
    assert cfg.experiment.trackers == ["console", "wandb", "jsonl"]
    assert noted(notes, "actor_rollout_ref.rollout.name")  # '???' -> temper default
    assert noted(notes, "trainer.default_hdfs_dir")


@needs_flat
def test_load_config_accepts_the_flat_file():
    pytest.importorskip("temper.config.dialects.roll.translate")
    from temper.pipelines.catalog import load_config

    loaded = load_config(FLAT, ["trainer.n_gpus_per_node=1"], dialect="auto")
    assert loaded.dialect == "verl"
    assert loaded.config.resources.backend == "local"
    assert loaded.notes


@needs_flat
def test_round_trip_through_the_native_dialect():
    cfg, _ = build(base())
    again = from_dict(
        TemperConfig, translate_native(RawConfig(to_dict(cfg), "<x>"), CATALOG).native
    )
    assert again == cfg


def test_detected_as_verl():
    assert detect({"actor_rollout_ref": {}, "trainer": {}, "data": {}}) == "verl"
    assert detect({"backend_config": {}, "af_output_dir": "/x"}) == "verl"


def test_example_translates_and_validates():
    raw = load_yaml(EXAMPLE)
    assert detect(raw.data) == "verl"
    cfg, _ = build(raw.data)
    validate(cfg, CATALOG)
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.critic.model_path and cfg.model.path.endswith("SmolLM2-135M-Instruct")
    assert cfg.actor.mini_batch_size == cfg.critic.mini_batch_size


def test_document_003_wrapper():
    data: dict[str, Any] = {}
    for key, (value, _native) in DOC_003.items():
        set_key(data, key, value)
    cfg, notes = build(data)
    special = {
        "actor.mini_batch_size": 8 * 4,
        "data.train_files": ["/data/geometry3k/train.parquet"],
        "data.val_files": ["/data/geometry3k/test.parquet"],
        "experiment.trackers": ["console", "tensorboard", "jsonl"],
    }
    for key, (value, native) in DOC_003.items():
        if native is None:
            assert noted(notes, key), key
        else:
            assert get_native(cfg, native) == special.get(native, value), key


def test_document_003_errors_name_the_wrapped_key():
    data = {"backend_config": {"data": {"use_shmm": True}}}
    with pytest.raises(ConfigError, match=r"backend_config\.data\.use_shmm: unknown"):
        build(data)


# ------------------------------------------------------------------ errors and semantics


def test_typo_says_did_you_mean():
    data = {"actor_rollout_ref": {"actor": {"ppo_mini_bach_size": 4}}}
    with pytest.raises(ConfigError) as err:
        build(data)
    msg = str(err.value)
    assert "actor_rollout_ref.actor.ppo_mini_bach_size" in msg
    assert "did you mean 'ppo_mini_batch_size'" in msg


def test_typo_in_a_section_name():
    with pytest.raises(ConfigError, match="did you mean 'trainer'"):
        build({"trainr": {"total_epochs": 1}})


def test_wrong_type_names_the_verl_key():
    with pytest.raises(ConfigError) as err:
        build({"trainer": {"total_epochs": "thirty"}})
    assert str(err.value).startswith("trainer.total_epochs: expected int")


def test_short_file_gets_verl_defaults_and_inheritance():
    cfg, notes = build(
        {
            "data": {"train_batch_size": 8},
            "actor_rollout_ref": {
                "rollout": {"n": 4},
                "actor": {"ppo_mini_batch_size": 2, "ppo_epochs": 3},
            },
        }
    )
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.experiment.total_epochs == 30
    assert cfg.actor.mini_batch_size == 8
    assert cfg.critic.mini_batch_size == 8  # verl: critic follows the actor
    assert cfg.critic.ppo_epochs == 3
    assert noted(notes, "algorithm.adv_estimator")
    assert cfg.resources.backend == "local"


def test_response_length_must_agree():
    data = {
        "data": {"max_response_length": 256},
        "actor_rollout_ref": {"rollout": {"response_length": 512}},
    }
    with pytest.raises(ConfigError, match="rollout.response_length"):
        build(data)


def test_global_micro_batch_respects_sequence_parallel():
    data = {
        "trainer": {"n_gpus_per_node": 8},
        "actor_rollout_ref": {
            "actor": {"ppo_micro_batch_size": 16, "ulysses_sequence_parallel_size": 2}
        },
    }
    cfg, notes = build(data)
    assert cfg.actor.micro_batch_size_per_device == 4  # 16 / (8 / 2)
    assert any("deprecated global micro-batch" in n for n in notes)


def test_unset_marker_keeps_default():
    cfg, notes = build({"actor_rollout_ref": {"rollout": {"top_k": "???"}}})
    assert cfg.rollout.top_k == -1
    assert noted(notes, "actor_rollout_ref.rollout.top_k")


def test_unset_rollout_name_means_auto():
    """verl leaves the engine to the user, its default rollout (TP 2) being vLLM's: here
    ``auto`` (vLLM where installed, else hf)."""
    cfg, notes = build({"actor_rollout_ref": {"rollout": {"name": "???"}}})
    assert cfg.rollout.engine == "auto"
    assert noted(notes, "actor_rollout_ref.rollout.name")


DOC_002 = """
data:
  tokenizer: null
  train_files: ~/data/rlhf/gsm8k/train.parquet
  val_files: ~/data/rlhf/gsm8k/test.parquet
  prompt_key: prompt
  max_prompt_length: 512
  max_response_length: 512
  train_batch_size: 1024
  val_batch_size: 1312
  return_raw_input_ids: False
  return_raw_chat: False
actor_rollout_ref:
  hybrid_engine: True
  model:
    path: ~/models/deepseek-llm-7b-chat
    external_lib: null
    override_config: {}
    enable_gradient_checkpointing: False
  actor:
    strategy: fsdp
    ppo_mini_batch_size: 256
    ppo_micro_batch_size: 64
    grad_clip: 1.0
    clip_ratio: 0.2
    entropy_coeff: 0.001
    ppo_epochs: 1
    shuffle: True
    optim:
      lr: 1e-6
      lr_warmup_steps_ratio: 0.
      min_lr_ratio: null
      warmup_style: constant
      total_training_steps: -1
    fsdp_config:
      wrap_policy:
        min_num_params: 0
      param_offload: False
      grad_offload: False
      optimizer_offload: False
  ref:
    fsdp_config:
      param_offload: False
      wrap_policy:
        min_num_params: 0
    log_prob_micro_batch_size: 128
  rollout:
    name: vllm
    temperature: 1.0
    top_k: -1
    top_p: 1
    response_length: ${data.max_response_length}
    dtype: bfloat16
    gpu_memory_utilization: 0.5
    ignore_eos: False
    enforce_eager: True
    free_cache_engine: True
    load_format: dummy_dtensor
    tensor_model_parallel_size: 2
    max_num_batched_tokens: 8192
    max_num_seqs: 1024
    log_prob_micro_batch_size: 128
    do_sample: True
reward_model:
  enable: False
  model:
    input_tokenizer: ${actor_rollout_ref.model.path}
    path: ~/models/Anomy-RM-v0.1
    external_lib: ${actor_rollout_ref.model.external_lib}
    fsdp_config:
      min_num_params: 0
      param_offload: False
  micro_batch_size: 64
  max_length: null
algorithm:
  gamma: 1.0
  lam: 1.0
  adv_estimator: gae
  kl_penalty: kl
  kl_ctrl:
    type: fixed
    kl_coef: 0.005
trainer:
  total_epochs: 30
  project_name: verl_examples
  experiment_name: gsm8k
  logger: ['console', 'tracking']
  nnodes: 1
  n_gpus_per_node: 8
  save_freq: -1
  test_freq: 2
  critic_warmup: 0
  default_hdfs_dir: ~/experiments/gsm8k/ppo/${trainer.experiment_name}
  default_local_dir: checkpoints/${trainer.project_name}/${trainer.experiment_name}
"""


def test_document_002_file(tmp_path):
    path = tmp_path / "ppo_trainer.yaml"
    path.write_text(DOC_002)
    with pytest.raises(ConfigError, match=r"trainer\.default_hdfs_dir: HDFS is not supported"):
        build(load_yaml(path).data)
    cfg, notes = build(load_yaml(path, ["trainer.default_hdfs_dir=null"]).data)
    validate(cfg, CATALOG)
    assert cfg.actor.micro_batch_size_per_device == 8  # 64 global / 8 GPUs
    assert cfg.reference.log_prob_micro_batch_size_per_device == 16
    assert cfg.reward.model.micro_batch_size_per_device == 8
    assert cfg.rollout.load_format == "dummy" and cfg.rollout.engine == "vllm"
    assert cfg.actor.optim.lr == 1e-6 and cfg.algorithm.kl_ctrl.kl_coef == 0.005
    assert cfg.experiment.trackers == ["console", "wandb", "jsonl"]
    assert noted(notes, "actor_rollout_ref.actor.fsdp_config.grad_offload")


@needs_flat
@pytest.mark.parametrize("loss", ["gspo", "sapo"])
def test_sequence_level_losses_aggregate_like_verl(loss):
    """verl's gspo/sapo hard-code seq-mean-token-mean in their agg_loss call; the
    translation pins the policy loss's aggregation the same way, and says so when the
    file's loss_agg_mode differs (it still governs the value loss and entropy)."""
    from temper.roles.actor import policy_loss_params

    data = base()
    data["actor_rollout_ref"]["actor"]["policy_loss"]["loss_mode"] = loss
    data["actor_rollout_ref"]["actor"]["loss_agg_mode"] = "token-mean"
    cfg, notes = build(data)
    assert cfg.actor.loss_agg_mode == "token-mean"
    assert policy_loss_params(cfg.actor).loss_agg_mode_override == "seq-mean-token-mean"
    assert noted(notes, "actor_rollout_ref.actor.loss_agg_mode")
    vanilla, _ = build(base())
    assert policy_loss_params(vanilla.actor).loss_agg_mode_override is None
