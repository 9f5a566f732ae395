"""The VL trajectory env manager with an env that brings its own images (DeepEyes): the
observation text cut at its ``<image>`` marks, the env's system message, zero or more
images a turn, each image's tokens where its mark is; and the checks around such envs."""

from __future__ import annotations

import pytest
import torch
from deepeyes_rows import SYSTEM, write_rows  # tests/ is on the path
from doubles import ScriptedEngine

from temper.config.errors import ConfigError
from temper.data.vision import MULTI_MODAL_INPUTS
from temper.envs import EnvManager
from temper.envs.deepeyes import DeepEyesEnv, load_rows
from temper.envs.registry import EnvSpec
from temper.pipelines import agentic
from temper.pipelines.agentic_vision import VLPlayer, image_starts, observation_content
from temper.pipelines.catalog import build_config
from temper.rollout.base import SamplingParams

ZOOM = '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 60, 60]}}</tool_call>'
BAD = (
    '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 5, 5]}}</tool_call>'
)


class Judge:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def complete(self, conversations, template_kwargs=None):
        self.calls.append(len(conversations))
        return ["1" for _ in conversations]

    def close(self) -> None:
        pass


def test_observation_content_cuts_at_image_marks():
    spec = EnvSpec("D", "deepeyes", DeepEyesEnv, pre_step_template="T{turn_idx}:")
    assert observation_content(spec, "<image>\nWhat?", 1, 5, "Look. ") == [
        {"type": "text", "text": "Look. T1:"},
        {"type": "image"},
        {"type": "text", "text": "\nWhat?"},
    ]
    # no templates: a text-only observation is one text part; two marks, two images
    bare = EnvSpec("D", "deepeyes", DeepEyesEnv)
    assert observation_content(bare, "Error: bad", 2, 4) == [{"type": "text", "text": "Error: bad"}]
    assert observation_content(bare, "<image><image>x", 2, 4) == [
        {"type": "image"},
        {"type": "image"},
        {"type": "text", "text": "x"},
    ]


def test_image_starts():
    # runs of 2 and 3 image tokens (9): they start at 1 and 4
    assert image_starts([5, 9, 9, 6, 9, 9, 9, 7], 9, [2, 3]) == [1, 4]
    assert image_starts([9, 9, 9, 9], 9, [2, 2]) == [0, 2]  # adjacent runs
    assert image_starts([1, 2], 9, []) == []


def config(model, data, manager="vl_trajectory", judge=True):
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(model)},
            "rollout": {"response_length": 200},
            "reward": {"judge": {"model_path": str(model)}} if judge else {},
            "agentic": {
                "env_manager": manager,
                "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["D"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["D"]},
                "custom_envs": {
                    "D": {
                        "env_type": "deepeyes",
                        "max_turns": 3,
                        "max_tokens_per_turn": 200,
                        "env_config": {"data_args": {"file_name": str(data)}, "max_steps": 3},
                    }
                },
            },
        }
    )


@pytest.fixture
def data(tmp_path):
    load_rows.cache_clear()
    yield write_rows(tmp_path / "d.parquet")
    load_rows.cache_clear()


def test_scripted_deepeyes_episode(tiny_vlm_dir, data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    cfg = config(tiny_vlm_dir, data)
    turns = iter([ZOOM, ZOOM, BAD, BAD, "<answer>red</answer>", "<answer>red</answer>"])
    engine = ScriptedEngine(tok, lambda text: next(turns))
    player = VLPlayer(cfg, engine, tok)
    judge = Judge()
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0, judge=judge)
    played = player.play_round(manager, 1, SamplingParams())
    assert judge.calls == [2]  # both episodes ended in one turn: one judge call
    batch = played.batch
    assert batch["num_turns"] == [3, 3]
    log = played.logs[0]
    assert [m["role"] for m in log.messages] == [
        "system", "user", "assistant", "user", "assistant", "user", "assistant",
    ]  # fmt: skip
    assert log.messages[0]["content"] == SYSTEM  # the row's system message
    assert log.messages[1]["content"].startswith("<image>\nWhat colour is the square?")
    assert log.messages[3]["content"].startswith("<tool_response><image>")  # the crop
    assert log.messages[5]["content"].startswith("Error: ")  # no image
    image_id = player.vision.image_token_id
    for k in range(2):
        grids = batch[MULTI_MODAL_INPUTS][k]["image_grid_thw"]
        assert len(grids) == 2  # the question's image and the crop
        tokens = int((grids.prod(dim=1) // 4).sum())  # merge 2×2
        ids = torch.cat([batch["prompt_ids"][k], batch["response_ids"][k]])
        assert int((ids == image_id).sum()) == tokens
    # right after a zoom that ran, but the second call failed: no bonus, 0.8
    assert log.episode_return == pytest.approx(0.8)


def test_checks(tiny_vlm_dir, data):
    agentic.check(config(tiny_vlm_dir, data))
    with pytest.raises(ConfigError, match=r"reward\.judge\.model_path: .*grades answers"):
        agentic.check(config(tiny_vlm_dir, data, judge=False))
    with pytest.raises(ConfigError, match=r"custom_envs\.D\.env_type: 'deepeyes' shows images"):
        agentic.check(config(tiny_vlm_dir, data, manager="trajectory"))
    cfg = config(tiny_vlm_dir, data)
    cfg.reward.judge.parser = "score"
    with pytest.raises(ConfigError, match=r"reward\.judge\.parser: env tag D writes"):
        agentic.check(cfg)
    with pytest.raises(ConfigError, match=r"reward\.judge\.model_path: .*has none"):
        EnvManager.from_agentic(cfg.agentic, "train", 0)
