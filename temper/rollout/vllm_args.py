"""``rollout.*`` → the arguments of ``vllm.LLM(**kwargs)`` (vLLM's ``EngineArgs``).

Every engine key of ``rollout.*`` is passed on (on vLLM's CPU build a block size rounded
up to a multiple of 32, with a note), left out with a note saying why (on vLLM's CPU
build: GPU-memory and sleep settings), or rejected with a
``ConfigError`` naming the key. ``rollout.engine_kwargs`` (``{vllm: {...}}`` or the verl
dialect's flat dict) is passed through last, after its names are checked against
``EngineArgs``' fields and the ones that would break RL (another ``logprobs_mode``, a
foreign worker extension) are refused. :data:`OPTION_KEYS` maps the arguments back to
the temper keys that set them, for messages.

Pure config mapping: runs without vLLM installed (the caller passes vLLM's field names).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from temper.config.errors import ConfigError, did_you_mean
from temper.config.schema import DTYPES, ModelConfig, RolloutConfig
from temper.rollout.vllm_kv import (
    DEFAULT_CPU_KV_CACHE_BYTES,
    DTYPE_BYTES,
    EngineDemand,
    cpu_kv_cache_bytes,
    kv_bytes_per_token,
)

__all__ = [
    "DEFAULT_CPU_KV_CACHE_BYTES",
    "OPTION_KEYS",
    "ROUTED_EXPERTS_ON_CPU",
    "cpu_block_size",
    "engine_args",
]
_EXTENSION = "temper.rollout.vllm_worker.TemperWorkerExtension"

#: ``(key, reason, fix)`` of router replay R3 with vLLM's CPU build (``temper check``).
ROUTED_EXPERTS_ON_CPU = (
    "actor.router_replay",
    "router replay R3 replays the experts the rollout engine chose for each token; vLLM "
    "returns them only with enable_return_routed_experts, which needs its V2 model runner, "
    "which needs Triton: not in the CPU build",
    "set rollout.engine=hf (it records the routing as it generates), or "
    "actor.router_replay=R2, or run vLLM on a GPU",
)

#: vLLM engine argument -> the temper key that sets it (for error messages).
OPTION_KEYS = {
    "gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "tensor_parallel_size": "rollout.tensor_parallel_size",
    "enforce_eager": "rollout.enforce_eager",
    "enable_sleep_mode": "rollout.free_cache_engine",
    "load_format": "rollout.load_format",
    "max_model_len": "rollout.max_model_len",
    "max_num_seqs": "rollout.max_num_seqs",
    "max_num_batched_tokens": "rollout.max_num_batched_tokens",
    "enable_chunked_prefill": "rollout.enable_chunked_prefill",
    "block_size": "rollout.block_size",
    "disable_log_stats": "rollout.disable_log_stats",
    "enable_prefix_caching": "rollout.enable_prefix_caching",
    "dtype": "rollout.dtype",
    "kv_cache_memory_bytes": "rollout.engine_kwargs.vllm.kv_cache_memory_bytes",
    "model": "model.path",
    "tokenizer": "model.tokenizer_path",
    "trust_remote_code": "model.trust_remote_code",
    "enable_return_routed_experts": "actor.router_replay",
}

#: Engine arguments of older vLLM releases that verl/ROLL configs still pass, and what
#: they became (seed document 003 and ROLL's VL examples set disable_mm_preprocessor_cache).
RENAMED_ARGS = {
    "disable_mm_preprocessor_cache": lambda v: {"mm_processor_cache_gb": 0} if v else {},
}


def cpu_block_size(block_size: int) -> int:
    """The KV-cache block of vLLM's CPU build: ``block_size`` rounded up to a multiple of
    32 (its attention's unit). Not vLLM's own CPU default (128): prefix caching shares
    whole blocks only, so a small block lets a GRPO group's ``n`` samples (and prompts
    with a common system message) share all but the last partial block of their prompt —
    a prompt shorter than 128 tokens shares nothing with 128."""
    return -(-block_size // 32) * 32


def spawns_ranks(tensor_parallel_size: int, spmd: bool, demand: EngineDemand | None) -> bool:
    """Whether vLLM starts the engine's tensor-parallel ranks as processes of its own
    (its ``mp`` executor): only for an engine alone in its process, which nothing syncs
    weights into — the trainer's in-process weight sync reaches the ranks of this
    process only."""
    return tensor_parallel_size > 1 and not spmd and demand is not None and demand.standalone


def cpu_thread_binding(cpus: Iterable[int], ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``ranks`` CPU workers over ``cpus`` (this
    process's CPUs): contiguous, near-equal groups joined by ``|`` (``"0,1|2,3"``; with
    fewer CPUs than ranks, ranks share them round-robin). vLLM's own ``auto`` binding puts
    each rank on a NUMA node of its own, and refuses when there are fewer nodes than ranks
    (one node on most single-socket machines)."""
    ordered = sorted(cpus)
    if len(ordered) < ranks:
        return "|".join(str(ordered[r % len(ordered)]) for r in range(ranks))
    size, extra = divmod(len(ordered), ranks)
    groups, start = [], 0
    for r in range(ranks):
        stop = start + size + (r < extra)
        groups.append(",".join(str(c) for c in ordered[start:stop]))
        start = stop
    return "|".join(groups)


