"""SFT runs of the tiny test model on CPU: the loss falls on training and validation data
and every parameter moves; LoRA trains its adapters; a checkpoint's ``actor/`` loads in
transformers; and upstream SFT configs — a verl command line of each trainer era and a
ROLL file — train 2 steps with only these overrides:

- model: the tiny test model;
- data: ``task:`` rows with a ``response`` column (or conversations made from them), and
  the columns that hold them;
- length: short samples and 2 steps;
- device: one device (and no sequence parallelism over it), on this CPU;
- where outputs go (and the console for the file's wandb logger).

Every other setting — batch sizes, learning rates, schedules, strategies — is the file's.
The repository's SFT examples run the same way on the tiny model: ``examples/verl_sft.yaml``
and the two stages of ``examples/sft_then_grpo`` (GRPO from the SFT run's ``final/actor``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from upstream_command import script_command  # tests/ is on the path

from temper.cli.main import main
from temper.data.tasks import make_task_rows
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config, load_config

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
TRAIN = "task:arithmetic?n=64&seed=5&response=true"
VAL = "task:arithmetic?n=16&seed=6&split=test&response=true"


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _native(tiny: Path, out: Path, **extra) -> dict:
    cfg = {
        "pipeline": "sft",
        "model": {"path": str(tiny)},
        "data": {"train_files": [TRAIN], "val_files": [VAL], "train_batch_size": 8},
        "sft": {"max_length": 128},
        "actor": {"micro_batch_size_per_device": 4, "optim": {"lr": 3e-3}},
        "experiment": {
            "max_steps": 8,
            "test_freq": 4,
            "val_before_train": True,
            "save_freq": 4,
            "output_dir": str(out),
            "trackers": ["jsonl"],
        },
    }
    for section, values in extra.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


def test_sft_loss_falls_and_every_parameter_moves(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "sft"
    summary = run_pipeline(build_config(_native(tiny_model_dir, out)))
    assert summary["curve"] == "train/loss" and summary["steps"] == 8
    losses = summary["curve_values"]
    assert summary["curve_last5"] < summary["curve_first5"] and losses[-1] < 0.8 * losses[0]
    assert summary["val_steps"] == [0, 4, 8]
    assert summary["val_after"] < 0.8 * summary["val_before"]  # val/loss, the headline
    rows = [r for r in _rows(out) if "train/loss" in r]
    assert all(r["train/target_tokens"] > 0 and "actor/grad_norm" in r for r in rows)
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))
    assert before.keys() == after.keys()
    still = [k for k in before if torch.equal(before[k], after[k])]
    assert not still, f"parameters that did not move: {still}"


def test_checkpoint_actor_loads_in_transformers(tmp_path, tiny_model_dir, monkeypatch):
    """``checkpoints/global_step_N/actor`` is a Hugging Face directory: transformers loads
    it, and at the last step it is the final actor."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "sft"
    cfg = _native(tiny_model_dir, out, experiment={"max_steps": 4, "val_before_train": False})
    run_pipeline(build_config(cfg))
    ckpt = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "global_step_4" / "actor")
    final = AutoModelForCausalLM.from_pretrained(out / "final" / "actor")
    for (name, a), (_, b) in zip(ckpt.state_dict().items(), final.state_dict().items()):
        assert torch.equal(a, b), name


def test_lora_sft_trains_the_adapters_only(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "lora"
    cfg = _native(
        tiny_model_dir,
        out,
        model={"path": str(tiny_model_dir), "lora": {"rank": 8, "alpha": 16}},
        experiment={"max_steps": 4, "val_before_train": True},
    )
    summary = run_pipeline(build_config(cfg))
    assert summary["val_after"] < summary["val_before"]
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))  # merged
    assert before.keys() == after.keys()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("proj" in k or "fc" in k or "mlp" in k for k in moved), moved
    assert not any("embed" in k or "norm" in k for k in moved)


# ------------------------------------------------------------------ upstream files


