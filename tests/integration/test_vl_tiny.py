"""Vision-language RL end to end on a tiny Qwen2-VL: the verl-style and ROLL-style VL
examples train 2 steps; on the synthetic ``visual_color`` task the reward rises (a few
supervised steps first so the model answers at all, then GRPO); a resumed VL run equals
an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from vl_teach import teach_tiny_vlm  # next to this file

from temper.data.tasks import make_task_rows
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config, load_config

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TASK = "task:visual_color?n=32&seed=5"
COLORS = "red,green,blue"


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run_example(name: str, overrides: list[str]) -> list[dict]:
    loaded = load_config(EXAMPLES / name, overrides)
    run_pipeline(loaded.config)
    return rows(Path(loaded.config.experiment.output_dir))


def test_verl_vl_example_trains_two_steps(tmp_path, tiny_vlm_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    metrics = run_example(
        "verl_geo3k_vl_grpo.yaml",
        [
            f"actor_rollout_ref.model.path={tiny_vlm_dir}",
            f"data.train_files={TASK}",
            f"data.val_files={TASK}",
            "data.max_prompt_length=64",
            "data.max_response_length=4",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.freeze_vision_tower=true",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={tmp_path / 'verl'}",
        ],
    )
    train_rows = [r for r in metrics if "train/reward_mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all("actor/kl" in r for r in train_rows) and any("val/reward_mean" in r for r in metrics)
    saved = tmp_path / "verl" / "final" / "actor"
    assert (saved / "preprocessor_config.json").is_file()


def test_roll_vl_example_trains_two_steps(tmp_path, tiny_vlm_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    metrics = run_example(
        "roll_vl_rlvr.yaml",
        [
            f"pretrain={tiny_vlm_dir}",
            f"actor_train.data_args.file_name=[{TASK}]",
            f"validation.data_args.file_name=[{TASK}]",
            "prompt_length=64",
            "response_length=4",
            "rollout_batch_size=4",
            "actor_train.training_args.per_device_train_batch_size=4",
            "actor_train.training_args.gradient_accumulation_steps=2",
            "max_steps=2",
            "eval_steps=2",
            "track_with=stdout",
            f"output_dir={tmp_path / 'roll'}",
            f"checkpoint_config.output_dir={tmp_path / 'roll' / 'checkpoints'}",
        ],
    )
    train_rows = [r for r in metrics if "train/reward_mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all("actor/kl" in r for r in train_rows) and any("val/reward_mean" in r for r in metrics)


def test_reward_rises_on_the_visual_task(tmp_path, tiny_vlm_dir, monkeypatch):
    """40 supervised steps on 16 images teach the tiny VLM to answer with a colour word
    (greedy: 0.875 of held-out images right); 12 GRPO steps on the colour reward make it
    right more often, in its samples and on the held-out images.

    Measured (this CPU): seed 1: train/reward_mean 0.65 → 0.84 (steps 1-3 → 10-12),
    validation (greedy, 48 images) 0.875 → 0.979; seed 2: 0.69 → 0.93, 0.875 → 1.0.
    """
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    taught = tmp_path / "taught"
    lesson = make_task_rows("visual_color", 16, seed=3, colors=COLORS)
    answers = [r["reward_model"]["ground_truth"] for r in lesson]
    losses = teach_tiny_vlm(tiny_vlm_dir, taught, lesson, answers, steps=40, lr=5e-3)
    assert losses["loss_last"] < losses["loss_first"]
    steps = 12
    cfg = build_config(
        {
            "experiment": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": steps,
                "seed": 1,
                "trackers": ["jsonl"],
                "val_before_train": True,
                "test_freq": steps,
            },
            "model": {"path": str(taught)},
            "data": {
                "train_files": [f"task:visual_color?n=256&seed=7&colors={COLORS}"],
                "val_files": [f"task:visual_color?n=48&seed=4&colors={COLORS}"],
                "train_batch_size": 16,
                "max_prompt_length": 64,
            },
            "rollout": {"n": 8, "response_length": 3, "engine": "hf"},
            "actor": {
                "mini_batch_size": 128,
                "micro_batch_size_per_device": 128,
                "optim": {"lr": 3e-3, "weight_decay": 0.0},
            },
            "algorithm": {"adv_estimator": "grpo"},
            "reward": {"num_workers": 1},
        }
    )
    summary = run_pipeline(cfg)
    rewards = summary["curve_values"]
    val = [r["val/reward_mean"] for r in rows(tmp_path / "run") if "val/reward_mean" in r]
    print(f"visual_color train reward {rewards}; val (greedy) before/after {val}")
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.1, rewards
    assert len(val) == 2 and val[1] > val[0], val


def test_resumed_vl_run_equals_the_uninterrupted_one(tmp_path, tiny_vlm_dir, monkeypatch):
    """PPO with a critic (values over images) and a frozen vision tower: 2 steps, then
    the same command with max_steps 4, ends bit-identical to 4 steps in one go."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    reward = tmp_path / "letters.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return sum(c.isalpha() for c in solution_str) / max(len(solution_str), 1)\n"
    )

    def cfg(out: Path, steps: int):
        return build_config(
            {
                "experiment": {
                    "output_dir": str(out),
                    "max_steps": steps,
                    "seed": 3,
                    "save_freq": 2,
                    "trackers": ["jsonl"],
                },
                "model": {"path": str(tiny_vlm_dir)},
                "data": {
                    "train_files": [TASK],
                    "train_batch_size": 2,
                    "max_prompt_length": 64,
                },
                "rollout": {"n": 2, "response_length": 4},
                "actor": {
                    "mini_batch_size": 4,
                    "micro_batch_size_per_device": 2,
                    "freeze_vision_tower": True,
                    "optim": {"lr": 1e-3},
                },
                "critic": {"mini_batch_size": 4, "micro_batch_size_per_device": 2},
                "algorithm": {"adv_estimator": "gae", "lam": 0.95},
                "reward": {
                    "function": "custom",
                    "custom_function": {"path": str(reward)},
                    "num_workers": 0,
                    "timeout_s": None,  # in process: no deadline (debugging)
                },
            }
        )

    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run_pipeline(cfg(full, 4))
    run_pipeline(cfg(resumed, 2))
    run_pipeline(cfg(resumed, 4))  # resume_mode auto: from global_step_2
    a = load_file(str(full / "final" / "actor" / "model.safetensors"))
    b = load_file(str(resumed / "final" / "actor" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ck = "checkpoints/global_step_4/critic_train/engine/model.safetensors"
    ca, cb = load_file(str(full / ck)), load_file(str(resumed / ck))
    assert all(torch.equal(ca[k], cb[k]) for k in ca)
    strip = lambda rs: [  # noqa: E731
        {k: v for k, v in r.items() if not k.startswith(("timing/", "perf/"))} for r in rs
    ]
    assert strip(rows(full)) == strip(rows(resumed))
    assert [r["step"] for r in rows(full)] == [1, 2, 3, 4]


def _fsdp2_rank(rank: int, world: int, path: str, batch, freeze: bool) -> dict | None:
    actor = _vl_actor(path, "fsdp2", freeze)
    n = len(batch) // world
    actor.update(batch.slice(rank * n, (rank + 1) * n))
    full = {k: v.detach().clone() for k, v in actor.engine.named_weights()}  # collective
    return full if rank == 0 else None


def _vl_actor(path: str, strategy: str, freeze: bool):
    from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
    from temper.roles.actor import Actor
    from temper.training.micro_batching import MicroBatching
    from temper.training.registry import build_engine
    from temper.training.spec import EngineSpec

    cfg = ActorConfig(
        strategy=strategy,
        use_dynamic_bsz=True,  # token budgets: ranks run different micro-batch counts
        max_token_len_per_device=90,
        freeze_vision_tower=freeze,
        # Adam's first step is lr·g/(|g|+eps): with the default eps, fp32 round-off on a
        # ~1e-8 gradient (summed in another order on 2 ranks) moves a weight by O(lr);
        # a large eps makes the update linear in the gradient (see the engine test)
        optim=OptimConfig(lr=0.1, eps=1.0, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=2),
    )
    return Actor(cfg, build_engine(strategy, spec))


@pytest.mark.parametrize("freeze", [False, True], ids=["all", "frozen-tower"])
def test_fsdp2_two_ranks_match_one_process_on_images(tmp_path, tiny_vlm_dir, freeze):
    """FSDP2 over two gloo ranks (vision blocks and decoder layers sharded) computes the
    single-process update of a VL batch; a frozen tower stays frozen when sharded."""
    from transformers import AutoTokenizer

    from temper.cluster.process_group import spawn_ranks
    from temper.config.schema import DataConfig
    from temper.data import build_dataset
    from temper.data.row_files import write_rows
    from temper.data.vision import load_vision_processor
    from temper.rollout.base import SamplingParams
    from temper.rollout.hf import HFRolloutEngine

    path = str(tiny_vlm_dir)
    tok = AutoTokenizer.from_pretrained(path)
    data = write_rows(make_task_rows("visual_color", 2, seed=2, size=84), tmp_path / "d.parquet")
    cfg = DataConfig(max_prompt_length=96)
    ds = build_dataset(data, cfg, tok, vision=load_vision_processor(path, tok, cfg))
    single = _vl_actor(path, "torch", freeze)
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
    got = spawn_ranks(_fsdp2_rank, 2, path, batch, freeze)[0]
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(
            got[k], ref[k], atol=2e-6, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}"
        )
    visual = [k for k in before if k.startswith("model.visual.")]
    unchanged = [k for k in visual if torch.equal(before[k], got[k])]
    assert unchanged == (visual if freeze else [])


def test_qwen3_vl_trains_on_image_rows(tmp_path, monkeypatch):
    """A tiny Qwen3-VL (16-pixel patches, deepstack features, its own M-RoPE layout)
    trains 2 GRPO steps on image rows; a reward with spread (letters in the response)
    gives the update a gradient, which reaches the vision tower through the images."""
    from temper.utils.tiny_vlm import make_tiny_vlm

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    model = make_tiny_vlm(tmp_path / "qwen3-vl", family="qwen3_vl")
    reward = tmp_path / "letters.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return sum(c.isalpha() for c in solution_str) / max(len(solution_str), 1)\n"
    )
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
            "data": {"train_files": [TASK], "train_batch_size": 2, "max_prompt_length": 64},
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
    train = [r for r in rows(tmp_path / "run") if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    a = load_file(str(model / "model.safetensors"))
    b = load_file(str(tmp_path / "run" / "final" / "actor" / "model.safetensors"))
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    tower = [k for k in moved if "visual" in k]
    assert tower and len(moved) > len(tower), moved


def test_verl_vl_example_trains_with_ulysses_on_ray(
    tmp_path, tiny_vlm_dir, monkeypatch, ray_session
):
    """The geo3k example on two Ray ranks as one Ulysses group
    (``ulysses_sequence_parallel_size=2``): actor and reference split every image row's
    text decoder over both ranks; both steps train and validate. The reward has spread
    (the letters in a response: the colour task's exact answers are luck for a random
    model, and all-zero rewards give no gradient), so both steps have one."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    reward = tmp_path / "letters.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return sum(c.isalpha() for c in solution_str) / max(len(solution_str), 1)\n"
    )
    overrides = [
        f"actor_rollout_ref.model.path={tiny_vlm_dir}",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.name=compute_score",
        f"data.train_files={TASK}",
        f"data.val_files={TASK}",
        "data.max_prompt_length=64",
        "data.max_response_length=4",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "trainer.n_gpus_per_node=2",
        "trainer.total_training_steps=2",
        "trainer.test_freq=2",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={tmp_path / 'verl-sp'}",
    ]
    cfg = load_config(EXAMPLES / "verl_geo3k_vl_grpo.yaml", overrides).config
    assert (cfg.resources.backend, cfg.actor.strategy, cfg.reference.strategy) == (
        "ray",
        "fsdp2",
        "fsdp2",
    )
    assert cfg.actor.ulysses_sequence_parallel_size == 2
    metrics = run_example("verl_geo3k_vl_grpo.yaml", overrides)
    train_rows = [r for r in metrics if "train/reward_mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all("actor/kl" in r and r["actor/grad_norm"] > 0 for r in train_rows)
    assert any("val/reward_mean" in r for r in metrics)
