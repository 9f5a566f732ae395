"""Hostile configs and model directories: each is refused by ``temper check`` and by
``temper train`` alike, in one line naming the key (or file), the reason and the fix —
never a traceback, and never "valid" from ``check`` followed by a crash in ``train``
(``train`` must stop before the run starts: reaching the pipeline fails the test)."""

from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path

import pytest
import yaml

from temper.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
VERL = str(EXAMPLES / "verl_gsm8k_ppo.yaml")
TASK = "task:arithmetic?n=16&seed=3"


@pytest.fixture
def no_run(monkeypatch):
    """``train`` must stop before the run: reaching the pipeline fails the test."""

    def run_pipeline(cfg, plan=None):
        raise AssertionError("train started a run although it should refuse the config")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)


def refused(args: list[str], capsys) -> str:
    """The one-line refusal of ``check`` and of ``train`` (the same), exit 2, no
    traceback on stderr or stdout; the message without its ``config error:`` prefix."""
    messages = []
    for command in ("check", "train"):
        assert main([command, *args]) == 2, command
        out, err = capsys.readouterr()
        err = err.strip()
        assert err.startswith("config error: ") and "\n" not in err, err
        assert "Traceback" not in err + out
        messages.append(err)
    assert messages[0] == messages[1]
    return messages[0].removeprefix("config error: ")


def native(tmp_path: Path, model_dir: Path | str, **sections) -> Path:
    """A small native RLVR config on ``model_dir`` (sections update its defaults)."""
    data: dict = {
        "model": {"path": str(model_dir)},
        "data": {"train_files": [TASK], "train_batch_size": 4, "max_prompt_length": 96},
        "rollout": {"n": 2, "response_length": 8},
        "experiment": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- verl units


ACTOR_MINI = "actor_rollout_ref.actor.ppo_mini_batch_size (temper: actor.mini_batch_size): "


@pytest.mark.parametrize(
    ("overrides", "start", "fix"),
    [
        # 16 prompts × n=2 per step: a mini-batch of 32 prompts is 64 samples > 32
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=32"],
            ACTOR_MINI + "64 samples per mini-batch exceed the 32 samples of a step",
            "set actor_rollout_ref.actor.ppo_mini_batch_size (in prompts: temper's samples ÷ "
            "rollout.n) ≤ 16 or raise data.train_batch_size",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=7"],
            ACTOR_MINI + "32 samples per step",
            "to a divisor of 16, e.g. 8",
        ),
        (
            ["critic.ppo_mini_batch_size=32"],
            "critic.ppo_mini_batch_size (temper: critic.mini_batch_size): ",
            "set critic.ppo_mini_batch_size (in prompts: temper's samples ÷ rollout.n) ≤ 16",
        ),
        # 4 data-parallel ranks: 2 prompts × n=2 are 4 samples, so any even count of prompts
        (
            [
                "trainer.n_gpus_per_node=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=1",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            ],
            ACTOR_MINI + "2 samples cannot be split evenly over 4 data-parallel ranks",
            "to a multiple of 2",
        ),
    ],
)
def test_verl_mini_batch_fix_counts_prompts(overrides, start, fix, capsys, no_run):
    """verl's ppo_mini_batch_size counts prompts: the fix's numbers do too (and the reason
    says what the refused value is in prompts), not the samples those prompts make."""
    msg = refused([VERL, *overrides], capsys)
    assert msg.startswith(start), msg
    assert fix in msg, msg
    assert "prompts × rollout.n 2)" in msg
    assert "≤ 32" not in msg and "divisor of 32" not in msg


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("overrides", "start"),
    [
        (
            ["experiment.trackers=[console,neptune]"],
            "experiment.trackers: unknown value 'neptune'. Fix: use one of: console, jsonl, "
            "mlflow, swanlab, tensorboard, trackio, wandb",
        ),
        (["actor.optim.lr=nan"], "actor.optim.lr: must be a finite number, got nan. Fix: "),
        (["actor.optim.lr=inf"], "actor.optim.lr: must be a finite number, got inf"),
        (["critic.optim.eps=-inf"], "critic.optim.eps: must be a finite number, got -inf"),
        (["actor.entropy_coeff=nan"], "actor.entropy_coeff: must be a finite number"),
        (["algorithm.kl_ctrl.kl_coef=inf"], "algorithm.kl_ctrl.kl_coef: must be a finite"),
        (["reward.failure_score=nan"], "reward.failure_score: must be a finite number"),
        (["actor.optim.betas=[0.9]"], "actor.optim.betas: Adam takes two betas"),
        (["actor.optim.betas=[0.9,1.0]"], "actor.optim.betas: Adam takes two betas"),
        (["actor.optim.betas=[0.9,0.99,0.999]"], "actor.optim.betas: Adam takes two betas"),
        (["actor.optim.weight_decay=-0.1"], "actor.optim.weight_decay: must be ≥ 0"),
        (["experiment.seed=-1"], "experiment.seed: -1 is not a seed numpy takes"),
        (["experiment.seed=4294967296"], "experiment.seed: 4294967296 is not a seed"),
    ],
)
def test_values_that_would_crash_train_are_refused_at_load(
    tmp_path, tiny_model_dir, overrides, start, capsys, no_run
):
    msg = refused([str(native(tmp_path, tiny_model_dir)), *overrides], capsys)
    assert msg.startswith(start), msg
    assert "Fix: " in msg


