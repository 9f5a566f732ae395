"""The algorithm library: pure tensor math of an RL step, registered by config name.

Layer rule: imports torch and the standard library only. Parameters arrive as the
dataclasses defined here (:class:`AdvantageParams`, :class:`PolicyLossParams`,
:class:`LossAggregator`) or as keyword scalars.
"""

from __future__ import annotations

from temper.algorithms import (  # noqa: F401  (register the variants)
    advantages_gigpo,
    advantages_variants,
    policy_losses_trust,
    policy_losses_variants,
    sppo,
)
from temper.algorithms.advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    discounted_returns,
    estimator_inputs,
    estimator_params,
    own_params,
)
from temper.algorithms.aggregation import (
    LOSS_AGG_MODES,
    GlobalNormalizers,
    LossAggregator,
    compute_global_normalizers,
)
from temper.algorithms.distill import distill_penalty, route_by_tag
from temper.algorithms.groups import GroupStats, as_group_ids, group_stats
from temper.algorithms.kd import KD_OBJECTIVES, KDParams
from temper.algorithms.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    KLNeedsLogitsError,
    apply_kl_penalty,
    kl_estimator_needs_logits,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from temper.algorithms.logprobs import (
    entropy_from_logits,
    full_kl_from_logits,
    logprobs_and_entropy,
    logprobs_from_logits,
    response_logprobs_from_sequence_logits,
    sum_pi_squared_from_logits,
)
from temper.algorithms.masked import masked_mean, masked_sum, masked_var, masked_whiten
from temper.algorithms.objectives import actor_loss, entropy_loss, nll_loss, sft_loss
from temper.algorithms.policy_losses import (
    POLICY_LOSSES,
    PolicyLossParamError,
    PolicyLossParams,
    check_policy_loss,
    compute_policy_loss,
    policy_loss_inputs,
    roll_dual_clip_constant,
)
from temper.algorithms.preference import (
    PREFERENCE_LOSSES,
    PreferenceParams,
    preference_loss,
    sequence_log_probs,
)
from temper.algorithms.reward_model import (
    REWARD_MODEL_LOSSES,
    RewardLossParams,
    bradley_terry_loss,
)
from temper.algorithms.reward_shaping import (
    REWARD_NORMALIZATION_METHODS,
    REWARD_NORMS,
    RunningMoments,
    clip_with_fraction,
    format_penalty,
    grouped_reward_normalization,
    length_reward,
    normalize_rewards,
    overlong_penalty,
    reward_norm_types,
)
from temper.algorithms.rollout_correction import (
    ROLLOUT_IS_LEVELS,
    ROLLOUT_RS_LEVELS,
    ROLLOUT_RS_STATS,
    RejectionFilter,
    rollout_is_weights,
    rollout_rejection_mask,
)
from temper.algorithms.sample_filters import (
    PF_PPO_REWEIGHT,
    filter_groups_by_mean,
    filter_groups_nonzero_std,
    pf_ppo_resample_indices,
    pf_ppo_weights,
    sample_loss_weights,
)
from temper.algorithms.value_loss import value_loss
from temper.registry import Registry, UnknownNameError

#: config key -> the registry of its valid values (for the config validator).
REGISTRIES: dict[str, Registry] = {
    "adv_estimator": ADV_ESTIMATORS,
    "policy_loss": POLICY_LOSSES,
    "kl_penalty": KL_ESTIMATORS,
    "kl_loss_type": KL_ESTIMATORS,
    "loss_agg_mode": LOSS_AGG_MODES,
    "kl_ctrl.type": KL_CONTROLLERS,
    "reward_norm": REWARD_NORMS,
    "reward_normalization.method": REWARD_NORMALIZATION_METHODS,
    "pf_ppo.reweight_method": PF_PPO_REWEIGHT,
    "rollout_correction.rollout_is": ROLLOUT_IS_LEVELS,
    "rollout_correction.rollout_rs_stat": ROLLOUT_RS_STATS,
    "rollout_correction.rollout_rs_level": ROLLOUT_RS_LEVELS,
    "dpo_loss": PREFERENCE_LOSSES,
    "reward_model_loss": REWARD_MODEL_LOSSES,
    "kd_objective": KD_OBJECTIVES,
}


def registry_names() -> dict[str, list[str]]:
    """``config key -> sorted valid names`` (aliases included), e.g.
    ``{"adv_estimator": ["gae", "gpg", "grpo", …], …}``. ``reward_norm`` and
    ``rollout_correction.rollout_is`` also accept ``null`` (disabled)."""
    return {key: reg.names() for key, reg in REGISTRIES.items()}


def check_name(key: str, name: str) -> str:
    """Validate ``name`` for config ``key``; returns the canonical name or raises
    :class:`UnknownNameError` (``unknown adv_estimator 'grpoo', did you mean 'grpo'?``)."""
    reg = REGISTRIES.get(key)
    if reg is None:
        raise UnknownNameError("algorithm config key", key, sorted(REGISTRIES))
    if name not in reg:
        raise UnknownNameError(key, name, reg.names())
    return reg.canonical(name)


__all__ = [
    "ADV_ESTIMATORS",
    "KD_OBJECTIVES",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "PF_PPO_REWEIGHT",
    "POLICY_LOSSES",
    "PREFERENCE_LOSSES",
    "REGISTRIES",
    "REWARD_MODEL_LOSSES",
    "REWARD_NORMALIZATION_METHODS",
    "REWARD_NORMS",
    "ROLLOUT_IS_LEVELS",
    "ROLLOUT_RS_LEVELS",
    "ROLLOUT_RS_STATS",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageParams",
    "FixedKLController",
    "GlobalNormalizers",
    "GroupStats",
    "KDParams",
    "KLController",
    "KLNeedsLogitsError",
    "LossAggregator",
    "PolicyLossParamError",
    "PolicyLossParams",
    "PreferenceParams",
    "Registry",
    "RejectionFilter",
    "RewardLossParams",
    "RunningMoments",
    "UnknownNameError",
    "actor_loss",
    "apply_kl_penalty",
    "as_group_ids",
    "bradley_terry_loss",
    "check_name",
    "check_policy_loss",
    "clip_with_fraction",
    "compute_advantages",
    "compute_global_normalizers",
    "compute_policy_loss",
    "discounted_returns",
    "distill_penalty",
    "entropy_from_logits",
    "entropy_loss",
    "estimator_inputs",
    "estimator_params",
    "filter_groups_by_mean",
    "filter_groups_nonzero_std",
    "format_penalty",
    "full_kl_from_logits",
    "group_stats",
    "grouped_reward_normalization",
    "kl_estimator_needs_logits",
    "kl_loss",
    "kl_penalty",
    "length_reward",
    "logprobs_and_entropy",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "nll_loss",
    "normalize_rewards",
    "overlong_penalty",
    "own_params",
    "pf_ppo_resample_indices",
    "pf_ppo_weights",
    "policy_loss_inputs",
    "preference_loss",
    "registry_names",
    "response_logprobs_from_sequence_logits",
    "reward_norm_types",
    "roll_dual_clip_constant",
    "rollout_is_weights",
    "rollout_rejection_mask",
    "route_by_tag",
    "sample_loss_weights",
    "sequence_log_probs",
    "sft_loss",
    "sum_pi_squared_from_logits",
    "value_loss",
]
