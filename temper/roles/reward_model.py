"""The reward model on a training engine: a sequence classifier's backbone and bias-free
``score`` head loaded as a frozen ``kind='score'`` engine (``reward.model.strategy:
megatron``), scoring as :class:`temper.rewards.model.RewardModel` does.

Inputs are :meth:`RewardModel.build_inputs`' token lists. Each becomes one row whose
"prompt" is the whole sequence and whose "response" is one placeholder token: an engine's
value at a response token is the head's output at the position before it, here the
sequence's last real token — the position Hugging Face's classifier pools. Causal
attention keeps the placeholder out of that output.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from temper.config.errors import ConfigError
from temper.config.schema import RewardModelConfig
from temper.data.batch import Batch
from temper.rewards.model import DEFAULT_MICRO_BATCH, RewardModel
from temper.training.base import TrainEngine
from temper.training.micro_batching import MicroBatching


def score_rows(seqs: list[list[int]]) -> Batch:
    """The engine batch of token lists (module doc): ``prompt_ids`` left-padded with 0,
    ``response_ids`` one placeholder 0 per row, every mask 1 on real tokens."""
    seqs = [s or [0] for s in seqs]
    width = max(len(s) for s in seqs)
    prompt = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for row, s in enumerate(seqs):
        prompt[row, width - len(s) :] = torch.tensor(s)
        mask[row, width - len(s) :] = 1
    one = torch.ones(len(seqs), 1, dtype=torch.long)
    return Batch.from_dict(
        {
            "prompt_ids": prompt,
            "prompt_mask": mask,
            "response_ids": torch.zeros_like(one),
            "response_mask": one,
            "attention_mask": torch.cat([mask, one], dim=1),
        }
    )


class EngineRewardModel(RewardModel):
    """:class:`RewardModel` whose scores come from a frozen ``kind='score'`` engine."""

    def __init__(
        self, engine: TrainEngine, tokenizer: Any, config: RewardModelConfig
    ) -> None:  # the HF model's set-up is not run: the engine holds the network
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.device = engine.device
        self.retemplate = config.input_tokenizer is not None

    def micro_batching(self) -> MicroBatching:
        """``micro_batch_size_per_device`` rows, or with ``use_dynamic_bsz`` a token budget."""
        c = self.config
        budget = c.forward_max_token_len_per_device if c.use_dynamic_bsz else None
        return MicroBatching(
            size=c.micro_batch_size_per_device or DEFAULT_MICRO_BATCH, max_tokens=budget
        )

    @torch.no_grad()
    def score_sequences(self, seqs: list[list[int]]) -> Tensor:
        """``(N,)`` float32 head outputs at each token list's last token."""
        if not seqs:
            return torch.zeros(0)
        out = self.engine.forward(
            score_rows(seqs), with_values=True, micro_batching=self.micro_batching()
        )
        return out["values"][:, 0].float().cpu()


def check_one_label(path: str) -> None:
    """The classifier at ``path`` has one output (``num_labels`` 1: a scalar reward)."""
    config = json.loads((Path(path) / "config.json").read_text())
    labels = len(config["id2label"]) if "id2label" in config else config.get("num_labels", 1)
    if labels != 1:
        raise ConfigError(
            "reward.model.path",
            f"the reward model has num_labels={labels}",
            "use a sequence-classification model with one output (num_labels=1)",
        )
