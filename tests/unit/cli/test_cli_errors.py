"""``temper`` prints the errors users hit as one ``error: ...`` line (exit 1; config
errors ``config error: ...``, exit 2) without a traceback, unless ``--debug`` or
``TEMPER_DEBUG=1`` asks for it. A bug (any other exception) keeps its traceback.

The non-finite loss and the vLLM start failure are real runs on a tiny model; the Ray
worker failure is the real ``WorkerGroupError`` raised where the pipeline would raise it
(a failing Ray cluster is the Ray integration tests' business).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from temper.cli.main import main

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TYPO = "actor.optim.lrr=1e-3"


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_config_error_is_one_line_exit_2(capsys):
    assert main(["train", str(EXAMPLES / "grpo_native.yaml"), TYPO]) == 2
    captured = capsys.readouterr()
    (line,) = _lines(captured.err)
    assert line.startswith("config error: actor.optim.lrr: ") and "did you mean 'lr'" in line
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize("how", ["--debug before", "--debug after", "TEMPER_DEBUG"])
def test_debug_adds_the_traceback(how, capsys, monkeypatch):
    argv = ["check", str(EXAMPLES / "grpo_native.yaml"), TYPO]
    if how == "--debug before":
        argv = ["--debug", *argv]
    elif how == "--debug after":
        argv = [*argv, "--debug"]
    else:
        monkeypatch.setenv("TEMPER_DEBUG", "1")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert "ConfigError" in err and _lines(err)[-1].startswith("config error: actor.optim.lrr")


def _gae_config(
    tmp_path: Path, model_dir: Path, *, critic: dict | None = None, rollout: dict | None = None
) -> Path:
    cfg = {
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "seed": 1,
            "trackers": ["jsonl"],
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=16&seed=3"],
            "train_batch_size": 2,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 2, "response_length": 4, **(rollout or {})},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4},
        "critic": {"mini_batch_size": 4, "micro_batch_size_per_device": 4, **(critic or {})},
        "algorithm": {"adv_estimator": "gae"},
        "reward": {"function": "format", "num_workers": 1},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.slow
def test_non_finite_loss_in_a_real_run_is_one_line_exit_1(
    tmp_path, tiny_model_dir, monkeypatch, capsys
):
    """A diverging critic (lr 1e30): step 1's update overflows its weights, so step 2's
    value loss is inf and the engine stops before the optimizer step."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    path = _gae_config(tmp_path, tiny_model_dir, critic={"optim": {"lr": 1e30}})
    assert main(["train", str(path)]) == 1
    captured = capsys.readouterr()
    (line,) = [x for x in _lines(captured.err) if x.startswith("error: ")]
    assert line.startswith("error: critic: ") and "optimizer step skipped" in line
    assert "lower that role's optim.lr" in line
    assert "Traceback" not in captured.err


@pytest.mark.slow
def test_vllm_refusing_to_start_is_one_line_naming_the_option(tmp_path, monkeypatch, capsys):
    pytest.importorskip("vllm")
    from temper.utils.tiny import make_tiny_model

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # head size 32 for vLLM CPU; positions for 100k tokens (a context the model lacks is
    # the pre-flight's refusal, before vLLM starts)
    model = make_tiny_model(tmp_path / "tiny-32", hidden_size=128, max_position_embeddings=131_072)
    rollout = {
        "engine": "vllm",
        "max_model_len": 100_000,  # a KV cache of 1 MiB holds ~1000 of its tokens
        "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": 1 << 20}},
    }
    path = _gae_config(tmp_path, model, rollout=rollout)
    assert main(["train", str(path)]) == 1
    captured = capsys.readouterr()
    (line,) = [x for x in _lines(captured.err) if x.startswith("error: ")]
    assert line.startswith("error: vLLM failed to start: ")
    assert "rollout.max_model_len=100000" in line and "rollout.engine=hf" in line
    assert "Traceback" not in captured.err
    # the process group vLLM made for the engine that never started is gone: a later
    # engine of the process (a later test's FSDP2) would otherwise take it for its own
    import torch.distributed as dist

    assert not dist.is_initialized()


def test_failed_ray_worker_is_one_line_exit_1(tmp_path, monkeypatch, capsys):
    from temper.cluster.ray import WorkerGroupError

    def run_pipeline(cfg, plan=None):
        raise WorkerGroupError("actor", 1, "the worker process died (exit code -9)")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)
    # grpo_native.yaml names its author's model directory: skip the pre-flight
    monkeypatch.setattr("temper.pipelines.preflight.preflight", lambda cfg, plan: [])
    assert main(["train", str(EXAMPLES / "grpo_native.yaml")]) == 1
    captured = capsys.readouterr()
    (line,) = _lines(captured.err)
    assert line.startswith("error: actor rank 1: the worker process died (exit code -9) (")
    assert "Traceback" not in captured.err


def test_a_bug_keeps_its_traceback(monkeypatch):
    def run_pipeline(cfg, plan=None):
        raise KeyError("response_mask")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)
    monkeypatch.setattr("temper.pipelines.preflight.preflight", lambda cfg, plan: [])
    with pytest.raises(KeyError, match="response_mask"):
        main(["train", str(EXAMPLES / "grpo_native.yaml")])


def test_check_refuses_an_unsupported_tool_call_format(capsys):
    """`temper check` catches rollout-layer values too, before any model loads."""
    code = main(
        [
            "check",
            str(EXAMPLES / "grpo_native.yaml"),
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.format=gpt-oss",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: rollout.multi_turn.format: tool-call format 'gpt-oss'")
