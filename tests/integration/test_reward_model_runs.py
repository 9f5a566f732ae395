"""Reward-model runs of the tiny test model on CPU: on the synthetic pairs of
``task:arithmetic`` (the right answer chosen, a wrong one rejected) the loss falls and
held-out pair accuracy rises well above 0.5; the run's ``final/actor`` loads as
``AutoModelForSequenceClassification`` and, served by the reward-model role, scores the
held-out pairs as the run's last validation did; ``examples/reward_model`` chains the
trained model into a GRPO run that it scores; bad rows are reported by file and row; and
``temper check`` refuses what the pipeline cannot honour. (The update's micro-batch
invariance and the saved model's scores are ``tests/unit/roles/test_reward_scorer.py``;
SIGKILL → resume is ``tests/integration/test_resume.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from temper.cli.main import main
from temper.config.errors import ConfigError
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TRAIN = "task:arithmetic?n=64&seed=5&max_operand=3&pairs=true"
VAL = "task:arithmetic?n=32&seed=6&split=test&max_operand=3&pairs=true"


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _native(tiny: Path, out: Path, **extra) -> dict:
    cfg = {
        "pipeline": "reward_model",
        "model": {"path": str(tiny)},
        "data": {"train_files": [TRAIN], "val_files": [VAL], "train_batch_size": 8},
        "rm": {"max_length": 128},
        "actor": {"micro_batch_size_per_device": 4, "optim": {"lr": 2e-3}},
        "experiment": {
            "max_steps": 16,
            "test_freq": 8,
            "val_before_train": True,
            "save_freq": 8,
            "output_dir": str(out),
            "trackers": ["jsonl"],
        },
    }
    for section, values in extra.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """One 16-step run, shared by the tests that read it."""
    tmp = tmp_path_factory.mktemp("rm")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEMPER_CACHE", str(tmp / "cache"))
        out = tmp / "rm"
        summary = run_pipeline(build_config(_native(tiny_model_dir, out)))
        yield out, summary


def test_loss_falls_and_held_out_accuracy_rises_well_above_half(trained, tiny_model_dir):
    out, summary = trained
    assert summary["curve"] == "train/loss" and summary["steps"] == 16
    rows = _rows(out)
    train = [r for r in rows if "train/loss" in r]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margin", "rewards/accuracy"):
        assert all(f"train/{key}" in r for r in train), key
    assert all(r["train/pairs"] == 8 and r["perf/samples"] == 16 for r in train)

    def mean(key: str, part: list[dict]) -> float:
        return sum(r[key] for r in part) / len(part)

    first, last = train[:4], train[-4:]
    assert mean("train/loss", last) < mean("train/loss", first) - 0.05
    assert mean("train/rewards/margin", last) > mean("train/rewards/margin", first) + 0.2
    val = [r for r in rows if "val/accuracy" in r]
    assert [r["step"] for r in val] == [0, 8, 16] and val[0]["val/pairs"] == 32
    assert val[-1]["val/accuracy"] >= 0.75 and val[-1]["val/accuracy"] > val[0]["val/accuracy"]
    assert val[-1]["val/margin"] > val[0]["val/margin"] + 0.3
    assert val[-1]["val/loss"] < val[0]["val/loss"]
    assert summary["val_after"] > summary["val_before"]  # val/accuracy, the headline
    # every weight of the backbone moved (a scalar head on the policy, not a frozen one)
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(out / "final" / "actor" / "model.safetensors"))
    still = [k for k in before if torch.equal(before[k], after[f"model.{k[len('model.') :]}"])]
    assert not still, f"parameters that did not move: {still}"


def test_final_model_loads_as_sequence_classification_and_scores_as_trained(trained):
    """``final/actor`` (and the last checkpoint's ``actor/``, the same weights) loads as
    ``AutoModelForSequenceClassification`` with nothing missing; served by the
    reward-model role it scores the held-out pairs as the run's last validation did."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from temper.config.schema import RewardModelConfig
    from temper.data.preference import build_pair_datasets
    from temper.rewards.model import RewardModel

    out, _ = trained
    final = out / "final" / "actor"
    model, info = AutoModelForSequenceClassification.from_pretrained(
        final, num_labels=1, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.num_labels == 1
    ckpt = AutoModelForSequenceClassification.from_pretrained(
        out / "checkpoints" / "global_step_16" / "actor"
    )
    for (name, a), (_, b) in zip(ckpt.state_dict().items(), model.state_dict().items()):
        assert torch.equal(a, b), name
    cfg = build_config(_native(Path(final), out))
    tokenizer = AutoTokenizer.from_pretrained(final)
    _, val = build_pair_datasets(cfg, tokenizer)
    assert val is not None
    served = RewardModel.from_config(RewardModelConfig(enable=True, path=str(final)), "cpu")
    sides = [s for p in val.pairs for s in (p.chosen, p.rejected)]
    sequences = [list(s.prompt_ids + s.response_ids) for s in sides]
    scores = served.score_sequences(sequences)
    chosen, rejected = scores[0::2], scores[1::2]
    last = [r for r in _rows(out) if "val/accuracy" in r][-1]
    assert float((chosen > rejected).float().mean()) == pytest.approx(last["val/accuracy"])
    margin = float((chosen - rejected).mean())
    assert margin == pytest.approx(last["val/margin"], rel=1e-4, abs=1e-5)


def test_example_chains_the_reward_model_into_an_rl_run(tmp_path, tiny_model_dir, monkeypatch):
    """``examples/reward_model``, run from a working directory as the README says: the
    GRPO stage's ``reward.model.path`` is the reward-model stage's ``final/actor``, whose
    scores are its rewards (no rule), for 2 steps. The tiny model (its tokenizer spells
    the prompts longer), 2 reward-model steps, the hf rollout engine."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    stage = EXAMPLES / "reward_model"
    assert main(["train", str(stage / "rm.yaml"), f"model.path={tiny_model_dir}",
                 "rm.max_length=256", "experiment.max_steps=2"]) == 0  # fmt: skip
    rm = tmp_path / "outputs" / "reward_model" / "rm"
    assert [r["step"] for r in _rows(rm) if "val/accuracy" in r] == [0, 2]
    assert main(["train", str(stage / "rl.yaml"), f"model.path={tiny_model_dir}",
                 "data.max_prompt_length=256", "experiment.max_steps=2", "rollout.engine=hf",
                 "rollout.n=4", "actor.mini_batch_size=16"]) == 0  # fmt: skip
    rows = _rows(tmp_path / "outputs" / "reward_model" / "rl")
    steps = [r for r in rows if "train/score_mean" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # the scores are the reward model's (train/rm_score_mean), real-valued, not a rule's 0/1
    for r in steps:
        assert r["train/rm_score_mean"] == pytest.approx(r["train/score_mean"], abs=1e-6)
        assert r["train/score_min"] < r["train/score_max"]
        assert {r["train/score_min"], r["train/score_max"]} - {0.0, 1.0}
    assert rows[0]["step"] == 0 and "val/reward_mean" in rows[0]


def test_a_row_without_chosen_is_reported_by_file_and_row(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": "3+3?", "rejected": "7"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _native(
        tiny_model_dir,
        tmp_path / "out",
        data={"train_files": [str(data)], "val_files": [], "train_batch_size": 1},
        actor={"micro_batch_size_per_device": 2},
        experiment={"max_steps": 1, "val_before_train": False},
    )
    # reported and skipped (data.bad_rows: skip, the default): the run trains on the rest
    run_pipeline(build_config(cfg))
    (row,) = [r for r in _rows(tmp_path / "out") if "train/loss" in r]
    assert row["data/skipped_rows"] == 1 and row["data/num_pairs"] == 1
    # or the load fails naming the file and row
    cfg["data"]["bad_rows"] = "error"
    cfg["experiment"]["output_dir"] = str(tmp_path / "out2")
    with pytest.raises(ConfigError) as err:
        run_pipeline(build_config(cfg))
    assert f"{data}:line 2" in str(err.value) and "'chosen'" in str(err.value)


def test_check_refuses_what_the_pipeline_cannot_honour(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "2+2?", "chosen": "4", "worse": "5"}) + "\n")
    config = tmp_path / "rm.yaml"
    config.write_text(
        f"pipeline: reward_model\nmodel: {{path: {tiny_model_dir}}}\n"
        f"data: {{train_files: [{data}], train_batch_size: 1}}\n"
        f"experiment: {{output_dir: {tmp_path / 'out'}}}\nrm: {{max_length: 128}}\n"
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "rm.rejected_key" in err and "'rejected' is not in data.train_files" in err
    assert main(["check", str(config), "rm.rejected_key=worse"]) == 0
    capsys.readouterr()
    refusals = {
        "actor.strategy=megatron": "actor.strategy",
        "model.lora.rank=8": "model.lora.rank",
        "dpo.beta=0.5": "dpo",
        "reference.enable=true": "reference.enable",
        "actor.entropy_coeff=0.01": "actor.entropy_coeff",
        "rm.loss_type=hinge": "rm.loss_type",
    }
    for override, key in refusals.items():
        assert main(["check", str(config), "rm.rejected_key=worse", override]) == 2, override
        assert f"config error: {key}" in capsys.readouterr().err, override


def test_deepspeed_zero3_trains_the_same_reward_model(tmp_path, tiny_model_dir, monkeypatch):
    """``actor.strategy: deepspeed`` (ZeRO-3, one rank on the local backend: its gathered
    export path) computes the torch engine's first step and writes a final model that
    loads as ``AutoModelForSequenceClassification``."""
    pytest.importorskip("deepspeed")
    from transformers import AutoModelForSequenceClassification

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    steps = {"max_steps": 2, "val_before_train": False, "test_freq": 2, "save_freq": 2}
    losses = {}
    for strategy in ("torch", "deepspeed"):
        out = tmp_path / strategy
        actor = {"micro_batch_size_per_device": 4, "optim": {"lr": 2e-3}, "strategy": strategy}
        if strategy == "deepspeed":
            actor["deepspeed"] = {"zero_optimization": {"stage": 3}}
        run_pipeline(build_config(_native(tiny_model_dir, out, actor=actor, experiment=steps)))
        losses[strategy] = [r["train/loss"] for r in _rows(out) if "train/loss" in r]
    assert losses["deepspeed"][0] == pytest.approx(losses["torch"][0], rel=1e-5)
    model, info = AutoModelForSequenceClassification.from_pretrained(
        tmp_path / "deepspeed" / "final" / "actor", num_labels=1, output_loading_info=True
    )
    assert type(model).__name__ == "LlamaForSequenceClassification"
    assert not info["missing_keys"] and not info["unexpected_keys"], info


def test_check_refuses_a_model_without_a_sequence_classification_class(
    tmp_path, tiny_vlm_dir, monkeypatch, capsys
):
    """A vision-language model (Qwen2-VL) has no ``*ForSequenceClassification`` in
    transformers: ``temper check`` refuses it before a run would train and fail to save."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "2+2?", "chosen": "4", "rejected": "5"}) + "\n")
    config = tmp_path / "rm.yaml"
    config.write_text(
        f"pipeline: reward_model\nmodel: {{path: {tiny_vlm_dir}}}\n"
        f"data: {{train_files: [{data}], train_batch_size: 1}}\n"
        f"experiment: {{output_dir: {tmp_path / 'out'}}}\nrm: {{max_length: 128}}\n"
    )
    assert main(["check", str(config)]) == 2
    err = capsys.readouterr().err
    assert "config error: model.path" in err and "'qwen2_vl'" in err
