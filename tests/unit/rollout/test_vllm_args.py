"""The rollout.* → vLLM engine-argument table: honored, left out with a note, or rejected.

Pure config mapping: runs without vLLM installed.
"""

from __future__ import annotations

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import ModelConfig, RolloutConfig
from temper.rollout.vllm_args import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    cpu_block_size,
    cpu_thread_binding,
    engine_args,
)
from temper.rollout.vllm_kv import EngineDemand

FIELDS = {
    "model",
    "tokenizer",
    "dtype",
    "seed",
    "enforce_eager",
    "swap_space",
    "kv_cache_memory_bytes",
    "max_num_seqs",
    "enable_sleep_mode",
    "logprobs_mode",
}


def args(on_cpu: bool = True, environ: dict[str, str] | None = None, **rollout):
    return engine_args(
        RolloutConfig(engine="vllm", **rollout),
        ModelConfig(path="/models/x", dtype="auto"),
        on_cpu=on_cpu,
        seed=7,
        valid_args=FIELDS,
        environ=environ or {},
    )


def test_cpu_mapping_honors_engine_keys_and_notes_gpu_ones():
    kwargs, notes = args(
        max_model_len=512,
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        enable_chunked_prefill=False,
        block_size=16,
        load_format="dummy",
        disable_log_stats=False,
    )
    assert kwargs["dtype"] == "float32" and kwargs["seed"] == 7
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["max_model_len"] == 512 and kwargs["max_num_seqs"] == 8
    assert kwargs["max_num_batched_tokens"] == 1024 and kwargs["enable_chunked_prefill"] is False
    assert kwargs["load_format"] == "dummy" and kwargs["disable_log_stats"] is False
    assert kwargs["kv_cache_memory_bytes"] == DEFAULT_CPU_KV_CACHE_BYTES
    # GPU-only settings are left out on CPU, each with its reason
    for key in ("gpu_memory_utilization", "enable_sleep_mode", "tensor_parallel_size"):
        assert key not in kwargs
    assert kwargs["block_size"] == 32  # 16 rounded up to CPU attention's unit, with a note
    text = " ".join(notes)
    for key in ("gpu_memory_utilization", "block_size", "free_cache_engine"):
        assert f"rollout.{key}" in text


def test_cpu_block_size_rounds_up_to_a_multiple_of_32():
    assert [cpu_block_size(b) for b in (1, 16, 32, 33, 64, 128)] == [32, 32, 32, 64, 64, 128]


def test_cpu_keeps_a_multiple_of_32_block_size_and_env_kv_cache():
    kwargs, _ = args(block_size=64, environ={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert kwargs["block_size"] == 64 and "kv_cache_memory_bytes" not in kwargs


def test_gpu_mapping_passes_memory_parallelism_and_sleep():
    kwargs, notes = args(
        on_cpu=False, gpu_memory_utilization=0.7, tensor_parallel_size=2, free_cache_engine=True
    )
    assert kwargs["gpu_memory_utilization"] == 0.7 and kwargs["tensor_parallel_size"] == 2
    assert kwargs["enable_sleep_mode"] is True and kwargs["dtype"] == "bfloat16"
    assert kwargs["block_size"] == 16 and not notes


def test_tensor_parallel_on_cpu_is_rejected_with_the_reason():
    with pytest.raises(ConfigError) as err:
        args(tensor_parallel_size=2)
    assert err.value.key == "rollout.tensor_parallel_size" and "one process" in str(err.value)


def test_a_standalone_engine_starts_its_tensor_parallel_ranks_itself():
    """Nothing trains beside ``temper generate``'s engine: vLLM's ``mp`` executor starts
    the second rank; an engine a trainer syncs weights into still refuses on CPU."""
    alone = EngineDemand(64, ("rollout.max_model_len",), 4, standalone=True)
    kwargs, _ = engine_args(
        RolloutConfig(engine="vllm", tensor_parallel_size=2),
        ModelConfig(path="/models/x", dtype="auto"),
        on_cpu=True,
        seed=7,
        valid_args=FIELDS,
        environ={},
        demand=alone,
    )
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["distributed_executor_backend"] == "mp"
    with pytest.raises(ConfigError, match="one process per rank"):
        engine_args(
            RolloutConfig(engine="vllm", tensor_parallel_size=2),
            ModelConfig(path="/models/x", dtype="auto"),
            on_cpu=True,
            seed=7,
            valid_args=FIELDS,
            environ={},
            demand=EngineDemand(64, ("rollout.max_model_len",), 4),
        )


@pytest.mark.parametrize(
    ("cpus", "ranks", "bind"),
    [
        ([0, 1], 2, "0|1"),
        ([3, 2, 1, 0], 2, "0,1|2,3"),
        ([0, 1, 2, 3, 4], 2, "0,1,2|3,4"),
        ([4, 5, 6], 3, "4|5|6"),
        ([0, 1], 4, "0|1|0|1"),  # fewer CPUs than ranks: shared round-robin
    ],
)
def test_cpu_thread_binding_splits_this_process_cpus_among_ranks(cpus, ranks, bind):
    assert cpu_thread_binding(cpus, ranks) == bind


def test_engine_kwargs_pass_through_both_shapes_and_typos_are_named():
    kwargs, _ = args(engine_kwargs={"vllm": {"swap_space": 1}, "sglang": {"x": 1}})
    assert kwargs["swap_space"] == 1 and "x" not in kwargs
    kwargs, _ = args(engine_kwargs={"swap_space": 2})  # the verl dialect's flat shape
    assert kwargs["swap_space"] == 2
    with pytest.raises(ConfigError) as err:
        args(engine_kwargs={"vllm": {"swap_spcae": 1}})
    assert err.value.key == "rollout.engine_kwargs.vllm.swap_spcae"
    assert "did you mean 'swap_space'" in str(err.value)


@pytest.mark.parametrize(
    ("extra", "word"),
    [
        ({"logprobs_mode": "raw_logprobs"}, "PPO ratio"),
        ({"enable_sleep_mode": True}, "no sleep mode"),
    ],
)
def test_engine_kwargs_that_would_break_rl_are_rejected(extra, word):
    with pytest.raises(ConfigError, match=word):
        args(engine_kwargs={"vllm": extra})
