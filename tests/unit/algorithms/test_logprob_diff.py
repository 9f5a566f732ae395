"""rollout/logprob_diff: mean and max |train − rollout| log-prob over valid tokens."""

from __future__ import annotations

import torch

from temper.algorithms.rollout_correction import logprob_diff


def test_mean_and_max_over_valid_tokens_only():
    train = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 9.0]])
    rollout = torch.tensor([[-1.1, -2.0, -2.7], [-0.5, -0.4, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the 9.0 is padding
    out = logprob_diff(train, rollout, mask)
    torch.testing.assert_close(out["logprob_diff"], torch.tensor((0.1 + 0 + 0.3 + 0 + 0.1) / 5))
    torch.testing.assert_close(out["logprob_diff_max"], torch.tensor(0.3))


def test_no_valid_tokens_is_zero():
    out = logprob_diff(torch.ones(2, 2), torch.zeros(2, 2), torch.zeros(2, 2))
    assert float(out["logprob_diff"]) == 0.0 and float(out["logprob_diff_max"]) == 0.0


def test_roll_enable_old_logprobs_recompute_false_still_means_the_trainers_log_probs():
    """ROLL caches its trainer's first forward as the old log-probs: never the engine's."""
    from temper.config.dialects.roll.translate import translate_roll
    from temper.config.loader import RawConfig

    t = translate_roll(RawConfig(data={"enable_old_logprobs_recompute": False}, source="<t>"))
    assert t.native.get("actor", {}).get("recompute_old_log_prob", True) is True
    assert any("enable_old_logprobs_recompute" in note for note in t.notes)