def test_unknown_tracker_in_verl_terms(capsys, no_run):
    """A verl file cannot name temper's trackers; its logger list is checked by its own
    table, in its own key."""
    msg = refused([VERL, "trainer.logger=[console,clearml]"], capsys)
    assert msg.startswith("trainer.logger: this logger is not supported (got 'clearml')")


def test_nan_lr_in_verl_terms(capsys, no_run):
    msg = refused([VERL, "actor_rollout_ref.actor.optim.lr=nan"], capsys)
    assert msg.startswith(
        "actor_rollout_ref.actor.optim.lr (temper: actor.optim.lr): must be a finite number"
    )


# --------------------------------------------------------------------------- config files


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"model:\n  path: caf\xe9\n", "not UTF-8 text (byte 0xe9 at offset 18)"),  # Latin-1
        (bytes(range(256)) * 4, "not UTF-8 text (byte 0x80 at offset 128)"),  # binary
        (b"\x00\x01\x02model: x\n", "not valid YAML"),  # UTF-8, but no text
    ],
)
def test_a_config_file_that_is_not_text(tmp_path, content, reason, capsys, no_run):
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    msg = refused([str(path)], capsys)
    assert msg.startswith(f"{path}: {reason}"), msg


def test_a_defaults_file_that_is_not_text(tmp_path, tiny_model_dir, capsys, no_run):
    (tmp_path / "base.yaml").write_bytes(b"data:\n  prompt_key: caf\xe9\n")
    top = tmp_path / "top.yaml"
    top.write_text(f"defaults:\n  - base\n  - _self_\nmodel:\n  path: {tiny_model_dir}\n")
    msg = refused([str(top)], capsys)
    assert msg.startswith(f"{tmp_path / 'base.yaml'}: not UTF-8 text"), msg


# --------------------------------------------------------------------------- model dirs


def model_copy(tmp_path: Path, tiny: Path, name: str = "model", **config) -> Path:
    """A copy of the tiny model whose config.json is updated with ``config``."""
    out = tmp_path / name
    shutil.copytree(tiny, out)
    data = json.loads((out / "config.json").read_text())
    data.update(config)
    (out / "config.json").write_text(json.dumps(data))
    return out


def shard(model: Path) -> Path:
    """Turn ``model``'s one safetensors file into a one-shard checkpoint with an index."""
    from safetensors import safe_open

    (model / "model.safetensors").rename(model / "model-00001-of-00001.safetensors")
    with safe_open(str(model / "model-00001-of-00001.safetensors"), "pt") as f:
        names = list(f.keys())
    index = {"weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}
    path = model / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    return path


def _no_weights(model: Path) -> None:
    (model / "model.safetensors").unlink()


def _truncated(model: Path) -> None:
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])


def _garbage(model: Path) -> None:
    weights = model / "model.safetensors"
    weights.write_bytes(bytes(random.Random(0).getrandbits(8) for _ in range(4096)))


def _bad_header(model: Path) -> None:
    weights = model / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 5) + b"{oops" + b"\0" * 64)


def _empty_bin(model: Path) -> None:
    _no_weights(model)
    (model / "pytorch_model.bin").write_bytes(b"")


def _shard_missing(model: Path) -> None:
    shard(model)
    (model / "model-00001-of-00001.safetensors").unlink()


