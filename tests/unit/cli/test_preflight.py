"""``temper check`` is a pre-flight: what ``temper train`` would reject in its first minute
is reported by ``check`` in the same one line, and ``train`` stops with it before Ray
starts or a model loads (here: ``run_pipeline`` must not be reached)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from temper.cli.main import main

TASK = "task:arithmetic?n=16&seed=3"


@pytest.fixture
def no_run(monkeypatch):
    """``train`` must stop in its pre-flight: reaching the pipeline fails the test."""

    def run_pipeline(cfg, plan=None):
        raise AssertionError("train started a run although its pre-flight should refuse it")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)


def native(tmp_path: Path, tiny: Path | str, **sections) -> Path:
    data = {
        "model": {"path": str(tiny)},
        "data": {"train_files": [TASK], "train_batch_size": 4, "max_prompt_length": 96},
        "rollout": {"n": 2, "response_length": 8},
        "experiment": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(args: list[str], capsys) -> str:
    """The one-line refusal of ``check`` and of ``train`` (the same), exit 2, no traceback."""
    messages = []
    for command in ("check", "train"):
        assert main([command, *args]) == 2, command
        err = capsys.readouterr().err.strip()
        assert err.startswith("config error: ") and "\n" not in err, err
        assert "Traceback" not in err
        messages.append(err)
    assert messages[0] == messages[1]
    return messages[0].removeprefix("config error: ")


def test_missing_model_path(tmp_path, tiny_model_dir, capsys, no_run):
    path = native(tmp_path, tmp_path / "no-such-model")
    msg = refused([str(path)], capsys)
    assert msg.startswith(f"model.path: model directory not found: {tmp_path / 'no-such-model'}")


def test_missing_model_path_in_verl_terms(tmp_path, capsys, no_run):
    verl = Path(__file__).resolve().parents[3] / "examples" / "verl_gsm8k_ppo.yaml"
    msg = refused([str(verl), f"actor_rollout_ref.model.path={tmp_path / 'nope'}"], capsys)
    assert msg.startswith("actor_rollout_ref.model.path (temper: model.path): model directory")


def test_a_directory_without_config_json(tmp_path, capsys, no_run):
    (tmp_path / "empty").mkdir()
    msg = refused([str(native(tmp_path, tmp_path / "empty"))], capsys)
    assert "holds no config.json" in msg


def test_output_dir_under_a_file(tmp_path, tiny_model_dir, capsys, no_run):
    (tmp_path / "taken").write_text("a file")
    out = tmp_path / "taken" / "run"
    path = native(tmp_path, tiny_model_dir, experiment={"output_dir": str(out)})
    msg = refused([str(path)], capsys)
    assert msg == (
        f"experiment.output_dir: {tmp_path / 'taken'} is a file, so {out} cannot be a directory"
    )


def test_output_dir_not_writable(tmp_path, tiny_model_dir, capsys, no_run, monkeypatch):
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    # (the tests run as root, whom file modes do not stop)
    monkeypatch.setattr(os, "access", lambda p, m: False if Path(p) == locked else real(p, m))
    path = native(tmp_path, tiny_model_dir, experiment={"output_dir": str(locked / "run")})
    msg = refused([str(path)], capsys)
    assert msg.startswith(f"experiment.output_dir: {locked / 'run'} cannot be written")


def test_missing_data_file(tmp_path, tiny_model_dir, capsys, no_run):
    path = native(tmp_path, tiny_model_dir, data={"train_files": [str(tmp_path / "x.parquet")]})
    assert refused([str(path)], capsys).startswith("data.train_files: file not found")


def test_missing_prompt_column(tmp_path, tiny_model_dir, capsys, no_run):
    path = native(tmp_path, tiny_model_dir, data={"prompt_key": "question"})
    msg = refused([str(path)], capsys)
    assert msg.startswith("data.prompt_key: the column 'question' is not in data.train_files")


def test_no_data_source_column_means_no_reward(tmp_path, tiny_model_dir, capsys, no_run):
    """A reward that would fail on every sample (the rows name no data source, and
    reward.function auto picks by data source) is refused before the run."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "2+2?", "answer": "4"}\n' * 4)
    path = native(tmp_path, tiny_model_dir, data={"train_files": [str(rows)]})
    msg = refused([str(path)], capsys)
    assert msg.startswith(
        "reward.function: the rows of data.train_files have no 'data_source' column, and "
        "reward.function is auto"
    )


