"""Reading vLLM's error messages: which temper keys they point at, and what to change.

vLLM reports a bad setting in English prose ("This model's maximum context length is
…", a dead "EngineCore", a KV cache without memory). The engine wraps each failure in a
``VLLMEngineError`` whose message adds the temper keys (with their values) that the
prose names or implies, and the fix. Options are found by their whole names
(``max_model_len`` or ``max-model-len``) and by the words of :data:`_HINTS`; a message
that points at none says so ("see vLLM's message").
"""

from __future__ import annotations

import re
from typing import Any

from temper.rollout.vllm_args import OPTION_KEYS

#: Words in vLLM error messages that point at an option without naming it.
_HINTS = {
    "context length": ("max_model_len",),  # "This model's maximum context length is …"
    "model length": ("max_model_len",),
    "enginecore": ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"),
    "engine core": ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"),
    "kv cache": ("max_model_len", "kv_cache_memory_bytes", "gpu_memory_utilization"),
    "memory": ("gpu_memory_utilization", "kv_cache_memory_bytes", "max_model_len"),
    "block": ("block_size",),
    "chunked": ("enable_chunked_prefill", "max_num_batched_tokens"),
    "sleep": ("enable_sleep_mode",),
    "parallel": ("tensor_parallel_size",),
}
#: Option names too common in vLLM's prose to be found by name ("This model's …").
_NOT_BY_NAME = frozenset({"model"})


def _option_names(message: str) -> list[str]:
    """vLLM argument names that an error message names (whole words) or implies."""
    low = message.lower()
    names = [
        n
        for n in OPTION_KEYS
        if n not in _NOT_BY_NAME
        and re.search(rf"\b(?:{n}|{n.replace('_', '-')})\b", low) is not None
    ]
    for word, implied in _HINTS.items():
        if word in low:
            names.extend(n for n in implied if n not in names)
    return names


def option_hint(message: str, kwargs: dict[str, Any]) -> str:
    """The temper keys (with their values) that a vLLM error message points at."""
    shown = [f"{OPTION_KEYS[n]}={kwargs[n]!r}" for n in _option_names(message) if n in kwargs]
    return "; ".join(shown) if shown else "see vLLM's message"


def generation_fix(message: str, longest_prompt: int, max_new_tokens: int) -> str:
    """What to change after a failed generation, from the options the message points at."""
    names = _option_names(message)
    # only a message about the context itself, not every "memory"/"kv cache" message
    if re.search(
        r"\bmax_model_len\b|\bmax-model-len\b|context length|model length", message.lower()
    ):
        need = longest_prompt + max_new_tokens
        return (
            f"raise rollout.max_model_len to at least prompt + response tokens ({need} "
            f"here: longest prompt {longest_prompt} + {max_new_tokens} new tokens), or "
            "shorten data.max_prompt_length / rollout.response_length"
        )
    if any(w in message.lower() for w in ("enginecore", "engine core", "dead")):
        return (
            "the engine died (out of memory is the usual cause; see vLLM's log above): "
            "lower rollout.max_num_seqs / rollout.max_num_batched_tokens, or set "
            "rollout.engine=hf; the run resumes from its last checkpoint"
        )
    if any(n in names for n in ("kv_cache_memory_bytes", "gpu_memory_utilization")):
        return (
            "give the KV cache more memory (rollout.gpu_memory_utilization on GPU; "
            "rollout.engine_kwargs.vllm.kv_cache_memory_bytes or VLLM_CPU_KVCACHE_SPACE on "
            "CPU) or lower rollout.max_num_seqs, or set rollout.engine=hf"
        )
    return "change the options named above, or set rollout.engine=hf to avoid vLLM"
