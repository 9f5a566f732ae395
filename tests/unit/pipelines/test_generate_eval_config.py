"""generate and eval configs: each runs under its own command only, its plan trains
nothing, and what it would read nothing of is refused in one line naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from temper.config.derive import explain
from temper.config.errors import ConfigError
from temper.pipelines import command_pipeline
from temper.pipelines.catalog import build_config, plan

GENERATE: dict[str, Any] = {
    "pipeline": "generate",
    "model": {"path": "m"},
    "rollout": {"n": 4},
    "generate": {"files": ["p.parquet"], "output_path": "out/g.parquet", "batch_size": 3},
}
EVAL: dict[str, Any] = {"pipeline": "eval", "evaluate": {"files": ["g.parquet"]}}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_each_runs_under_its_own_command():
    gen, ev = build_config(GENERATE), build_config(EVAL)  # eval needs no model.path
    assert command_pipeline(gen, "generate").main is not None
    assert command_pipeline(ev, "eval").main is not None
    with pytest.raises(ConfigError, match="runs with temper generate, not temper train"):
        command_pipeline(gen, "train")
    rl = build_config({"model": {"path": "m"}, "data": {"train_files": ["t.parquet"]}})
    with pytest.raises(ConfigError, match="pipeline rlvr runs with temper train"):
        command_pipeline(rl, "eval")


def test_check_explains_the_call_not_a_training_step():
    cfg = build_config(GENERATE)
    rows = {name: value for name, value, _how in explain(cfg, plan(cfg))}
    assert rows == {"prompts per generate call": "3", "responses per prompt": "4"}


REFUSED_GENERATE = [
    ({"reward": {"function": "gsm8k"}}, "reward.function", "scores nothing"),
    ({"actor": {"optim": {"lr": 1e-3}}}, "actor.optim.lr", "trains nothing"),
    ({"data": {"train_files": ["t.parquet"]}}, "data.train_files", "generate.files"),
    ({"rollout": {"val": {"n": 2}}}, "rollout.val.n", "no validation"),
    ({"experiment": {"max_steps": 3}}, "experiment.max_steps", "no run directory"),
    ({"resources": {"actor_train": [0]}}, "resources.actor_train", "no roles to place"),
    ({"rollout": {"temperature": 0.0}}, "rollout.n", "identical responses"),
    ({"generate": {"output_path": "out/g.txt"}}, "generate.output_path", ".parquet"),
    ({"generate": {"output_path": ""}}, "generate.output_path", "no output file"),
]


@pytest.mark.parametrize(("over", "key", "why"), REFUSED_GENERATE)
def test_generate_refuses_what_it_would_not_read(over, key, why):
    with pytest.raises(ConfigError) as err:
        build_config(merged(GENERATE, over))
    assert err.value.key == key and why in str(err.value)


REFUSED_EVAL = [
    ({"model": {"path": "m"}}, "model.path", "loads no policy"),
    ({"rollout": {"n": 2}}, "rollout.n", "generates nothing"),
    ({"data": {"max_prompt_length": 64}}, "data.max_prompt_length", "evaluate.*"),
    ({"reward": {"model": {"enable": True, "path": "rm"}}}, "reward.model.enable", "texts"),
    ({"evaluate": {"k": [0, 2]}}, "evaluate.k", "k >= 1"),
    ({"reward": {"max_failed_steps": 5}}, "reward.max_failed_steps", "no steps to fail"),
    ({"evaluate": {"files": []}}, "evaluate.files", "no files"),
    ({"generate": {"batch_size": 4}}, "generate", "generate pipeline"),
]


@pytest.mark.parametrize(("over", "key", "why"), REFUSED_EVAL)
def test_eval_refuses_what_it_would_not_read(over, key, why):
    with pytest.raises(ConfigError) as err:
        build_config(merged(EVAL, over))
    assert err.value.key == key and why in str(err.value)


def test_the_examples_load():
    """examples/generate.yaml writes what examples/eval.yaml reads."""
    from pathlib import Path

    from temper.pipelines.catalog import load_config

    root = Path(__file__).resolve().parents[3] / "examples"
    gen = load_config(root / "generate.yaml").config
    ev = load_config(root / "eval.yaml").config
    assert (gen.pipeline, ev.pipeline) == ("generate", "eval")
    assert ev.evaluate.files == [gen.generate.output_path]


def test_source_metrics_by_hand():
    """Two sources; prompts of source b have 2 and 4 responses, so pass@4 is left out
    for b (and for all) and pass@2 uses every prompt."""
    from temper.pipelines.evaluate import metrics_table, source_metrics

    scores = [[1.0, 0.0, 0.0, 0.0], [0.5, 1.0], [1.0, 1.0, 0.0, 0.0]]
    metrics = source_metrics(scores, ["a", "b", "b"], [1, 2, 4], threshold=1.0)
    assert metrics["a/mean@n"] == pytest.approx(0.25)
    assert metrics["a/pass@4"] == pytest.approx(1.0)
    # b: mean of (0.75, 0.5); pass@1 of (1/2, 2/4); pass@2 of (1, 1 − C(2,2)/C(4,2) = 5/6)
    assert metrics["b/mean@n"] == pytest.approx(0.625)
    assert metrics["b/pass@1"] == pytest.approx(0.5)
    assert metrics["b/pass@2"] == pytest.approx((1 + 5 / 6) / 2)
    assert "b/pass@4" not in metrics and "all/pass@4" not in metrics
    assert metrics["all/prompts"] == 3.0 and metrics["all/responses"] == 10.0
    lines = metrics_table(metrics)
    assert lines[0].split() == [
        "data",
        "source",
        "prompts",
        "responses",
        "mean@n",
        "pass@1",
        "pass@2",
        "pass@4",
    ]
    assert [line.split()[0] for line in lines[1:]] == ["a", "b", "all"]
    assert lines[2].split()[-1] == "-"  # b has no pass@4


# ------------------------------------------- verl 0.9's main_generation_server line


def _server_line() -> tuple[Any, list[str]]:
    """verl 2026-08's generation example: ``main_generation_server`` on ppo_trainer.yaml."""
    import sys
    from pathlib import Path

    tests = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(tests / "unit" / "config"))
    from upstream_scripts import script_commands

    root = tests / "data" / "upstream" / "verl-2026-08-1dda039"
    cmd = script_commands(root / "examples/generation/run_deepseek_llm_7b.sh", root)[0]
    assert cmd.command == "generate" and cmd.config.name == "ppo_trainer.yaml"
    return cmd.config, list(cmd.overrides)


