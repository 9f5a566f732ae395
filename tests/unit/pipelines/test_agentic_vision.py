"""The VL trajectory env manager (ROLL's VLTrajEnvManager): each turn's user message
(text, state image, text), image placeholders expanded to their tokens, scripted and
sampled VL Sokoban episodes, and the trainer's forward over them reproducing the
generation's log-probs."""

from __future__ import annotations

import pytest
import torch
from doubles import ScriptedEngine

from temper.config.errors import ConfigError
from temper.data.vision import MULTI_MODAL_INPUTS
from temper.envs import EnvManager
from temper.envs.registry import EnvSpec
from temper.envs.sokoban import SokobanEnv
from temper.pipelines import agentic
from temper.pipelines.agentic_vision import (
    VLPlayer,
    expand_image_ids,
    frame_image,
    vl_turn_content,
)
from temper.pipelines.catalog import build_config
from temper.rollout.base import SamplingParams

PRE = "\nTurn {turn_idx}:\nState:\n"
NEXT = "You have {actions_left} actions left. Max response length: {max_response_length}."


@pytest.fixture(scope="module")
def vl_tokenizer(tiny_vlm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_vlm_dir)


def config(model, max_turns=3, **tag):
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(model)},
            "rollout": {"response_length": 8},
            "agentic": {
                "env_manager": "vl_trajectory",
                "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["S"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["S"]},
                "custom_envs": {
                    "S": {
                        "env_type": "sokoban",
                        "max_turns": max_turns,
                        "max_tokens_per_turn": 32,
                        "system_template": "You play games.",
                        "pre_step_template": PRE,
                        "next_step_template": NEXT,
                        "env_config": {"dim_room": [6, 6], "num_boxes": 1},
                        **tag,
                    }
                },
            },
        }
    )


def test_turn_content_is_text_image_text():
    spec = EnvSpec(
        "S", "sokoban", SokobanEnv, pre_step_template=PRE, next_step_template=NEXT,
        max_tokens_per_turn=64,
    )  # fmt: skip
    first = vl_turn_content(spec, 1, 10, "Push the box.")
    assert first == [
        {"type": "text", "text": "Push the box.\nTurn 1:\nState:\n"},
        {"type": "image"},
        {"type": "text", "text": "You have 10 actions left. Max response length: 64."},
    ]
    later = vl_turn_content(spec, 3, 8)
    assert later[0]["text"] == "\nTurn 3:\nState:\n" and later[2]["text"].startswith("You have 8")


def test_expand_image_ids():
    assert expand_image_ids([1, 9, 2, 9, 3], 9, [2, 3]) == [1, 9, 9, 2, 9, 9, 9, 3]
    with pytest.raises(ValueError, match="without a placeholder"):
        expand_image_ids([1, 9], 9, [2, 2])
    with pytest.raises(ValueError, match="more image placeholders"):
        expand_image_ids([9, 9], 9, [1])


def test_frame_image_is_sized_to_the_grid(tiny_vlm_dir, vl_tokenizer):
    from temper.data.vision import load_vision_processor

    cfg = config(tiny_vlm_dir)
    vision = load_vision_processor(str(tiny_vlm_dir), vl_tokenizer, cfg.data)
    env = SokobanEnv(dim_room=(6, 6), num_boxes=1)
    env.reset(3)
    frame = env.render("rgb_array")
    assert frame.shape == (96, 96, 3)  # 16 pixels a cell
    # factor 28: round(96 / 28) = 3 → 84 × 84 = 7056 pixels, inside [3136, 50176]
    image = frame_image(frame, vision)
    assert (image.height, image.width, image.tokens) == (84, 84, 9)


