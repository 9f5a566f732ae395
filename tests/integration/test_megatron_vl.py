"""Vision-language models (tiny Qwen2-VL / Qwen2.5-VL) on the megatron engine against the
torch engine, on image rows: per-token log-probs at TP=1 and TP=2; one actor update at
TP=2 (vision tower trained, or frozen and unchanged; with sequence parallelism), at DP=2,
PP=2 and CP=2; the exported
HF names and tensors are the torch engine's, and the saved directory loads in
transformers.

Ranks are forked by ``spawn_ranks`` after this module has imported Megatron-Core.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, DataConfig, MegatronConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny_vlm import make_tiny_vlm

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

FAMILIES = ("qwen2_vl", "qwen2_5_vl")


@pytest.fixture(scope="module")
def vlms(tmp_path_factory) -> dict[str, str]:
    """Tiny VL models with 2 key/value heads (TP=2 splits them)."""
    root = tmp_path_factory.mktemp("megatron-vl")
    return {f: str(make_tiny_vlm(root / f, num_kv_heads=2, family=f)) for f in FAMILIES}


def vl_actor(path: str, strategy: str, tp: int = 1, freeze: bool = False, **split: Any) -> Actor:
    """A VL actor; ``split``: more MegatronConfig degrees (pipeline, context, sequence
    parallelism)."""
    cfg = ActorConfig(
        strategy=strategy,
        use_dynamic_bsz=True,  # token budgets: ranks run different micro-batch counts
        max_token_len_per_device=90,
        freeze_vision_tower=freeze,
        grad_clip=1.0,
        megatron=MegatronConfig(tensor_model_parallel_size=tp, **split),
        # a large eps keeps Adam's first step linear in the gradient (fp32 round-off
        # on tiny gradients summed in another order would move a weight by O(lr))
        optim=OptimConfig(lr=0.1, eps=1.0, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=2),
    )
    return Actor(cfg, build_engine(strategy, spec))


def image_batch(path: str, tmp: Path) -> tuple[Batch, Actor]:
    """Four sampled responses to two image prompts, scored by the torch engine (its
    old log-probs), with advantages ±1 and ±0.5; and that torch actor."""
    from transformers import AutoTokenizer

    from temper.data import build_dataset
    from temper.data.row_files import write_rows
    from temper.data.tasks import make_task_rows
    from temper.data.vision import load_vision_processor
    from temper.rollout.base import SamplingParams
    from temper.rollout.hf import HFRolloutEngine

    tok = AutoTokenizer.from_pretrained(path)
    data = write_rows(make_task_rows("visual_color", 2, seed=2, size=84), tmp / "d.parquet")
    cfg = DataConfig(max_prompt_length=96)
    ds = build_dataset(data, cfg, tok, vision=load_vision_processor(path, tok, cfg))
    single = vl_actor(path, "torch")
    torch.manual_seed(0)
    batch = HFRolloutEngine(single.engine.model, tok).generate(
        ds.make_batch([0, 1]), SamplingParams(n=2, max_new_tokens=5)
    )
    batch = single.compute_log_probs(batch)
    sign = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None]
    batch["advantages"] = sign * batch["response_mask"].float()
    return batch, single


def _log_prob_rank(rank: int, world: int, path: str, batch: Batch) -> torch.Tensor:
    actor = vl_actor(path, "megatron", tp=world)
    return actor.compute_log_probs(batch)["old_log_probs"]


@pytest.mark.parametrize("family", FAMILIES)
def test_log_probs_on_images_equal_the_torch_engine_at_tp1_and_tp2(vlms, tmp_path, family):
    path = vlms[family]
    batch, _ = image_batch(path, tmp_path)
    ref = batch["old_log_probs"]
    assert len(batch.objects["multi_modal_inputs"]) == 4
    for world in (1, 2):
        got = spawn_ranks(_log_prob_rank, world, path, batch)
        for g in got:
            torch.testing.assert_close(g, ref, atol=2e-6, rtol=1e-5)


def _step_rank(
    rank: int,
    world: int,
    path: str,
    batch: Batch,
    split: dict[str, Any],
    freeze: bool,
    out: str,
) -> dict[str, Any] | None:
    actor = vl_actor(path, "megatron", freeze=freeze, **split)
    tp = split.get("tp", 1)
    cp = split.get("context_parallel_size", 1)
    dp = world // (tp * split.get("pipeline_model_parallel_size", 1) * cp)
    n = len(batch) // dp
    d = (rank // (tp * cp)) % dp  # Megatron's order: TP, CP, DP
    actor.update(batch.slice(d * n, (d + 1) * n))
    full = {k: v.detach().clone() for k, v in actor.engine.named_weights()}  # collective
    actor.engine.save_hf(out)
    return full if rank == 0 else None


TP2 = {"tp": 2}
SPLITS = [
    (TP2, False),
    (TP2, True),
    ({"tp": 2, "sequence_parallel": True}, False),
    ({}, False),
    ({"pipeline_model_parallel_size": 2}, False),
    ({"context_parallel_size": 2}, False),
]


@pytest.mark.parametrize(
    ("split", "freeze"), SPLITS, ids=["tp2", "tp2-frozen", "tp2-sp", "dp2", "pp2", "cp2"]
)
def test_update_on_images_equals_the_torch_engine(vlms, tmp_path, split, freeze):
    """One update at TP=2 (tower trained or frozen; with sequence parallelism: the
    decoder input split over TP as Megatron's embedding splits it), at DP=2, over two
    pipeline stages (the tower on the first) or at CP=2 (each CP rank runs its share of
    the decoder input; the tower's partial gradients summed over CP) gives the torch
    engine's parameters, vision tower included; the saved directory loads in
    transformers with the same weights."""
    from transformers import AutoModelForImageTextToText

    path = vlms["qwen2_vl"]
    batch, _ = image_batch(path, tmp_path)
    single = vl_actor(path, "torch", freeze=freeze)
    before = {k: v.clone() for k, v in single.engine.named_weights()}
    single.update(batch)
    ref = {k: v.clone() for k, v in single.engine.named_weights()}
    out = tmp_path / "hf"
    got = spawn_ranks(_step_rank, 2, path, batch, split, freeze, str(out))[0]
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(
            got[k], ref[k], atol=2e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}"
        )
    visual = [k for k in before if k.startswith("model.visual.")]
    assert visual
    unchanged = [k for k in visual if torch.equal(before[k], got[k])]
    assert unchanged == (visual if freeze else [])
    loaded = AutoModelForImageTextToText.from_pretrained(out).state_dict()
    for k in ref:
        torch.testing.assert_close(loaded[k], got[k], atol=0, rtol=0, msg=k)
    assert (out / "preprocessor_config.json").is_file()
    # the source checkpoint's layout (model.*, visual.*), as save_pretrained writes it
    from safetensors import safe_open

    with (
        safe_open(str(Path(path) / "model.safetensors"), "pt") as f,
        safe_open(str(out / "model.safetensors"), "pt") as g,
    ):
        assert set(g.keys()) == set(f.keys())


def _checkpoint_rank(
    rank: int, world: int, path: str, batch: Batch, ckpt: str, tp: int, mode: str
) -> dict[str, Any] | None:
    actor = vl_actor(path, "megatron", tp=tp)
    engine = actor.engine
    first, second = batch.slice(0, 2), batch.slice(2, 4)
    out: dict[str, Any] = {}
    if mode == "train":
        actor.update(first)
        engine.save_checkpoint(f"{ckpt}/a")
    else:
        engine.load_checkpoint(f"{ckpt}/a")
    out["w1"] = {k: v.detach().clone() for k, v in engine.named_weights()}
    actor.update(second)
    out["w2"] = {k: v.detach().clone() for k, v in engine.named_weights()}
    return out if rank == 0 else None


def test_checkpoint_with_the_tower_resumes_at_another_tensor_parallel_size(vlms, tmp_path):
    """TP=2: step, save, step. TP=1: load, step: the same weights, vision tower and its
    AdamW moments included (the second step moves them again)."""
    path = vlms["qwen2_vl"]
    batch, _ = image_batch(path, tmp_path)
    ckpt = str(tmp_path / "ckpt")
    trained = spawn_ranks(_checkpoint_rank, 2, path, batch, ckpt, 2, "train")[0]
    resumed = spawn_ranks(_checkpoint_rank, 1, path, batch, ckpt, 1, "load")[0]
    for k in trained["w1"]:
        torch.testing.assert_close(resumed["w1"][k], trained["w1"][k], atol=0, rtol=0, msg=k)
        torch.testing.assert_close(resumed["w2"][k], trained["w2"][k], atol=1e-6, rtol=1e-5, msg=k)
    tower = "model.visual.merger.mlp.2.weight"
    assert not torch.equal(trained["w1"][tower], trained["w2"][tower])


def _prefix_rank(rank: int, world: int, path: str, batch: Batch, prefix: str) -> dict[str, Any]:
    from temper.config.errors import ConfigError

    cfg = ActorConfig(
        strategy="megatron",
        freeze_module_prefix=[prefix],
        optim=OptimConfig(lr=0.1, eps=1.0, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=2),
    )
    try:
        actor = Actor(cfg, build_engine("megatron", spec))
    except ConfigError as err:
        return {"error": str(err)}
    before = {k: v.detach().clone() for k, v in actor.engine.named_weights()}
    actor.update(batch)
    after = {k: v.detach().clone() for k, v in actor.engine.named_weights()}
    return {"moved": sorted(k for k in before if not torch.equal(before[k], after[k]))}


def test_freeze_module_prefix_names_the_tower_as_hf_or_mcore_adapter_does(vlms, tmp_path):
    """ROLL's ``freeze_module_prefix``: ``vision_model.blocks`` (mcore_adapter's name)
    freezes the tower's blocks (``model.visual.blocks``), the merger still trains; a
    prefix of no parameter is a ConfigError naming the key."""
    path = vlms["qwen2_vl"]
    batch, _ = image_batch(path, tmp_path)
    moved = spawn_ranks(_prefix_rank, 1, path, batch, "vision_model.blocks")[0]["moved"]
    assert not any(k.startswith("model.visual.blocks.") for k in moved)
    assert any(k.startswith("model.visual.merger.") for k in moved)
    assert any(k.startswith("model.language_model.layers.") for k in moved)
    said = spawn_ranks(_prefix_rank, 1, path, batch, "model.vision")[0]["error"]
    assert said.startswith("actor.freeze_module_prefix: 'model.vision' matches no parameter")
