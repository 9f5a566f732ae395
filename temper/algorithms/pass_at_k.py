"""Evaluation metrics of ``n`` scored responses per prompt: pass@k and mean@n.

Pure functions over plain numbers (a prompt's responses are few; no tensors needed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` are correct
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"):

        pass@k = 1 − C(n − c, k) / C(n, k)

    the probability that ``k`` samples drawn without replacement from the ``n`` hold at
    least one correct one. Computed as ``1 − Π_{i = n−c+1}^{n} (1 − k / i)`` (no huge
    binomials); 1 when ``n − c < k`` (every draw of k holds a correct one).
    Requires ``0 ≤ c ≤ n`` and ``1 ≤ k ≤ n``."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """pass@k of a set of prompts: the mean over prompts ``j`` of
    ``pass_at_k(n_j, c_j, k)``, ``n_j`` the prompt's responses and ``c_j`` its correct
    ones. Every prompt needs ``n_j ≥ k``; no prompts: 0."""
    if not correct:
        return 0.0
    return sum(pass_at_k(len(row), sum(map(bool, row)), k) for row in correct) / len(correct)


def mean_at_n(scores: Sequence[Sequence[float]]) -> float:
    """mean@n of a set of prompts: the mean over prompts of the mean score of each
    prompt's responses,

        mean@n = (1 / P) Σ_j (1 / n_j) Σ_i s_ji

    (verl ``main_eval``'s ``test_score/<data_source>``: each prompt weighs the same
    whatever its number of responses). Prompts without responses are an error; no
    prompts: 0."""
    if not scores:
        return 0.0
    if any(len(row) == 0 for row in scores):
        raise ValueError("mean@n needs at least one response per prompt")
    return sum(sum(row) / len(row) for row in scores) / len(scores)


def default_ks(n: int) -> list[int]:
    """The k reported when none are asked for: the powers of two below ``n``, and ``n``
    (1, 2, 4, 8, 10 for n = 10)."""
    ks = [1 << i for i in range(max(n, 1).bit_length()) if (1 << i) < n]
    return [*ks, n] if n >= 1 else []