def test_scripted_episode_messages_and_tokens(tiny_vlm_dir, vl_tokenizer):
    cfg = config(tiny_vlm_dir, max_turns=2)
    engine = ScriptedEngine(vl_tokenizer, lambda text: "<answer>Up</answer>")
    player = VLPlayer(cfg, engine, vl_tokenizer)
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    played = player.play_round(manager, 1, SamplingParams())
    batch = played.batch
    assert len(batch) == 2 and batch["num_turns"] == [2, 2]
    log = played.logs[0]
    roles = [m["role"] for m in log.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    assert log.messages[0]["content"] == "You play games."
    first, second = log.messages[1]["content"], log.messages[3]["content"]
    instruction = log.slot.instruction
    assert (
        first
        == f"{instruction}\nTurn 1:\nState:\n<image>You have 2 actions left. Max response length: 32."
    )
    assert second == "\nTurn 2:\nState:\n<image>You have 1 actions left. Max response length: 32."
    assert log.messages[2]["content"] == "<answer>Up</answer>"
    image_id = player.vision.image_token_id
    for k in range(2):
        inputs = batch[MULTI_MODAL_INPUTS][k]
        assert inputs["image_grid_thw"].tolist() == [[1, 6, 6], [1, 6, 6]]  # 2 states
        ids = torch.cat([batch["prompt_ids"][k], batch["response_ids"][k]])
        assert int((ids == image_id).sum()) == 2 * 9
        # only the answers are learnt: 2 turns of "<answer>Up</answer>" + end of turn
        answer = len(vl_tokenizer("<answer>Up</answer>")["input_ids"]) + 1
        assert int(batch["response_mask"][k].sum()) == 2 * answer
    # episodes of one group start alike (inductive grouping); the key holds the board
    assert batch["start_key"][0] == batch["start_key"][1]
    assert batch["start_key"][0][2] == log.slot.observation
    # the second image lies in the response, among its context tokens
    resp = batch["response_ids"][0]
    assert bool(((resp == image_id) & (batch["response_mask"][0] == 0)).any())


def test_trainer_forward_reproduces_generation_log_probs(tiny_vlm_dir, vl_tokenizer):
    from transformers import AutoModelForImageTextToText

    from temper.rollout.hf import HFRolloutEngine
    from temper.training.micro_batching import model_inputs
    from temper.training.vision import vision_forward_inputs

    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir, dtype=torch.float32).eval()
    cfg = config(tiny_vlm_dir, max_turns=3)
    player = VLPlayer(cfg, HFRolloutEngine(model, vl_tokenizer), vl_tokenizer)
    manager = EnvManager.from_agentic(cfg.agentic, "train", 1)
    params = SamplingParams(n=1, max_new_tokens=6, temperature=1.0, top_k=0, top_p=1.0)
    batch = player.play_round(manager, 0, params).batch
    assert sum(len(r["image_grid_thw"]) for r in batch[MULTI_MODAL_INPUTS]) > len(batch)

    def log_probs(b):
        inp = model_inputs(b, torch.device("cpu"))
        kwargs, context = vision_forward_inputs(model, b, inp)
        args = {"input_ids": inp.input_ids, "attention_mask": inp.attention_mask, **kwargs}
        with torch.no_grad(), context:
            logits = model(**args).logits[:, -inp.response_len - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, inp.response_ids[..., None])[..., 0]

    lp = log_probs(batch)
    mask = batch["response_mask"][:, : lp.shape[1]].bool()
    rollout = batch["rollout_log_probs"][:, : lp.shape[1]]
    assert torch.allclose(lp[mask], rollout[mask], atol=1e-4)
    # a generated placeholder token (mask 1) among context images is text to the model
    k = int(mask[0].nonzero()[0])
    batch["response_ids"][0, k] = player.vision.image_token_id
    assert torch.isfinite(log_probs(batch)[mask]).all()


def test_checks(tiny_vlm_dir):
    with pytest.raises(ConfigError, match="turn_template"):
        agentic.check(config(tiny_vlm_dir, turn_template="{observation}"))
    with pytest.raises(ConfigError, match="renders no rgb_array"):
        agentic.check(
            config(
                tiny_vlm_dir,
                env_type="countdown",
                env_config={},
            )
        )
    text = config(tiny_vlm_dir)
    text.agentic.env_manager = "trajectory"
    with pytest.raises(ConfigError, match="pre_step_template"):
        agentic.check(text)


def test_text_model_is_refused(tiny_dir):
    from transformers import AutoTokenizer

    cfg = config(tiny_dir)
    with pytest.raises(ConfigError, match="not a vision-language model"):
        agentic.preflight(cfg, [])  # temper check
    with pytest.raises(ConfigError, match="not a vision-language model"):
        VLPlayer(cfg, None, AutoTokenizer.from_pretrained(tiny_dir))  # type: ignore[arg-type]
