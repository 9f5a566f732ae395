"""Policy losses, registered under the ``policy_loss`` config name (verl
``actor.policy_loss.loss_mode``).

One signature for all::

    fn(log_prob, old_log_prob, advantages, response_mask,
       params: PolicyLossParams, agg: LossAggregator,
       rollout_is_weights: Tensor | None = None, **inputs) -> (loss, metrics)

where ``inputs`` are the few extra tensors a loss declares (:func:`needs_inputs`; only
``topr_score`` takes one, ``sample_positive``).

Shapes: every tensor ``(B, T)``; ``loss`` is a scalar, already divided by the *global*
normalizers of ``agg`` (sum the micro-batch losses, do not average them). ``metrics``
are detached 0-dim tensors computed on the micro-batch: ``pg_loss``, ``ppo_kl`` (k1
estimate of KL(π_old‖π_θ) = mean(log π_old - log π_θ)), ``pg_clipfrac``,
``pg_clipfrac_lower``. ``rollout_is_weights`` (see :mod:`rollout_correction`) multiply
the per-token loss. ``r = π_θ/π_old = exp(clamp(log π_θ - log π_old, ±20))`` so very
negative log-probs never give inf/NaN.

This module holds the parameters, the PPO family (``vanilla``, ``gspo``, ``cispo``,
``gpg``) and the dispatcher; :mod:`temper.algorithms.policy_losses_variants` registers
``clip_cov``, ``kl_cov``, ``geo_mean``, ``sapo`` and ``topr`` in the same registry,
:mod:`temper.algorithms.policy_losses_trust` ``dppo_tv``, ``dppo_kl`` and ``dro``, and
:mod:`temper.algorithms.sppo` ``sppo``.

A loss that cannot run with its parameters (``dro`` without ``dro_beta``) raises
:class:`PolicyLossParamError`; :func:`check_policy_loss` finds that before a run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.masked import masked_mean
from temper.registry import Registry

Metrics = dict[str, Tensor]


@dataclass(frozen=True)
class PolicyLossParams:
    """Scalars of the policy losses.

    Attributes:
        clip_ratio: PPO ε (verl ``clip_ratio``, ROLL ``pg_clip``).
        clip_ratio_low / clip_ratio_high: asymmetric ε (DAPO clip-higher); default
            ``clip_ratio`` (ROLL ``pg_clip_low``/``pg_clip_high`` with ``use_pg_clip_range``).
        clip_ratio_c: dual-clip constant ``c`` (Ye et al. 2019, arXiv:1912.09729); ``None``
            disables dual clip. verl always applies it with ``clip_ratio_c`` (default 3.0);
            ROLL applies it only with ``dual_clip_loss: true`` and then ``c = 1 + 2·pg_clip``
            — use :meth:`from_roll`.
        loss_agg_mode_override: aggregate the policy loss with this mode instead of
            ``agg.mode`` (verl's ``gspo`` and ``sapo`` always use ``seq-mean-token-mean``).
        clip_cov_ratio / clip_cov_lb / clip_cov_ub: Clip-Cov parameters.
        kl_cov_ratio / ppo_kl_coef: KL-Cov parameters.
        tau_pos / tau_neg: SAPO gate temperatures for positive/negative advantages.
        topr_positive_weight / topr_negative_weight: TOPR weights of the two sets.
        dro_beta: DRO's quadratic penalty coefficient ``β`` (must be set, > 0, for ``dro``).
        sppo_eta: SPPO's ``η``, the scale of the advantage the sequence log-ratio is
            regressed onto (verl ``actor.sppo_eta``).
        cispo_unified_mask: CISPO's token mask (MiniMax-M1 eq. 7; ROLL
            ``cispo_use_unified_mask``): drop tokens whose ratio left the clip range in the
            direction the advantage pushes it.
        log_ratio_clamp: bound on ``|log π_θ - log π_old|`` before ``exp``.
        reinforce_is_level / reinforce_is_threshold / reinforce_is_threshold_low: the
            importance weights of ``reinforce_is`` (``none``, ``token`` or ``sequence``;
            truncated at the threshold, or zero outside ``[low, threshold]`` with a low).
        reinforce_is_batch_normalize: divide ``reinforce_is``'s weights by their mean over
            the whole mini-batch (all micro-batches and data-parallel ranks; verl
            ``rollout_is_batch_normalize`` in bypass mode). The loss cannot see the other
            micro-batches, so the actor computes the mean before the mini-batch's update
            with one extra forward and hands the loss ``1/mean`` as a token weight.

    ``dppo_tv`` / ``dppo_kl`` read ``clip_ratio_low`` / ``clip_ratio_high`` as divergence
    thresholds and ``clip_ratio_c`` as the truncation of their importance weight.
    """

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float | None = 3.0
    loss_agg_mode_override: str | None = None
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    topr_positive_weight: float = 1.0
    topr_negative_weight: float = 1.0
    dro_beta: float | None = None
    sppo_eta: float = 1.0
    cispo_unified_mask: bool = False
    log_ratio_clamp: float = 20.0
    reinforce_is_level: str = "none"
    reinforce_is_threshold: float = 2.0
    reinforce_is_threshold_low: float | None = None
    reinforce_is_batch_normalize: bool = False

    def __post_init__(self) -> None:
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(
                f"dual-clip constant clip_ratio_c must be > 1, got {self.clip_ratio_c}"
            )

    @property
    def low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    @classmethod
    def from_roll(
        cls,
        pg_clip: float = 0.2,
        *,
        use_pg_clip_range: bool = False,
        pg_clip_low: float | None = None,
        pg_clip_high: float | None = None,
        dual_clip_loss: bool = False,
    ) -> PolicyLossParams:
        """ROLL's convention: dual clip only if ``dual_clip_loss``, with ``c = 1 + 2·pg_clip``."""
        return cls(
            clip_ratio=pg_clip,
            clip_ratio_low=pg_clip_low if use_pg_clip_range else None,
            clip_ratio_high=pg_clip_high if use_pg_clip_range else None,
            clip_ratio_c=roll_dual_clip_constant(pg_clip) if dual_clip_loss else None,
        )


