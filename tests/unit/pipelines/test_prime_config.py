"""What a ``prime`` run refuses at ``temper check``, each in one line with its key; and
the keep-order of its oversampled groups (the producer's downsampling)."""

from __future__ import annotations

from typing import Any

import pytest

from temper.config.errors import ConfigError
from temper.pipelines.catalog import build_config, load_config

PRIME: dict[str, Any] = {
    "pipeline": "prime",
    "model": {"path": "m"},
    "data": {"train_files": ["t.parquet"], "train_batch_size": 4},
    "rollout": {"n": 4},
}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


REFUSED = [
    ({"rollout": {"n": 1}}, "rollout.n"),
    ({"algorithm": {"adv_estimator": "gae"}}, "algorithm.adv_estimator"),
    ({"algorithm": {"use_kl_in_reward": True}}, "algorithm.use_kl_in_reward"),
    ({"critic": {"enable": True}}, "critic.enable"),
    ({"prime": {"oversample_factor": 1.3}}, "prime.oversample_factor"),
    ({"prime": {"oversample_factor": 0.5}}, "prime.oversample_factor"),
    (
        {
            "prime": {
                "filter_accuracy": True,
                "accuracy_lower_bound": 0.9,
                "accuracy_upper_bound": 0.5,
            }
        },
        "prime.accuracy_lower_bound",
    ),
    ({"prime": {"accuracy_upper_bound": 0.5}}, "prime.accuracy_upper_bound"),
    ({"prime": {"prm": {"beta_train": 0.0}}}, "prime.prm.beta_train"),
    ({"prime": {"prm": {"update": "reverse"}}}, "prime.prm.update"),
    ({"prime": {"prm": {"loss_type": "dpo"}}}, "prime.prm.loss_type"),
    ({"prime": {"granularity": "step"}}, "prime.granularity"),
    ({"model": {"lora": {"rank": 8}}}, "model.lora.rank"),
    ({"data": {"gen_batch_size": 8}}, "data.gen_batch_size"),
    ({"prime": {"prm": {"ppo_epochs": 2}}}, "prime.prm.ppo_epochs"),
    ({"prime": {"prm": {"shuffle": True}}}, "prime.prm.shuffle"),
    ({"prime": {"prm": {"mini_batch_size": 32}}}, "prime.prm.mini_batch_size"),
    (
        {"prime": {"prm": {"mini_batch_size": 6, "micro_batch_size_per_device": 4}}},
        "prime.prm.mini_batch_size",
    ),
    ({"async_training": {"staleness": 1}}, "async_training"),
]


@pytest.mark.parametrize(("over", "key"), REFUSED, ids=[r[1] for r in REFUSED])
def test_refused_with_the_key(over, key):
    with pytest.raises(ConfigError) as err:
        build_config(merged(PRIME, over))
    assert key in str(err.value) and err.value.fix and "\n" not in str(err.value)


def test_prime_section_is_refused_under_another_pipeline():
    with pytest.raises(ConfigError) as err:
        build_config({**PRIME, "pipeline": "rlvr", "prime": {"reward_gt_coef": 1.0}})
    assert str(err.value).startswith("prime: the prime section configures the prime pipeline")


def test_accepted_and_planned_with_the_prm(tmp_path):
    path = tmp_path / "prime.yaml"
    path.write_text(
        "pipeline: prime\nmodel: {path: m}\ndata: {train_files: [t.parquet], "
        "train_batch_size: 4}\nrollout: {n: 4}\nprime: {oversample_factor: 2.5, "
        "filter_accuracy: true, accuracy_lower_bound: 0.2, accuracy_upper_bound: 0.8}\n"
    )
    loaded = load_config(path, [])
    assert loaded.plan.use_prm and loaded.plan.roles == ("actor", "prm")
    assert not loaded.plan.use_critic and not loaded.plan.use_reference


def test_downsample_keeps_passing_groups_first_in_draw_order():
    import torch

    from temper.data import Batch
    from temper.pipelines.prime import PrimeProducer

    cfg = build_config(
        merged(PRIME, {"rollout": {"n": 2}, "data": {"train_batch_size": 2}, "prime": {
            "oversample_factor": 2, "filter_accuracy": True,
            "accuracy_lower_bound": 0.2, "accuracy_upper_bound": 0.8}})
    )  # fmt: skip
    producer = PrimeProducer.__new__(PrimeProducer)  # downsampling reads the config only
    producer.cfg = cfg
    batch = Batch.from_dict(
        {
            "scores": torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]),
            "response_mask": torch.ones(8, 3),
            "row": torch.arange(8),
        }
    )
    kept, metrics = producer.downsample(batch)
    # groups 1 and 3 (mean 0.5) pass; the first 2 groups of [1, 3, 0, 2] are kept
    assert kept["row"].tolist() == [2, 3, 6, 7]
    assert metrics["prime/groups_passed"] == 0.5
