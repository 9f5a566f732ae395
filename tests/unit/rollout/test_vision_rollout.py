"""Rollout with images on a tiny Qwen2-VL: HF ``generate`` with pixel inputs and token
types, the trainer's log-probs equal to the rollout's (``rollout/logprob_diff``), the n
responses of a prompt sharing one set of image inputs; vLLM's prompts with
``multi_modal_data``, and `temper check` refusing vLLM where it cannot run the model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from temper.algorithms.rollout_correction import logprob_diff
from temper.config.schema import ActorConfig, DataConfig, ModelConfig, RolloutConfig
from temper.data import build_dataset
from temper.data.row_files import write_rows
from temper.data.tasks import make_task_rows
from temper.data.vision import (
    MULTI_MODAL_INPUTS,
    load_vision_processor,
    stack_inputs,
    token_type_ids,
)
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine
from temper.training.micro_batching import MicroBatching
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def vl_setup(tiny_vlm_dir, tmp_path_factory):
    """A dataset of image prompts of different sizes (and one text prompt) and a trainer
    engine whose module the HF rollout engine shares."""
    from transformers import AutoTokenizer

    tmp = tmp_path_factory.mktemp("vl-rollout")
    rows = make_task_rows("visual_color", 3, seed=1, size=84)
    rows += make_task_rows("visual_color", 2, seed=2, size=56)
    rows[1]["prompt"] = [{"role": "user", "content": "<image> Colour of this square?"}]
    text_row = {"prompt": [{"role": "user", "content": "A text prompt."}], "images": []}
    path = write_rows([*rows, text_row], tmp / "d.parquet")
    tok = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    cfg = DataConfig(max_prompt_length=128)
    ds = build_dataset(path, cfg, tok, vision=load_vision_processor(str(tiny_vlm_dir), tok, cfg))
    engine = TorchEngine(
        EngineSpec(
            model=ModelConfig(path=str(tiny_vlm_dir)),
            device=torch.device("cpu"),
            train=ActorConfig(micro_batch_size_per_device=2),
            infer_micro=MicroBatching(size=4),
        )
    )
    return ds, tok, engine


def test_hf_rollout_and_trainer_log_probs_agree(vl_setup):
    ds, tok, engine = vl_setup
    rollout = HFRolloutEngine(engine.model, tok, infer_batch_size=4)
    torch.manual_seed(0)
    prompts = ds.make_batch(list(range(len(ds))))
    out = rollout.generate(prompts, SamplingParams(n=3, max_new_tokens=10, temperature=1.3))
    assert len(out) == 3 * len(ds)
    for i in range(len(ds)):  # the n rows of a prompt share its image inputs
        assert all(
            out[MULTI_MODAL_INPUTS][3 * i + k] is prompts[MULTI_MODAL_INPUTS][i] for k in range(3)
        )
    for micro in (MicroBatching(size=5), MicroBatching(size=1, max_tokens=150)):
        trainer = engine.forward(out, temperature=1.3, micro_batching=micro)["log_probs"]
        diff = logprob_diff(trainer, out["rollout_log_probs"], out["response_mask"])
        assert float(diff["logprob_diff"]) < 1e-4, diff  # rollout/logprob_diff
        assert float(diff["logprob_diff_max"]) < 1e-4, diff


def test_images_change_what_the_model_computes(vl_setup):
    """The pixels reach the model: other images, other log-probs (same tokens)."""
    ds, tok, engine = vl_setup
    torch.manual_seed(0)
    out = HFRolloutEngine(engine.model, tok).generate(
        ds.make_batch([0, 2]), SamplingParams(n=1, max_new_tokens=6)
    )
    base = engine.forward(out)["log_probs"]
    swapped = out.select([0, 1])
    swapped.objects[MULTI_MODAL_INPUTS] = list(reversed(out[MULTI_MODAL_INPUTS]))
    if not torch.equal(out["prompt_ids"][0], out["prompt_ids"][1]):
        pytest.skip("the two prompts differ in length; swap needs equal image sizes")
    other = engine.forward(swapped)["log_probs"]
    assert (base - other).abs().max() > 1e-4


def manual_log_probs(model, batch, row: int, temperature: float = 1.0) -> torch.Tensor:
    """Token-by-token decoding with a KV cache, as ``generate`` scores a response."""
    image_id, video_id = model.config.image_token_id, model.config.video_token_id
    ids = batch["prompt_ids"][row][batch["prompt_mask"][row].bool()].unsqueeze(0)
    vision = stack_inputs([batch[MULTI_MODAL_INPUTS][row]])
    if vision:
        vision["mm_token_type_ids"] = token_type_ids(ids, ids.shape[1], image_id, video_id)
    mask = torch.ones_like(ids)
    n = int(batch["response_mask"][row].sum())
    out_lp = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, **vision)
        delta = model.model.rope_deltas if vision else torch.zeros(1, 1, dtype=torch.long)
        for j in range(n):
            token = int(batch["response_ids"][row, j])
            logp = torch.log_softmax(out.logits[0, -1].float() / temperature, -1)
            out_lp.append(float(logp[token]))
            pos = (ids.shape[1] + j + delta).view(1, 1, 1).expand(3, 1, 1)
            mask = torch.cat([mask, torch.ones(1, 1, dtype=mask.dtype)], 1)
            out = model(
                input_ids=torch.tensor([[token]]),
                attention_mask=mask,
                position_ids=pos,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return torch.tensor(out_lp)


def test_response_tokens_that_are_image_placeholders_score_as_in_generation(vl_setup):
    """A policy may sample <|image_pad|>; the trainer must score it as generation did
    (as a token), not count it as another image slot (verl fails there)."""
    ds, tok, engine = vl_setup
    torch.manual_seed(1)
    out = HFRolloutEngine(engine.model, tok).generate(
        ds.make_batch([0, 1, 5]), SamplingParams(n=1, max_new_tokens=8)
    )
    ids = out["response_ids"].clone()
    pad, video = engine.model.config.image_token_id, engine.model.config.video_token_id
    ids[0, 1], ids[1, 0], ids[2, 2] = pad, video, pad
    out["response_ids"] = ids
    trainer = engine.forward(out)["log_probs"]
    for row in range(3):
        ref = manual_log_probs(engine.model, out, row)
        torch.testing.assert_close(trainer[row, : len(ref)], ref, atol=1e-5, rtol=0)


def test_owned_hf_engine_syncs_the_vision_tower(vl_setup, tiny_vlm_dir):
    """Weight sync covers every weight, the vision tower's included."""
    _ds, _tok, engine = vl_setup
    owned = HFRolloutEngine.from_pretrained(str(tiny_vlm_dir), device="cpu")
    weights = {n: t.clone() for n, t in engine.named_weights()}
    assert any(n.startswith("model.visual.") for n in weights)
    weights = {n: t + 0.01 for n, t in weights.items()}
    owned.load_weights(weights.items())
    state = owned.module.state_dict()
    assert all(torch.equal(state[n], t) for n, t in weights.items())


