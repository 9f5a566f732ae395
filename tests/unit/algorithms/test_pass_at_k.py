"""pass@k (unbiased, from n samples) and mean@n against values computed by hand."""

from __future__ import annotations

import math

import pytest

from temper.algorithms.pass_at_k import default_ks, mean_at_n, mean_pass_at_k, pass_at_k


def test_pass_at_1_is_the_fraction_correct() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # 1 − C(3,1)/C(4,1) = 1 − 3/4
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)


def test_pass_at_k_equals_the_binomial_formula() -> None:
    # n=4, c=1, k=2: 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n=5, c=2, k=2: 1 − C(3,2)/C(5,2) = 1 − 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    for n, c, k in [(10, 3, 4), (20, 1, 7), (8, 0, 3)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_edges() -> None:
    assert pass_at_k(4, 0, 4) == 0.0  # nothing correct
    assert pass_at_k(4, 3, 2) == 1.0  # n − c = 1 < k: every pair holds a correct one
    assert pass_at_k(4, 1, 4) == 1.0  # all four drawn
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_means_over_prompts() -> None:
    correct = [[True, False, False, False], [True, True, False, False]]
    # pass@2: (0.5 + (1 − C(2,2)/C(4,2) = 5/6)) / 2
    assert mean_pass_at_k(correct, 2) == pytest.approx((0.5 + 5 / 6) / 2)
    # mean@n weighs each prompt once: (mean(1, 0) + mean(0.5, 0.5, 0.5, 0.5)) / 2
    assert mean_at_n([[1.0, 0.0], [0.5, 0.5, 0.5, 0.5]]) == pytest.approx(0.5)
    assert mean_at_n([]) == 0.0 and mean_pass_at_k([], 1) == 0.0
    with pytest.raises(ValueError):
        mean_at_n([[]])


def test_default_ks() -> None:
    assert default_ks(1) == [1]
    assert default_ks(4) == [1, 2, 4]
    assert default_ks(10) == [1, 2, 4, 8, 10]
