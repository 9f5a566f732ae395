"""Typed building and validation: every failure names the key, the reason and the fix."""

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.config.typed import diff_from_default, from_dict, to_dict
from temper.config.validate import validate
from temper.pipelines.catalog import CATALOG, build_config, plan

BASE = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}}


def cfg(**sections):
    data = {k: dict(v) for k, v in BASE.items()}
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return data


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


def test_roundtrip_full_and_minimal():
    c = build_config(cfg(actor={"optim": {"lr": 3e-6}}, rollout={"n": 4}))
    assert from_dict(TemperConfig, to_dict(c)) == c
    assert diff_from_default(c)["rollout"] == {"n": 4}


def test_partial_section_starts_from_the_field_default():
    # CriticConfig.optim defaults to OptimConfig(lr=1e-5) (default_factory); OptimConfig's
    # own class default is lr=1e-6. Writing one optimizer key must keep the critic's 1e-5.
    c = from_dict(TemperConfig, {"critic": {"optim": {"weight_decay": 0.1}}})
    assert c.critic.optim.lr == 1e-5 and c.critic.optim.weight_decay == 0.1
    assert c.actor.optim.lr == 1e-6  # the actor's optim is the class default
    # nested deeper: critic given, optim omitted -> the factory value too
    assert from_dict(TemperConfig, {"critic": {"enable": True}}).critic.optim.lr == 1e-5
    # the minimal form (what `temper convert` writes) reads back to the same config
    assert from_dict(TemperConfig, diff_from_default(c)) == c
    assert diff_from_default(c) == {"critic": {"optim": {"weight_decay": 0.1}}}


def test_typo_says_did_you_mean():
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"mini_bach_size": 4}))
    msg = one_line(err)
    assert msg.startswith("actor.mini_bach_size: unknown key (did you mean 'mini_batch_size'?)")
    assert "Fix: remove it" in msg


def test_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError) as err:
        build_config(cfg(rollout={"n": "four"}))
    assert one_line(err) == (
        "rollout.n: expected int, got 'four' (str). Fix: set rollout.n to a value of type int"
    )
    with pytest.raises(ConfigError, match="expected bool"):
        build_config(cfg(actor={"use_kl_loss": "yes"}))


def test_literal_suggests_value():
    with pytest.raises(ConfigError) as err:
        build_config(cfg(data={"truncation": "lefft"}))
    msg = one_line(err)
    assert "data.truncation: 'lefft' is not allowed (did you mean 'left'?)" in msg
    assert "use one of: error, left, right, middle" in msg


def test_indivisible_batch():
    with pytest.raises(ConfigError) as err:
        build_config(
            cfg(data={"train_batch_size": 3}, rollout={"n": 4}, actor={"mini_batch_size": 5})
        )
    msg = one_line(err)
    assert msg.startswith("actor.mini_batch_size: 12 samples per step")
    assert "not divisible by 5" in msg
    assert "Fix: set actor.mini_batch_size to a divisor of 12, e.g. 4" in msg


def test_mini_batch_larger_than_batch():
    with pytest.raises(ConfigError, match=r"actor.mini_batch_size: 16 samples .* exceed the 8"):
        build_config(
            cfg(data={"train_batch_size": 2}, rollout={"n": 4}, actor={"mini_batch_size": 16})
        )


def test_micro_batch_must_divide():
    with pytest.raises(ConfigError, match=r"actor.micro_batch_size_per_device: .* 8 samples"):
        build_config(
            cfg(
                data={"train_batch_size": 2},
                rollout={"n": 4},
                actor={"micro_batch_size_per_device": 3},
            )
        )


def test_gae_needs_critic():
    with pytest.raises(ConfigError, match="critic.enable: adv_estimator gae needs a critic"):
        build_config(cfg(algorithm={"adv_estimator": "gae"}, critic={"enable": False}))
    c = build_config(cfg(algorithm={"adv_estimator": "gae"}))
    assert plan(c).use_critic