# --------------------------------------------------------------------------- vLLM


def test_vllm_prompt_carries_images_with_collapsed_placeholders(vl_setup):
    pytest.importorskip("vllm")
    from temper.rollout.vllm_engine import VLLMRolloutEngine

    ds, tok, engine = vl_setup
    vllm_engine = VLLMRolloutEngine(
        None,
        tok,
        eos_token_ids=[tok.eos_token_id],
        image_tokens=(engine.model.config.image_token_id, 2),
    )
    batch = ds.make_batch([0, 5])
    prompts = vllm_engine._token_prompts(batch)
    pad = engine.model.config.image_token_id
    assert prompts[0]["prompt_token_ids"].count(pad) == 1  # one placeholder per image
    assert prompts[0]["multi_modal_data"]["image"][0].size == (84, 84)
    full = batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist()
    assert full.count(pad) == 9 and len(full) == len(prompts[0]["prompt_token_ids"]) + 8
    assert "multi_modal_data" not in prompts[1]  # the text prompt


def test_disable_mm_preprocessor_cache_becomes_this_vllms_argument():
    from temper.rollout.vllm_args import engine_args

    cfg = RolloutConfig(engine="vllm", engine_kwargs={"disable_mm_preprocessor_cache": True})
    kwargs, notes = engine_args(
        cfg, ModelConfig(path="/m"), on_cpu=True, seed=0, valid_args=["mm_processor_cache_gb"]
    )
    assert kwargs["mm_processor_cache_gb"] == 0 and "disable_mm_preprocessor_cache" not in kwargs
    assert any("mm_processor_cache_gb" in n for n in notes)
    off = RolloutConfig(
        engine="vllm", engine_kwargs={"vllm": {"disable_mm_preprocessor_cache": False}}
    )
    kwargs, _ = engine_args(off, ModelConfig(path="/m"), on_cpu=True, seed=0, valid_args=[])
    assert "mm_processor_cache_gb" not in kwargs


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_check_refuses_vllm_for_a_vl_model_it_cannot_run_here(tiny_vlm_dir, tmp_path, capsys):
    from temper.cli.main import main
    from temper.rollout.vllm_engine import multimodal_problem

    problem = multimodal_problem(ModelConfig(path=str(tiny_vlm_dir)))
    if problem is None:
        pytest.skip("this vLLM runs Qwen2-VL here (torchvision present)")
    assert "torchvision" in problem
    config = tmp_path / "vl.yaml"
    config.write_text(
        f"model: {{path: {tiny_vlm_dir}}}\ndata: {{train_files: ['task:visual_color?n=4']}}\n"
        "rollout: {engine: vllm}\n"
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("config error: rollout.engine: vllm cannot run")
    assert "rollout.engine=hf" in err[0]
    assert main(["check", str(config), "rollout.engine=auto"]) == 0  # auto: hf here
    assert "hf (in process)" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")
def test_vllm_rollout_with_images_matches_the_trainer(vl_setup, tiny_vlm_dir):
    """Where vLLM can run Qwen2-VL (torchvision installed): generation with
    multi_modal_data, and the trainer's log-probs equal vLLM's."""
    from temper.rollout.vllm_engine import VLLMRolloutEngine, multimodal_problem

    problem = multimodal_problem(ModelConfig(path=str(tiny_vlm_dir)))
    if problem is not None:
        pytest.skip(f"vLLM cannot run Qwen2-VL here: {problem}")
    ds, tok, engine = vl_setup
    vllm_engine = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm", max_model_len=256, enable_prefix_caching=False),
        ModelConfig(path=str(tiny_vlm_dir), dtype="fp32"),
        tokenizer=tok,
        seed=0,
    )
    try:
        vllm_engine.load_weights(engine.named_weights())
        out = vllm_engine.generate(
            ds.make_batch(list(range(len(ds)))), SamplingParams(n=2, max_new_tokens=8)
        )
    finally:
        vllm_engine.close()
    trainer = engine.forward(out)["log_probs"]
    mask = out["response_mask"].bool()
    assert (trainer - out["rollout_log_probs"]).abs()[mask].max() < 1e-3