def _train(config: Path, overrides: list[str], out: Path) -> list[dict]:
    assert main(["train", str(config), *overrides]) == 0
    train = [r for r in _rows(out) if "train/loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["train/loss"] > 0 and r["train/target_tokens"] > 0 for r in train)
    return train


def test_verl_fsdp_sft_trainer_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl's char_count SFT recipe (2025-06, fsdp_sft_trainer): 256 samples a step in
    micro-batches of 8, prompt and response columns."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command("verl-2025-06-38d9a88/recipe/char_count/train_sft.sh")
    out = tmp_path / "verl-sft"
    overrides += [
        f"model.partial_pretrain={tiny_model_dir}",  # model
        "data.train_files=task:arithmetic?n=512&seed=5&response=true",  # data
        f"data.val_files={VAL}",
        "data.max_length=128",  # length
        "trainer.total_training_steps=2",
        "trainer.n_gpus_per_node=1",  # device
        "trainer.device=cpu",
        f"trainer.default_local_dir={out}",  # outputs
    ]
    train = _train(config, overrides, out)
    assert all(r["perf/samples"] == 256 for r in train)
    assert any("val/loss" in r for r in _rows(out))


def _conversations(path: Path) -> Path:
    """Two question/answer exchanges per row, as verl's multi-turn SFT data holds them."""
    rows = make_task_rows("arithmetic", 64, seed=7, response=True)
    out = []
    for a, b in zip(rows[::2], rows[1::2]):
        messages = []
        for row in (a, b):
            messages.append({"role": "user", "content": row["prompt"][0]["content"]})
            messages.append({"role": "assistant", "content": row["response"]})
        out.append({"messages": messages})
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def test_verl_engine_sft_trainer_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 0.9's multi-turn SFT example (sft_trainer, engine=fsdp): conversations, every
    assistant turn learnt, token-budget micro-batches."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(
        "verl-2026-08-1dda039/examples/sft/multiturn/run_qwen2_5_0_5b_fsdp.sh"
    )
    data = _conversations(tmp_path / "conversations.jsonl")
    out = tmp_path / "verl-engine-sft"
    overrides += [
        f"model.path={tiny_model_dir}",  # model
        f"data.train_files={data}",  # data
        f"data.val_files={data}",
        "data.train_batch_size=16",
        "data.max_length=256",  # length
        "trainer.total_training_steps=2",
        "engine.ulysses_sequence_parallel_size=1",  # device
        "trainer.device=cpu",
        f"trainer.default_local_dir={out}",  # outputs
        "trainer.logger=[console]",
    ]
    train = _train(config, overrides, out)
    assert all(r["perf/samples"] == 16 for r in train)