def test_kl_loss_needs_reference():
    with pytest.raises(ConfigError, match="reference.enable: actor.use_kl_loss needs"):
        build_config(cfg(actor={"use_kl_loss": True}, reference={"enable": False}))
    assert plan(build_config(cfg(actor={"use_kl_loss": True}))).use_reference


def test_an_icepop_band_needs_a_positive_low_below_the_threshold():
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"rollout_is_threshold": 2.0, "rollout_is_threshold_low": 3.0}))
    assert one_line(err).startswith("actor.rollout_is_threshold_low: the IcePop band [3.0, 2.0]")
    ok = build_config(cfg(actor={"rollout_is_threshold_low": 0.5}))
    assert ok.actor.rollout_is_threshold_low == 0.5


def test_warmup_from_one_is_refused_with_a_schedule_already_counted_from_one():
    optim = {"warmup_from_one": True, "zero_indexed_step": False}
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"optim": optim}))
    assert one_line(err).startswith("actor.optim.warmup_from_one: zero_indexed_step: false")
    ok = build_config(cfg(actor={"optim": {"warmup_from_one": True}}))
    assert ok.actor.optim.warmup_from_one


def test_is_weights_need_a_recompute_else_each_would_be_one():
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"rollout_is": "token", "recompute_old_log_prob": False}))
    assert one_line(err).startswith("actor.rollout_is: with actor.recompute_old_log_prob false")
    assert build_config(cfg(actor={"rollout_is": "token"})).actor.rollout_is == "token"


def test_rejection_filters_are_typed_named_and_bounded():
    ok = build_config(
        cfg(actor={"rollout_rs": [{"stat": "k3", "level": "sequence_max", "high": 0.01}]})
    )
    (f,) = ok.actor.rollout_rs
    assert (f.stat, f.level, f.low, f.high) == ("k3", "sequence_max", None, 0.01)
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"rollout_rs": [{"stat": "k9", "high": 1.0}]}))
    assert one_line(err).startswith("actor.rollout_rs[0].stat: unknown")
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"rollout_rs": [{"level": "sequence"}]}))
    assert "actor.rollout_rs[0].level" in one_line(err)
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"rollout_rs": [{"low": 0.5}, {"stat": "ratio"}]}))
    assert one_line(err).startswith("actor.rollout_rs[1]: a filter without bounds")
    with pytest.raises(ConfigError) as err:
        build_config(cfg(actor={"rollout_rs": [{"low": 2.0, "high": 0.5}]}))
    assert one_line(err).startswith("actor.rollout_rs[0].low: 2.0 > high 0.5")
    # old log-probs = the rollout's (verl's bypass mode): the filter compares the current
    # policy with the rollout's before each mini-batch's update (tests/unit/roles)
    bypass = {"rollout_rs": [{"high": 2.0}], "recompute_old_log_prob": False}
    build_config(cfg(actor=bypass, rollout={"calculate_log_probs": True}))


def test_placement_checks():
    with pytest.raises(ConfigError, match=r"resources.actor_train: device ids \[4\] are outside"):
        build_config(
            cfg(resources={"backend": "ray", "devices_per_node": 4, "actor_train": [3, 4]})
        )
    with pytest.raises(ConfigError, match="not contiguous"):
        build_config(
            cfg(resources={"backend": "ray", "devices_per_node": 4, "actor_train": [0, 2]})
        )
    with pytest.raises(ConfigError, match="resources.backend: the local backend"):
        build_config(cfg(resources={"devices_per_node": 2}, actor={"strategy": "fsdp2"}))
    with pytest.raises(ConfigError, match="actor.strategy: the torch engine trains in one process"):
        build_config(cfg(resources={"backend": "ray", "devices_per_node": 2}))