def engine_args(
    rollout_cfg: RolloutConfig,
    model_cfg: ModelConfig,
    *,
    on_cpu: bool,
    seed: int,
    valid_args: Iterable[str] | None = None,
    environ: dict[str, str] | None = None,
    spmd: bool = False,
    demand: EngineDemand | None = None,
    model_text: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """vLLM ``LLM(**kwargs)`` arguments for the config, and notes on what was not used.

    Every engine key of ``rollout.*`` is either passed on, or left out with a note
    saying why (on CPU: GPU-memory and sleep settings), or rejected with a
    ``ConfigError``. ``engine_kwargs.vllm.*`` is passed through last (it wins), after
    its names are checked against ``valid_args`` (vLLM's ``EngineArgs`` fields).
    ``spmd``: this process is one rank of a tensor-parallel engine whose ranks the caller
    started (vLLM's ``external_launcher``: one rank per process, CPU or GPU); a
    standalone engine (``demand.standalone``) starts its ranks itself (vLLM's ``mp``
    executor, :func:`spawns_ranks`).
    On CPU, ``demand`` (the run's generation, :func:`temper.pipelines.demand.demand_of`)
    and ``model_text`` (the model's text config) size the KV cache and, with no
    ``max_model_len``, give vLLM the run's context instead of the model's own (which it
    would plan every sequence for).
    """
    from temper.utils.model_path import resolve_model_path

    env = os.environ if environ is None else environ
    notes: list[str] = []
    dtype = model_cfg.dtype if rollout_cfg.dtype == "auto" else rollout_cfg.dtype
    if dtype == "auto":
        dtype = "fp32" if on_cpu else "bf16"
    path = resolve_model_path(model_cfg.path)
    kwargs: dict[str, Any] = {
        "model": path,
        "tokenizer": resolve_model_path(model_cfg.tokenizer_path)
        if model_cfg.tokenizer_path
        else path,
        "trust_remote_code": model_cfg.trust_remote_code,
        "dtype": DTYPES.get(dtype, dtype),
        "seed": int(seed),
        "enforce_eager": rollout_cfg.enforce_eager,
        "load_format": rollout_cfg.load_format,
        "max_num_seqs": rollout_cfg.max_num_seqs,
        "max_num_batched_tokens": rollout_cfg.max_num_batched_tokens,
        "enable_chunked_prefill": rollout_cfg.enable_chunked_prefill,
        "enable_prefix_caching": rollout_cfg.enable_prefix_caching,
        "disable_log_stats": rollout_cfg.disable_log_stats,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": _EXTENSION,
    }
    if rollout_cfg.max_model_len is not None:
        kwargs["max_model_len"] = rollout_cfg.max_model_len
    elif on_cpu and demand is not None and demand.context is not None:
        kwargs["max_model_len"] = demand.context
        notes.append(
            f"rollout.max_model_len is not set: vLLM plans for {demand.context} tokens "
            f"({' + '.join(demand.context_keys)}), not the model's whole context"
        )
    if demand is not None and demand.routed_experts:
        if on_cpu:
            raise ConfigError(*ROUTED_EXPERTS_ON_CPU)
        kwargs["enable_return_routed_experts"] = True
    spawned = spawns_ranks(rollout_cfg.tensor_parallel_size, spmd, demand)
    if spmd:
        kwargs["tensor_parallel_size"] = rollout_cfg.tensor_parallel_size
        kwargs["distributed_executor_backend"] = "external_launcher"
    elif spawned:
        kwargs["tensor_parallel_size"] = rollout_cfg.tensor_parallel_size
        kwargs["distributed_executor_backend"] = "mp"
    if on_cpu:
        if rollout_cfg.tensor_parallel_size > 1 and not (spmd or spawned):
            raise ConfigError(
                "rollout.tensor_parallel_size",
                f"{rollout_cfg.tensor_parallel_size} > 1 is not supported with vLLM's CPU "
                "build here: temper runs the CPU engine in the training process, and "
                "tensor parallelism needs one process per rank",
                "set rollout.tensor_parallel_size=1 on CPU",
            )
        notes.append(
            "rollout.gpu_memory_utilization is not used on CPU (vLLM would reserve that "
            "fraction of host RAM, which the trainer shares): the KV cache is "
            "engine_kwargs.vllm.kv_cache_memory_bytes, VLLM_CPU_KVCACHE_SPACE (GiB) or "
            f"what the run's generation needs, at most {DEFAULT_CPU_KV_CACHE_BYTES >> 30} GiB"
        )
        kwargs["block_size"] = cpu_block_size(rollout_cfg.block_size)
        explicit = any(
            n == "kv_cache_memory_bytes"
            for _, n, _ in _vllm_kwargs(rollout_cfg.engine_kwargs or {})
        )
        if not env.get("VLLM_CPU_KVCACHE_SPACE") and not explicit:
            kv, why = _cpu_kv_cache(kwargs, demand, model_text)
            kwargs["kv_cache_memory_bytes"] = kv
            notes.append(f"the KV cache is {kv / 2**20:.1f} MiB: {why}")
        if kwargs["block_size"] != rollout_cfg.block_size:
            notes.append(
                f"rollout.block_size={rollout_cfg.block_size} is rounded up to "
                f"{kwargs['block_size']} on CPU: vLLM's CPU attention wants multiples of 32"
            )
        if rollout_cfg.free_cache_engine:
            notes.append(
                "rollout.free_cache_engine is ignored on CPU: vLLM's CPU build has no sleep "
                "mode (enable_sleep_mode raises), and its memory is host memory"
            )
    else:
        kwargs.setdefault("tensor_parallel_size", rollout_cfg.tensor_parallel_size)
        kwargs["gpu_memory_utilization"] = rollout_cfg.gpu_memory_utilization
        kwargs["block_size"] = rollout_cfg.block_size
        kwargs["enable_sleep_mode"] = rollout_cfg.free_cache_engine
    valid = set(valid_args) if valid_args is not None else None
    for key, name, value in _vllm_kwargs(rollout_cfg.engine_kwargs or {}):
        if name in RENAMED_ARGS and (valid is None or name not in valid):
            renamed = RENAMED_ARGS[name](value)
            kwargs.update(renamed)
            notes.append(f"{key}={value!r} is {renamed or 'the default'} in this vLLM")
            continue
        if valid is not None and name not in valid:
            raise ConfigError(
                key,
                f"'{name}' is not a vLLM engine argument{did_you_mean(name, valid)}",
                "use a field of vllm.EngineArgs, or remove it",
            )
        if name == "logprobs_mode" and value != "processed_logprobs":
            raise ConfigError(
                key,
                f"'{value}' would report log-probs of another distribution than the one "
                "tokens are drawn from, which breaks the PPO ratio",
                "remove it (temper sets processed_logprobs)",
            )
        if name == "worker_extension_cls":
            raise ConfigError(key, "temper's weight sync needs its own extension", "remove it")
        if on_cpu and name == "enable_sleep_mode" and value:
            raise ConfigError(key, "vLLM's CPU build has no sleep mode", "remove it on CPU")
        kwargs[name] = value
    return kwargs, notes


def _cpu_kv_cache(
    kwargs: dict[str, Any], demand: EngineDemand | None, text: Mapping[str, Any] | None
) -> tuple[int, str]:
    """The CPU KV cache's bytes for ``demand`` (``kwargs``' dtype and block size), and why."""
    cap = f"{DEFAULT_CPU_KV_CACHE_BYTES >> 30} GiB"
    if demand is None or text is None:
        return DEFAULT_CPU_KV_CACHE_BYTES, f"{cap} (the run's generation is not known here)"
    if demand.context is None:
        return DEFAULT_CPU_KV_CACHE_BYTES, f"{cap} (nothing bounds a sequence's length)"
    per_token = kv_bytes_per_token(text, DTYPE_BYTES.get(str(kwargs["dtype"]), 4))
    if per_token is None:
        return DEFAULT_CPU_KV_CACHE_BYTES, f"{cap} (the model's config gives no KV shape)"
    block = int(kwargs["block_size"])
    kv = cpu_kv_cache_bytes(per_token, block, demand)
    why = (
        f"{demand.sequences} sequences in flight x {demand.context} tokens "
        f"({' + '.join(demand.context_keys)}) in blocks of {block}, {per_token} bytes a token"
    )
    return kv, why if kv < DEFAULT_CPU_KV_CACHE_BYTES else f"{cap}, the cap ({why} is more)"


def _vllm_kwargs(engine_kwargs: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``(config key, name, value)`` of the vLLM arguments in ``rollout.engine_kwargs``.

    Both shapes occur: ``{vllm: {...}}`` (native, ROLL) and a flat dict of the chosen
    engine's arguments (the verl dialect writes the chosen engine's dict). Other engines'
    sections (``sglang``, ``trtllm``) are not vLLM's and are skipped.
    """
    out: list[tuple[str, str, Any]] = []
    for name, value in engine_kwargs.items():
        if name == "vllm" and isinstance(value, dict):
            out.extend((f"rollout.engine_kwargs.vllm.{k}", k, v) for k, v in value.items())
        elif name not in ("sglang", "trtllm"):
            out.append((f"rollout.engine_kwargs.{name}", name, value))
    return out
