"""Video RL end to end on tiny vision-language models: prompts with ``<video>`` and a
``videos`` column (MPEG-4 files written here with PyAV, and a list of frames) train 2
GRPO steps — rollout on the HF engine, old and reference log-probs and the update all
with ``pixel_values_videos`` / ``video_grid_thw`` and M-RoPE positions over video
tokens — for Qwen2-VL from a ROLL file with its ``video_*`` data arguments, and for
Qwen2.5-VL and Qwen3-VL from a native config, and verl's video GRPO script. A row whose
video is missing or broken is reported and skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config, load_config
from temper.utils.tiny_video import write_video
from temper.utils.tiny_vlm import make_tiny_vlm

pytest.importorskip("av")
pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
COLORS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def video_rows(root: Path) -> Path:
    """6 good rows (5 video files of 6 frames at 4 fps, one list of 3 frames), and 2 bad
    ones (a missing file, a file that is no video)."""
    rows = []
    for i, (name, rgb) in enumerate(list(COLORS.items()) * 2):
        if i == 5:
            frames = []
            for j in range(3):
                frame = root / f"frame{j}.png"
                from PIL import Image

                Image.new("RGB", (32, 32), rgb).save(frame)
                frames.append(frame.name)
            video: object = frames
        else:
            video = write_video(root / f"clip{i}.mp4", [rgb] * 6, fps=4).name
        rows.append(_row(name, [video]))
    (root / "broken.mp4").write_bytes(b"not a video" * 8)
    rows += [_row("red", ["missing.mp4"]), _row("blue", ["broken.mp4"])]
    out = root / "videos.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _row(color: str, videos: list) -> dict:
    return {
        "data_source": "visual_color",
        "prompt": [{"role": "user", "content": "<video>Which colour is the video?"}],
        "videos": videos,
        "reward_model": {"style": "rule", "ground_truth": color},
    }


def train_rows(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "train/reward_mean" in r]


def moved_parameters(before: Path, after: Path) -> list[str]:
    """Names of the parameters that differ between two saved models."""
    a, b = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
    return [k for k in a if not torch.equal(a[k], b[k])]


LETTERS = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return sum(c.isalpha() for c in solution_str) / max(len(solution_str), 1)\n"
)


def test_roll_file_with_video_args_trains_two_steps(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    model = make_tiny_vlm(tmp_path / "qwen2-vl")
    data = video_rows(tmp_path / "data")
    loaded = load_config(
        EXAMPLES / "roll_vl_rlvr.yaml",
        [
            f"pretrain={model}",
            f"actor_train.data_args.file_name=[{data}]",
            "~validation",
            "actor_train.data_args.video_fps=2.0",
            "actor_train.data_args.video_max_frames=4",
            "actor_train.data_args.video_min_pixels=3136",
            "actor_train.data_args.video_max_pixels=3136",
            "actor_train.data_args.video_total_pixels=100352",
            "actor_train.data_args.video_resize_chunk_frames=8",
            "prompt_length=96",
            "response_length=3",
            "rollout_batch_size=2",
            "num_return_sequences_in_group=2",
            "actor_train.training_args.per_device_train_batch_size=2",
            "actor_train.training_args.gradient_accumulation_steps=2",
            "max_steps=2",
            "track_with=stdout",
            f"output_dir={tmp_path / 'roll'}",
            f"checkpoint_config.output_dir={tmp_path / 'roll' / 'checkpoints'}",
        ],
    )
    data_cfg = loaded.config.data
    assert (data_cfg.video_fps, data_cfg.video_max_frames) == (2.0, 4)
    assert (data_cfg.video_min_pixels, data_cfg.video_max_pixels) == (3136, 3136)
    assert data_cfg.video_total_pixels == 100352
    with caplog.at_level("WARNING", logger="temper.data"):
        run_pipeline(loaded.config)
    rows = train_rows(tmp_path / "roll")
    assert [r["step"] for r in rows] == [1, 2]
    assert all("actor/kl" in r for r in rows)
    skipped = "\n".join(r.getMessage() for r in caplog.records)
    assert "line 7: video 0: no video file at" in skipped
    assert "line 8: video 0:" in skipped and "cannot be decoded" in skipped


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_native_video_config_trains_two_steps(family, tmp_path, monkeypatch):
    """A reward with spread (letters in the response) gives the update a gradient: every
    part moves, the vision tower too, which only video pixels reach."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    model = make_tiny_vlm(tmp_path / family, family=family)
    data = video_rows(tmp_path / "data")
    reward = tmp_path / "letters.py"
    reward.write_text(LETTERS)
    cfg = build_config(
        {
            "experiment": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "seed": 1,
                "trackers": ["jsonl"],
                "save_freq": -1,
            },
            "model": {"path": str(model)},
            "data": {
                "train_files": [str(data)],
                "train_batch_size": 2,
                "max_prompt_length": 128,
                "video_max_frames": 4,
                "video_min_pixels": 4 * 32 * 32,
                "video_max_pixels": 4 * 32 * 32,
            },
            "rollout": {"n": 4, "response_length": 3, "engine": "hf"},
            "actor": {
                "mini_batch_size": 8,
                "micro_batch_size_per_device": 4,
                "use_kl_loss": True,
                "optim": {"lr": 1e-2, "weight_decay": 0.0},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "reward": {
                "function": "custom",
                "custom_function": {"path": str(reward)},
                "num_workers": 0,
                "timeout_s": None,  # in process: no deadline (a test's own function)
            },
        }
    )
    run_pipeline(cfg)
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    moved = moved_parameters(model, tmp_path / "run" / "final" / "actor")
    tower = [k for k in moved if "visual" in k]
    assert tower and len(moved) > len(tower), moved  # the tower and the language model