def test_derived_arithmetic_fsdp_and_megatron():
    c = build_config(
        cfg(
            data={"train_batch_size": 16},
            rollout={"n": 8},
            actor={"strategy": "fsdp2", "mini_batch_size": 64, "micro_batch_size_per_device": 2},
            resources={"backend": "ray", "devices_per_node": 8},
        )
    )
    d = plan(c)
    assert (d.samples_per_step, d.actor.dp, d.actor.per_rank_mini_batch) == (128, 8, 8)
    assert (d.actor.grad_accum, d.actor.optimizer_steps_per_rl_step) == (4, 2)
    # document 001: megatron global batch = per_device × accumulation × world / TP / PP / CP
    c = build_config(
        cfg(
            data={"train_batch_size": 8},
            rollout={"n": 8},
            actor={
                "strategy": "megatron",
                "micro_batch_size_per_device": 1,
                "megatron": {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2},
            },
            resources={"backend": "ray", "devices_per_node": 16},
        )
    )
    d = plan(c)
    assert d.actor.dp == 4 and d.actor.grad_accum == 64 // 4


def test_megatron_expert_groups_must_divide_the_devices():
    """Megatron-Core cuts a role's devices a second time for the experts, into ETP × EP ×
    PP groups (ETP: TP when unset): 4 devices at TP 2 × EP 4 do not divide; at ETP 1 they
    do (each TP pair is then part of an EP group of 4). Data parallelism stays devices /
    (TP × PP × CP)."""

    def build(megatron: dict) -> object:
        actor = {"strategy": "megatron", "micro_batch_size_per_device": 1, "megatron": megatron}
        return build_config(
            cfg(
                data={"train_batch_size": 8},
                rollout={"n": 1},
                actor=actor,
                resources={"backend": "ray", "devices_per_node": 4},
            )
        )

    tp_ep = {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 4}
    with pytest.raises(ConfigError) as err:
        build(tp_ep)
    assert err.value.key == "actor.megatron.expert_model_parallel_size"
    assert "4 devices are not divisible by ETP×EP×PP = 8" in err.value.reason
    d = plan(build({**tp_ep, "expert_tensor_parallel_size": 1}))
    assert d.actor.dp == 2


def test_a_sequence_parallel_group_is_one_data_parallel_rank():
    """verl's run_deepseek7b_llm_sp2: 8 devices, Ulysses SP 2, a mini-batch of 256, micro
    64 per SP group — 4 groups (data-parallel ranks) × 64 samples, one micro-step each,
    as verl runs it."""
    actor = {"strategy": "fsdp2", "mini_batch_size": 256, "micro_batch_size_per_device": 64}
    base = cfg(data={"train_batch_size": 256}, resources={"backend": "ray", "devices_per_node": 8})
    d = plan(build_config({**base, "actor": {**actor, "ulysses_sequence_parallel_size": 2}}))
    assert (d.actor.dp, d.actor.per_rank_mini_batch, d.actor.micro_batch_size) == (4, 64, 64)
    assert d.actor.grad_accum == 1
    # without SP a rank's 32 samples are one micro-batch of at most 64: all 32 (verl splits
    # a rank's mini-batch into chunks of 64, which gives one)
    d = plan(build_config({**base, "actor": actor}))
    assert (d.actor.per_rank_mini_batch, d.actor.micro_batch_size, d.actor.grad_accum) == (
        32,
        32,
        1,
    )
    bad = {**actor, "micro_batch_size_per_device": 48, "ulysses_sequence_parallel_size": 2}
    with pytest.raises(ConfigError) as err:
        build_config({**base, "actor": bad})
    assert "64 samples each rank gets per mini-batch are not divisible by 48" in one_line(err)
    # 4 samples fill the 4 SP groups, one sequence each
    four = {**actor, "mini_batch_size": 4, "micro_batch_size_per_device": 1}
    small = cfg(data={"train_batch_size": 4}, resources={"backend": "ray", "devices_per_node": 8})
    d = plan(build_config({**small, "actor": {**four, "ulysses_sequence_parallel_size": 2}}))
    assert (d.actor.dp, d.actor.per_rank_mini_batch, d.actor.grad_accum) == (4, 1, 1)
    with pytest.raises(ConfigError) as err:
        build_config({**small, "actor": {**four, "ulysses_sequence_parallel_size": 3}})
    assert err.value.key == "actor.ulysses_sequence_parallel_size"
    assert "not divisible by the sequence-parallel size 3" in err.value.reason