def test_verl_automodel_sft_command_line_trains(tmp_path, tiny_model_dir, monkeypatch):
    """verl 0.9's SFT example on NeMo AutoModel's engine (``engine=automodel``, FSDP2,
    ``optim=automodel``: a cosine schedule from 0 to 0.1 × lr after a 20% warmup) runs on
    temper's fsdp2."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config, overrides = script_command(
        "verl-2026-08-1dda039/examples/sft/gsm8k/run_qwen2_5_0_5b_automodel.sh"
    )
    data = _conversations(tmp_path / "conversations.jsonl")
    out = tmp_path / "verl-automodel-sft"
    overrides += [
        f"model.path={tiny_model_dir}",  # model
        f"data.train_files={data}",  # data
        f"data.val_files={data}",
        "data.train_batch_size=16",
        "data.max_length=256",  # length
        "data.max_token_len_per_gpu=512",
        "trainer.total_training_steps=2",
        "trainer.n_gpus_per_node=1",  # device
        "trainer.device=cpu",
        f"trainer.default_local_dir={out}",  # outputs
        "trainer.logger=[console]",
    ]
    cfg = load_config(config, overrides).config
    assert cfg.actor.strategy == "fsdp2" and cfg.actor.optim.lr_scheduler == "cosine"
    assert (cfg.actor.optim.warmup_ratio, cfg.actor.optim.min_lr_ratio) == (0.2, 0.1)
    train = _train(config, overrides, out)
    assert all(r["perf/samples"] == 16 for r in train)


def _roll_sft(tmp_path: Path, tiny_model_dir: Path, name: str, devices: list[str]) -> list[dict]:
    config = UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen3-30BA3B-sft_fsdp2/sft_config.yaml"
    out = tmp_path / name
    overrides = [
        f"pretrain={tiny_model_dir}",  # model
        f"sft_train.data_args.file_name=[{TRAIN}]",  # data
        f"validation.data_args.file_name=[{VAL}]",
        "prompt_key=prompt",
        "response_key=response",
        "sequence_length=128",  # length
        "max_steps=2",
        *devices,
        f"output_dir={out}",  # outputs
    ]
    return _train(config, overrides, out)


def test_roll_sft_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's fsdp2 SFT example (2026-08): instruction/input/output columns, one optimizer
    step per global batch; on one device, and on two as the file's one Ulysses group of
    2 (each rank runs half of every sequence): the same batch, the same losses (to the
    file's bf16 compute)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    one = _roll_sft(
        tmp_path,
        tiny_model_dir,
        "roll-sft",
        [
            "num_gpus_per_node=1",  # device
            "sft_train.device_mapping=list(range(0,1))",
            "sft_train.model_args.ulysses_size=1",
            "sft_train.strategy_args.strategy_config.fsdp_size=1",
        ],
    )
    assert all(r["perf/samples"] == 1 for r in one)  # 1 device × 1 × 1 per device
    group = _roll_sft(
        tmp_path,
        tiny_model_dir,
        "roll-sft-ulysses",
        [
            "num_gpus_per_node=2",  # device: the file's ulysses_size 2 kept
            "sft_train.device_mapping=list(range(0,2))",
            "sft_train.strategy_args.strategy_config.fsdp_size=2",
        ],
    )
    assert all(r["perf/samples"] == 1 for r in group)  # one group: 1 data-parallel rank
    for a, b in zip(one, group, strict=True):  # the file computes in bf16
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=2e-4), a["step"]


# ------------------------------------------------------------------ examples/


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_verl_sft_example_trains(tmp_path, tiny_model_dir, monkeypatch):
    """``examples/verl_sft.yaml`` (verl's sft_trainer.yaml keys) with the tiny model, 2
    steps: validation after the last step though trainer.test_freq is 8, as verl's."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "verl-sft-example"
    overrides = [
        f"model.partial_pretrain={tiny_model_dir}",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={out}",
    ]
    train = _train(EXAMPLES / "verl_sft.yaml", overrides, out)
    assert all(r["perf/samples"] == 16 for r in train)
    assert [r["step"] for r in _rows(out) if "val/loss" in r] == [2]


def test_sft_then_grpo_example_chains(tmp_path, tiny_model_dir, monkeypatch):
    """``examples/sft_then_grpo``, run from a working directory as the README says: the
    GRPO stage's ``model.path`` is the SFT stage's ``final/actor``, which it loads,
    validates (before training: the SFT model's reward) and trains 2 steps. The tiny
    model (its tokenizer spells the prompts longer), 2 SFT steps, the hf rollout engine."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    stage = EXAMPLES / "sft_then_grpo"
    assert main(["train", str(stage / "sft.yaml"), f"model.path={tiny_model_dir}",
                 "sft.max_length=256", "experiment.max_steps=2"]) == 0  # fmt: skip
    sft = tmp_path / "outputs" / "sft_then_grpo" / "sft"
    assert [r["step"] for r in _rows(sft) if "val/loss" in r] == [0, 2]
    assert main(["train", str(stage / "rl.yaml"), "data.max_prompt_length=256",
                 "experiment.max_steps=2", "rollout.engine=hf"]) == 0  # fmt: skip
    rl = tmp_path / "outputs" / "sft_then_grpo" / "rl"
    rows = _rows(rl)
    assert rows[0]["step"] == 0 and "val/reward_mean" in rows[0]
    assert [r["step"] for r in rows if "train/score_mean" in r] == [1, 2]
    # rl.yaml names the SFT output by a relative path: only that directory holds a model
    # here, so the run above loaded it (the tiny model scores 0, so weights need not move)
    start = load_file(str(sft / "final" / "actor" / "model.safetensors"))
    after = load_file(str(rl / "final" / "actor" / "model.safetensors"))
    assert start.keys() == after.keys()
