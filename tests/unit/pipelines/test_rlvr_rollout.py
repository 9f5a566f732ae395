"""The rlvr_rollout pipeline (``temper eval`` on a ROLL RLVR file): ROLL's val_correct by
hand, the mapping of ROLL's RLVR file read for eval, ROLL's engine assertions, and what a
rollout that trains nothing refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from temper.config.errors import ConfigError
from temper.pipelines import command_pipeline
from temper.pipelines.catalog import build_config, load_config
from temper.pipelines.rlvr_rollout import correct_metrics

UPSTREAM = Path(__file__).resolve().parents[2] / "data" / "upstream"
RLVR_8GPUS = (
    UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml"
)
STRATEGY = "actor_infer.strategy_args.strategy_config"


def test_correct_metrics_by_hand():
    """ROLL counts a sample correct when its score is exactly 1 (a soft 0.9 is not)."""
    m = correct_metrics([1.0, 0.0, 1.0, 0.9, 1.0], ["a", "a", "b", "b", "b"])
    assert m == {
        "val_correct/all/mean": pytest.approx(3 / 5),
        "val_correct/a/mean": pytest.approx(1 / 2),
        "val_correct/b/mean": pytest.approx(2 / 3),
    }
    assert correct_metrics([], []) == {}


def test_roll_rlvr_file_read_for_eval_is_its_validation_rollout():
    loaded = load_config(RLVR_8GPUS, command="eval")
    cfg = loaded.config
    assert cfg.pipeline == "rlvr_rollout"
    assert command_pipeline(cfg, "eval").main is not None
    with pytest.raises(ConfigError, match="runs with temper eval"):
        command_pipeline(cfg, "train")
    assert cfg.data.val_files == ["data/math_benchmarks.jsonl"]  # validation.data_args
    assert cfg.data.train_files == [] and cfg.data.source_weights == {}
    val = cfg.rollout.val  # validation.generating_args
    assert (val.temperature, val.top_p, val.top_k, val.n) == (0.6, 0.6, 50, 1)
    assert cfg.rollout.engine == "vllm" and cfg.rollout.response_length == 4096
    assert cfg.data.data_source_key == "tag"  # val_correct/<tag>/mean
    assert sorted(cfg.reward.routes) == [
        "code_sandbox",
        "crossthinkqa",
        "ifeval",
        "llm_judge",
        "math_rule",
    ]
    assert cfg.actor.strategy == "torch" and cfg.experiment.max_steps is None  # defaults
    assert cfg.experiment.log_val_generations == 10  # ROLL logs 10 generate examples
    notes = "\n".join(loaded.notes)
    assert "actor_train.data_args.file_name: no effect here" in notes
    assert "checkpoint_config.output_dir, max_steps, save_steps" in notes
    assert "actor_infer.generating_args.temperature" in notes
    # the same file still trains under temper train
    assert load_config(RLVR_8GPUS).config.pipeline == "rlvr"


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ([f"{STRATEGY}.load_format=dummy"], f"{STRATEGY}.load_format", "'dummy'"),
        ([f"~{STRATEGY}.load_format"], f"{STRATEGY}.load_format", "default when absent"),
        ([f"+{STRATEGY}.sleep_level=2"], f"{STRATEGY}.sleep_level", "sleep_level 1 (got 2)"),
        (["~validation"], "validation.data_args.file_name", "none is given"),
    ],
)
def test_roll_rollout_assertions_are_refused_by_key(overrides, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(RLVR_8GPUS, overrides, command="eval")
    assert str(err.value).startswith(key) and words in str(err.value)


def test_hf_engine_has_no_load_format_assertion():
    """ROLL asserts load_format for vLLM and SGLang only."""
    cfg = load_config(
        RLVR_8GPUS,
        ["actor_infer.strategy_args.strategy_name=hf_infer", f"~{STRATEGY}"],
        command="eval",
    ).config
    assert cfg.pipeline == "rlvr_rollout" and cfg.rollout.engine == "hf"


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("actor_train.model_args.dtype=fp32", "reference.model_args.dtype"),  # Same
        ("reference.model_args.model_type=value", "reference.model_args.model_type"),  # Refuse
    ],
)
def test_eval_checks_nothing_of_the_workers_it_does_not_build(override, key):
    """The rollout builds actor_infer and the reward workers only: a reference whose dtype
    differs from actor_train's, or that names a model_type, refuses the file for
    training, not for eval, which notes the key as having no effect."""
    with pytest.raises(ConfigError) as err:
        load_config(RLVR_8GPUS, [override])
    assert str(err.value).startswith(key)
    loaded = load_config(RLVR_8GPUS, [override], command="eval")
    assert loaded.config.pipeline == "rlvr_rollout"
    (note,) = [n for n in loaded.notes if "builds actor_infer and the reward workers" in n]
    assert key in note.split(": no effect here")[0].split(", ")


def test_a_rollout_only_roll_file_runs_under_eval_and_is_sent_there(tmp_path):
    path = tmp_path / "rollout.yaml"
    path.write_text(
        "pretrain: /m\nvalidation:\n  data_args: {file_name: [v.jsonl]}\n"
        "actor_infer:\n  generating_args: {max_new_tokens: 8}\n"
    )
    assert load_config(path, command="eval").config.pipeline == "rlvr_rollout"
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith("actor_infer: this is a ROLL RLVR rollout pipeline")
    assert "temper eval runs" in str(err.value)


def _native(**extra: dict) -> dict:
    cfg: dict = {"pipeline": "rlvr_rollout", "model": {"path": "/m"}}
    cfg["data"] = {"val_files": ["v.jsonl"]}
    for section, values in extra.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"actor": {"optim": {"lr": 0.1}}}, "actor.optim.lr", "trains nothing"),
        ({"data": {"train_files": ["t.jsonl"]}}, "data.train_files", "validation.data_args"),
        ({"rollout": {"n": 4}}, "rollout.n", "validation.generating_args"),
        ({"experiment": {"save_freq": 5}}, "experiment.save_freq", "no steps, checkpoints"),
        ({"data": {"val_files": []}}, "data.val_files", "none are given"),
    ],
)
def test_what_a_validation_rollout_reads_nothing_of_is_refused(extra, key, words):
    with pytest.raises(ConfigError) as err:
        build_config(_native(**extra))
    assert str(err.value).startswith(key) and words in str(err.value)


def test_a_native_validation_rollout_builds():
    cfg = build_config(_native(rollout={"val": {"n": 2, "temperature": 1.0, "do_sample": True}}))
    assert cfg.pipeline == "rlvr_rollout" and cfg.rollout.val.n == 2
