"""Initial weights from a Megatron-Core distributed checkpoint (verl's
``use_dist_checkpointing``): one written at TP = 1 loads at TP = 2 (each rank reads its
shard), and the weights are the checkpoint's, not ``model.path``'s (which gives only the
architecture): the log-probs equal those of the model the checkpoint was made from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_megatron import make_batch  # same folder: pytest puts it on sys.path
from test_megatron_pipeline import make_actor

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.errors import ConfigError

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


def _save_rank(rank: int, world: int, path: str, out: str) -> None:
    from megatron.core import dist_checkpointing

    module = make_actor(path, "megatron").engine.built.module
    # the checkpoint stands for verl's converter output, written on a GPU: Megatron's
    # writer syncs CUDA after its (here CPU-to-CPU) copies and reduces its error flags on
    # the current CUDA device — on CPU, a no-op and the CPU (this rank's process only)
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_device = lambda: "cpu"
    dist_checkpointing.save(module.sharded_state_dict(), out)


def _critic(path: str, strategy: str, *, tp: int = 1, pp: int = 1, dist: str | None = None):
    from temper.config.schema import CriticConfig, MegatronConfig, ModelConfig, OptimConfig
    from temper.roles.critic import Critic
    from temper.training.micro_batching import MicroBatching
    from temper.training.registry import build_engine
    from temper.training.spec import EngineSpec

    cfg = CriticConfig(
        strategy=strategy,
        micro_batch_size_per_device=1,
        megatron=MegatronConfig(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            dist_checkpoint_path=dist,
        ),
        optim=OptimConfig(lr=1e-3),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        kind="value",
        train=cfg,
        infer_micro=MicroBatching(size=2),
        seed=5,
        role="critic",
    )
    return Critic(cfg, build_engine(strategy, spec))


def _critic_rank(rank: int, world: int, path: str, dist: str, tp: int, batch) -> torch.Tensor:
    critic = _critic(path, "megatron", tp=tp, pp=world // tp, dist=dist)
    return critic.compute_values(batch)["values"]


def _load_rank(rank: int, world: int, path: str, dist: str, batch) -> torch.Tensor:
    return make_actor(path, "megatron", tp=world, dist=dist).compute_log_probs(batch)[
        "old_log_probs"
    ]


@pytest.fixture(scope="module")
def two_models(tmp_path_factory) -> tuple[str, str]:
    from temper.utils.tiny import make_tiny_model

    root = tmp_path_factory.mktemp("dist-init")
    return str(make_tiny_model(root / "a", seed=1)), str(make_tiny_model(root / "b", seed=2))


def test_a_dist_checkpoint_loads_at_another_tensor_parallel_size(two_models, tmp_path: Path):
    source, other = two_models  # one architecture, two sets of weights
    dist = str(tmp_path / "mcore")
    Path(dist).mkdir()  # dist_checkpointing.save writes into an existing directory
    spawn_ranks(_save_rank, 1, source, dist)
    assert (Path(dist) / "metadata.json").is_file()
    batch = make_batch()
    want = make_actor(source, "torch").compute_log_probs(batch)["old_log_probs"]
    unwanted = make_actor(other, "torch").compute_log_probs(batch)["old_log_probs"]
    assert not torch.allclose(want, unwanted, atol=1e-3)
    for got in spawn_ranks(_load_rank, 2, other, dist, batch):  # model.path: architecture only
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def actor_checkpoint(two_models, tmp_path_factory) -> str:
    """The first model's weights, written by its TP = 1 actor."""
    dist = tmp_path_factory.mktemp("dist-init-actor") / "mcore"
    dist.mkdir()
    spawn_ranks(_save_rank, 1, two_models[0], str(dist))
    return str(dist)


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_a_critic_starts_from_an_actors_dist_checkpoint(two_models, actor_checkpoint, tp, pp):
    source, other = two_models
    batch = make_batch()
    want = _critic(source, "torch").compute_values(batch)["values"]
    unwanted = _critic(other, "torch").compute_values(batch)["values"]
    assert not torch.allclose(want, unwanted, atol=1e-3)
    for got in spawn_ranks(_critic_rank, tp * pp, other, actor_checkpoint, tp, batch):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_missing_dist_checkpoint_is_refused_at_check(tmp_path: Path):
    from temper.training.megatron_dist_init import check_dist_checkpoint

    with pytest.raises(ConfigError, match="is not a Megatron-Core distributed checkpoint"):
        check_dist_checkpoint(str(tmp_path), "actor.megatron.dist_checkpoint_path")
