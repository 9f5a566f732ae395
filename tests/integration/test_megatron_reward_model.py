"""A reward model on the megatron engine (``reward.model.strategy: megatron``): a tiny
sequence classifier's backbone and ``score.weight`` loaded into a ``GPTModel`` with a
scalar head score token lists as the Hugging Face classifier (the torch reward model)
does — fp32, at TP=1, TP=2 and PP=2, on left-padded micro-batches of different lengths.

Ranks are forked by ``spawn_ranks`` after this module has imported Megatron-Core.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import MegatronConfig, ModelConfig, RewardModelConfig
from temper.rewards.model import RewardModel
from temper.roles.reward_model import EngineRewardModel, score_rows
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_classifier

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

#: token lists of different lengths (one of a single token), micro-batched 2 by 2
SEQS = [[5, 9, 12, 40, 41], [7, 3], [100, 101, 102, 103, 104, 105, 106, 107], [8], [30, 31, 32]]


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("rm-models")
    return {t: make_tiny_classifier(root / t, t) for t in ("llama", "qwen2")}


def _config(path: str) -> RewardModelConfig:
    return RewardModelConfig(enable=True, path=path, micro_batch_size_per_device=2)


def megatron_reward_model(path: str, megatron: MegatronConfig) -> EngineRewardModel:
    from transformers import AutoTokenizer

    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        kind="score",
        model_path=path,
        role="reward.model",
        megatron=megatron,
    )
    engine = build_engine("megatron", spec)
    return EngineRewardModel(engine, AutoTokenizer.from_pretrained(path), _config(path))


def _score_rank(rank: int, world: int, path: str, megatron: MegatronConfig) -> torch.Tensor:
    return megatron_reward_model(path, megatron).score_sequences(SEQS)


def test_score_rows_put_the_last_token_before_the_placeholder() -> None:
    batch = score_rows([[4, 5, 6], [7]])
    assert batch["prompt_ids"].tolist() == [[4, 5, 6], [0, 0, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert batch["response_mask"].tolist() == [[1], [1]]


@pytest.mark.parametrize(
    "layout",
    [
        {},
        {"tensor_model_parallel_size": 2},
        {"pipeline_model_parallel_size": 2},
    ],
    ids=["tp1", "tp2", "pp2"],
)
def test_megatron_scores_equal_the_hf_classifier(classifiers, layout) -> None:
    megatron = MegatronConfig(**layout)
    world = megatron.model_parallel_size
    for path in classifiers.values():
        hf = RewardModel.from_config(_config(path), dtype=torch.float32)
        want = hf.score_sequences(SEQS)
        ranks = spawn_ranks(_score_rank, world, path, megatron)
        for got in ranks:  # every rank returns the scores (the last stage's, broadcast)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert want.std() > 0  # distinct scores, not a constant head


def _rl_run(
    tiny: Path, rm: str, out: Path, strategy: str, rm_over: dict | None = None, **over: dict
) -> list[dict]:
    """2 GRPO steps (the local backend unless ``over`` says otherwise) scored by the reward
    model alone (no rule); ``rm_over``: more ``reward.model`` keys."""
    from temper.pipelines import run_pipeline
    from temper.pipelines.catalog import build_config

    cfg = {
        "pipeline": "rlvr",
        "model": {"path": str(tiny), "dtype": "fp32"},
        "data": {
            "train_files": ["task:arithmetic?n=16&seed=0&max_operand=3"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"engine": "hf", "n": 2, "response_length": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 2},
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {
            "model": {
                "enable": True,
                "path": rm,
                "strategy": strategy,
                "micro_batch_size_per_device": 3,
                **(rm_over or {}),
            }
        },
        "experiment": {
            "max_steps": 2,
            "seed": 0,
            "val_before_train": False,
            "output_dir": str(out),
            "trackers": ["jsonl"],
        },
    }
    for section, values in over.items():
        cfg.setdefault(section, {}).update(values)
    run_pipeline(build_config(cfg))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "train/score_mean" in r]


def test_rlvr_run_scored_by_a_megatron_reward_model(
    tmp_path, tiny_model_dir, classifiers, monkeypatch
) -> None:
    """reward.model.strategy: megatron on the local backend (a one-rank world in this
    process): 2 steps whose rewards are the reward model's real-valued scores (that they
    equal the Hugging Face classifier's on the same tokens is the test above)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    try:
        got = _rl_run(tiny_model_dir, classifiers["qwen2"], tmp_path / "meg", "megatron")
    finally:
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert r["train/rm_score_mean"] == pytest.approx(r["train/score_mean"], abs=1e-6)
        assert r["train/score_min"] < r["train/score_max"]
        assert {r["train/score_min"], r["train/score_max"]} - {0.0, 1.0}


@pytest.mark.ray
@pytest.mark.parametrize(
    ("strategy", "layout", "dp"),
    [
        ("megatron", {"tensor_model_parallel_size": 2}, 1),
        ("megatron", {}, 2),
        ("fsdp2", {}, 2),
        ("torch", {}, 2),
    ],
    ids=["megatron-tp2", "megatron-dp2", "fsdp2-dp2", "torch-dp2"],
)
def test_a_reward_group_on_two_ray_ranks_scores_as_one_process(
    classifiers, ray_session, strategy, layout, dp
) -> None:
    from ray_groups import score_on_a_ray_group

    """The Ray ``reward`` group (temper.cluster.reward): two TP ranks sharing every row,
    or two data-parallel ranks (FSDP2 shards, or whole torch replicas) each scoring its
    (token-balanced, padded) share, give
    the one-process classifier's scores, in the batch's order."""
    path = classifiers["qwen2"]
    want = RewardModel.from_config(_config(path), dtype=torch.float32).score_sequences(SEQS)
    got, data_size = score_on_a_ray_group(path, strategy, MegatronConfig(**layout), SEQS)
    assert data_size == dp
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert want.std() > 0


@pytest.mark.ray
@pytest.mark.parametrize(
    ("strategy", "rm"),
    [("megatron", {"megatron": {"tensor_model_parallel_size": 2}}), ("torch", {})],
    ids=["megatron-tp2", "torch-replicas"],
)
def test_rlvr_run_on_ray_scored_by_a_reward_model_on_its_own_ranks(
    tmp_path, tiny_model_dir, classifiers, monkeypatch, capsys, strategy, rm
) -> None:
    """On the Ray backend (the actor on two fsdp2 ranks in workers) the reward model
    scores on a worker group of its own, colocated with the actor (verl's default
    placement) — a megatron one at TP=2, or a torch replica per device, each scoring
    its share: 2 GRPO steps whose rewards are its scores."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    over = dict(
        actor={"strategy": "fsdp2"},
        experiment={"device": "cpu"},
        resources={"backend": "ray", "devices_per_node": 2, "ray": {"num_cpus": 4}},
    )
    try:
        got = _rl_run(tiny_model_dir, classifiers["qwen2"], tmp_path / "ray", strategy, rm, **over)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert [r["step"] for r in got] == [1, 2]
    for r in got:
        assert r["train/rm_score_mean"] == pytest.approx(r["train/score_mean"], abs=1e-6)
        assert r["train/score_min"] < r["train/score_max"]
    assert "ray: reward ranks 0..1 up" in capsys.readouterr().out  # its group, not the driver