def _tensor_missing(model: Path) -> None:
    index = shard(model)
    data = json.loads(index.read_text())
    data["weight_map"]["lm_head.extra"] = "model-00001-of-00001.safetensors"
    index.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_no_weights, "{model} holds no weights: none of model.safetensors, "),
        (_truncated, "{model}/model.safetensors is not a valid safetensors file: its tensors "),
        (_garbage, "{model}/model.safetensors is not a valid safetensors file: its header "),
        (_bad_header, "{model}/model.safetensors is not a valid safetensors file: its header is"),
        (_empty_bin, "{model}/pytorch_model.bin is empty"),
        (_shard_missing, "model.safetensors.index.json names model-00001-of-00001.safetensors"),
        (_tensor_missing, "model.safetensors.index.json places 1 tensor(s) in model-00001-of-"),
    ],
)
def test_weights_that_would_not_load(tmp_path, tiny_model_dir, damage, reason, capsys, no_run):
    model = model_copy(tmp_path, tiny_model_dir)
    damage(model)
    msg = refused([str(native(tmp_path, model))], capsys)
    assert msg.startswith("model.path: " + reason.format(model=model)), msg
    assert "Fix: re-save or re-download the model" in msg or "Fix: point it at" in msg


def test_unknown_architecture(tmp_path, tiny_model_dir, capsys, no_run):
    model = model_copy(tmp_path, tiny_model_dir, model_type="llama_unheard_of")
    msg = refused([str(native(tmp_path, model))], capsys)
    assert msg.startswith("model.path: config.json names model_type 'llama_unheard_of', which ")
    assert "does not know. Fix: " in msg and "model.external_lib" in msg


def test_remote_code_needs_trust_and_its_files(tmp_path, tiny_model_dir, capsys, no_run):
    auto_map = {"AutoConfig": "configuration_mine.MineConfig"}
    model = model_copy(tmp_path, tiny_model_dir, model_type="mine", auto_map=auto_map)
    msg = refused([str(native(tmp_path, model))], capsys)
    assert "ships its own code (auto_map)" in msg
    assert msg.endswith("Fix: set model.trust_remote_code=true if you trust that code")
    path = native(tmp_path, model, model={"path": str(model), "trust_remote_code": True})
    msg = refused([str(path)], capsys)
    assert msg.startswith(
        f"model.path: config.json's auto_map names configuration_mine.MineConfig, but {model} "
        "holds no configuration_mine.py"
    )


def test_tokenizer_larger_than_the_vocabulary(tmp_path, tiny_model_dir, capsys, no_run):
    model = model_copy(tmp_path, tiny_model_dir, vocab_size=200)
    msg = refused([str(native(tmp_path, model))], capsys)
    assert msg.startswith(
        "model.path: the tokenizer (model.path) has 260 tokens but config.json's vocab_size "
        "is 200: ids from 200 on have no embedding"
    )


def test_a_broken_tokenizer(tmp_path, tiny_model_dir, capsys, no_run):
    model = model_copy(tmp_path, tiny_model_dir)
    (model / "tokenizer.json").write_text("{not json")
    msg = refused([str(native(tmp_path, model))], capsys)
    assert msg.startswith(f"model.path: the tokenizer in {model} cannot be loaded: ")


def test_critic_reward_model_and_judge_are_checked_too(tmp_path, tiny_model_dir, capsys, no_run):
    bad = model_copy(tmp_path, tiny_model_dir, "bad")
    _truncated(bad)
    critic = native(tmp_path, tiny_model_dir, algorithm={"adv_estimator": "gae"})
    data = yaml.safe_load(critic.read_text())
    data["critic"] = {"model_path": str(bad)}
    critic.write_text(yaml.safe_dump(data))
    assert refused([str(critic)], capsys).startswith(f"critic.model_path: {bad}/model.safetensors")

    rm = model_copy(
        tmp_path, tiny_model_dir, "rm", architectures=["LlamaForSequenceClassification"]
    )
    _truncated(rm)
    path = native(tmp_path, tiny_model_dir, reward={"model": {"enable": True, "path": str(rm)}})
    assert refused([str(path)], capsys).startswith(f"reward.model.path: {rm}/model.safetensors")

    judge = {"function": "llm_judge", "judge": {"model_path": str(bad)}}
    path = native(tmp_path, tiny_model_dir, reward=judge)
    assert refused([str(path)], capsys).startswith(
        f"reward.judge.model_path: {bad}/model.safetensors"
    )