def test_generation_server_line_reads_as_generate():
    from temper.config.dialects.verl.generation import SERVER_NOT_READ
    from temper.pipelines.catalog import load_config

    config, overrides = _server_line()
    lr = "actor_rollout_ref.actor.optim.lr=1e-5"  # a PPO key: noted, not refused
    loaded = load_config(config, [*overrides, lr], command="generate")
    cfg = loaded.config
    assert cfg.pipeline == "generate"
    assert cfg.generate.files == ["/home/user/data/gsm8k/test.parquet"]
    assert cfg.generate.output_path.endswith("deepseek_llm_7b_gen_test.parquet")
    assert cfg.model.path == "deepseek-ai/deepseek-llm-7b-chat" and cfg.model.trust_remote_code
    r = cfg.rollout
    assert (r.n, r.temperature, r.top_k, r.top_p) == (1, 1.0, 50, 0.7)
    assert (r.response_length, cfg.data.max_prompt_length) == (1024, 2048)
    assert r.tensor_parallel_size == 2 and r.gpu_memory_utilization == 0.8
    assert r.calculate_log_probs is False  # the server writes responses only
    assert cfg.actor.optim.lr == build_config(GENERATE).actor.optim.lr  # untouched
    unread = next(n for n in loaded.notes if SERVER_NOT_READ in n)
    assert "actor_rollout_ref.actor.optim.lr" in unread and "data.train_batch_size" in unread


def test_generation_server_refuses_what_it_reads_and_cannot_honour():
    from temper.pipelines.catalog import load_config

    config, overrides = _server_line()
    cases = [
        # verl's default: random weights, which no trainer syncs in a generation
        ("actor_rollout_ref.rollout.load_format=dummy", "load_format", "random weights"),
        ("actor_rollout_ref.rollout.temprature=1", "temprature", "did you mean 'temperature'"),
    ]
    for extra, key, why in cases:
        with pytest.raises(ConfigError) as err:
            load_config(config, [*overrides, extra], command="generate")
        assert key in err.value.key and why in str(err.value), extra


@pytest.mark.parametrize(
    ("devices", "backend"),
    [
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=8"], "ray"),
        (["trainer.nnodes=1", "trainer.n_gpus_per_node=1"], "local"),
    ],
)
def test_generation_engines_span_verls_devices(devices, backend):
    """verl's generation worker group spans ``nnodes × n_gpus_per_node`` devices, one
    engine per tensor-parallel group: more than one device runs on Ray, over the nodes."""
    from temper.pipelines.catalog import load_config

    config, overrides = _server_line()
    cfg = load_config(config, [*overrides, *devices], command="generate").config
    res = cfg.resources
    assert res.backend == backend
    assert f"trainer.nnodes={res.nnodes}" in devices
    assert f"trainer.n_gpus_per_node={res.devices_per_node}" in devices


def test_the_same_line_under_train_is_read_as_rl():
    """``temper train`` reads ppo_trainer.yaml as main_ppo does: this line's generation
    keys disagree with the trainer's (verl's main_ppo would train with prompts of 512)."""
    from temper.pipelines.catalog import load_config

    config, overrides = _server_line()
    with pytest.raises(ConfigError) as err:
        load_config(config, overrides)
    assert err.value.key == "data.max_prompt_length"
    keep = ("data.train_files", "actor_rollout_ref.model.path", "trainer.n")
    rl = [o for o in overrides if o.startswith(keep)]
    assert load_config(config, rl).config.pipeline == "rlvr"


def test_check_for_generate(capsys):
    from temper.cli.main import main

    config, overrides = _server_line()
    assert main(["check", "--config-only", "--for", "generate", str(config), *overrides]) == 0
    out = capsys.readouterr().out
    assert "pipeline: generate" in out and "responses per prompt" in out
    assert main(["check", "--config-only", str(config), *overrides]) == 2  # train's reading
