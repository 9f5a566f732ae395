"""Shared fixtures: a user reward file with well- and ill-behaved functions."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from temper.data.batch import Batch

USER_REWARDS = textwrap.dedent(
    """
    import os
    import time

    NOT_CALLABLE = 3

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return {"score": float(solution_str.strip() == str(ground_truth)) + bonus, "length": len(solution_str)}

    def raises(data_source, solution_str, ground_truth, extra_info=None):
        raise RuntimeError("boom " + solution_str)

    def sleeps(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str.startswith("slow"):
            time.sleep(60)
        return 1.0

    def dies(data_source, solution_str, ground_truth, extra_info=None):
        os._exit(3)

    def returns_text(data_source, solution_str, ground_truth, extra_info=None):
        return "yes"

    def huge(data_source, solution_str, ground_truth, extra_info=None):
        return {"a": 10**400, "b": 1e300, "c": "x"}[solution_str]

    def huge_extra(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "big": 10**400}

    class Stubborn:
        def __float__(self):
            raise ArithmeticError("no float here")

    def stubborn(data_source, solution_str, ground_truth, extra_info=None):
        return Stubborn()

    def batched(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
        return [scale * float(s == str(g)) for s, g in zip(solution_strs, ground_truths)]
    """
)


@pytest.fixture(scope="session")
def user_reward_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("user") / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from temper.utils.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def make_batch(tokenizer, prompts: list[str], responses: list[str], **objects) -> Batch:
    """Left-padded prompts ‖ right-padded responses (response ends with eos unless empty)."""
    pad = tokenizer.pad_token_id
    p_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    r_ids = [
        tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] if r else []
        for r in responses
    ]
    P = max(len(p) for p in p_ids)
    R = max(1, max(len(r) for r in r_ids))
    B = len(prompts)
    prompt_ids = torch.full((B, P), pad)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    response_ids = torch.full((B, R), pad)
    response_mask = torch.zeros(B, R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(p_ids, r_ids)):
        prompt_ids[i, P - len(p) :] = torch.tensor(p)
        prompt_mask[i, P - len(p) :] = 1
        if r:
            response_ids[i, : len(r)] = torch.tensor(r)
            response_mask[i, : len(r)] = 1
    return Batch.from_dict(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, response_ids], -1),
            "attention_mask": torch.cat([prompt_mask, response_mask], -1),
        },
        objects,
    )
