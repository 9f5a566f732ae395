"""verl's Megatron keys (``ppo_megatron_trainer.yaml``, 2026-01 snapshot): each
``*.megatron.*`` key, ``load_weight`` and ``layer_name_map`` is mapped, noted or rejected.

The base is the snapshot's megatron trainer config (Hydra-composed from its defaults)
with the keys the dialect does not read yet outside the megatron sections removed
(issue 12 adds them; see ``OUTSIDE``).
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import pytest
from reference_paths import UPSTREAM, needs  # next to this file

from temper.config.dialects.verl.translate import translate_verl
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.pipelines.catalog import CATALOG

GENERATED = (
    UPSTREAM / "verl-2026-01-b178a3c/verl/trainer/config/_generated_ppo_megatron_trainer.yaml"
)
ACT, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"

# outside the megatron sections and not read by the verl dialect yet (issue 12)
OUTSIDE = [
    *(
        f"{role}.optim.{key}"
        for role in (ACT, "critic")
        for key in (
            "lr_warmup_init",
            "lr_decay_steps",
            "lr_decay_style",
            "min_lr",
            "weight_decay_incr_style",
            "lr_wsd_decay_style",
            "lr_wsd_decay_steps",
            "use_checkpoint_opt_param_scheduler",
        )
    ),
    "critic.model.lora",
    "critic.model.override_config",
    "critic.nccl_timeout",
    "reward_model.nccl_timeout",
]


@cache
def _generated() -> dict[str, Any]:
    return load_yaml(GENERATED, ["actor_rollout_ref.model.path=/m/policy"]).data


def base() -> dict[str, Any]:
    data = copy.deepcopy(_generated())
    for path in OUTSIDE:
        node = data
        *parents, leaf = path.split(".")
        for part in parents:
            node = node[part]
        node.pop(leaf, None)
    for role in (ACT, "critic"):
        _set(data, f"{role}.optim.optimizer", "adamw")
    return data


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def translate(**changes: Any) -> tuple[dict[str, Any], list[str]]:
    data = base()
    for path, value in changes.items():
        _set(data, path.replace("__", "."), value)
    out = translate_verl(RawConfig(data=data, source="test"), CATALOG)
    return out.native, out.notes


def native(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        node = node[part]
    return node


needs_generated = needs(GENERATED)


@needs_generated
def test_the_megatron_trainer_translates_with_megatron_roles() -> None:
    tree, notes = translate()
    assert native(tree, "actor.strategy") == "megatron"
    assert native(tree, "reference.strategy") == "megatron"
    assert native(tree, "critic.strategy") == "megatron"
    # verl's defaults: sequence parallel and the distributed optimizer on
    assert native(tree, "actor.megatron.sequence_parallel") is True
    assert native(tree, "actor.megatron.use_distributed_optimizer") is True
    joined = "\n".join(notes)
    for key in ("use_mbridge", "layer_name_map", "attention_backend", "load_weight"):
        assert key in joined


@needs_generated
@pytest.mark.parametrize(
    ("key", "value", "target"),
    [
        (
            f"{ACT}.megatron.tensor_model_parallel_size",
            4,
            "actor.megatron.tensor_model_parallel_size",
        ),
        (
            f"{ACT}.megatron.pipeline_model_parallel_size",
            2,
            "actor.megatron.pipeline_model_parallel_size",
        ),
        (f"{ACT}.megatron.context_parallel_size", 2, "actor.megatron.context_parallel_size"),
        (
            f"{ACT}.megatron.expert_model_parallel_size",
            2,
            "actor.megatron.expert_model_parallel_size",
        ),
        (
            f"{ACT}.megatron.expert_tensor_parallel_size",
            1,
            "actor.megatron.expert_tensor_parallel_size",
        ),
        (f"{ACT}.megatron.param_offload", True, "actor.megatron.param_offload"),
        (f"{ACT}.megatron.grad_offload", True, "actor.megatron.grad_offload"),
        (f"{ACT}.megatron.optimizer_offload", True, "actor.megatron.optimizer_offload"),
        (
            f"{REF}.megatron.tensor_model_parallel_size",
            2,
            "reference.megatron.tensor_model_parallel_size",
        ),
        (f"{REF}.megatron.param_offload", True, "reference.param_offload"),
        (
            "critic.megatron.tensor_model_parallel_size",
            2,
            "critic.megatron.tensor_model_parallel_size",
        ),
        (
            f"{ACT}.megatron.override_ddp_config.overlap_grad_reduce",
            True,
            "actor.megatron.overlap_grad_reduce",
        ),
    ],
)
def test_mapped(key: str, value: Any, target: str) -> None:
    tree, _ = translate(**{key.replace(".", "__"): value})
    assert native(tree, target) == value


@needs_generated
def test_override_transformer_config_splits_into_recompute_fields_and_extra() -> None:
    otc = {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
        "recompute_modules": ["core_attn"],
        "attention_backend": "flash",
        "moe_router_topk": 2,
        "apply_rope_fusion": True,
    }
    tree, notes = translate(
        **{f"{ACT}.megatron.override_transformer_config".replace(".", "__"): otc}
    )
    m = native(tree, "actor.megatron")
    assert (m["recompute_granularity"], m["recompute_method"], m["recompute_num_layers"]) == (
        "full",
        "uniform",
        1,
    )
    assert m["extra"] == {"moe_router_topk": 2, "apply_rope_fusion": True}
    assert any("attention_backend" in n for n in notes)


@needs_generated
@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        (f"{ACT}.megatron.use_dist_checkpointing", True, "checkpoint to start from is not"),
        (
            f"{ACT}.megatron.override_mcore_model_config",
            {"num_layers": 2},
            "model-config overrides",
        ),
        (f"{ACT}.load_weight", False, "load_weight"),
        (f"{REF}.megatron.dtype", "float32", "one compute dtype"),
    ],
)
def test_rejected(key: str, value: Any, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        translate(**{key.replace(".", "__"): value})
    assert key in str(err.value) and words in str(err.value)


@needs_generated
def test_use_dist_checkpointing_starts_the_role_from_its_path() -> None:
    tree, notes = translate(
        **{
            f"{ACT}.megatron.use_dist_checkpointing".replace(".", "__"): True,
            f"{ACT}.megatron.dist_checkpointing_path".replace(".", "__"): "/ckpt/mcore",
        }
    )
    assert native(tree, "actor.megatron")["dist_checkpoint_path"] == "/ckpt/mcore"
    assert any("dist_checkpoint_path" in n for n in notes)
    tree, notes = translate(
        **{f"{ACT}.megatron.dist_checkpointing_path".replace(".", "__"): "/ckpt/mcore"}
    )  # off: the path is read by nothing
    assert "dist_checkpoint_path" not in native(tree, "actor.megatron")
    assert any("use_dist_checkpointing is off" in n for n in notes)


@needs_generated
def test_a_short_file_gets_the_reference_parallel_sizes_from_the_actor() -> None:
    """verl's ``ref.megatron.* = ${oc.select:actor…megatron.*}``, for files without it."""
    data = {
        "actor_rollout_ref": {
            "model": {"path": "/m/policy"},
            "actor": {"strategy": "megatron", "megatron": {"tensor_model_parallel_size": 2}},
            "ref": {"strategy": "megatron"},
        },
        "algorithm": {"adv_estimator": "grpo"},
    }
    tree = translate_verl(RawConfig(data=data, source="test"), CATALOG).native
    assert native(tree, "reference.megatron.tensor_model_parallel_size") == 2