def test_registry_names_checked():
    c = from_dict(TemperConfig, cfg(algorithm={"adv_estimator": "grpoo"}))
    with pytest.raises(ConfigError) as err:
        validate(c, CATALOG)
    assert "algorithm.adv_estimator: unknown value 'grpoo' (did you mean 'grpo'?)" in one_line(err)


def test_dynamic_bsz_budget_must_hold_a_sample():
    with pytest.raises(ConfigError, match="actor.max_token_len_per_device: a token budget of 100"):
        build_config(cfg(actor={"use_dynamic_bsz": True, "max_token_len_per_device": 100}))


def test_a_critic_budget_is_checked_only_when_there_is_a_critic():
    small = {"use_dynamic_bsz": True, "max_token_len_per_device": 100}
    with pytest.raises(ConfigError, match="critic.max_token_len_per_device: a token budget"):
        build_config(cfg(algorithm={"adv_estimator": "gae"}, critic=small))
    build_config(cfg(algorithm={"adv_estimator": "grpo"}, critic=small))  # no critic: unread


def test_bound_in_units():
    """A batch-size fix's bound (samples) restated in units of n samples: x units are
    x·n samples, so "≤ 32" is "≤ 16" pairs, "divides 32" is "divides 16", and "a multiple
    of 4" is "a multiple of 2" pairs; no whole count of units meets "divides 30" by 4s."""
    from temper.config.errors import Bound

    assert Bound("at_most", 32, 64).in_units(2) == Bound("at_most", 16, 32)
    assert Bound("divisor_of", 32, 14).in_units(2).text() == "a divisor of 16, e.g. 8"
    assert Bound("multiple_of", 4, 2).in_units(2) == Bound("multiple_of", 2, 1)
    assert Bound("multiple_of", 3, 16).in_units(2).text() == "a multiple of 3"
    assert Bound("divisor_of", 30, 7).in_units(4) is None
    assert Bound("at_most", 3, 8).in_units(4) is None
    assert Bound("at_most", 32, 64).in_units(1) == Bound("at_most", 32, 64)
    # a token budget of whole samples ≥ 22528, counted per rank of 4 (rounded up)
    assert Bound("at_least", 22528, 11264).in_units(4) == Bound("at_least", 5632, 2816)
    assert Bound("at_least", 10, 4).in_units(4).text() == "≥ 3"


def test_engines_take_a_sequence_parallel_groups_whole_micro_batch():
    import torch

    from temper.roles.builder import infer_micro_batching
    from temper.training.spec import EngineSpec

    c = build_config(
        cfg(
            data={"train_batch_size": 256},
            actor={
                "strategy": "fsdp2",
                "micro_batch_size_per_device": 64,
                "log_prob_micro_batch_size_per_device": 16,
                "ulysses_sequence_parallel_size": 2,
            },
            resources={"backend": "ray", "devices_per_node": 8},
        )
    )
    spec = EngineSpec(model=c.model, device=torch.device("cpu"), train=c.actor)
    # every rank of a group takes the group's samples (and runs 1/2 of their tokens)
    assert spec.train_micro.size == 64 and spec.ulysses_size == 2
    assert infer_micro_batching(c, c.actor).size == 16


def test_an_engine_spans_its_tensor_parallel_ranks():
    ray = {"backend": "ray", "devices_per_node": 4, "actor_train": [0], "actor_infer": [0, 1]}
    ok = cfg(rollout={"engine": "vllm", "tensor_parallel_size": 2}, resources=ray)
    assert build_config(ok).resources.devices_per_infer_worker == 1
    both = cfg(
        rollout={"engine": "vllm", "tensor_parallel_size": 2},
        resources={**ray, "devices_per_infer_worker": 2},
    )
    assert build_config(both).rollout.tensor_parallel_size == 2
    with pytest.raises(ConfigError) as err:
        build_config(cfg(resources={**ray, "devices_per_infer_worker": 2}))
    assert one_line(err).startswith(
        "resources.devices_per_infer_worker: 2 devices per rollout engine, but "
        "rollout.tensor_parallel_size is 1"
    )