def test_a_judge_hub_id_not_on_this_machine(tmp_path, tiny_model_dir, capsys, no_run, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    judge = {"function": "llm_judge", "judge": {"model_path": "no-such-org/no-such-judge"}}
    msg = refused([str(native(tmp_path, tiny_model_dir, reward=judge))], capsys)
    assert msg.startswith(
        "reward.judge.model_path: 'no-such-org/no-such-judge' is not a local directory and not "
        "in the Hugging Face cache"
    )


def test_a_bogus_attention_kernel(tmp_path, tiny_model_dir, capsys, no_run):
    path = native(tmp_path, tiny_model_dir, model={"attn_implementation": "flash_attn_9"})
    msg = refused([str(path)], capsys)
    assert msg.startswith("model.attn_implementation: unknown value 'flash_attn_9'")
    assert "Fix: use one of: auto, eager, " in msg and "sdpa" in msg


# --------------------------------------------------------------------------- context


@pytest.mark.parametrize(
    ("sections", "reason", "fix"),
    [
        (
            {"data": {"max_prompt_length": 1000}, "rollout": {"response_length": 100}},
            "a prompt and its response may reach 1100 tokens, more than the model's context "
            "of 1024",
            "lower data.max_prompt_length and rollout.response_length to fit 1024 tokens",
        ),
        (
            {"rollout": {"max_model_len": 4096}},
            "a sequence may reach 4096 tokens, more than the model's context of 1024",
            "lower rollout.max_model_len to fit 1024 tokens",
        ),
        (
            {"rollout": {"max_model_len": 2048, "multi_turn": {"enable": True}}},
            "an episode may reach 2048 tokens, more than the model's context of 1024",
            "lower rollout.max_model_len to fit 1024 tokens",
        ),
    ],
)
def test_sequences_past_the_model_context(
    tmp_path, tiny_model_dir, sections, reason, fix, capsys, no_run
):
    msg = refused([str(native(tmp_path, tiny_model_dir, **sections))], capsys)
    assert msg.startswith(f"model.path: {reason}"), msg
    assert f"Fix: {fix}" in msg


def test_rope_scaling_extends_the_context(tmp_path, tiny_model_dir, capsys):
    """A linear RoPE factor of 2 doubles the tiny model's 1024 positions; yarn scales its
    original length; llama3's states the extended length already."""
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    model = model_copy(tmp_path, tiny_model_dir, rope_parameters=rope)
    long = {"data": {"max_prompt_length": 1500}, "rollout": {"response_length": 500}}
    assert main(["check", str(native(tmp_path, model, **long))]) == 0
    capsys.readouterr()

    from temper.pipelines.model_files import context_length

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert context_length({"max_position_embeddings": 32768, "rope_scaling": yarn}) == 131072
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert context_length({"max_position_embeddings": 131072, "rope_scaling": llama3}) == 131072
    assert context_length({"text_config": {"max_position_embeddings": 4096}}) == 4096
    assert context_length({"n_positions": 1024, "max_position_embeddings": 2048}) == 1024
    assert context_length({"hidden_size": 8}) is None


def test_the_agentic_episode_limit_is_max_model_len(tmp_path, tiny_model_dir, capsys, no_run):
    sokoban = EXAMPLES / "agentic_sokoban.yaml"
    msg = refused(
        [str(sokoban), f"model.path={tiny_model_dir}", "rollout.max_model_len=5000"], capsys
    )
    assert msg.startswith("model.path: an episode may reach 5000 tokens, more than the model's")
    assert "Fix: lower rollout.max_model_len to fit 1024 tokens" in msg


def test_context_fix_in_verl_terms(tiny_model_dir, capsys, no_run):
    paths = [
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"critic.model.path={tiny_model_dir}",
    ]
    msg = refused([VERL, *paths, "data.max_prompt_length=1000"], capsys)
    assert msg.startswith(
        "actor_rollout_ref.model.path (temper: model.path): a prompt and its response may "
        "reach 1256 tokens, more than the model's context of 1024"
    )
    assert "Fix: lower data.max_prompt_length and data.max_response_length to fit 1024" in msg


# --------------------------------------------------------------------------- a run


@pytest.mark.slow
def test_a_reward_no_float_holds_trains_with_a_recorded_failure(tmp_path, tiny_model_dir, capsys):
    """A reward returning 10**400 (no float holds it) on half the samples: the step
    trains, those samples score failure_score with a recorded failure — no traceback."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1 = ?"}) + "\n" for i in range(8)))
    fn = tmp_path / "huge_reward.py"
    fn.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    compute_score.calls = getattr(compute_score, 'calls', 0) + 1\n"
        "    return 10**400 if compute_score.calls % 2 else 1.0\n"
    )
    path = native(
        tmp_path,
        tiny_model_dir,
        data={"train_files": [str(data)], "train_batch_size": 2, "max_prompt_length": 64},
        rollout={"n": 2, "response_length": 6},
        actor={"mini_batch_size": 4, "micro_batch_size_per_device": 4},
        reward={"num_workers": 1, "custom_function": {"path": str(fn)}},
        experiment={"output_dir": str(tmp_path / "run"), "max_steps": 1, "trackers": ["jsonl"]},
    )
    assert main(["train", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["train/reward_failures"] == 2.0