def test_unknown_data_source(tmp_path, tiny_model_dir, capsys, no_run):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi", "data_source": "my/dataset"}\n' * 4)
    path = native(tmp_path, tiny_model_dir, data={"train_files": [str(rows)]})
    msg = refused([str(path)], capsys)
    assert msg.startswith("reward.function: no reward scores the data source(s) 'my/dataset'")


def test_sglang_is_refused_before_models_load(tmp_path, tiny_model_dir, capsys, no_run):
    path = native(tmp_path, tiny_model_dir, rollout={"engine": "sglang"})
    msg = refused([str(path)], capsys)
    assert msg.startswith("rollout.engine: 'sglang'")
    assert "temper has no adapter for it" in msg


def test_unbuilt_engine_on_several_devices_is_refused_before_ray(
    tmp_path, capsys, no_run, monkeypatch
):
    """A strategy is a name of the training-engine registry (it used to fail inside a Ray
    worker with an UnserializableException). verl: megatron; ROLL: deepspeed_train —
    each told in its own dialect, the valid engines spelled as that dialect spells them."""
    from temper.registry import Registry
    from temper.training.registry import ENGINES

    partial = Registry("training engine")
    for name in ("torch", "fsdp2"):
        partial.add(name, ENGINES.get(name))
    monkeypatch.setattr("temper.training.registry.ENGINES", partial)
    examples = Path(__file__).resolve().parents[3] / "examples"
    args = [
        str(examples / "verl_gsm8k_ppo.yaml"),
        "actor_rollout_ref.actor.strategy=megatron",
        "trainer.n_gpus_per_node=2",
    ]
    assert refused(args, capsys) == (
        "actor_rollout_ref.actor.strategy (temper: actor.strategy): unknown value 'megatron'. "
        "Fix: use one of: fsdp2, fsdp (one device)"
    )
    args = [
        str(examples / "roll_rlvr.yaml"),
        "num_gpus_per_node=2",
        "actor_train.device_mapping=list(range(0,2))",
    ]
    assert refused(args, capsys) == (
        "actor_train.strategy_args.strategy_name (temper: actor.strategy): unknown value "
        "'deepspeed'. Fix: use one of: fsdp2_train, hf_train"
    )


def test_flash_attention_settles_to_sdpa(tmp_path, tiny_model_dir, capsys):
    """ROLL's flash_attn: fa2 on a machine without flash-attn (or CUDA) runs with sdpa,
    the same attention, with a note — settled, not refused."""
    roll = Path(__file__).resolve().parents[3] / "examples" / "roll_agentic_sokoban.yaml"
    args = [str(roll), f"pretrain={tiny_model_dir}", "actor_train.model_args.flash_attn=fa2"]
    assert main(["check", *args]) == 0
    out = capsys.readouterr().out
    assert "model.attn_implementation: flash_attention_2 -> sdpa" in out
    assert "attn_implementation: sdpa" in out  # the resolved config the run gets


