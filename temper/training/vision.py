"""Forward inputs of a vision-language model for one training micro-batch.

Each row of a micro-batch carries its prompt's ``multi_modal_inputs`` (verl's name:
``pixel_values``, ``image_grid_thw``), which micro-batching keeps with the row (they are
per-sample objects of the :class:`~temper.data.batch.Batch`, so ``select``/``slice`` carry
them). A forward over rows with images passes, besides the trimmed ``input_ids`` and
``attention_mask`` of :func:`~temper.training.micro_batching.model_inputs`:

* the rows' pixel inputs, concatenated in row order (the model scatters the vision
  tower's features into the image placeholder tokens, row by row);
* ``mm_token_type_ids``: 1 on image tokens, 2 on video tokens of the context — the
  prompt and, in a multi-turn episode, the response's tokens that were not generated
  (observation images, :mod:`temper.pipelines.agentic_vision`) — 0 elsewhere;
* no ``position_ids``: Qwen2-VL's positions are 3-D (M-RoPE: time, height, width for
  image tokens; the same index thrice for text), and the model computes them from the
  token types, the image grids and the attention mask (``get_rope_index``), exactly as
  ``generate`` does for the prompt. Left padding is skipped by the mask, and response
  tokens continue after the prompt's largest position, as in generation.

One case ``generate`` meets that a plain forward does not: a *sampled* response token that
is a vision placeholder (a small or early policy does write ``<|image_pad|>``). During
generation it is just a token; in a forward over prompt ‖ response the model would count
it as one more image slot and fail ("Image features and image tokens do not match"), as
verl and others do. Here such response tokens enter the model as a neutral id and the
embedding layer's output at their positions is put back to the placeholder token's own
embedding, so the forward computes what generation computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from temper.data.batch import Batch
from temper.data.vision import (
    MULTI_MODAL_INPUTS,
    has_pixels,
    image_token_counts,
    stack_inputs,
    token_type_ids,
    vision_token_ids,
)
from temper.training.micro_batching import ModelInputs


@dataclass(frozen=True)
class VisionTokens:
    """A VL micro-batch's vision side: ``inputs`` the rows' pixel inputs and grids
    (concatenated in row order), ``types`` the ``mm_token_type_ids`` (B, L) of the
    context's placeholders (module doc), ``in_response`` (B, L) the sampled tokens that
    are vision placeholders (plain tokens, no image slot)."""

    inputs: dict[str, torch.Tensor]
    types: torch.Tensor
    in_response: torch.Tensor


def vision_tokens(config: Any, mb: Batch, inp: ModelInputs) -> VisionTokens | None:
    """The :class:`VisionTokens` of ``mb`` for a model of HF ``config``; None when no
    row has images (engines share it: the torch engine's HF forward, the megatron
    engine's decoder input)."""
    rows = mb.objects.get(MULTI_MODAL_INPUTS)
    if rows is None or not has_pixels(rows):
        return None
    device = inp.input_ids.device
    image_id, video_id = vision_token_ids(config)
    prompt_len = inp.input_ids.shape[1] - inp.response_len
    inputs = {k: v.to(device) for k, v in stack_inputs(rows).items()}
    # sampled: the response's generated tokens; its other tokens (a multi-turn episode's
    # observations, with their images) are context like the prompt
    sampled = torch.zeros_like(inp.input_ids, dtype=torch.bool)
    sampled[:, prompt_len:] = True
    if "response_mask" in mb and image_id is not None:
        # only rows whose images are not all in the prompt have images in the response
        vision_cfg = getattr(config, "vision_config", None)
        merge = int(getattr(vision_cfg, "spatial_merge_size", 2))
        expected = torch.tensor([sum(image_token_counts(r, merge)) for r in rows], device=device)
        in_prompt = (inp.input_ids[:, :prompt_len] == image_id).sum(dim=1)
        later = (expected > in_prompt).unsqueeze(1)
        generated = mb["response_mask"][:, : inp.response_len].to(device) > 0
        sampled[:, prompt_len:] = generated | ~later
    types = token_type_ids(inp.input_ids, inp.input_ids.shape[1], image_id, video_id)
    types[sampled] = 0
    special = [i for i in (image_id, video_id) if i is not None]
    in_response = sampled & torch.isin(inp.input_ids, torch.tensor(special, device=device))
    return VisionTokens(inputs, types, in_response)


def vision_forward_inputs(
    model: nn.Module, mb: Batch, inp: ModelInputs
) -> tuple[dict[str, Any], contextlib.AbstractContextManager[None]]:
    """Keyword arguments that replace/extend the text forward's, and a context to run
    the forward in; ``({}, nullcontext())`` when no row of ``mb`` has images."""
    vt = vision_tokens(model.config, mb, inp)
    if vt is None:
        return {}, contextlib.nullcontext()
    kwargs: dict[str, Any] = dict(vt.inputs)
    kwargs["mm_token_type_ids"] = vt.types
    kwargs["position_ids"] = None  # the model's M-RoPE positions (module doc)
    if not bool(vt.in_response.any()):
        return kwargs, contextlib.nullcontext()
    special = [i for i in vision_token_ids(model.config) if i is not None]
    neutral = _neutral_id(model, special)
    ids = inp.input_ids.clone()
    ids[vt.in_response] = neutral
    kwargs["input_ids"] = ids
    return kwargs, _restore_embeddings(model, vt.in_response, inp.input_ids[vt.in_response])


def _neutral_id(model: nn.Module, special: list[int]) -> int:
    """A token id that is no vision placeholder (its embedding is overwritten anyway)."""
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    if isinstance(pad, int) and pad not in special:
        return pad
    return next(i for i in range(len(special) + 1) if i not in special)


@contextlib.contextmanager
def _restore_embeddings(
    model: nn.Module, positions: torch.Tensor, token_ids: torch.Tensor
) -> Iterator[None]:
    """While active, the input embedding layer outputs ``embed(token_ids)`` at
    ``positions`` (B, L) — the embeddings of the original response tokens."""
    get_embeddings = model.get_input_embeddings  # HF models and temper's ValueModel
    embed = get_embeddings() if callable(get_embeddings) else None
    if not isinstance(embed, nn.Module):
        raise TypeError(f"{type(model).__name__} has no input embedding module")

    def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        if output.shape[:2] != positions.shape:
            return output  # another lookup than the forward's input ids
        own = module.forward(token_ids)  # forward, not __call__: no hook recursion
        fixed = output.clone()
        fixed[positions] = own.to(fixed.dtype)
        return fixed

    handle = embed.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
