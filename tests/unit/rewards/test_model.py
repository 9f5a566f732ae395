"""Reward-model scoring with a tiny random sequence-classification model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from temper.config.schema import RewardConfig, RewardModelConfig
from temper.rewards.manager import RewardScorer
from temper.rewards.model import RewardModel, token_budget_ranges

from .conftest import make_batch


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    from temper.utils.tiny import build_tokenizer

    out = tmp_path_factory.mktemp("rm")
    tok = build_tokenizer(out)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_labels=1,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def rm_batch(tokenizer):
    return make_batch(tokenizer, ["hi", "a longer prompt?", "x"], ["hello there", "ok", "yes!"])


def test_scores_shape_determinism_and_padding_invariance(rm_dir, tokenizer, rm_batch) -> None:
    cfg = RewardModelConfig(enable=True, path=str(rm_dir), micro_batch_size_per_device=2)
    rm = RewardModel.from_config(cfg, dtype=torch.float32)
    scores, token_level = rm.score_token_level(rm_batch)
    assert scores.shape == (3,) and token_level.shape == rm_batch["response_ids"].shape
    assert torch.equal(scores, rm.score(rm_batch))  # deterministic
    alone = torch.cat([rm.score(rm_batch.slice(i, i + 1)) for i in range(3)])
    torch.testing.assert_close(scores, alone, atol=1e-5, rtol=1e-5)  # padding does not matter
    last = rm_batch["response_mask"].sum(-1) - 1
    for i in range(3):
        assert token_level[i, last[i]] == scores[i]
        assert token_level[i].count_nonzero() <= 1


def test_dynamic_bsz_cuts_micro_batches_by_tokens_and_scores_the_same(
    rm_dir, tokenizer, rm_batch
) -> None:
    """reward.model.use_dynamic_bsz: forwards of at most forward_max_token_len_per_device
    padded tokens; the scores do not depend on the cut."""
    assert token_budget_ranges([3, 4, 2, 9, 1], budget=8) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert token_budget_ranges([2, 2, 2, 2], budget=8) == [(0, 4)]
    cfg = RewardModelConfig(
        enable=True, path=str(rm_dir), use_dynamic_bsz=True, forward_max_token_len_per_device=12
    )
    rm = RewardModel.from_config(cfg, dtype=torch.float32)
    seqs = rm.build_inputs(rm_batch)
    ranges = rm.micro_batches([len(s) for s in seqs])
    assert len(ranges) > 1 and all(
        (b - a) * max(len(s) for s in seqs[a:b]) <= 12 or b - a == 1 for a, b in ranges
    )
    fixed = RewardModel.from_config(
        RewardModelConfig(enable=True, path=str(rm_dir), micro_batch_size_per_device=3),
        dtype=torch.float32,
    )
    torch.testing.assert_close(rm.score(rm_batch), fixed.score(rm_batch), atol=1e-5, rtol=1e-5)


def test_retemplated_inputs(rm_dir, tokenizer, rm_batch) -> None:
    cfg = RewardModelConfig(enable=True, path=str(rm_dir), input_tokenizer="policy", max_length=64)
    rm = RewardModel.from_config(cfg, dtype=torch.float32)
    seqs = rm.build_inputs(rm_batch, tokenizer)
    text = tokenizer.decode(seqs[0])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello there<|im_end|>\n"
    assert rm.score(rm_batch, tokenizer).shape == (3,)


def test_scorer_uses_rm_alone_when_no_rule_is_configured(rm_dir, tokenizer, rm_batch) -> None:
    rm = RewardModel.from_config(
        RewardModelConfig(enable=True, path=str(rm_dir)), dtype=torch.float32
    )
    with RewardScorer(RewardConfig(num_workers=0), reward_model=rm) as scorer:
        scores, token_level, metrics, failures = scorer.score_batch(rm_batch, tokenizer)
    torch.testing.assert_close(scores, rm.score(rm_batch))
    assert not failures and "train/rm_score_mean" in metrics
    torch.testing.assert_close(token_level.sum(-1), scores)