# 64×64 frames (2×2 tokens a temporal patch of Qwen3-VL), per video as verl rows give them
PIXELS = {"min_pixels": 4096, "max_pixels": 4096}
VERL_VIDEO_SCRIPT = "verl-2026-08-1dda039/examples/grpo_trainer/run_qwen3_5_2b_video_fsdp.sh"
# The script scores with verl/utils/reward_score/tinyllava_video_r1.py, a path relative
# to where it runs, which the verl snapshot does not hold: the test writes one there
# (the option letter in <answer> tags, as the data's solutions give it).
TINYLLAVA_REWARD = """import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    said = re.search(r"<answer>\\s*(.*?)\\s*</answer>", solution_str, re.DOTALL)
    truth = re.search(r"<answer>\\s*(.*?)\\s*</answer>", ground_truth, re.DOTALL)
    return float(bool(said and truth and said.group(1)[:1] == truth.group(1)[:1]))
"""


def test_verl_video_script_trains_two_steps(tmp_path, monkeypatch):
    """verl's Qwen3.5 video GRPO script (Qwen3-VL family: timestamped video prompts),
    with rows in the shape of verl's tinyllava_video_r1 preprocessing (a ``videos`` list
    of ``{"video": path, "fps": 1, "max_frames": 32, ...}``), passes ``temper check`` and
    trains 2 steps. What changes: model (a tiny Qwen3-VL), data (the synthetic rows, one
    mini-batch of prompts a step) and outputs through the script's user-adjustable
    variables; length, device (one device, the hf rollout engine) and outputs as
    overrides. Everything else — GRPO, KL loss, entropy, batch arithmetic — is the
    script's."""
    import sys

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "config"))
    from upstream_scripts import script_commands

    from temper.cli.main import main

    upstream = Path(__file__).resolve().parents[1] / "data" / "upstream"
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    reward = tmp_path / "verl" / "utils" / "reward_score" / "tinyllava_video_r1.py"
    reward.parent.mkdir(parents=True)
    reward.write_text(TINYLLAVA_REWARD)
    model = make_tiny_vlm(tmp_path / "qwen3-vl", family="qwen3_vl")
    rows = []
    for i, rgb in enumerate(list(COLORS.values()) * 6):
        clip = write_video(tmp_path / "videos" / f"{i}.mp4", [rgb] * 6, fps=4)
        problem = f"Which colour is shown?\nOptions:\nA. red.\nB. green.\nC. blue.\n#{i}"
        rows.append(
            {
                "data_source": "Zhang199/TinyLLaVA-Video-R1-training-data",
                "prompt": [{"role": "user", "content": f"<video>\n{problem}\n\nAnswer."}],
                # per-video pixel bounds are verl's row keys (qwen-vl-utils reads them)
                "videos": [{"video": str(clip), "fps": 1.0, "max_frames": 32, **PIXELS}],
                "ability": "video_qa",
                "reward_model": {
                    "style": "rule",
                    "ground_truth": f"<answer>{'ABC'[i % 3]}</answer>",
                },
                "extra_info": {"split": "train", "index": i},
            }
        )
    data = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    out = tmp_path / "out"
    env = {
        "MODEL_PATH": str(model),  # model
        "TRAIN_FILE": str(data),  # data
        "TEST_FILE": str(data),
        "CKPTS_DIR": str(out),  # outputs
    }
    snap, _, path = VERL_VIDEO_SCRIPT.partition("/")
    (cmd,) = script_commands(upstream / snap / path, upstream / snap, env=env)
    overrides = [
        "data.train_batch_size=16",  # data: one mini-batch of prompts a step
        "data.max_prompt_length=256",  # length
        "data.max_response_length=4",
        "actor_rollout_ref.rollout.prompt_length=256",
        "actor_rollout_ref.rollout.response_length=4",
        "trainer.total_training_steps=2",
        # device: the script's NPU branch sets 8 devices (its case is not followed here)
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.actor.fsdp_config.fsdp_size=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.name=hf",
        "trainer.logger=[console]",  # outputs
    ]
    args = [str(cmd.config), *cmd.overrides, *overrides]
    assert main(["check", *args]) == 0
    assert main(["train", *args]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all("actor/kl" in r for r in train)


def test_fsdp2_two_ranks_match_one_process_on_videos(tmp_path):
    """FSDP2 over two gloo ranks computes the single-process update of a batch of video
    prompts (pixel_values_videos split with their rows, M-RoPE over video tokens)."""
    from test_vl_tiny import _fsdp2_rank, _vl_actor  # same folder
    from transformers import AutoTokenizer

    from temper.cluster.process_group import spawn_ranks
    from temper.config.schema import DataConfig
    from temper.data import build_dataset
    from temper.data.vision import load_vision_processor
    from temper.rollout.base import SamplingParams
    from temper.rollout.hf import HFRolloutEngine

    path = str(make_tiny_vlm(tmp_path / "qwen2-vl"))
    tok = AutoTokenizer.from_pretrained(path)
    rows = [
        _row(name, [write_video(tmp_path / f"{name}.mp4", [rgb] * 4, fps=2).name])
        for name, rgb in list(COLORS.items())[:2]
    ]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(max_prompt_length=96, video_min_pixels=3136, video_max_pixels=3136)
    ds = build_dataset([str(data)], cfg, tok, vision=load_vision_processor(path, tok, cfg))
    single = _vl_actor(path, "torch", False)
    torch.manual_seed(0)
    batch = HFRolloutEngine(single.engine.model, tok).generate(
        ds.make_batch([0, 1]), SamplingParams(n=2, max_new_tokens=5)
    )
    batch = single.compute_log_probs(batch)
    sign = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None]
    batch["advantages"] = sign * batch["response_mask"].float()
    before = {k: v.clone() for k, v in single.engine.named_weights()}
    single.update(batch)
    ref = {k: v.clone() for k, v in single.engine.named_weights()}
    got = spawn_ranks(_fsdp2_rank, 2, path, batch, False)[0]
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(
            got[k], ref[k], atol=2e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}"
        )
    visual = [k for k in before if k.startswith("model.visual.")]
    assert visual and all(not torch.equal(before[k], got[k]) for k in visual)


