"""The reward model on a training engine: a sequence classifier's backbone and bias-free
``score`` head loaded as a frozen ``kind='score'`` engine, scoring as
:class:`temper.rewards.model.RewardModel` does.

Where it scores (:func:`build_reward_model`, :func:`build_reward_scorer`):

- ``resources.backend: local`` — the driver process: the Hugging Face classifier for
  ``torch`` and ``fsdp2`` (one rank computes what the classifier computes), a one-rank
  megatron world for ``megatron``;
- ``resources.backend: ray`` — the ``reward`` worker group on ``resources.reward``
  (``temper.cluster.reward``): each rank an engine of the strategy over the group's
  process group (a whole ``torch`` replica per rank, FSDP2 data-parallel ranks, Megatron
  TP × PP × CP model-parallel ones), scoring its data-parallel slice of the rows.

Inputs are :meth:`RewardModel.build_inputs`' token lists. Each becomes one row whose
"prompt" is the whole sequence and whose "response" is one placeholder token: an engine's
value at a response token is the head's output at the position before it, here the
sequence's last real token — the position Hugging Face's classifier pools. Causal
attention keeps the placeholder out of that output.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, RewardModelConfig, TemperConfig
from temper.data.batch import Batch
from temper.rewards.model import DEFAULT_MICRO_BATCH, RewardModel
from temper.training.base import TrainEngine
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

log = logging.getLogger(__name__)

#: the strategies that serve a reward model; on the Ray backend each is an engine over the
#: ``reward`` worker group, on the devices resources.reward names
REWARD_MODEL_STRATEGIES = ("torch", "fsdp2", "megatron")


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
        return self.score_batch(score_rows(seqs))["scores"]

    @torch.no_grad()
    def score_batch(self, rows: Batch) -> Batch:
        """``scores`` ``(N,)`` float32 of :func:`score_rows`' rows (a worker rank's share
        of them on the Ray backend: the ranks of a sharded engine call it together)."""
        out = self.engine.forward(rows, with_values=True, micro_batching=self.micro_batching())
        return Batch.from_dict({"scores": out["values"][:, 0].float().cpu()})


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


def scores_on_workers(cfg: TemperConfig) -> bool:
    """The reward model scores on the ``reward`` worker group (module doc)."""
    rm = cfg.reward.model
    return rm.enable and cfg.resources.backend == "ray" and rm.strategy in REWARD_MODEL_STRATEGIES


def _require_path(rm: RewardModelConfig) -> str:
    if not rm.path:
        raise ConfigError(
            "reward.model.path", "is not set but reward.model.enable is true", "set it"
        )
    return rm.path


def score_engine(cfg: TemperConfig, dev: torch.device, strategy: str) -> TrainEngine:
    """The reward model as a frozen ``kind='score'`` engine of ``strategy`` (a
    ``megatron`` or ``fsdp2`` one joins this process's process group)."""
    rm = cfg.reward.model
    offload = rm.megatron.param_offload if strategy == "megatron" else rm.fsdp.param_offload
    return build_engine(
        strategy,
        EngineSpec(
            model=replace(
                cfg.model,  # the policy's compute settings; its own architecture and code
                trust_remote_code=rm.trust_remote_code,
                override_config={},
                lora=LoraConfig(),
            ),
            device=dev,
            kind="score",
            model_path=_require_path(rm),
            train=None,
            param_offload=offload,
            seed=cfg.experiment.seed,
            role="reward.model",
            fsdp=rm.fsdp,
            megatron=rm.megatron,
        ),
        key="reward.model.strategy",
    )


def build_reward_model(cfg: TemperConfig, dev: torch.device) -> Any:
    """The driver's scorer of ``reward.model`` (None unless enabled; module doc): the
    Hugging Face classifier itself (:class:`RewardModel`) on ``torch`` / ``fsdp2``, the
    backbone and score head as a one-rank megatron engine (:class:`EngineRewardModel`)
    on ``megatron``."""
    from transformers import AutoTokenizer

    rm = cfg.reward.model
    if not rm.enable:
        return None
    if rm.strategy in ("torch", "fsdp2"):
        if rm.strategy != "torch":
            log.warning(
                "reward.model.strategy=%s: on resources.backend=local the reward model "
                "scores in the driver process, where one FSDP2 rank computes what the "
                "torch classifier computes",
                rm.strategy,
            )
        return RewardModel.from_config(replace(rm, strategy="torch"), device=dev)
    if rm.strategy != "megatron":
        raise ConfigError(
            "reward.model.strategy",
            f"'{rm.strategy}' does not serve a reward model",
            "use torch, fsdp2 or megatron",
        )
    check_one_label(_require_path(rm))
    engine = score_engine(cfg, dev, "megatron")
    tokenizer = AutoTokenizer.from_pretrained(rm.path, trust_remote_code=rm.trust_remote_code)
    return EngineRewardModel(engine, tokenizer, rm)


def build_reward_scorer(cfg: TemperConfig, dev: torch.device) -> EngineRewardModel:
    """One rank of the Ray ``reward`` group: the ``reward.model.strategy`` engine over the
    group's process group. It scores rows (:meth:`EngineRewardModel.score_batch`); the
    driver builds the inputs, so the rank holds no tokenizer."""
    return EngineRewardModel(
        score_engine(cfg, dev, cfg.reward.model.strategy), None, cfg.reward.model
    )
