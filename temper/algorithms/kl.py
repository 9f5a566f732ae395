"""KL estimators, KL in the reward / as a loss, and KL coefficient controllers.

Estimators (registry :data:`KL_ESTIMATORS`, config keys verl ``algorithm.kl_penalty`` /
``actor.kl_loss_type``, ROLL ``kl_penalty``) have one signature::

    fn(log_prob: Tensor (B, T), ref_log_prob: Tensor (B, T)) -> Tensor (B, T)

with ``x = log π_θ(y_t) - log π_ref(y_t)`` of the sampled token (Schulman, "Approximating
KL divergence", 2020, http://joschu.net/blog/kl-approx.html), all estimating
KL(π_θ ‖ π_ref):

* ``kl``/``k1``: ``x`` (unbiased, high variance, can be negative);
* ``abs``: ``|x|``;
* ``mse``/``k2``: ``x²/2`` (biased, but its gradient is the gradient of the true KL);
* ``low_var_kl``/``k3``: ``e^{-x} + x - 1`` with ``-x`` clamped to [-20, 20] and the
  result to [-10, 10] (verl; ROLL omits the inner clamp), ≥ 0, unbiased;
* ``<name>+`` (``k1+``, ``k3+``, ``low_var_kl+``, ``kl+``, ``abs+``): straight-through — the
  forward value of ``<name>``, the gradient of ``k2`` (verl); ``k2+``/``mse+`` equal ``k2``;
* ``full``: exact KL over the vocabulary; needs both models' logits, so its registry entry
  raises :class:`KLNeedsLogitsError` — the actor's training engine computes it with
  :func:`temper.algorithms.logprobs.full_kl_from_logits` against the reference's logits,
  micro-batch by micro-batch, and passes it as ``kl_matrix`` (check
  :func:`kl_estimator_needs_logits`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.masked import masked_mean
from temper.registry import Registry

KLFn = Callable[[Tensor, Tensor], Tensor]

KL_ESTIMATORS: Registry[KLFn] = Registry("kl_penalty")


class KLNeedsLogitsError(ValueError):
    """The ``full`` KL needs logits of both models, not log-probs of the sampled token."""


@KL_ESTIMATORS.register("kl", "k1")
def kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """``k1 = log π - log π_ref``; shapes ``(B, T)``."""
    return log_prob - ref_log_prob


@KL_ESTIMATORS.register("abs")
def kl_abs(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """``|log π - log π_ref|``; shapes ``(B, T)``."""
    return (log_prob - ref_log_prob).abs()


@KL_ESTIMATORS.register("mse", "k2")
def kl_k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """``k2 = ½ (log π - log π_ref)²``; shapes ``(B, T)``."""
    return 0.5 * (log_prob - ref_log_prob).square()


@KL_ESTIMATORS.register("low_var_kl", "k3")
def kl_k3(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """``k3 = e^{d} - d - 1``, ``d = clamp(log π_ref - log π, -20, 20)``, result in [-10, 10].

    Shapes ``(B, T)``. Non-negative (``e^d ≥ 1 + d``); the clamps follow verl's
    ``low_var_kl`` and keep very negative log-probs finite.
    """
    d = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(d) - d - 1.0, min=-10.0, max=10.0)


def _straight_through(base: KLFn) -> KLFn:
    def fn(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
        forward = base(log_prob, ref_log_prob)
        backward = kl_k2(log_prob, ref_log_prob)
        return backward - backward.detach() + forward.detach()

    fn.__name__ = f"{base.__name__}_plus"
    fn.__doc__ = (
        f"Straight-through: value of ``{base.__name__}``, gradient of ``k2`` "
        "(verl ``kl_penalty`` with a ``+`` suffix); shapes ``(B, T)``."
    )
    return fn


KL_ESTIMATORS.add("kl+", _straight_through(kl_k1), "k1+")
KL_ESTIMATORS.add("abs+", _straight_through(kl_abs))
KL_ESTIMATORS.add("mse+", kl_k2, "k2+")
KL_ESTIMATORS.add("low_var_kl+", _straight_through(kl_k3), "k3+")


@KL_ESTIMATORS.register("full")
def kl_full(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """Exact KL over the vocabulary: needs logits, see ``full_kl_from_logits``."""
    raise KLNeedsLogitsError(
        "kl 'full' is the exact KL over the vocabulary and needs both models' logits: call "
        "temper.algorithms.full_kl_from_logits(logits, ref_logits, mask) instead of the "
        "per-token estimator"
    )


kl_full.needs_logits = True  # type: ignore[attr-defined]


def kl_estimator_needs_logits(name: str) -> bool:
    """True for estimators that need full logits (``full``) rather than log-probs."""
    return bool(getattr(KL_ESTIMATORS.get(name), "needs_logits", False))


def kl_penalty(log_prob: Tensor, ref_log_prob: Tensor, name: str) -> Tensor:
    """The per-token KL estimate ``(B, T)`` of estimator ``name``."""
    return KL_ESTIMATORS.get(name)(log_prob, ref_log_prob)


def apply_kl_penalty(
    token_level_scores: Tensor,
    old_log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    kl_coef: float,
    kl_penalty_name: str = "kl",
    kl_matrix: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """KL in the reward (verl ``use_kl_in_reward``, ROLL ``add_token_level_kl``).

    ``r_t = score_t - β·kl_t·m_t`` with ``kl_t`` the estimator ``kl_penalty_name`` of the
    rollout policy vs the reference (pass ``kl_matrix`` precomputed for ``full``).
    Returns ``(token_level_rewards (B,T), kl (B,T) masked, current_kl scalar)`` where
    ``current_kl`` = mean over non-empty sequences of the per-sequence masked mean — the
    value fed to the KL controller's ``update``.
    """
    m = (response_mask > 0).to(token_level_scores.dtype)
    kld = (
        kl_matrix
        if kl_matrix is not None
        else kl_penalty(old_log_prob, ref_log_prob, kl_penalty_name)
    )
    kld = kld.to(token_level_scores.dtype) * m
    rewards = token_level_scores - kl_coef * kld
    per_seq = masked_mean(kld, m, dim=-1)
    nonempty = m.sum(dim=-1) > 0
    current = per_seq[nonempty].mean() if nonempty.any() else per_seq.new_zeros(())
    return rewards, kld, current


def kl_loss(
    log_prob: Tensor,
    ref_log_prob: Tensor,
    response_mask: Tensor,
    agg: LossAggregator,
    kl_loss_type: str = "low_var_kl",
    kl_matrix: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL as a loss (verl ``use_kl_loss``/``kl_loss_type``; ROLL ``use_kl_loss`` uses k3).

    ``loss = agg(kl_{type}(log π, log π_ref))``; multiply by ``kl_loss_coef`` in
    :func:`temper.algorithms.objectives.actor_loss`. For ``full`` pass ``kl_matrix`` from
    ``full_kl_from_logits``. Returns ``(loss, {"kl_loss": …})``.
    """
    kld = kl_matrix if kl_matrix is not None else kl_penalty(log_prob, ref_log_prob, kl_loss_type)
    loss = agg(kld, response_mask)
    return loss, {"kl_loss": loss.detach()}


