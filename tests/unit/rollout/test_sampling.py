"""inverse_cdf_sample: the draw follows softmax(scores), filtered entries are never drawn."""

from __future__ import annotations

import math

import pytest
import torch

from temper.rollout.sampling import inverse_cdf_sample


def test_frequencies_follow_softmax():
    p = torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0])
    rows = 200_000
    scores = p.log().expand(rows, -1).contiguous()  # log 0 = -inf: a filtered entry
    torch.manual_seed(0)
    drawn = inverse_cdf_sample(scores)
    assert drawn.shape == (rows, 1) and drawn.dtype == torch.int64
    counts = torch.bincount(drawn.squeeze(1), minlength=5).double()
    assert counts[4] == 0
    for i in range(4):  # within 5 binomial standard deviations
        sd = math.sqrt(rows * p[i] * (1 - p[i]))
        assert abs(counts[i] - rows * p[i]) < 5 * sd, (i, counts.tolist())


def test_rows_are_independent_distributions():
    scores = torch.full((3, 6), float("-inf"))
    scores[0, 2] = 0.0  # one finite entry: always drawn
    scores[1, [0, 5]] = torch.tensor([1.0, 1.0])
    scores[2] = torch.arange(6.0)
    torch.manual_seed(1)
    for _ in range(200):
        drawn = inverse_cdf_sample(scores).squeeze(1)
        assert drawn[0] == 2
        assert drawn[1] in (0, 5)


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-53, 1.0])
def test_extreme_uniforms_never_draw_a_filtered_entry(monkeypatch, u):
    # leading and trailing -inf: U = 0 takes the first finite entry, U near 1 the last
    # one; U = 1 stands for U·F_V rounding up to F_V, which the clamp below F_V covers
    scores = torch.tensor([[float("-inf"), 0.3, -1.0, float("-inf"), float("-inf")]] * 4)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full(a[0], u, dtype=k["dtype"]))
    drawn = inverse_cdf_sample(scores).squeeze(1)
    assert drawn.tolist() == [1 if u == 0.0 else 2] * 4


def test_seeded_draws_repeat():
    scores = torch.randn(8, 100)
    torch.manual_seed(3)
    a = inverse_cdf_sample(scores)
    torch.manual_seed(3)
    assert torch.equal(a, inverse_cdf_sample(scores))
