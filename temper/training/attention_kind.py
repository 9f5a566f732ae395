"""Whether a model's sequence mixing is plain causal softmax attention.

temper's own attention paths compute exactly that: the block-causal and prefix-tree masks
of a packed row (:mod:`temper.training.packing`), the segment kernel
(:mod:`temper.training.segment_attention`) and Ulysses' all-to-all kernel
(:mod:`temper.training.ulysses`) each attend every earlier token of a sequence with an
unmodified softmax. A model whose layers do something else would be computed wrongly by
them, silently: a sliding window (Mistral, Gemma 2/3, gpt-oss, OLMo 3), attention sinks
(gpt-oss's per-head ``sinks`` in the softmax), logit soft-capping (Gemma 2), or a
layer that is not attention at all (linear attention, state-space or convolution layers:
Qwen3-Next, Qwen3.5, LFM2, Mamba hybrids). Such a model runs its forwards in the padded
layout, where transformers builds its masks and runs its own attention functions, and
refuses Ulysses — except a sliding window alone, which the segment kernel and Ulysses'
kernel apply (each attention layer hands them its window).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: ``layer_types`` values that are softmax attention over the causal past (a window is
#: checked separately)
ATTENTION_LAYERS = ("full_attention", "sliding_attention")
#: families whose attention adds learned sinks to the softmax's denominator
SINK_MODELS = ("gpt_oss",)
#: state-space / recurrent families that declare no ``layer_types``
RECURRENT_MODELS = (
    "mamba",
    "mamba2",
    "falcon_mamba",
    "jamba",
    "zamba",
    "zamba2",
    "bamba",
    "falcon_h1",
    "granitemoehybrid",
    "nemotron_h",
    "rwkv",
    "recurrent_gemma",
    "xlstm",
)


def attention_limit(config: Mapping[str, Any], *, windows: bool = False) -> str | None:
    """Why the model of ``config`` (``config.json``'s keys; a vision-language model's text
    config is read) is not plain causal softmax attention over whole sequences, or None
    when it is; ``windows``: a sliding window is fine (the segment kernel applies the
    window its attention layers pass)."""
    text = config.get("text_config") or config
    model_type = str(text.get("model_type") or config.get("model_type") or "")
    layer_types = list(text.get("layer_types") or [])
    other = sorted({t for t in layer_types if t not in ATTENTION_LAYERS})
    if other or model_type in RECURRENT_MODELS:
        kinds = ", ".join(other) if other else "state-space / recurrent"
        return f"{model_type} has sequence-mixing layers that are not attention ({kinds})"
    attn_config = text.get("attn_config") or {}
    if model_type == "bloom" or text.get("alibi") or attn_config.get("alibi"):
        return f"{model_type} adds ALiBi position biases to its attention"
    if model_type in SINK_MODELS:
        return f"{model_type}'s attention adds learned sinks to the softmax"
    if text.get("attn_logit_softcapping") is not None:
        return f"{model_type} soft-caps its attention logits"
    window = text.get("sliding_window")
    sliding = (
        "sliding_attention" in layer_types
        if layer_types
        else window is not None and text.get("use_sliding_window", True) is not False
    )
    if sliding and window is not None and not windows:
        return f"{model_type} attends within a sliding window of {window} tokens"
    return None


def declares(config: Mapping[str, Any], flag: str, autos: tuple[Any, ...] = ()) -> bool:
    """Whether transformers' model class for ``config``'s ``model_type`` (built by the
    auto classes ``autos``; by default its causal LM, else its image-text-to-text model)
    sets class flag ``flag`` — ``_supports_sdpa``, or ``_supports_attention_backend``
    (its layers call a registered attention function with their forward keywords). True
    for a type this transformers does not know (remote code decides when it loads)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = str(config.get("model_type") or "")
    if model_type not in CONFIG_MAPPING:
        return True
    config_class = CONFIG_MAPPING[model_type]
    for auto in autos or (AutoModelForCausalLM, AutoModelForImageTextToText):
        if config_class in auto._model_mapping:
            return bool(getattr(auto._model_mapping[config_class], flag, True))
    return True
