"""ROLL's DeepEyes agentic file (2026-08): its ``reward`` worker (vLLM, an InferWorker)
is the envs' LLM judge (``reward.judge``, with ROLL's sampling defaults where the file
says nothing), its env type ``deepeyes`` is registered, its VLTrajEnvManager is
``vl_trajectory``; ``temper check`` passes it as the upstream replay does."""

from __future__ import annotations

import pytest
from reference_paths import UPSTREAM  # next to this file
from upstream_replay import Row, check

from temper.config.errors import ConfigError
from temper.pipelines.catalog import load_config

FILE = UPSTREAM / "roll-2026-08-8eb27cc/examples/agentic_deepeyes/deepeyes.yaml"


def test_reward_worker_is_the_envs_judge():
    loaded = load_config(FILE, [])
    cfg = loaded.config
    judge = cfg.reward.judge
    assert (judge.model_path, judge.engine, judge.dtype) == (
        "Qwen/Qwen2.5-72B-Instruct",
        "vllm",
        "bf16",
    )
    assert judge.temperature == 0.3  # the file's
    # ROLL's GeneratingArguments defaults, which its reward worker samples with
    assert (judge.top_p, judge.top_k, judge.max_new_tokens) == (0.7, 50, 8192)
    assert judge.gpu_memory_utilization == 0.8
    assert not cfg.reward.model.enable  # not a reward model
    assert cfg.resources.reward == [12, 13, 14, 15]
    notes = "\n".join(loaded.notes)
    assert "reward.generating_args.top_p: not in the file; ROLL's default 0.7" in notes
    assert "reward.strategy_args.strategy_config.tensor_parallel_size" in notes


def test_envs_and_manager():
    cfg = load_config(FILE, []).config
    assert cfg.pipeline == "agentic" and cfg.agentic.env_manager == "vl_trajectory"
    tag = cfg.agentic.custom_envs["deepeyes"]
    assert tag.env_type == "deepeyes" and tag.max_turns == 5
    assert tag.env_config["acc_weight"] == 0.8 and tag.env_config["tool_weight"] == 1.2
    # mcore_adapter's names for the tower: resolved against the model when it loads
    assert cfg.actor.freeze_module_prefix == ["vision_model.blocks", "vision_model.patch_embed"]


def test_file_passes_check():
    assert check(Row("deepeyes", FILE)) == "passes"


def test_judge_engine_outside_roll_choices_is_refused():
    with pytest.raises(
        ConfigError,
        match=r"reward\.strategy_args\.strategy_name: this value is not supported "
        r"\(got 'megatron_infer'\)",
    ):
        load_config(FILE, ["reward.strategy_args.strategy_name=megatron_infer"])


def test_no_judge_model_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"reward\.judge\.model_path .*env tag deepeyes"):
        load_config(FILE, ["~reward.model_args.model_name_or_path"])


def test_an_rlvr_files_reward_worker_stays_a_reward_model(tmp_path):
    """Outside agentic files ``reward`` is a reward model: its infer_batch_size is the
    scoring micro-batch, its generating_args are noted (it does not generate)."""
    import yaml

    src = UPSTREAM / "roll-2026-08-8eb27cc/examples/docs_examples/example_ppo.yaml"
    data = yaml.safe_load(src.read_text())
    data["reward"] = {
        "model_args": {"model_name_or_path": "my/rm", "dtype": "bf16"},
        "infer_batch_size": 4,
        "generating_args": {"temperature": 0.5},
        "strategy_args": {"strategy_name": "hf_infer"},
    }
    path = tmp_path / "ppo_rm.yaml"
    path.write_text(yaml.safe_dump(data))
    loaded = load_config(path, [])
    cfg = loaded.config
    assert (cfg.reward.model.enable, cfg.reward.model.path) == (True, "my/rm")
    assert cfg.reward.model.micro_batch_size_per_device == 4
    assert cfg.reward.judge.model_path is None
    notes = "\n".join(loaded.notes)
    assert "reward.generating_args.temperature" in notes and "does not generate" in notes
    assert "reward.model_args.dtype" in notes