@needs_generated
def test_a_megatron_reward_model_maps_onto_reward_model_megatron() -> None:
    """The trainer file's reward model runs on megatron (reward.model.strategy) with its
    section under reward.model.megatron."""

    tree, _ = translate(
        reward_model__enable=True,
        reward_model__model__path="/m/rm",
        reward_model__megatron__tensor_model_parallel_size=1,
        reward_model__megatron__param_offload=True,
    )
    assert native(tree, "reward.model.strategy") == "megatron"
    assert native(tree, "reward.model.megatron.tensor_model_parallel_size") == 1
    assert native(tree, "reward.model.megatron.param_offload") is True


def _rm_config(backend: str, devices: int, reward: list[int] | None = None, **megatron: int):
    """A GRPO config scored by a megatron reward model with ``megatron`` degrees."""
    from temper.pipelines.catalog import build_config

    resources: dict = {"backend": backend, "devices_per_node": devices}
    if reward is not None:
        resources["reward"] = reward
    return build_config(
        {
            "model": {"path": "/m/policy"},
            "data": {"train_files": ["/d/train.parquet"], "train_batch_size": 2 * devices},
            "actor": {"strategy": "fsdp2", "mini_batch_size": 2 * devices},
            "reward": {
                "model": {
                    "enable": True,
                    "path": "/m/rm",
                    "strategy": "megatron",
                    "megatron": megatron,
                }
            },
            "resources": resources,
            "experiment": {"device": "cpu"},
        }
    )


