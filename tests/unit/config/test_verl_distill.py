"""verl 0.9's ``distillation`` section (the 2026-08 snapshot's composed ``ppo_trainer``):
off, it is read by nothing; on, its policy-gradient OPD becomes the native ``distill``
section; what temper does not build is refused naming the key."""

from __future__ import annotations

import pytest
from test_verl_v09 import composed, native  # next to this file

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict

D = "distillation"
LOSS = f"{D}.distillation_loss"
MOPD = (  # run_qwen3_8b_mopd_fsdp.sh's distillation arguments, n_gpus and nnodes aside
    f"{D}.enabled=True",
    f"{D}.nnodes=0",
    f"{D}.teacher_key=data_source",
    f"+{D}.teacher_models.gsm8k.key=openai/gsm8k",
    f"+{D}.teacher_models.gsm8k.model_path=Qwen/Qwen3-32B",
    f"+{D}.teacher_models.gsm8k.num_replicas=1",
    f"+{D}.teacher_models.gsm8k.inference.name=vllm",
    f"+{D}.teacher_models.geo3k.key=hiyouga/geometry3k",
    f"+{D}.teacher_models.geo3k.model_path=Qwen/Qwen3-VL-32B-Instruct",
    f"{LOSS}.loss_mode=k1",
    f"{LOSS}.topk=64",
    f"{LOSS}.use_task_rewards=False",
    f"{LOSS}.use_policy_gradient=True",
    f"{LOSS}.loss_max_clamp=10.0",
    f"{LOSS}.log_prob_min_clamp=-10.0",
)


def test_off_by_default_and_read_by_nothing():
    out = native(composed("ppo_trainer.yaml"))
    assert "distill" not in out


def test_multi_teacher_policy_gradient_distillation():
    out = native(composed("ppo_trainer.yaml", *MOPD))
    cfg = from_dict(TemperConfig, out)
    d = cfg.distill
    assert sorted(d.teachers) == ["geo3k", "gsm8k"]  # verl drops the default teacher_model
    assert d.teachers["gsm8k"].model_path == "Qwen/Qwen3-32B"
    assert d.teachers["gsm8k"].tags == ["openai/gsm8k"]
    assert d.teachers["geo3k"].tags == ["hiyouga/geometry3k"]
    assert all(t.kl_coef == 1.0 for t in d.teachers.values())
    assert d.pure and d.kl_penalty == "k1"
    assert (d.log_prob_min_clamp, d.loss_max_clamp) == (-10.0, 10.0)
    assert cfg.data.tag_key == "data_source"


def test_task_rewards_make_mixed_distillation_weighted_by_the_coef():
    over = (*MOPD, f"{LOSS}.use_task_rewards=True", f"{LOSS}.distillation_loss_coef=0.5")
    d = from_dict(TemperConfig, native(composed("ppo_trainer.yaml", *over))).distill
    assert not d.pure and all(t.kl_coef == 0.5 for t in d.teachers.values())


def test_a_teacher_pool_of_its_own_is_the_references_devices_after_the_trainers():
    """verl places the teachers on ``distillation.nnodes × n_gpus_per_node`` devices beside
    the trainer's; temper places teachers on the reference's devices."""
    over = (*MOPD, "trainer.n_gpus_per_node=4", f"{D}.nnodes=1", f"{D}.n_gpus_per_node=2")
    res = from_dict(TemperConfig, native(composed("ppo_trainer.yaml", *over))).resources
    assert (res.nnodes, res.devices_per_node) == (1, 6)
    assert (res.actor_train, res.reference) == ([0, 1, 2, 3], [4, 5])


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (f"{LOSS}.use_policy_gradient=False", f"{LOSS}.use_policy_gradient"),
        (f"{LOSS}.loss_mode=forward_kl_topk", f"{LOSS}.loss_mode"),
        (f"{LOSS}.policy_loss_mode=gspo", f"{LOSS}.policy_loss_mode"),
        (f"{LOSS}.clip_ratio_high=0.28", f"{LOSS}.clip_ratio_high"),
        ("actor_rollout_ref.actor.use_kl_loss=True", f"{LOSS}.use_task_rewards"),
    ],
)
def test_what_is_not_built_is_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError) as err:
        native(composed("ppo_trainer.yaml", *MOPD, change))
    assert err.value.key == key
