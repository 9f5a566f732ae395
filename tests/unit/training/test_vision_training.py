"""Training forwards of a vision-language model: each row's ``multi_modal_inputs`` reach
the actor, reference and critic forwards; every parameter that should train moves and a
frozen vision tower does not; saved models keep their processor."""

from __future__ import annotations

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import ActorConfig, CriticConfig, DataConfig, ModelConfig, OptimConfig
from temper.data import Batch, build_dataset
from temper.data.row_files import write_rows
from temper.data.tasks import make_task_rows
from temper.data.vision import MULTI_MODAL_INPUTS, load_vision_processor
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.training.micro_batching import MicroBatching
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine


@pytest.fixture(scope="module")
def vl_batch(tiny_vlm_dir, tmp_path_factory) -> Batch:
    """Sampled responses to four image prompts (two responses each)."""
    from transformers import AutoTokenizer

    tmp = tmp_path_factory.mktemp("vl-train")
    path = write_rows(make_task_rows("visual_color", 4, seed=3), tmp / "d.parquet")
    tok = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    cfg = DataConfig(max_prompt_length=96)
    ds = build_dataset(path, cfg, tok, vision=load_vision_processor(str(tiny_vlm_dir), tok, cfg))
    engine = actor(tiny_vlm_dir)
    torch.manual_seed(0)
    return HFRolloutEngine(engine.model, tok).generate(
        ds.make_batch([0, 1, 2, 3]), SamplingParams(n=2, max_new_tokens=6)
    )


def actor(model_dir, **train) -> TorchEngine:
    cfg = ActorConfig(
        micro_batch_size_per_device=3,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        **train,
    )
    return TorchEngine(
        EngineSpec(
            model=ModelConfig(path=str(model_dir)),
            device=torch.device("cpu"),
            train=cfg,
            infer_micro=MicroBatching(size=3),
        )
    )


def nll(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    mask = mb["response_mask"].float()
    return -(out["log_probs"] * mask).sum() / mask.sum(), {}


def snapshot(engine: TorchEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.model.named_parameters()}


def test_every_parameter_moves_vision_tower_included(tiny_vlm_dir, vl_batch):
    engine = actor(tiny_vlm_dir)
    before = snapshot(engine)
    engine.train_mini_batch(vl_batch, nll)
    after = dict(engine.model.named_parameters())
    still = [n for n in before if torch.equal(before[n], after[n].detach())]
    assert not still, still
    assert any(n.startswith("model.visual.") for n in before)


def test_frozen_vision_tower_does_not_move_and_the_rest_does(tiny_vlm_dir, vl_batch):
    engine = actor(tiny_vlm_dir, freeze_vision_tower=True)
    optimized = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    before = snapshot(engine)
    engine.train_mini_batch(vl_batch, nll)
    params = dict(engine.model.named_parameters())
    visual = [n for n in before if n.startswith("model.visual.")]
    assert visual and all(not params[n].requires_grad for n in visual)
    assert not any(id(params[n]) in optimized for n in visual)
    assert all(torch.equal(before[n], params[n].detach()) for n in visual)
    moved = [n for n in before if n not in visual]
    still = [n for n in moved if torch.equal(before[n], params[n].detach())]
    assert not still, still
    assert set(engine.state_dict()["model"]) == set(moved)  # checkpoints hold what trains


def test_freeze_module_prefix_roll_rule(tiny_vlm_dir):
    engine = actor(tiny_vlm_dir, freeze_module_prefix=["model.visual.blocks.0"])
    frozen = {n for n, p in engine.model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith("model.visual.blocks.0.") for n in frozen)
    with pytest.raises(ConfigError, match=r"actor\.freeze_module_prefix: 'vision_mod' matches"):
        actor(tiny_vlm_dir, freeze_module_prefix=["vision_mod"])


def test_freeze_module_prefix_mcore_vision_name(tiny_vlm_dir):
    """ROLL's megatron files name the tower as mcore_adapter does: vision_model.blocks
    freezes the HF tower's blocks (model.visual.blocks), not its merger."""
    engine = actor(tiny_vlm_dir, freeze_module_prefix=["vision_model.blocks"])
    frozen = {n for n, p in engine.model.named_parameters() if not p.requires_grad}
    tower = {n for n, _ in engine.model.named_parameters() if n.startswith("model.visual.blocks.")}
    assert frozen == tower and tower


def test_freeze_vision_tower_of_a_text_model_is_an_error(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"actor\.freeze_vision_tower: .*no vision tower"):
        actor(tiny_model_dir, freeze_vision_tower=True)


def test_batch_of_one_equals_batch_of_many(tiny_vlm_dir, vl_batch):
    """Left padding and the model's M-RoPE positions: a row alone scores the same."""
    engine = actor(tiny_vlm_dir)
    together = engine.forward(vl_batch, micro_batching=MicroBatching(size=8))["log_probs"]
    alone = engine.forward(vl_batch, micro_batching=MicroBatching(size=1))["log_probs"]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)
    # use_remove_padding (the default) leaves vision-language rows padded (training.packing)
    assert engine.spec.model.use_remove_padding and engine.layouts["packed"] == 0
    assert engine.layouts["padded"] == 1 + len(vl_batch)


def test_critic_values_see_the_images(tiny_vlm_dir, vl_batch):
    critic = TorchEngine(
        EngineSpec(
            model=ModelConfig(path=str(tiny_vlm_dir)),
            device=torch.device("cpu"),
            kind="value",
            train=CriticConfig(micro_batch_size_per_device=4),
            infer_micro=MicroBatching(size=4),
            role="critic",
        )
    )
    values = critic.forward(vl_batch, with_values=True)["values"]
    assert values.shape == vl_batch["response_ids"].shape and values.abs().sum() > 0
    swapped = vl_batch.select(list(range(len(vl_batch))))
    inputs = list(vl_batch[MULTI_MODAL_INPUTS])
    swapped.objects[MULTI_MODAL_INPUTS] = inputs[2:4] + inputs[0:2] + inputs[4:]
    other = critic.forward(swapped, with_values=True)["values"]
    same_len = torch.equal(vl_batch["prompt_mask"][0], vl_batch["prompt_mask"][2])
    if same_len:
        assert (values[:4] - other[:4]).abs().max() > 1e-6


def test_saved_model_keeps_the_processor(tiny_vlm_dir, tmp_path):
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    engine = actor(tiny_vlm_dir)
    engine.save_hf(str(tmp_path / "out"))
    assert (tmp_path / "out" / "preprocessor_config.json").is_file()
    AutoImageProcessor.from_pretrained(tmp_path / "out", backend="pil")
    AutoModelForImageTextToText.from_pretrained(tmp_path / "out")