def test_check_refuses_a_megatron_reward_model_split_in_the_driver() -> None:
    """On the local backend it scores in the driver process, one rank: degrees above 1
    are refused naming the key and the Ray backend; a distributed checkpoint everywhere."""
    from temper.pipelines.catalog import plan
    from temper.training.megatron_check import check_reward_model

    cfg = _rm_config("local", 1)
    check_reward_model(cfg, plan(cfg))  # TP = PP = CP = 1 on the local backend
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        cfg = _rm_config("local", 1, **{key: 2})
        with pytest.raises(
            ConfigError, match=f"reward.model.megatron.{key}: 2: on the local backend.*backend=ray"
        ):
            check_reward_model(cfg, plan(cfg))
    cfg = _rm_config("ray", 2)
    cfg.reward.model.megatron.dist_checkpoint_path = "/m/dist"
    with pytest.raises(ConfigError, match="reward.model.megatron.dist_checkpoint_path"):
        check_reward_model(cfg, plan(cfg))


def test_check_splits_a_megatron_reward_model_over_its_ray_devices() -> None:
    """On Ray it scores on a group of its own (resources.reward, else the actor's
    devices): TP=2 over 2 devices passes (one data-parallel replica), over 3 it is refused
    before any model loads; 2 of the 3 devices placed for it pass."""
    from temper.cluster.placement import placement_rows
    from temper.pipelines.catalog import plan
    from temper.training.megatron_check import check_reward_model

    cfg = _rm_config("ray", 2, tensor_model_parallel_size=2)
    check_reward_model(cfg, plan(cfg))
    rows = {row[0]: row for row in placement_rows(cfg, plan(cfg))[1:]}
    assert rows["reward"][1:6] == ("0,1", "0", "2", "1", "megatron")
    cfg = _rm_config("ray", 3, tensor_model_parallel_size=2)
    with pytest.raises(ConfigError, match="3 devices .* not divisible by TP×PP×CP = 2"):
        check_reward_model(cfg, plan(cfg))
    cfg = _rm_config("ray", 3, reward=[1, 2], tensor_model_parallel_size=2)
    check_reward_model(cfg, plan(cfg))
    cfg = _rm_config("local", 1)  # the driver scores: no group placed
    assert "reward" not in [row[0] for row in placement_rows(cfg, plan(cfg))[1:]]


# ----------------------------------------------------------------------- megatron LoRA

LORA = "actor_rollout_ref__model__lora"


@needs_generated
def test_megatron_lora_section_maps_onto_model_lora() -> None:
    section = {
        "type": "lora",
        "rank": 32,
        "alpha": 64,
        "dropout": 0.0,
        "target_modules": ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"],
        "lora_A_init_method": "kaiming",
        "merge": False,
    }
    tree, notes = translate(**{LORA: section})
    assert native(tree, "model.lora.rank") == 32
    assert native(tree, "model.lora.alpha") == 64
    assert native(tree, "model.lora.target_modules") == section["target_modules"]
    joined = "\n".join(notes)
    assert "canonical_lora" in joined and "merged weights" in joined
    tree, _ = translate()  # verl's default section: rank 0, LoRA off
    assert native(tree, "model.lora.rank") == 0


@needs_generated
@pytest.mark.parametrize(
    ("changes", "key", "words"),
    [
        ({f"{ACT}__strategy": "fsdp"}, "actor_rollout_ref.model.lora.rank", "megatron actor only"),
        (
            {"actor_rollout_ref__model__lora_rank": 8},
            "actor_rollout_ref.model.lora_rank",
            "set twice",
        ),
        ({f"{LORA}__type": "dora"}, "actor_rollout_ref.model.lora.type", "DoRA"),
        ({f"{LORA}__exclude_modules": ["linear_fc2"]}, "", "excluding modules from LoRA"),
        ({f"{LORA}__adapter_path": "/a"}, "", "saved LoRA adapter"),
    ],
)
def test_megatron_lora_section_refusals_name_their_key(changes, key, words) -> None:
    with pytest.raises(ConfigError) as err:
        translate(**{f"{LORA}__rank": 8, **changes})
    assert words in err.value.reason and err.value.fix
    assert not key or err.value.key == key
