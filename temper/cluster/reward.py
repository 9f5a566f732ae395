"""Where the reward model scores: the ``reward`` worker group on Ray, else the driver.

With ``resources.backend: ray`` (any ``reward.model.strategy``: torch, fsdp2 or megatron;
:func:`temper.roles.reward_model.scores_on_workers`) the reward model is a worker group
of its own, as verl's reward-model workers are: role ``reward``, placed on
``resources.reward`` (the actor's devices when unset; colocated roles share each
device's bundle), each rank a frozen ``kind='score'`` engine over the group's process
group (:func:`temper.roles.reward_model.build_reward_scorer`). The driver keeps what is
cheap and order-bound — the reward model's tokenizer and the inputs it builds
(:meth:`RewardModel.build_inputs`) — and the group scores: the rows are cut into one
equal, token-balanced share per data-parallel rank (a torch rank is a whole replica;
Megatron's model-parallel ranks of one replica get the same share), and the scores come
back in the batch's order (:meth:`temper.cluster.base.WorkerGroup.dispatch`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from temper.cluster.base import WorkerGroup
from temper.config.schema import RewardModelConfig, TemperConfig
from temper.rewards.model import RewardModel
from temper.roles.reward_model import build_reward_model, check_one_label, score_rows


class RemoteRewardModel(RewardModel):
    """:class:`RewardModel` whose scores come from the ``reward`` worker group."""

    def __init__(self, group: WorkerGroup, tokenizer: Any, config: RewardModelConfig) -> None:
        # the classifier's set-up is not run: the group's ranks hold the network
        self.group = group
        self.tokenizer = tokenizer
        self.config = config
        self.device = torch.device("cpu")
        self.retemplate = config.input_tokenizer is not None

    @classmethod
    def over(cls, group: WorkerGroup, config: RewardModelConfig) -> RemoteRewardModel:
        """The proxy of ``group``, with the reward model's tokenizer (for re-templating)."""
        from transformers import AutoTokenizer

        assert config.path is not None  # scores_on_workers: the check required it
        tokenizer = AutoTokenizer.from_pretrained(
            config.path, trust_remote_code=config.trust_remote_code
        )
        return cls(group, tokenizer, config)

    def score_sequences(self, seqs: list[list[int]]) -> Tensor:
        """``(N,)`` float32 scores of token lists, each rank scoring its share."""
        if not seqs:
            return torch.zeros(0)
        return self.group.dispatch("score_batch", score_rows(seqs))["scores"].float()


def check_reward_group(cfg: TemperConfig) -> None:
    """Before the group starts: the classifier has one output."""
    assert cfg.reward.model.path is not None
    check_one_label(cfg.reward.model.path)


def run_reward_model(
    cfg: TemperConfig, device: torch.device, remote: RewardModel | None
) -> RewardModel | None:
    """The run's reward model (None unless enabled): ``remote``, the ``reward`` group's
    proxy where ``build_ray_roles`` made one, else one in this process."""
    if remote is not None:
        return remote
    scorer: RewardModel | None = build_reward_model(cfg, device)
    return scorer