def test_flash_attention_3_on_cpu_settles_to_sdpa_too(tmp_path, tiny_model_dir, capsys):
    path = native(tmp_path, tiny_model_dir, model={"attn_implementation": "flash_attention_3"})
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model.attn_implementation: flash_attention_3 -> sdpa (the run is on CPU" in out


def test_liger_without_its_package_on_a_gpu_settles_to_off(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    """model.use_liger on a GPU machine without liger-kernel: speed only, so check turns
    it off with a note (as flash-attn settles to sdpa) and train starts; on CPU it is
    GPU-only tuning, noted."""
    import importlib.util

    import temper.pipelines.preflight as preflight

    path = native(tmp_path, tiny_model_dir, model={"use_liger": True})
    assert main(["check", str(path)]) == 0
    assert "model.use_liger=True: GPU-only tuning" in capsys.readouterr().out
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(preflight, "_cuda", lambda: True)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "liger_kernel" else find_spec(n, *a)
    )
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "model.use_liger: true -> false (liger-kernel is not installed" in out


def test_a_reward_file_no_function_reads_is_refused_at_check(tmp_path, tiny_model_dir, capsys):
    """A custom reward file with a built-in reward.function would be read by nothing:
    check refuses it, as train does (before, only train did, after the weights loaded)."""
    score = tmp_path / "score.py"
    score.write_text("def compute_score(*a, **k):\n    return 1.0\n")
    reward = {"function": "format", "custom_function": {"path": str(score)}}
    path = native(tmp_path, tiny_model_dir, reward=reward)
    assert refused([str(path)], capsys) == (
        "reward.custom_function.path: is set but reward.function is 'format'. Fix: set "
        "reward.function=custom (or auto) to use the file, or unset the path"
    )


RAY4 = {"backend": "ray", "devices_per_node": 4, "actor_train": [0, 1, 2, 3]}


@pytest.mark.parametrize(
    ("sections", "line"),
    [
        (
            {"actor": {"ulysses_sequence_parallel_size": 2}},
            "actor.ulysses_sequence_parallel_size: sequence parallelism needs several ranks; "
            "the torch engine is one process",
        ),
        (
            {
                "actor": {
                    "strategy": "deepspeed",
                    "l2_coef": 0.1,
                    "deepspeed": {"zero_optimization": {"stage": 3}},
                }
            },
            "actor.l2_coef: the explicit L2 term needs whole parameters; ZeRO-3 partitions them",
        ),
        (
            {"actor": {"strategy": "fsdp2", "fsdp": {"fsdp_size": 3}}, "resources": RAY4},
            "actor.fsdp.fsdp_size: 3 does not divide the 4 ranks of actor",
        ),
        (
            {"actor": {"strategy": "fsdp2", "l2_coef": 0.1}, "resources": RAY4},
            "actor.l2_coef: the explicit L2 term is not implemented for sharded (fsdp2)",
        ),
    ],
    ids=["torch-sequence-parallel", "zero3-l2", "fsdp-size", "fsdp2-l2"],
)
def test_what_an_engine_refuses_is_refused_at_check(
    tmp_path, tiny_model_dir, capsys, sections, line
):
    """Settings the engine's build refused, after check said valid and the weights
    loaded: check refuses them from the config alone, in the same words."""
    sections = {**sections, "experiment": {"device": "cpu"}}
    path = native(tmp_path, tiny_model_dir, **sections)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: {line}") and "Traceback" not in err, err


def test_gpu_tuning_is_noted_on_cpu(tmp_path, tiny_model_dir, capsys):
    path = native(
        tmp_path, tiny_model_dir, rollout={"n": 2, "response_length": 8, "enforce_eager": False}
    )
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "rollout.enforce_eager=False: GPU-only tuning (CUDA graphs); no effect on CPU" in out


def test_half_master_weights_on_cpu_are_noted(tmp_path, tiny_model_dir, capsys):
    path = native(tmp_path, tiny_model_dir, actor={"master_dtype": "bf16"})
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "actor.master_dtype=bf16: the role then computes in bf16 on CPU" in out


def test_cuda_device_runs_on_cpu_here(tmp_path, tiny_model_dir, capsys):
    path = native(tmp_path, tiny_model_dir, experiment={"device": "cuda"})
    assert main(["check", str(path)]) == 0
    assert "experiment.device: cuda -> cpu (no CUDA device on this machine)" in (
        capsys.readouterr().out
    )


def test_config_only_skips_the_preflight(tmp_path, capsys):
    path = native(tmp_path, tmp_path / "no-such-model")
    assert main(["check", str(path), "--config-only"]) == 0
    assert "config only, pre-flight skipped" in capsys.readouterr().out


def test_unknown_tool_in_tool_config(tmp_path, tiny_model_dir, capsys, no_run):
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        yaml.safe_dump(
            {
                "tools": [
                    {
                        "class_name": "x.Y",
                        "config": {},
                        "tool_schema": {
                            "type": "function",
                            "function": {
                                "name": "web_search",
                                "description": "search",
                                "parameters": {"type": "object", "properties": {}},
                            },
                        },
                    }
                ]
            }
        )
    )
    path = native(
        tmp_path,
        tiny_model_dir,
        rollout={"multi_turn": {"enable": True, "tool_config_path": str(tools)}},
    )
    msg = refused([str(path)], capsys)
    assert msg.startswith("rollout.multi_turn.tool_config_path: tools ['web_search'] are not")


