"""verl 0.9's ``distillation`` section (the 2026-08 snapshot's composed ``ppo_trainer``):
off, it is read by nothing; on, its policy-gradient OPD becomes the native ``distill``
section; what temper does not build is refused naming the key."""

from __future__ import annotations

import pytest
from test_verl_v09 import composed, native  # next to this file
from upstream_replay import ENV, check, rows  # next to this file

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
    assert d.pure and d.kl_penalty == "k1" and not d.direct_gradient
    # verl's sampled-token estimators read no log_prob_min_clamp (only the top-k loss)
    assert (d.log_prob_min_clamp, d.loss_max_clamp) == (None, 10.0)
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
        (f"{LOSS}.use_policy_gradient=False", f"{LOSS}.loss_mode"),  # k1: verl refuses
        (f"{LOSS}.loss_mode=forward_kl_topk", f"{LOSS}.use_policy_gradient"),
        (f"{LOSS}.loss_mode=reverse_kl_topk", f"{LOSS}.loss_mode"),
        (f"{LOSS}.policy_loss_mode=gspo", f"{LOSS}.policy_loss_mode"),
        (f"{LOSS}.clip_ratio_high=0.28", f"{LOSS}.clip_ratio_high"),
        ("actor_rollout_ref.actor.use_kl_loss=True", f"{LOSS}.use_task_rewards"),
    ],
)
def test_what_is_not_built_is_refused_naming_the_key(change, key):
    with pytest.raises(ConfigError) as err:
        native(composed("ppo_trainer.yaml", *MOPD, change))
    assert err.value.key == key


GKD = (f"{LOSS}.use_policy_gradient=False",)


def test_direct_gradient_with_a_sampled_estimator():
    """verl's GKD mode (use_policy_gradient: false, its default) with k3 and task
    rewards: the loss term weighted by distillation_loss_coef beside the PPO loss."""
    over = (
        *MOPD,
        *GKD,
        f"{LOSS}.loss_mode=k3",
        f"{LOSS}.use_task_rewards=True",
        f"{LOSS}.distillation_loss_coef=0.25",
    )
    d = from_dict(TemperConfig, native(composed("ppo_trainer.yaml", *over))).distill
    assert d.direct_gradient and d.kl_penalty == "k3" and d.topk == 0 and not d.pure
    assert all(t.kl_coef == 0.25 for t in d.teachers.values())
    assert (d.log_prob_min_clamp, d.loss_max_clamp) == (None, 10.0)


def test_direct_gradient_over_the_teachers_top_k():
    over = (*MOPD, *GKD, f"{LOSS}.loss_mode=forward_kl_topk")
    d = from_dict(TemperConfig, native(composed("ppo_trainer.yaml", *over))).distill
    assert d.direct_gradient and d.topk == 64 and d.pure
    assert (d.log_prob_min_clamp, d.loss_max_clamp) == (-10.0, 10.0)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (f"{LOSS}.loss_mode=kl", f"{LOSS}.loss_mode"),
        (f"{LOSS}.topk=null", f"{LOSS}.topk"),
        (
            f"+{D}.teacher_models.gsm8k.inference.engine_kwargs.vllm.max_logprobs=16",
            f"{D}.teacher_models.gsm8k.inference.engine_kwargs.vllm.max_logprobs",
        ),
        (f"{D}.teacher_models.gsm8k.inference.name=hf", f"{D}.teacher_models.gsm8k.inference.name"),
    ],
)
def test_direct_gradient_refusals_mirror_verls(change, key):
    mode = "loss_mode=kl" in change
    over = (*MOPD, *GKD, *(() if mode else (f"{LOSS}.loss_mode=forward_kl_topk",)), change)
    with pytest.raises(ConfigError) as err:
        native(composed("ppo_trainer.yaml", *over))
    assert err.value.key == key


OPD_SCRIPTS = "verl-2026-08-1dda039/examples/on_policy_distillation_trainer/"


def test_verl_opd_scripts_pass_temper_check(monkeypatch):
    """The 2026-08 snapshot's on-policy distillation scripts on the fsdp and megatron
    engines pass ``temper check``; the megatron one (verl's GKD defaults: forward_kl_topk,
    use_policy_gradient false, top-64) becomes the direct-gradient top-k loss."""
    from temper.pipelines.catalog import load_config

    opd = [r for r in rows() if r.name.startswith(OPD_SCRIPTS) and "veomni" not in r.name]
    assert len(opd) == 5
    for row in opd:
        assert check(row) == "passes", row.name
    (gkd,) = [r for r in opd if r.name.endswith("run_qwen3_8b_megatron.sh")]
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    d = load_config(gkd.config, list(gkd.overrides), command=gkd.command).config.distill
    assert d.direct_gradient and d.topk == 64 and d.pure
    assert (d.log_prob_min_clamp, d.loss_max_clamp) == (-10.0, 10.0)
