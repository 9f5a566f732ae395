"""Fixtures for role tests: one tiny model per session, a config factory, random batches."""

from __future__ import annotations

import os

import torch

from temper.config.schema import TemperConfig
from temper.data.batch import Batch

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
torch.set_num_threads(2)

PAD = 259


def make_config(path: str, adv_estimator: str = "grpo") -> TemperConfig:
    cfg = TemperConfig()
    cfg.model.path = path
    cfg.experiment.device = "cpu"
    cfg.algorithm.adv_estimator = adv_estimator
    cfg.actor.optim.lr = 1e-3
    cfg.actor.optim.weight_decay = 0.0
    cfg.actor.micro_batch_size_per_device = 2
    return cfg


def make_batch(
    prompt_lens: list[int], response_lens: list[int], P: int = 7, R: int = 6, seed: int = 0
) -> Batch:
    """Left-padded prompts, right-padded responses, ±1 scores, matching advantages."""
    g = torch.Generator().manual_seed(seed)
    B = len(prompt_lens)
    pl, rl = torch.tensor(prompt_lens), torch.tensor(response_lens)
    pm = (torch.arange(P)[None] >= P - pl[:, None]).long()
    rm = (torch.arange(R)[None] < rl[:, None]).long()
    pid = torch.where(pm > 0, torch.randint(0, 256, (B, P), generator=g), PAD)
    rid = torch.where(rm > 0, torch.randint(0, 256, (B, R), generator=g), PAD)
    score = torch.tensor([1.0, -1.0] * (B // 2) + [1.0] * (B % 2))
    last = (rl - 1).clamp(min=0)
    scores = torch.zeros(B, R).scatter(1, last[:, None], score[:, None]) * rm
    adv = (score[:, None] * rm).float()
    return Batch.from_dict(
        {
            "prompt_ids": pid,
            "prompt_mask": pm,
            "response_ids": rid,
            "response_mask": rm,
            "advantages": adv,
            "token_level_scores": scores,
        }
    )


PROMPTS = [7, 3, 5, 1]
RESPONSES = [6, 2, 4, 1]
