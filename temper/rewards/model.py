"""Reward-model scoring: an ``AutoModelForSequenceClassification`` (``num_labels=1``).

Inputs per sample:
- ``reward.model.input_tokenizer`` unset: the policy tokens themselves (real prompt
  tokens ‖ real response tokens) — the RM must share the policy's vocabulary;
- set (the RM's tokenizer/template differs): the prompt (``batch.objects["raw_prompt"]``
  chat messages when present, else the decoded prompt as one user message) and the
  decoded response (``response_text`` when present) are re-rendered with the RM
  tokenizer's chat template (plain concatenation when it has none) and re-tokenized.

Sequences longer than ``max_length`` keep their last ``max_length`` tokens (the end of
the response is what is scored). Micro-batches hold ``micro_batch_size_per_device``
sequences (default 8), or with ``use_dynamic_bsz`` as many consecutive sequences as fit
``forward_max_token_len_per_device`` padded tokens (verl's dynamic batch for the reward
model: short answers share a forward, a long one goes alone). They are
**left**-padded with explicit ``position_ids``, and the model is fed
``inputs_embeds`` so its pooling takes the last position — the last real token —
regardless of the pad id (a response that ends in ``eos == pad`` is still pooled
right). The score is that token's logit; token-level scores put it on the last
``response_mask`` token (``placement``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from temper.config.errors import ConfigError
from temper.config.schema import RewardModelConfig
from temper.data.batch import Batch
from temper.rewards.placement import place_at_last_token

DEFAULT_MICRO_BATCH = 8


class RewardModel:
    """A sequence-classification reward model that scores ``Batch`` responses."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: RewardModelConfig,
        device: str | torch.device = "cpu",
    ) -> None:
        if getattr(model.config, "num_labels", 1) != 1:
            raise ConfigError(
                "reward.model.path",
                f"the reward model has num_labels={model.config.num_labels}",
                "use a sequence-classification model with one output (num_labels=1)",
            )
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.config = config
        self.device = torch.device(device)
        self.retemplate = config.input_tokenizer is not None

    @classmethod
    def from_config(
        cls, config: RewardModelConfig, device: str | torch.device = "cpu", dtype: Any = "auto"
    ) -> RewardModel:
        """Load ``reward.model.path`` (only ``strategy: torch`` runs in this class)."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if not config.path:
            raise ConfigError(
                "reward.model.path", "is not set but reward.model.enable is true", "set it"
            )
        if config.strategy != "torch":
            raise ConfigError(
                "reward.model.strategy",
                f"'{config.strategy}' reward models are not served by temper.rewards.model",
                "use strategy=torch",
            )
        is_local = Path(config.path).expanduser().exists()
        if not is_local and "/" not in config.path:
            raise ConfigError("reward.model.path", f"'{config.path}' is not a directory")
        kwargs = {"trust_remote_code": config.trust_remote_code}
        tokenizer = AutoTokenizer.from_pretrained(config.path, **kwargs)
        model = AutoModelForSequenceClassification.from_pretrained(
            config.path, num_labels=1, dtype=dtype, **kwargs
        )
        return cls(model, tokenizer, config, device)

    # ------------------------------------------------------------------ inputs

    def build_inputs(self, batch: Batch, policy_tokenizer: Any = None) -> list[list[int]]:
        """One token list per sample (see the module doc)."""
        width = batch["response_ids"].shape[-1]
        if "attention_mask" in batch and batch["attention_mask"].shape[-1] >= width:
            present = batch["attention_mask"][:, -width:]
        else:
            present = batch["response_mask"]
        responses = [
            r[m.bool()].tolist() for r, m in zip(batch["response_ids"].cpu(), present.cpu())
        ]
        prompts = [p[m.bool()].tolist() for p, m in zip(batch["prompt_ids"].cpu(), _pmask(batch))]
        if not self.retemplate:
            seqs = [p + r for p, r in zip(prompts, responses)]
        else:
            if policy_tokenizer is None:
                raise ValueError("re-templating for the reward model needs the policy tokenizer")
            texts = batch.objects.get("response_text") or policy_tokenizer.batch_decode(
                responses, skip_special_tokens=True
            )
            raw = batch.objects.get("raw_prompt")
            seqs = []
            for i, text in enumerate(texts):
                if raw is not None and isinstance(raw[i], list):
                    messages = list(raw[i])
                else:
                    prompt = policy_tokenizer.decode(prompts[i], skip_special_tokens=True)
                    messages = [{"role": "user", "content": prompt}]
                seqs.append(self._render(messages, text))
        limit = self.config.max_length
        return [s[-limit:] if limit else s for s in seqs]

    def _render(self, messages: list[dict[str, Any]], response: str) -> list[int]:
        chat = [*messages, {"role": "assistant", "content": response}]
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(chat, tokenize=False)
        else:
            text = "".join(str(m["content"]) for m in chat)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ scoring

    def micro_batches(self, lengths: list[int]) -> list[tuple[int, int]]:
        """``[start, stop)`` ranges of consecutive sequences, one per forward (module doc)."""
        if not self.config.use_dynamic_bsz:
            size = self.config.micro_batch_size_per_device or DEFAULT_MICRO_BATCH
            return [(i, min(i + size, len(lengths))) for i in range(0, len(lengths), size)]
        return token_budget_ranges(lengths, self.config.forward_max_token_len_per_device)

    @torch.no_grad()
    def score_sequences(self, seqs: list[list[int]]) -> Tensor:
        """``(N,)`` float32 last-token logits of token lists, in micro-batches."""
        embed = self.model.get_input_embeddings()
        out: list[Tensor] = []
        for start, stop in self.micro_batches([max(len(s), 1) for s in seqs]):
            chunk = [s or [0] for s in seqs[start:stop]]
            length = max(len(s) for s in chunk)
            ids = torch.zeros(len(chunk), length, dtype=torch.long)
            mask = torch.zeros(len(chunk), length, dtype=torch.long)
            for row, s in enumerate(chunk):
                ids[row, length - len(s) :] = torch.tensor(s)
                mask[row, length - len(s) :] = 1
            position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
            ids, mask, position_ids = (t.to(self.device) for t in (ids, mask, position_ids))
            logits = self.model(
                inputs_embeds=embed(ids), attention_mask=mask, position_ids=position_ids
            ).logits
            out.append(logits.reshape(len(chunk), -1)[:, 0].float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    def score(self, batch: Batch, policy_tokenizer: Any = None) -> Tensor:
        """``(B,)`` reward-model scores of the batch's prompt+response pairs."""
        return self.score_sequences(self.build_inputs(batch, policy_tokenizer))

    def score_token_level(
        self, batch: Batch, policy_tokenizer: Any = None
    ) -> tuple[Tensor, Tensor]:
        """``((B,), (B, R))``: scores and the same placed on the last response token."""
        scores = self.score(batch, policy_tokenizer)
        return scores, place_at_last_token(scores, batch["response_mask"].cpu())


def token_budget_ranges(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Greedy ``[start, stop)`` ranges whose padded size ``count × longest`` stays within
    ``budget`` tokens; a sequence longer than the budget forms a range of its own."""
    out: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i, n in enumerate(lengths):
        if i > start and max(longest, n) * (i - start + 1) > budget:
            out.append((start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if start < len(lengths):
        out.append((start, len(lengths)))
    return out


def _pmask(batch: Batch) -> Tensor:
    if "prompt_mask" in batch:
        return batch["prompt_mask"].cpu()
    width = batch["prompt_ids"].shape[-1]
    return batch["attention_mask"][:, :width].cpu()
