"""DPO runs of the tiny test model on CPU: on the synthetic pairs of ``task:arithmetic``
(the right answer chosen, a wrong one rejected) the loss falls and preference accuracy
and margin rise on held-out pairs (the micro-batch invariance is
``tests/unit/roles/test_roles.py``); a checkpoint's ``actor/`` loads in transformers; and ROLL's DPO file trains 2 steps with
only model, data, length, device and output overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from temper.cli.main import main
from temper.data.tasks import make_task_rows
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
TRAIN = "task:arithmetic?n=64&seed=5&max_operand=3&pairs=true"
VAL = "task:arithmetic?n=16&seed=6&split=test&max_operand=3&pairs=true"


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _native(tiny: Path, out: Path, **extra) -> dict:
    cfg = {
        "pipeline": "dpo",
        "model": {"path": str(tiny)},
        "data": {"train_files": [TRAIN], "val_files": [VAL], "train_batch_size": 8},
        "dpo": {"max_length": 128, "beta": 0.5},
        "actor": {"micro_batch_size_per_device": 4, "optim": {"lr": 1e-3}},
        "experiment": {
            "max_steps": 12,
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


def test_dpo_loss_falls_and_held_out_preference_rises(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "dpo"
    summary = run_pipeline(build_config(_native(tiny_model_dir, out)))
    assert summary["curve"] == "train/rewards/margin" and summary["steps"] == 12
    rows = _rows(out)
    train = [r for r in rows if "train/loss" in r]
    # at step 1 the policy is the reference: every implicit reward is 0, the loss log 2
    assert train[0]["train/loss"] == pytest.approx(0.6931, abs=1e-4)
    assert train[0]["train/rewards/margin"] == pytest.approx(0.0, abs=1e-5)

    def mean(key: str, part: list[dict]) -> float:
        return sum(r[key] for r in part) / len(part)

    first, last = train[:4], train[-4:]
    assert mean("train/loss", last) < mean("train/loss", first) - 0.1
    assert mean("train/rewards/margin", last) > mean("train/rewards/margin", first) + 0.3
    assert mean("train/rewards/accuracy", last) > 0.6
    for key in ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected"):
        assert all(f"train/{key}" in r for r in train)
    # held-out pairs (questions of another seed): accuracy and margin rise, the loss falls
    val = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, 4, 8, 12] and val[0]["val/pairs"] == 16
    assert val[0]["val/margin"] == pytest.approx(0.0, abs=1e-5)
    assert val[-1]["val/accuracy"] >= 0.75 and val[-1]["val/margin"] > 0.3
    assert val[-1]["val/loss"] < 0.6 < val[0]["val/loss"]
    assert summary["val_after"] > summary["val_before"]  # val/accuracy, the headline
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))
    still = [k for k in before if torch.equal(before[k], after[k])]
    assert not still, f"parameters that did not move: {still}"


def test_checkpoint_actor_loads_in_transformers(tmp_path, tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "dpo"
    cfg = _native(tiny_model_dir, out, experiment={"max_steps": 4, "val_before_train": False})
    run_pipeline(build_config(cfg))
    ckpt = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "global_step_4" / "actor")
    final = AutoModelForCausalLM.from_pretrained(out / "final" / "actor")
    for (name, a), (_, b) in zip(ckpt.state_dict().items(), final.state_dict().items()):
        assert torch.equal(a, b), name


def test_lora_dpo_trains_the_adapters_against_the_base(tmp_path, tiny_model_dir, monkeypatch):
    """With LoRA the reference is the model without its adapters (no second copy): the
    first step's loss is log 2, held-out accuracy rises, and only adapted weights move."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "lora"
    cfg = _native(
        tiny_model_dir,
        out,
        model={"path": str(tiny_model_dir), "lora": {"rank": 8, "alpha": 16}},
        actor={"micro_batch_size_per_device": 4, "optim": {"lr": 3e-3}},
        experiment={"max_steps": 8, "test_freq": 8},
    )
    summary = run_pipeline(build_config(cfg))
    rows = _rows(out)
    assert next(r["train/loss"] for r in rows if "train/loss" in r) == pytest.approx(
        0.6931, abs=1e-4
    )
    assert summary["val_after"] > summary["val_before"]
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))  # merged
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and not any("embed" in k or "norm" in k for k in moved), moved