# --------------------------------------------------------------------------- controllers


@dataclass
class FixedKLController:
    """Constant KL coefficient ``β`` (``kl_ctrl.type: fixed``)."""

    kl_coef: float
    target_kl: float | None = None
    horizon: int = 10000

    @property
    def value(self) -> float:
        return self.kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op."""

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_coef = float(state["kl_coef"])


@dataclass
class AdaptiveKLController:
    """Adaptive β (Ziegler et al. 2019, arXiv:1909.08593; verl/ROLL ``adaptive``).

    ``e = clip(KL/target - 1, -0.2, 0.2)``, ``β ← β·(1 + e·n_steps/horizon)``, with
    ``n_steps`` the number of samples in the batch.
    """

    kl_coef: float
    target_kl: float | None = 0.1
    horizon: int = 10000

    def __post_init__(self) -> None:
        if self.target_kl is None or self.target_kl <= 0:
            raise ValueError(f"adaptive KL control needs target_kl > 0, got {self.target_kl}")
        if self.horizon <= 0:
            raise ValueError(f"adaptive KL control needs horizon > 0, got {self.horizon}")

    @property
    def value(self) -> float:
        return self.kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        assert self.target_kl is not None
        err = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.kl_coef *= 1.0 + err * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_coef}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_coef = float(state["kl_coef"])


KLController = FixedKLController | AdaptiveKLController

KL_CONTROLLERS: Registry[type[FixedKLController] | type[AdaptiveKLController]] = Registry(
    "kl_ctrl.type"
)
KL_CONTROLLERS.add("fixed", FixedKLController)
KL_CONTROLLERS.add("adaptive", AdaptiveKLController)


def make_kl_controller(
    kind: str, kl_coef: float, target_kl: float | None = None, horizon: int = 10000
) -> KLController:
    """Build the controller registered as ``kind`` (``fixed``/``adaptive``)."""
    return KL_CONTROLLERS.get(kind)(kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
