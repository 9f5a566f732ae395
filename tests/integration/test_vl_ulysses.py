"""Ulysses sequence parallelism on vision-language models computes what one process does.

Two gloo ranks form one sequence-parallel group over a tiny Qwen2-VL and a tiny Qwen3-VL
(deepstack features): the vision tower and the M-RoPE positions see whole sequences, the
text decoder runs on each rank's half of the columns, and the log-probs and the updated
weights (vision tower included) equal the single-process torch engine's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_vl_tiny import _vl_actor  # same folder

from temper.cluster.process_group import spawn_ranks
from temper.data.batch import Batch
from temper.data.tasks import make_task_rows

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


def _sp_actor(path: str):
    from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
    from temper.roles.actor import Actor
    from temper.training.micro_batching import MicroBatching
    from temper.training.registry import build_engine
    from temper.training.spec import EngineSpec

    cfg = ActorConfig(  # _vl_actor's, on one Ulysses group of two ranks
        strategy="fsdp2",
        use_dynamic_bsz=True,
        max_token_len_per_device=90,
        optim=OptimConfig(lr=0.1, eps=1.0, weight_decay=0.0),
        ulysses_sequence_parallel_size=2,
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=2),
    )
    return Actor(cfg, build_engine("fsdp2", spec))


def _sp_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    actor = _sp_actor(path)
    old = actor.compute_log_probs(batch)["old_log_probs"]  # every rank: the whole batch
    actor.update(batch)
    full = {k: v.detach().clone() for k, v in actor.engine.named_weights()}  # collective
    return {"old": old, "weights": full, "layouts": dict(actor.engine.layouts)}


def _image_batch(path: str, tmp_path: Path, single) -> Batch:
    from transformers import AutoTokenizer

    from temper.config.schema import DataConfig
    from temper.data import build_dataset
    from temper.data.row_files import write_rows
    from temper.data.vision import load_vision_processor
    from temper.rollout.base import SamplingParams
    from temper.rollout.hf import HFRolloutEngine

    tok = AutoTokenizer.from_pretrained(path)
    data = write_rows(make_task_rows("visual_color", 2, seed=2, size=84), tmp_path / "d.parquet")
    cfg = DataConfig(max_prompt_length=96)
    ds = build_dataset(data, cfg, tok, vision=load_vision_processor(path, tok, cfg))
    torch.manual_seed(0)
    batch = HFRolloutEngine(single.engine.model, tok).generate(
        ds.make_batch([0, 1]), SamplingParams(n=2, max_new_tokens=5)
    )
    sign = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None]
    batch["advantages"] = sign * batch["response_mask"].float()
    return batch


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_vl_sequence_parallel_ranks_match_single_process(tmp_path, family):
    from temper.utils.tiny_vlm import make_tiny_vlm

    path = str(make_tiny_vlm(tmp_path / family, family=family))
    single = _vl_actor(path, "torch", False)
    batch = _image_batch(path, tmp_path, single)
    batch = single.compute_log_probs(batch)
    before = {k: v.clone() for k, v in single.engine.named_weights()}
    single.update(batch)
    ref = {k: v.clone() for k, v in single.engine.named_weights()}

    ranks = spawn_ranks(_sp_rank, 2, path, batch)

    for r in ranks:
        assert r["layouts"]["padded"] > 0 and not r["layouts"].get("packed")
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        for k, w in r["weights"].items():
            torch.testing.assert_close(w, ref[k], atol=2e-6, rtol=1e-5, msg=k)
    visual = [k for k in before if ".visual." in f".{k}"]
    assert visual and all(not torch.equal(before[k], ref[k]) for k in visual)


def _sp_critic(path: str, strategy: str, sp: int):
    from temper.config.schema import CriticConfig, ModelConfig, OptimConfig
    from temper.roles.critic import Critic
    from temper.training.micro_batching import MicroBatching
    from temper.training.registry import build_engine
    from temper.training.spec import EngineSpec

    cfg = CriticConfig(
        strategy=strategy,
        use_dynamic_bsz=True,
        max_token_len_per_device=90,
        optim=OptimConfig(lr=0.1, eps=1.0, weight_decay=0.0),
        ulysses_sequence_parallel_size=sp,
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        kind="value",
        train=cfg,
        infer_micro=MicroBatching(size=2),
        role="critic",
    )
    return Critic(cfg, build_engine(strategy, spec))


def _critic_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    critic = _sp_critic(path, "fsdp2", 2)
    values = critic.compute_values(batch)["values"]
    critic.update(batch)
    full = {k: v.detach().clone() for k, v in critic.engine.named_weights()}  # collective
    return {"values": values, "weights": full}


def test_vl_value_model_under_ulysses_matches_single_process(tmp_path):
    """A VL critic (``critic.ulysses_sequence_parallel_size`` 2): values over images and the
    weights after a value update, vision tower included, equal one process's."""
    from temper.utils.tiny_vlm import make_tiny_vlm

    path = str(make_tiny_vlm(tmp_path / "m", family="qwen2_vl"))
    batch = _image_batch(path, tmp_path, _vl_actor(path, "torch", False))
    single = _sp_critic(path, "torch", 1)
    batch = single.compute_values(batch)
    batch["returns"] = batch["values"] + 0.5 * batch["response_mask"].float()
    before = {k: v.clone() for k, v in single.engine.named_weights()}
    single.update(batch)
    ref = {k: v.clone() for k, v in single.engine.named_weights()}

    for r in spawn_ranks(_critic_rank, 2, path, batch):
        torch.testing.assert_close(r["values"], batch["values"], atol=1e-5, rtol=1e-5)
        for k, w in r["weights"].items():
            torch.testing.assert_close(w, ref[k], atol=2e-6, rtol=1e-5, msg=k)
    visual = [k for k in before if ".visual." in f".{k}"]
    assert visual and all(not torch.equal(before[k], ref[k]) for k in visual)
