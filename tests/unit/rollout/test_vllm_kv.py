"""The CPU KV cache is sized to the run's generation (at most 2 GiB); explicit sizes win.

Pure config arithmetic: runs without vLLM installed.
"""

from __future__ import annotations

import dataclasses

from temper.config.schema import ModelConfig, RolloutConfig, TemperConfig
from temper.pipelines.demand import demand_of
from temper.rollout.vllm_args import engine_args
from temper.rollout.vllm_kv import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    EngineDemand,
    cpu_kv_cache_bytes,
    kv_bytes_per_token,
    largest_call,
)

FIELDS = {"model", "tokenizer", "dtype", "seed", "kv_cache_memory_bytes", "max_num_seqs"}
#: a tiny GQA model: 2 layers, 4 heads of 16 (hidden 64), 2 KV heads
TINY = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 64,
}


def run_cfg(**rollout: object) -> TemperConfig:
    cfg = TemperConfig()
    cfg.pipeline = "rlvr"
    cfg.data.train_batch_size = 3
    cfg.data.max_prompt_length = 40
    cfg.rollout = dataclasses.replace(
        cfg.rollout, engine="vllm", n=2, response_length=10, **rollout
    )
    return cfg


def cpu_args(cfg: TemperConfig, text=TINY, environ=None):
    return engine_args(
        cfg.rollout,
        ModelConfig(path="/models/x", dtype="fp32"),
        on_cpu=True,
        seed=0,
        valid_args=FIELDS,
        environ=environ or {},
        demand=demand_of(cfg),
        model_text=text,
    )


def test_bytes_per_token_is_k_and_v_of_every_layer():
    # 2 (K, V) x 2 layers x 2 kv heads x head 64/4 = 16 x 4 bytes
    assert kv_bytes_per_token(TINY, 4) == 2 * 2 * 2 * 16 * 4 == 512
    assert kv_bytes_per_token({**TINY, "head_dim": 32}, 2) == 2 * 2 * 2 * 32 * 2
    no_gqa = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}
    assert kv_bytes_per_token(no_gqa, 4) == 2 * 2 * 4 * 16 * 4
    assert kv_bytes_per_token({"hidden_size": 64}, 4) is None


def test_cache_is_whole_blocks_per_sequence_plus_the_null_block():
    # 6 sequences x ceil(50 / 32) = 2 blocks, + 1 null block = 13 blocks of 32 tokens
    assert cpu_kv_cache_bytes(512, 32, EngineDemand(50, (), 6)) == 512 * 32 * 13
    assert cpu_kv_cache_bytes(512, 32, EngineDemand(64, (), 1)) == 512 * 32 * 3
    assert cpu_kv_cache_bytes(512, 32, EngineDemand(None, (), 6)) == DEFAULT_CPU_KV_CACHE_BYTES
    huge = EngineDemand(8192, (), 256)  # 256 x 256 blocks x 32 MB: far past 2 GiB
    assert cpu_kv_cache_bytes(10**6, 32, huge) == DEFAULT_CPU_KV_CACHE_BYTES  # capped


def test_each_data_parallel_engine_sizes_for_its_slice_of_a_call():
    demand = EngineDemand(50, ("rollout.max_model_len",), 7)
    # the driver's prompt_slices give 3 engines 3, 2, 2 rows: each plans for the most
    assert demand.per_engine(3) == EngineDemand(50, ("rollout.max_model_len",), 3)
    assert demand.per_engine(1) == demand
    assert demand.per_engine(8).sequences == 1


def test_demand_is_the_pipeline_context_and_the_largest_call():
    cfg = run_cfg()
    assert largest_call(cfg) == 3 * 2
    assert demand_of(cfg) == EngineDemand(
        50, ("data.max_prompt_length", "rollout.response_length"), 6
    )
    assert demand_of(run_cfg(max_num_seqs=4)).sequences == 4  # the engine's own bound
    assert demand_of(run_cfg(max_model_len=128)).context == 128
    cfg.data.val_files = ["val.jsonl"]  # the whole validation set at once: max_num_seqs
    assert largest_call(cfg) == cfg.rollout.max_num_seqs
    cfg.data.val_batch_size = 5
    cfg.rollout = dataclasses.replace(cfg.rollout, val=dataclasses.replace(cfg.rollout.val, n=4))
    assert largest_call(cfg) == 5 * 4
    cfg.data.gen_batch_size = 12
    assert largest_call(cfg) == 12 * 2


def test_engine_gets_the_sized_cache_and_the_runs_context_with_a_note():
    kwargs, notes = cpu_args(run_cfg())
    assert kwargs["max_model_len"] == 50  # not the model's own context
    assert kwargs["kv_cache_memory_bytes"] == 512 * 32 * (6 * 2 + 1)
    text = " ".join(notes)
    assert "vLLM plans for 50 tokens" in text and "the KV cache is 0.2 MiB" in text
    assert "6 sequences in flight x 50 tokens" in text


def test_explicit_sizes_win_and_unknowns_keep_the_default():
    explicit = run_cfg(engine_kwargs={"vllm": {"kv_cache_memory_bytes": 12345}})
    assert cpu_args(explicit)[0]["kv_cache_memory_bytes"] == 12345
    env, _ = cpu_args(run_cfg(), environ={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert "kv_cache_memory_bytes" not in env  # vLLM reads the variable itself
    unknown, notes = cpu_args(run_cfg(), text={"model_type": "x"})
    assert unknown["kv_cache_memory_bytes"] == DEFAULT_CPU_KV_CACHE_BYTES
    assert any("no KV shape" in n for n in notes)
    multi = run_cfg(multi_turn=dataclasses.replace(RolloutConfig().multi_turn, enable=True))
    kwargs, notes = cpu_args(multi)
    assert "max_model_len" not in kwargs  # an unbounded episode: the model's own context
    assert kwargs["kv_cache_memory_bytes"] == DEFAULT_CPU_KV_CACHE_BYTES
    assert any("nothing bounds" in n for n in notes)
    big = run_cfg(max_model_len=8192, max_num_seqs=256)
    big.data.train_batch_size = 128
    assert (
        cpu_args(big, text={**TINY, "num_hidden_layers": 400})[0]["kv_cache_memory_bytes"]
        == DEFAULT_CPU_KV_CACHE_BYTES
    )


def test_on_gpu_the_demand_changes_nothing():
    cfg = run_cfg()
    kwargs, _ = engine_args(
        cfg.rollout,
        ModelConfig(path="/models/x"),
        on_cpu=False,
        seed=0,
        valid_args=FIELDS | {"gpu_memory_utilization", "block_size", "tensor_parallel_size"},
        environ={},
        demand=demand_of(cfg),
        model_text=TINY,
    )
    assert "max_model_len" not in kwargs and "kv_cache_memory_bytes" not in kwargs