ROLL_VIDEO_R1 = "roll-2026-08-8eb27cc/examples/qwen3-vl-30BA3B-video-rlvr/video_r1.yaml"


def test_roll_video_r1_file_passes_check_and_trains_two_steps(tmp_path, monkeypatch, capsys):
    """ROLL's Video-R1 example (its data function's rows: problem, problem_type,
    modality_type, video, solution; its VideoR1RewardWorker) passes ``temper check`` with
    model/data/length/device/output changes, and trains 2 steps when its Megatron
    strategy also becomes fsdp2: temper's Megatron engine converts no Qwen3-VL model, so
    ``train`` refuses the file's own strategy with that reason."""
    from temper.cli.main import main

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    model = make_tiny_vlm(tmp_path / "qwen3-vl", family="qwen3_vl")
    rows = []
    for i, rgb in enumerate(list(COLORS.values()) * 2):
        write_video(tmp_path / "videos" / f"{i}.mp4", [rgb] * 6, fps=4)
        rows.append(
            {
                "modality_type": "video",
                "problem": f"Which colour?\nOptions:\nA. red\nB. green\nC. blue\n#{i}",
                "solution": f"<answer>{'ABC'[i % 3]}</answer>",
                "video": f"videos/{i}.mp4",
                "problem_type": "multiple choice",
            }
        )
    data = tmp_path / "video_r1.json"
    data.write_text(json.dumps(rows))
    out = tmp_path / "out"
    roles = ["actor_train", "actor_infer", "reference"]
    args = [
        str(Path(__file__).resolve().parents[1] / "data" / "upstream" / ROLL_VIDEO_R1),
        f"pretrain={model}",  # model
        f"actor_train.data_args.file_name=[{data}]",  # data
        f"actor_train.data_args.video_folder={tmp_path}",
        "actor_train.data_args.video_min_pixels=4096",  # 64×64 frames
        "actor_train.data_args.video_max_pixels=4096",
        "max_steps=2",  # length (Video-R1's prompt template is long: byte tokens)
        "prompt_length=768",
        "response_length=4",
        "rollout_batch_size=4",
        "num_return_sequences_in_group=2",
        "num_gpus_per_node=1",  # device
        *[f"{role}.device_mapping=list(range(0,1))" for role in roles],
        *[  # the file's pipeline and expert parallel sizes: 2 and 8 devices
            f"{role}.strategy_args.strategy_config.{size}_model_parallel_size=1"
            for role in ("actor_train", "reference")
            for size in ("pipeline", "expert")
        ],
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "track_with=stdout",  # outputs
        f"output_dir={out}",
        f"checkpoint_config.output_dir={out / 'ckpt'}",
    ]
    assert main(["check", *args]) == 0
    assert main(["train", *args]) == 2
    said = capsys.readouterr()
    assert "model_type 'qwen3_vl' has no Megatron conversion" in said.out + said.err
    fsdp2 = [
        "actor_train.strategy_args.strategy_name=fsdp2_train",
        "reference.strategy_args.strategy_name=fsdp2_infer",
        "~actor_train.strategy_args.strategy_config",
        "~reference.strategy_args.strategy_config",
    ]
    assert main(["train", *args, *fsdp2]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all("actor/kl" in r for r in train)
