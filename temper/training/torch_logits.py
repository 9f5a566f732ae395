"""Logits of the one-process engine: the forward that keeps only response positions,
the per-token outputs computed from them (:func:`token_outputs`), packing a micro-batch
(``model.use_remove_padding``: :mod:`temper.training.packing`), and a teacher's side of
distillation and of the exact KL (``response_logits``, ``top_logits``)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from temper.algorithms.kd import teacher_top_logits
from temper.algorithms.logprobs import (
    fused_chunk_rows,
    logprobs_from_logits,
    sum_pi_squared_from_logits,
)
from temper.data.batch import Batch
from temper.training.attention_kind import attention_limit
from temper.training.micro_batching import (
    MicroBatching,
    ModelInputs,
    masked_outputs,
    model_inputs,
)
from temper.training.packing import (
    PREFIX_TREE_KERNELS,
    SEGMENT_KERNELS,
    VARLEN_KERNELS,
    LayoutCost,
    PackedInputs,
    Scored,
    choose_layout,
    model_cost,
    pack,
    plan_packing,
    scored_positions,
)
from temper.training.torch_hooks import OneProcessHooks
from temper.training.vision import vision_forward_inputs


def token_outputs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    fused: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None,
    *,
    temperature: float,
    entropy_grad: bool,
    with_sum_pi_squared: bool,
    chunk_size: int,
) -> dict[str, torch.Tensor]:
    """Outputs of the ``K`` scored positions from their logits ``(K, V)`` and labels
    ``(K,)``: ``log_probs`` = log softmax(z / T)[label]; with ``fused`` (the engine's
    ``logprobs_and_entropy``) also ``entropy`` = -Σ_v π_v log π_v from the same one pass,
    detached unless ``entropy_grad`` (a metric-only entropy skips its gradient pass);
    ``with_sum_pi_squared``: ``sum_pi_squared`` = Σ_v π_v² (the optimal-token-baseline
    estimators' input). ``chunk_size``: rows per chunk (0: sized to the vocabulary)."""
    out: dict[str, torch.Tensor] = {}
    if fused is not None:  # one pass for both
        out["log_probs"], entropy = fused(
            logits,
            labels,
            temperature=temperature,
            chunk_size=chunk_size or fused_chunk_rows(logits.shape[-1], logits.device),
        )
        out["entropy"] = entropy if entropy_grad else entropy.detach()
    else:
        out["log_probs"] = logprobs_from_logits(logits, labels, temperature=temperature)
    if with_sum_pi_squared:
        out["sum_pi_squared"] = sum_pi_squared_from_logits(
            logits,
            temperature=temperature,
            chunk_size=chunk_size or fused_chunk_rows(logits.shape[-1], logits.device),
        )
    return out


def output_head(model: nn.Module) -> nn.Module | None:
    """The LM head of the transformers model in ``model`` (a peft or engine wrapper, or
    the model itself), or None (no transformers model, or no output embeddings)."""
    from transformers import PreTrainedModel

    top = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    head = top.get_output_embeddings() if top is not None else None
    return head if isinstance(head, nn.Module) else None


@contextlib.contextmanager
def head_on_positions(head: nn.Module, scored: Scored, keep: int) -> Iterator[None]:
    """While open, ``head`` maps only the hidden states of the ``scored`` positions: its
    input ``(b, W, d)`` (``W ≥ keep``: the last ``keep`` are the kept positions) becomes
    ``(1, K, d)``, ``h[:, W-keep : W-keep+r][scored]`` for ``scored`` ``(b, r)`` — so the
    model's logits are ``(1, K, V)``. A padded micro-batch then computes, and keeps for
    backward, no logits of padding (what packing does by construction); what the model
    does after its head (soft-capping, scaling) is elementwise and sees the same rows."""

    def gather(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden, *rest = args
        return (scored.take(hidden[:, hidden.shape[1] - keep :])[None], *rest)

    handle = head.register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()


class PackedLogits(OneProcessHooks):
    """Logits of response positions, packed or padded (the engine's ``__init__`` sets the
    attributes below)."""

    infer_micro: MicroBatching
    #: micro-batches run per layout (packing: ``model.use_remove_padding``)
    layouts: Counter[str]
    _cost: LayoutCost | None  # packing's cost model (_layout_cost)
    _plain: bool | None  # the model's attention is what packed masks compute (_plain_attention)
    _logits_to_keep: bool  # the model's forward takes ``logits_to_keep``

    def _logits(
        self,
        inputs: dict[str, Any],
        keep: int | torch.Tensor,
        extra: dict[str, Any] | None = None,
        *,
        scored: Scored | None = None,
    ) -> torch.Tensor:
        """Logits of the last ``keep`` positions ``(b, keep, V)``, or of the positions
        ``keep`` (a tensor: a packed row's response positions) ``(K, V)``; with
        ``scored`` (a padded row's scored positions ``(b, keep - 1)`` among the kept
        ones) only those, ``(K, V)``, the LM head run on their hidden states alone."""
        kwargs: dict[str, Any] = {**inputs, "use_cache": False}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = keep
        head = output_head(self.model) if scored is not None else None
        if head is not None and isinstance(keep, int):
            assert scored is not None
            with head_on_positions(head, scored, keep):
                # squeeze, not [0]: a select's backward zero-fills and copies (b, K, V)
                return self._module()(**{**kwargs, **(extra or {})}).logits.squeeze(0)
        logits = self._module()(**{**kwargs, **(extra or {})}).logits
        if isinstance(keep, int):
            logits = logits[:, -keep:]
            return logits if scored is None else scored.take(logits)
        row = logits.squeeze(0)  # the packed row (a view: its backward copies nothing)
        return row if self._logits_to_keep else row[keep]

    # ------------------------------------------------------------------ packing

    def _attn_impl(self) -> str:
        """The attention kernel the loaded model runs (``sdpa``, ``eager``, ``flash_…``)."""
        return str(getattr(self.model.config, "_attn_implementation", None) or "sdpa")

    def _plain_attention(self) -> bool:
        """Whether the model attends as a packed row's masks do (plain causal softmax)."""
        if self._plain is None:
            config: Any = self.model.config  # a transformers PretrainedConfig
            windows = self._attn_impl() in SEGMENT_KERNELS  # it applies a layer's window
            self._plain = attention_limit(config.to_dict(), windows=windows) is None
        return self._plain

    def _layout_cost(self) -> LayoutCost:
        """The packing cost model of this model (from its config: deterministic, so every
        rank and a resumed run choose the same layouts)."""
        if self._cost is None:
            # a segment kernel, like a varlen one, visits only the pairs of each sequence
            segments = self._attn_impl() in VARLEN_KERNELS + SEGMENT_KERNELS
            self._cost = model_cost(self.model.config, varlen=segments)
        return self._cost

    def _pack(self, inp: ModelInputs, extra: dict[str, Any]) -> PackedInputs | None:
        """This micro-batch packed (``model.use_remove_padding`` and cheaper), or None."""
        if not self.spec.model.use_remove_padding:
            return None
        if extra or getattr(self.model.config, "vision_config", None) is not None:
            # vision-language models stay padded: the model computes its 3-D M-RoPE
            # positions from the padded 2-D mask and image grids (training.vision)
            self.layouts["padded"] += 1
            return None
        if self._attn_impl() not in VARLEN_KERNELS and not self._plain_attention():
            # a packed row's masks are plain causal attention (training.attention_kind);
            # transformers' own attention runs the padded rows (a varlen kernel, its own)
            self.layouts["padded"] += 1
            return None
        cost = self._layout_cost()
        lengths = inp.host.attention_mask.sum(dim=1).tolist()
        # a prompt shared by a group is packed once (prefix-tree mask: masked kernels only)
        plan = plan_packing(inp, share_prompts=self._attn_impl() in PREFIX_TREE_KERNELS)
        layout = choose_layout(lengths, inp.input_ids.shape[1], cost, plan.tokens)
        self.layouts[layout] += 1
        if layout == "padded":
            return None
        return pack(inp, self._attn_impl(), self.compute_dtype, plan)

    # ------------------------------------------------------------------ teacher logits

    @torch.no_grad()
    def response_logits(self, batch: Batch) -> torch.Tensor:
        """No-grad logits ``(b, r, V)`` of the response tokens of a micro-batch (the
        reference's side of the exact KL; the model's train/eval mode is left as it is —
        under LoRA it is the actor's own module). Zero where no response token is scored
        (padding): neither layout runs the LM head there."""
        inp = model_inputs(batch, self.device)
        r = inp.response_len
        extra, vision_context = vision_forward_inputs(self.model, batch, inp)
        with self._on_device(), self._autocast(), vision_context:
            packed = self._pack(inp, extra)
            model_in: dict[str, Any]
            if packed is None:
                model_in = {
                    "input_ids": inp.input_ids,
                    "attention_mask": inp.attention_mask,
                    "position_ids": inp.position_ids,
                }
                scored = scored_positions(inp)
                return scored.put(self._logits(model_in, r + 1, extra, scored=scored))
            return packed.valid.put(self._logits(packed.model_inputs(), packed.keep))

    @torch.no_grad()
    def top_logits(
        self,
        batch: Batch,
        k: int,
        scale: float,
        micro_batching: MicroBatching | None = None,
        *,
        vocab: int | None = None,
        log_probs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A teacher's side of offline distillation (``log_probs``: of on-policy
        distillation's top-k loss, the values normalized over the ids ``< vocab``): at every response token the ``k``
        largest logits divided by ``scale`` among ids ``< vocab`` (None: every column; the
        output layer may have padding rows past the tokenizer's tokens, which a student
        of another size lacks) and their token ids (``k = 0``: every token),
        ``(B, R, k)`` each in batch order, zero on masked tokens
        (:func:`temper.algorithms.kd.teacher_top_logits`)."""
        self.model.eval()
        b, r = batch["response_ids"].shape
        home = batch["response_ids"].device
        values = ids = torch.empty(0)
        micro, groups = self._split(batch, micro_batching or self.infer_micro)
        outs = self._top_logit_micro_batches(micro, k, scale, vocab, log_probs)
        for out, rows in zip(outs, groups, strict=True):
            if not rows:  # a padding micro-batch (collectives only)
                continue
            if values.numel() == 0:
                width = out["values"].shape[-1]
                values = torch.zeros(b, r, width, dtype=torch.float32, device=home)
                ids = torch.zeros(b, r, width, dtype=torch.long, device=home)
            index = torch.as_tensor(rows, device=home)
            values[index] = out["values"].to(home)
            ids[index] = out["ids"].to(home).long()
        return values, ids

    def _top_logit_micro_batches(
        self, micro: list[Batch], k: int, scale: float, vocab: int | None, log_probs: bool
    ) -> Iterator[dict[str, torch.Tensor]]:
        """:meth:`_micro_top_logits` of each micro-batch in turn (an engine whose forward
        spans pipeline stages runs them through its schedule together)."""
        for mb in micro:
            yield self._micro_top_logits(mb, k, scale, vocab, log_probs)

    def _micro_top_logits(
        self, mb: Batch, k: int, scale: float, vocab: int | None, log_probs: bool = False
    ) -> dict[str, torch.Tensor]:
        """``values`` and ``ids`` ``(b, R, k)`` of one micro-batch (:meth:`top_logits`)."""
        inp = model_inputs(mb, self.device)
        logits = self.response_logits(mb)[..., :vocab]
        if log_probs:  # log-softmax is monotone: the same top-k ids, normalized values
            logits, scale = torch.log_softmax(logits.float() / scale, dim=-1), 1.0
        values, ids = teacher_top_logits(logits, k, scale)
        return masked_outputs({"values": values, "ids": ids}, mb, inp)