def _instruction_pairs(path: Path, n: int, seed: int) -> Path:
    """``task:arithmetic`` pairs in ROLL's DPO columns: ``instruction`` (the question),
    ``chosen``, ``rejected``."""
    rows = make_task_rows("arithmetic", n, seed=seed, max_operand=3, pairs=True)
    out = [
        {"instruction": r["prompt"][0]["content"], "chosen": r["chosen"], "rejected": r["rejected"]}
        for r in rows
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


def test_roll_dpo_file_trains(tmp_path, tiny_model_dir, monkeypatch):
    """ROLL's DPO example (2026-08, megatron on 8 GPUs): 2 steps on this CPU with the
    one-process engines, its loss, β and batch arithmetic (16 pairs per device × 1)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    config = UPSTREAM / "roll-2026-08-8eb27cc/examples/dpo_examples/qwen2.5-3B_dpo_megatron.yaml"
    out = tmp_path / "roll-dpo"
    train = _instruction_pairs(tmp_path / "train.jsonl", 64, 5)
    val = _instruction_pairs(tmp_path / "val.jsonl", 8, 6)
    overrides = [
        f"pretrain={tiny_model_dir}",  # model
        f"actor_train.data_args.file_name=[{train}]",  # data
        f"validation.data_args.file_name=[{val}]",
        "sequence_length=128",  # length
        "max_steps=2",
        "eval_steps=2",
        "num_gpus_per_node=1",  # device
        "actor_train.device_mapping=list(range(0,1))",
        "reference.device_mapping=list(range(0,1))",
        "actor_train.strategy_args.strategy_name=hf_train",
        "~actor_train.strategy_args.strategy_config",
        "reference.strategy_args.strategy_name=hf_infer",
        "~reference.strategy_args.strategy_config",
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out}",
        f"tracker_kwargs.log_dir={out / 'tensorboard'}",
    ]
    assert main(["train", str(config), *overrides]) == 0
    rows = _rows(out)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r["train/pairs"] == 16 and r["perf/samples"] == 32 for r in steps)
    assert steps[0]["train/loss"] == pytest.approx(0.6931, abs=1e-4)  # the reference
    assert any("val/accuracy" in r for r in rows)


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_dpo_example_trains(tmp_path, tiny_model_dir, monkeypatch):
    """``examples/dpo.yaml`` with the tiny model (its tokenizer spells the prompts
    longer), 2 steps: validation before and after, 16 pairs a step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "dpo-example"
    overrides = [
        f"model.path={tiny_model_dir}",
        "dpo.max_length=256",
        "experiment.max_steps=2",
        f"experiment.output_dir={out}",
    ]
    assert main(["train", str(EXAMPLES / "dpo.yaml"), *overrides]) == 0
    rows = _rows(out)
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    assert all(r["train/pairs"] == 16 for r in rows if "train/loss" in r)
    assert [r["step"] for r in rows if "val/accuracy" in r] == [0, 2]


def test_check_names_a_missing_pair_column(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """``temper check`` reads the data's columns: a file without the rejected column is
    refused naming dpo.rejected_key and the columns the file has."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "2+2?", "chosen": "4", "worse": "5"}) + "\n")
    config = tmp_path / "dpo.yaml"
    config.write_text(
        f"pipeline: dpo\nmodel: {{path: {tiny_model_dir}}}\n"
        f"data: {{train_files: [{data}], train_batch_size: 1}}\n"
        f"experiment: {{output_dir: {tmp_path / 'out'}}}\n"
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "dpo.rejected_key" in err and "'rejected' is not in data.train_files" in err
    assert main(["check", str(config), "dpo.rejected_key=worse"]) == 0
