"""Which ``transformers`` auto class loads a model as a generator of text.

Text models load with ``AutoModelForCausalLM``. Vision-language models (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL, …) are not in that mapping: they load with
``AutoModelForImageTextToText`` (``*ForConditionalGeneration``: vision tower + language
model + LM head), which takes ``pixel_values`` beside ``input_ids`` in ``forward`` and
``generate``.
"""

from __future__ import annotations

from typing import Any


def causal_lm_class(config: Any) -> Any:
    """The auto class for ``config``: causal LM if it maps there, else image-text-to-text."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    if type(config) in AutoModelForCausalLM._model_mapping:
        return AutoModelForCausalLM
    if type(config) in AutoModelForImageTextToText._model_mapping:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM  # remote code and unknown types: let it say what is wrong


def text_hidden_size(config: Any) -> int:
    """Hidden size of the language model (a VL config keeps it in its text config)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return int(text.hidden_size)
