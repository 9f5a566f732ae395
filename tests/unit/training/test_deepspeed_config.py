"""The DeepSpeed config a role runs with: its ``deepspeed`` section (ROLL's
``strategy_config``) completed by temper, and what ``temper check`` refuses — without
importing DeepSpeed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from temper.config.errors import ConfigError
from temper.pipelines.catalog import build_config, plan
from temper.training.deepspeed_config import DeepSpeedFill, batch_fill, resolve_deepspeed_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FILL = DeepSpeedFill(
    role="actor",
    micro_batch=2,
    grad_accum=4,
    world=2,
    grad_clip=1.0,
    precision="fp32",
    hidden_size=64,
)
# ROLL's deepspeed_zero3_cpuoffload.yaml (2025-06), as written
ZERO3_CPUOFFLOAD: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": "auto",
    "bf16": {"enabled": True},
    "fp16": {"enabled": False, "loss_scale": 0, "initial_scale_power": 16},
    "zero_optimization": {
        "stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "sub_group_size": 1.0e9,
        "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto",
        "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1.0e9,
        "stage3_max_reuse_distance": 1.0e9,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}


def fragment(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "config" / f"{name}.yaml").read_text())[name]


@pytest.mark.parametrize("name", ["deepspeed_zero2", "deepspeed_zero3"])
def test_roll_fragments_resolve_with_temper_values(name: str) -> None:
    got = resolve_deepspeed_config(fragment(name), FILL)
    cfg = got.config
    assert cfg["train_micro_batch_size_per_gpu"] == 2
    assert cfg["gradient_accumulation_steps"] == 4
    assert cfg["train_batch_size"] == 2 * 4 * 2
    assert cfg["gradient_clipping"] == 1.0
    # the fragments say bf16; model.dtype (fp32 here) decides, and the change is a note
    assert cfg["bf16"] == {"enabled": False} and cfg["fp16"] == {"enabled": False}
    assert got.notes == (
        "actor.deepspeed.bf16.enabled: True -> False (temper runs DeepSpeed in model.dtype "
        "= fp32; set model.dtype to change it)",
    )
    assert got.stage == int(name[-1])
    assert cfg["zero_optimization"]["overlap_comm"] is True  # the rest as written


def test_auto_buckets_and_offload() -> None:
    got = resolve_deepspeed_config(ZERO3_CPUOFFLOAD, FILL)
    zero = got.config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 64 * 64
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64)
    assert zero["stage3_param_persistence_threshold"] == 10 * 64
    assert got.offload_optimizer and not got.offload_param
    # temper's torch AdamW steps the offloaded partitions (no compiled DeepSpeedCPUAdam)
    assert got.config["zero_force_ds_cpu_optimizer"] is False
    assert ZERO3_CPUOFFLOAD["zero_optimization"]["reduce_bucket_size"] == "auto"  # not mutated


def test_bf16_checks_gradients_before_the_step() -> None:
    bf16 = DeepSpeedFill(**{**FILL.__dict__, "precision": "bf16"})
    got = resolve_deepspeed_config(fragment("deepspeed_zero2"), bf16)
    assert got.config["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert got.notes == ()
    with pytest.raises(ConfigError) as err:
        resolve_deepspeed_config({"bf16": {"enabled": True, "check_grad_overflow": False}}, bf16)
    assert err.value.key == "actor.deepspeed.bf16.check_grad_overflow"


@pytest.mark.parametrize(
    "section, key",
    [
        ({"train_micro_batch_size_per_gpu": 8}, "actor.deepspeed.train_micro_batch_size_per_gpu"),
        ({"gradient_accumulation_steps": 2}, "actor.deepspeed.gradient_accumulation_steps"),
        ({"train_batch_size": 64}, "actor.deepspeed.train_batch_size"),
        ({"gradient_clipping": 0.5}, "actor.deepspeed.gradient_clipping"),
        ({"optimizer": {"type": "AdamW"}}, "actor.deepspeed.optimizer"),
        ({"scheduler": {"type": "WarmupLR"}}, "actor.deepspeed.scheduler"),
        ({"zero_optimization": {"stage": 4}}, "actor.deepspeed.zero_optimization.stage"),
        (
            {"zero_optimization": {"stage": 1, "x": {"y": "auto"}}},
            "actor.deepspeed.zero_optimization.x.y",
        ),
        (
            {
                "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                "zero_force_ds_cpu_optimizer": True,
            },
            "actor.deepspeed.zero_force_ds_cpu_optimizer",
        ),
    ],
)
def test_refused_sections_name_their_key(section: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_deepspeed_config(section, FILL)
    assert err.value.key == key and err.value.fix


def test_a_frozen_role_runs_zero2_as_stage_0() -> None:
    frozen = DeepSpeedFill(**{**FILL.__dict__, "role": "reference", "trainable": False})
    got = resolve_deepspeed_config(fragment("deepspeed_zero2"), frozen)
    assert got.stage == 0 and got.config["zero_optimization"]["stage"] == 0
    assert got.notes[-1].startswith("reference.deepspeed.zero_optimization.stage: 2 -> 0")
    assert resolve_deepspeed_config(fragment("deepspeed_zero3"), frozen).stage == 3


def test_values_equal_to_temper_s_are_accepted() -> None:
    same = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1, "train_batch_size": 16}
    assert resolve_deepspeed_config(same, FILL).config["gradient_clipping"] == 1.0


def test_batch_fill() -> None:
    from temper.config.schema import ActorConfig

    actor = ActorConfig(mini_batch_size=32, micro_batch_size_per_device=2)
    assert batch_fill(actor, 1, 4) == (2, 4)  # 32 / 4 ranks / 2 per micro-batch
    assert batch_fill(ActorConfig(), 1, 4) == (1, 1)  # mini-batch = the step's batch
    assert batch_fill(None, 8, 2) == (8, 1)  # a frozen role: its inference micro-batch


BASE = {"model": {"path": "unused"}, "data": {"train_files": ["task:arithmetic?n=8"]}}


def ds_config(**actor: Any) -> Any:
    return build_config({**BASE, "actor": {"strategy": "deepspeed", **actor}})


def test_check_engines_refuses_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from temper.training.registry import check_engines as check_with_plan

    def check_engines(cfg: Any) -> None:
        check_with_plan(cfg, plan(cfg))

    check_engines(ds_config(deepspeed=fragment("deepspeed_zero3")))
    with pytest.raises(ConfigError) as err:
        check_engines(ds_config(deepspeed={"optimizer": {"type": "Adam"}}))
    assert err.value.key == "actor.deepspeed.optimizer"
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "deepspeed" else real(name, *a),
    )
    with pytest.raises(ConfigError) as err:
        check_engines(ds_config())
    assert err.value.key == "actor.strategy" and "deepspeed package" in err.value.reason
    check_engines(build_config(BASE))  # torch: nothing to import


def test_local_backend_runs_deepspeed_itself() -> None:
    from temper.cluster.placement import placement_rows
    from temper.pipelines.catalog import plan
    from temper.roles.builder import local_engine

    cfg = ds_config()
    assert local_engine(cfg, "deepspeed") == "deepspeed"
    assert local_engine(cfg, "fsdp2") == "torch"
    rows = {r[0]: r[5] for r in placement_rows(cfg, plan(cfg))[1:]}
    assert rows["actor"] == "deepspeed (in process)"


def test_roll_reference_deepspeed_infer_keeps_its_strategy_config() -> None:
    from temper.config.dialects.roll.translate import translate_roll
    from temper.config.loader import RawConfig

    zero3 = {"zero_optimization": {"stage": 3}}
    ref = {"strategy_args": {"strategy_name": "deepspeed_infer", "strategy_config": zero3}}
    t = translate_roll(RawConfig(data={"reference": ref}, source="<test>", from_defaults=set()))
    assert t.native["reference"]["strategy"] == "deepspeed"
    assert t.native["reference"]["deepspeed"] == zero3