def test_a_weighted_domain_without_prompts(tmp_path, tiny_model_dir, capsys, no_run):
    """ROLL's domain_interleave_probs weights reward domains: a domain the data does not
    feed is reported by check, not at the first step of train."""
    path = native(
        tmp_path,
        tiny_model_dir,
        data={
            "source_weights": {"math_rule": 0.5, "code_sandbox": 0.5},
            "source_domains": {"math_rule": ["deepmath"], "code_sandbox": ["kodcode"]},
            "source_default_domain": "math_rule",
        },
    )
    msg = refused([str(path)], capsys)
    assert msg.startswith(
        "data.source_weights: domain(s) code_sandbox have a weight but no prompts"
    )


# --------------------------------------------------------------------------- trackers

ROLL_SOKOBAN = Path(__file__).resolve().parents[3] / "examples" / "roll_agentic_sokoban.yaml"
VERL_PPO = Path(__file__).resolve().parents[3] / "examples" / "verl_gsm8k_ppo.yaml"


def _installed(package: str):
    import importlib.util

    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None, reason=f"{package} is not installed"
    )


@pytest.mark.parametrize(
    "tracker",
    ["mlflow", "trackio", pytest.param("swanlab", marks=_installed("swanlab"))],
)
def test_check_passes_with_each_local_tracker(tmp_path, tiny_model_dir, capsys, tracker):
    path = native(tmp_path, tiny_model_dir, experiment={"trackers": ["console", tracker]})
    assert main(["check", str(path)]) == 0, capsys.readouterr().err


def test_check_passes_with_verl_loggers(tmp_path, tiny_model_dir, capsys):
    args = [
        str(VERL_PPO),
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"critic.model.path={tiny_model_dir}",
        f"trainer.default_local_dir={tmp_path / 'out'}",
        f"data.train_files=[{TASK}]",
        f"data.val_files=[{TASK}]",
        "trainer.logger=[console,mlflow,trackio]",
    ]
    assert main(["check", *args]) == 0, capsys.readouterr().err


def test_check_passes_with_roll_track_with_trackio(tmp_path, tiny_model_dir, capsys):
    args = [
        str(ROLL_SOKOBAN),
        f"pretrain={tiny_model_dir}",
        f"output_dir={tmp_path / 'out'}",
        "track_with=trackio",
        "+tracker_kwargs.project=roll-runs",
        "+tracker_kwargs.group=grpo",
    ]
    assert main(["check", *args]) == 0, capsys.readouterr().err


def test_roll_trackio_tags_are_refused_in_roll_terms(tmp_path, tiny_model_dir, capsys, no_run):
    """ROLL hands its trackio tracker's ``tags`` to ``trackio.init``, which takes none."""
    args = [
        str(ROLL_SOKOBAN),
        f"pretrain={tiny_model_dir}",
        f"output_dir={tmp_path / 'out'}",
        "track_with=trackio",
        "+tracker_kwargs.tags=[rl]",
    ]
    msg = refused(args, capsys)
    assert "tracker_kwargs.tags" in msg and "the trackio tracker does not read it" in msg


def test_a_tracker_whose_package_is_missing_is_refused(
    tmp_path, tiny_model_dir, capsys, no_run, monkeypatch
):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "swanlab" else real(n, *a)
    )
    path = native(tmp_path, tiny_model_dir, experiment={"trackers": ["console", "swanlab"]})
    assert refused([str(path)], capsys) == (
        "experiment.trackers: 'swanlab' needs the swanlab package, which is not installed. "
        "Fix: pip install 'temper-rl[swanlab]'"
    )
