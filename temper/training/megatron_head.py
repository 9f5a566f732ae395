"""What the megatron engine reads off its last pipeline stage: the right-aligned layout a
micro-batch runs in (:func:`right_align`), and the response outputs of the stage's output
(:class:`ResponseHead`) — log-probs, entropy and Σπ² from the vocabulary-parallel logits
without gathering them (:mod:`megatron_vocab`), a critic's or reward model's values, and
the logits at a teacher's top-k ids for offline distillation. Under context parallelism
the outputs of every held position are gathered back to whole sequences first
(:mod:`megatron_cp_head`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from temper.algorithms.logprobs import fused_chunk_rows
from temper.data.batch import Batch
from temper.training.megatron_cp import gather_sequence_cp
from temper.training.megatron_cp_head import at_response, cp_outputs
from temper.training.megatron_vocab import (
    VocabShard,
    gather_vocab,
    log_probs_and_entropy,
    top_vocab,
    vocab_logsumexp,
    vocab_sum_pi_squared,
)
from temper.training.micro_batching import KD_INDICES, KD_LOGITS, ModelInputs, masked_outputs


def right_align(inp: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, index)``: each row shifted left past its leading padding (real tokens from
    position 0, padding at the end), trimmed to the longest row; ``index (b, R')`` holds
    the shifted position whose output predicts each response token."""
    mask = inp.attention_mask
    width = mask.shape[1]
    lead = (mask.cumsum(dim=1) == 0).sum(dim=1)
    length = int(mask.sum(dim=1).max())
    arange = torch.arange(length, device=mask.device)
    gather = (arange.unsqueeze(0) + lead.unsqueeze(1)).clamp(max=width - 1)
    ids = inp.input_ids.gather(1, gather)
    prompt_width = width - inp.response_len
    r = torch.arange(inp.response_len, device=mask.device)
    index = (prompt_width - 1 - lead).unsqueeze(1) + r.unsqueeze(0)
    return ids, index.clamp(max=length - 1)


@dataclasses.dataclass(frozen=True)
class ResponseHead:
    """The response outputs of one engine's last-stage output: ``vocab`` its
    vocabulary-parallel shard, ``value_head`` a critic or reward model (values, not
    log-probs), ``chunk_size`` the Σπ² chunk rows (None: as the fused log-prob pass sizes
    them), ``cp`` / ``cp_group`` the context-parallel degree and group."""

    vocab: VocabShard
    value_head: bool
    chunk_size: int | None
    cp: int
    cp_group: Any

    def outputs(
        self,
        mb: Batch,
        inp: ModelInputs,
        hidden: torch.Tensor,
        ids: torch.Tensor,
        *,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
        with_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Log-probs (+ entropy, + Σπ², + KD logits) or values of ``mb``'s response tokens
        from ``hidden`` (the stage's output over ``ids``, the right-aligned and padded
        sequence the model ran)."""
        _, index = right_align(inp)
        if self.cp > 1:
            out = self._cp_outputs(
                mb, inp, hidden, ids, index, temperature, with_entropy, with_sum_pi_squared
            )
        elif self.value_head:
            out = {"values": hidden.squeeze(-1).float().gather(1, index)}
        else:
            logits = hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
            log_p, entropy = log_probs_and_entropy(
                logits,
                inp.response_ids,
                self.vocab,
                temperature=temperature,
                with_entropy=with_entropy,
            )
            out = {"log_probs": log_p}
            if with_sum_pi_squared:  # vocabulary-parallel: reduced over the TP group
                out["sum_pi_squared"] = vocab_sum_pi_squared(
                    logits, self.vocab, temperature=temperature, chunk_size=self._chunk(logits)
                )
            if KD_INDICES in mb:  # offline distillation: the teacher's top-k token ids
                kd = mb[KD_INDICES][:, : inp.response_len].to(logits.device)
                out[KD_LOGITS] = gather_vocab(logits, kd, self.vocab)
            if entropy is not None:
                out["entropy"] = entropy
        if "entropy" in out and not entropy_grad:
            out["entropy"] = out["entropy"].detach()
        return masked_outputs(out, mb, inp)

    def _chunk(self, hidden: torch.Tensor) -> int:
        return self.chunk_size or fused_chunk_rows(hidden.shape[-1], hidden.device)

    def _cp_outputs(
        self,
        mb: Batch,
        inp: ModelInputs,
        hidden: torch.Tensor,
        ids: torch.Tensor,
        index: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        with_sum_pi_squared: bool,
    ) -> dict[str, torch.Tensor]:
        """:meth:`outputs` under context parallelism (:mod:`megatron_cp_head`): ``hidden``
        holds this rank's share of the positions; the outputs are whole on every CP rank."""
        if self.value_head:
            return {"values": at_response(hidden.squeeze(-1).float(), index, self.cp_group)}
        kd = mb[KD_INDICES][:, : inp.response_len].to(hidden.device) if KD_INDICES in mb else None
        out = cp_outputs(
            hidden,
            ids,
            index,
            vocab=self.vocab,
            group=self.cp_group,
            temperature=temperature,
            with_entropy=with_entropy,
            sum_pi_squared_chunk=self._chunk(hidden) if with_sum_pi_squared else None,
            kd_ids=kd,
        )
        if kd is not None:
            out[KD_LOGITS] = out.pop("kd_logits")
        return out

    def top_logits(
        self,
        mb: Batch,
        inp: ModelInputs,
        hidden: torch.Tensor,
        k: int,
        scale: float,
        vocab: int | None,
        log_probs: bool = False,
    ) -> dict[str, torch.Tensor]:
        """A teacher's top-``k`` logits / ``scale`` (log-probs when ``log_probs``) and their
        ids at ``mb``'s response tokens, over the vocabulary-parallel logits ``hidden``
        (``vocab``: the real vocabulary size, past which the padded rows are ignored)."""
        _, index = right_align(inp)
        if self.cp == 1:  # else the top-k of every held position, gathered over CP below
            hidden = hidden.gather(1, index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        z = hidden.float() / scale
        values, top = top_vocab(z, k, self.vocab, vocab)
        if log_probs:  # normalized over the whole (vocabulary-parallel) vocabulary
            values = values - vocab_logsumexp(z, self.vocab, vocab).unsqueeze(-1)
        if self.cp > 1:
            at = index.unsqueeze(-1).expand(-1, -1, k)
            values = gather_sequence_cp(values, self.cp_group).gather(1, at)
            top = gather_sequence_cp(top, self.cp_group).gather(1, at)
        return masked_outputs({"values": values, "ids": top}, mb, inp)