def test_tiny_vlm_is_built_offline(tiny_vlm_dir):
    files = {p.name for p in Path(tiny_vlm_dir).iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "preprocessor_config.json",
    } <= files


def test_qwen2_5_vl_rollout_and_trainer_agree(tmp_path_factory):
    """The Qwen2.5-VL family (windowed vision attention) through the same path: HF
    generate with images, trainer log-probs equal, the vision tower freezable."""
    from transformers import AutoTokenizer

    from temper.utils.tiny_vlm import make_tiny_vlm

    model_dir = make_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm-2.5"), family="qwen2_5_vl")
    rows = make_task_rows("visual_color", 3, seed=4, size=84)
    path = write_rows(rows, tmp_path_factory.mktemp("d25") / "d.parquet")
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = DataConfig(max_prompt_length=96)
    ds = build_dataset(path, cfg, tok, vision=load_vision_processor(str(model_dir), tok, cfg))
    engine = TorchEngine(
        EngineSpec(
            model=ModelConfig(path=str(model_dir)),
            device=torch.device("cpu"),
            train=ActorConfig(freeze_vision_tower=True),
            infer_micro=MicroBatching(size=2),
        )
    )
    assert type(engine.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    frozen = {n for n, p in engine.model.named_parameters() if not p.requires_grad}
    assert frozen and all(n.startswith("model.visual.") for n in frozen)
    torch.manual_seed(0)
    out = HFRolloutEngine(engine.model, tok).generate(
        ds.make_batch([0, 1, 2]), SamplingParams(n=2, max_new_tokens=8, temperature=1.5)
    )
    trainer = engine.forward(out, temperature=1.5)["log_probs"]
    diff = logprob_diff(trainer, out["rollout_log_probs"], out["response_mask"])
    assert float(diff["logprob_diff_max"]) < 1e-4, diff