def roll_dual_clip_constant(pg_clip: float) -> float:
    """ROLL's dual-clip bound ``c = 1 + 2·pg_clip`` (1.4 for ``pg_clip = 0.2``)."""
    return 1.0 + 2.0 * pg_clip


PolicyLossFn = Callable[..., tuple[Tensor, Metrics]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy_loss")

#: Inputs a loss takes besides the common arguments, declared with
#: :func:`needs_inputs`; the caller provides them by these names (keyword arguments),
#: never by the loss's name. ``sample_positive``: ``(B,)``, 1 for a sample whose task
#: score is > 0.
POLICY_LOSS_INPUTS = frozenset({"sample_positive"})
_NEEDS: dict[PolicyLossFn, frozenset[str]] = {}


def needs_inputs(*names: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Declare the extra inputs (of :data:`POLICY_LOSS_INPUTS`) a registered loss takes."""
    unknown = set(names) - POLICY_LOSS_INPUTS
    if unknown:
        raise ValueError(f"unknown policy-loss inputs {sorted(unknown)}")

    def mark(fn: PolicyLossFn) -> PolicyLossFn:
        _NEEDS[fn] = frozenset(names)
        return fn

    return mark


def policy_loss_inputs(name: str) -> frozenset[str]:
    """The extra inputs policy loss ``name`` takes (empty for most)."""
    return _NEEDS.get(POLICY_LOSSES.get(name), frozenset())


class PolicyLossParamError(ValueError):
    """A policy loss cannot run with its parameters; ``param`` names the
    :class:`PolicyLossParams` field at fault, ``want`` what it must be."""

    def __init__(self, param: str, message: str, want: str) -> None:
        super().__init__(message)
        self.param = param
        self.want = want


def _log_ratio(log_prob: Tensor, old_log_prob: Tensor, p: PolicyLossParams) -> Tensor:
    return torch.clamp(log_prob - old_log_prob, -p.log_ratio_clamp, p.log_ratio_clamp)


def _finish(
    pg_losses: Tensor,
    mask: Tensor,
    p: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None,
    metrics: Metrics,
) -> tuple[Tensor, Metrics]:
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    a = agg.with_mode(p.loss_agg_mode_override) if p.loss_agg_mode_override else agg
    loss = a(pg_losses, mask)
    metrics = {"pg_loss": loss.detach(), **{k: v.detach() for k, v in metrics.items()}}
    return loss, metrics


def _ppo_clip_terms(
    ratio: Tensor, adv: Tensor, p: PolicyLossParams
) -> tuple[Tensor, Tensor, Tensor]:
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - p.low, 1.0 + p.high)
    return l1, l2, torch.maximum(l1, l2)


@POLICY_LOSSES.register("vanilla")
def vanilla(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with dual clip.

    ``L = max(-A r, -A clip(r, 1-ε_low, 1+ε_high))``; for ``A < 0`` and dual clip on,
    ``L = min(L, -A c)`` (Ye et al. 2019). Metrics: ``pg_clipfrac`` (share of tokens where
    the clipped term is active), ``pg_clipfrac_lower`` (share capped by the dual clip).
    """
    lr = _log_ratio(log_prob, old_log_prob, params)
    ratio = torch.exp(lr)
    l1, l2, clipped = _ppo_clip_terms(ratio, advantages, params)
    losses = clipped
    lower = torch.zeros_like(clipped, dtype=torch.bool)
    if params.clip_ratio_c is not None:
        l3 = -advantages * params.clip_ratio_c
        lower = (clipped > l3) & (advantages < 0)
        losses = torch.where(advantages < 0, torch.minimum(clipped, l3), clipped)
    m = response_mask
    metrics = {
        "pg_clipfrac": masked_mean((l2 > l1).float(), m),
        "pg_clipfrac_lower": masked_mean(lower.float(), m),
        "ppo_kl": masked_mean(-lr, m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


@POLICY_LOSSES.register("gspo")
def gspo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071).

    Sequence ratio ``s_i = exp(mean_t log(π_θ/π_old))``, applied per token as
    ``s_it = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)]`` (log clamped to ≤ 10, as verl), then the PPO
    clip on ``s_it``: ``L = max(-A s, -A clip(s, 1-ε_low, 1+ε_high))``. With
    ``seq-mean-token-mean`` aggregation the gradient is the paper's ``∇s_i``. No dual clip.
    """
    m = response_mask
    lr = log_prob - old_log_prob
    seq_lr = masked_mean(lr, m, dim=-1)
    log_s = log_prob - log_prob.detach() + seq_lr.detach().unsqueeze(-1)
    s = torch.exp(torch.clamp(log_s, min=-params.log_ratio_clamp, max=10.0))
    l1, l2, losses = _ppo_clip_terms(s, advantages, params)
    metrics = {
        "pg_clipfrac": masked_mean((l2 > l1).float(), m),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-_log_ratio(log_prob, old_log_prob, params), m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


@POLICY_LOSSES.register("cispo")
def cispo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """CISPO (MiniMax-M1, arXiv:2506.13585): clipped IS weight, stop-gradient.

    ``L = -sg[clip(r, 1-ε_low, 1+ε_high)]·A·log π_θ`` — every token keeps a gradient,
    only the weight is clipped. With ``cispo_unified_mask`` (the paper's eq. 7) the token
    loss is multiplied by ``M = 0`` if ``A > 0 and r > 1+ε_high`` or ``A < 0 and
    r < 1-ε_low``, else ``1`` (the token stays in the aggregation's denominator).
    """
    m = response_mask
    lr = _log_ratio(log_prob, old_log_prob, params)
    ratio = torch.exp(lr)
    w = torch.clamp(ratio, 1.0 - params.low, 1.0 + params.high)
    losses = -w.detach() * advantages * log_prob
    if params.cispo_unified_mask:
        drop = ((advantages > 0) & (ratio > 1.0 + params.high)) | (
            (advantages < 0) & (ratio < 1.0 - params.low)
        )
        losses = losses * (~drop).to(losses.dtype)
    metrics = {
        "pg_clipfrac": masked_mean((ratio != w).float(), m),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-lr, m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


@POLICY_LOSSES.register("gpg")
def gpg(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """GPG (arXiv:2504.02546): plain policy gradient ``L = -A·log π_θ`` (no ratio, no clip)."""
    m = response_mask
    losses = -advantages * log_prob
    metrics = {
        "pg_clipfrac": torch.zeros((), device=log_prob.device),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-_log_ratio(log_prob, old_log_prob, params), m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


def check_policy_loss(name: str, params: PolicyLossParams) -> None:
    """Raise :class:`PolicyLossParamError` if loss ``name`` cannot run with ``params``.

    The loss runs once on a two-token example (one positive, one negative advantage),
    with torch's RNG state restored afterwards, so what a loss checks of its parameters
    is found when the config is validated rather than at the first update.
    """
    if params.reinforce_is_batch_normalize and (
        name != "reinforce_is" or params.reinforce_is_level == "none"
    ):
        raise PolicyLossParamError(
            "reinforce_is_batch_normalize",
            "normalizes the importance weights of the reinforce_is loss at a "
            f"reinforce_is_level; policy loss {name} at level {params.reinforce_is_level} "
            "has none",
            "false",
        )
    log_prob = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    agg = LossAggregator.from_mask("token-mean", mask)
    inputs = {"sample_positive": torch.ones(1)}
    with torch.random.fork_rng(devices=[]):
        compute_policy_loss(
            name, log_prob, log_prob, torch.tensor([[1.0, -1.0]]), mask, params, agg, None, inputs
        )


def compute_policy_loss(
    name: str,
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
    inputs: Mapping[str, Tensor] | None = None,
) -> tuple[Tensor, Metrics]:
    """Look up ``name`` in :data:`POLICY_LOSSES` and call it, with the extra ``inputs`` it
    declares (:func:`policy_loss_inputs`; a missing one raises ``KeyError``)."""
    given = inputs or {}
    missing = policy_loss_inputs(name) - set(given)
    if missing:
        raise KeyError(f"policy loss {name!r} needs {', '.join(sorted(missing))}")
    extra = {k: given[k] for k in policy_loss_inputs(name)}
    return POLICY_LOSSES.get(name)(
        log_prob, old_log_prob, advantages, response_mask, params, agg, rollout_is_weights, **extra
    )
