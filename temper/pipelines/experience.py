"""From scored responses to advantages: the shaping phase of an RL step.

The order follows verl's ``compute_advantage`` path with ROLL's extra keys slotted
where ROLL applies them:

1. sequence scores (B,) ← reward manager (score_mean is reported *before* shaping)
2. + DAPO overlong penalty, + length reward (``add_len_reward``)
3. reward normalisation (``reward_norm`` with ``reward_shift``/``reward_scale``), clip
4. placed on the last response token → ``token_level_scores``
5. − β·KL(rollout policy ‖ reference) per token when ``use_kl_in_reward`` (β from the
   KL controller, which is then updated with the observed KL)
6. whiten rewards (optional) → advantages (registry ``adv_estimator``) → whiten /
   clip advantages (optional)
7. sample masks: ``max_len_mask`` drops truncated responses from the loss,
   ``difficulty_mask`` / ``filter_groups`` drop whole prompt groups without signal.

All math is in :mod:`temper.algorithms`; this module only composes it from config.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from temper import algorithms as A
from temper.config.schema import AlgorithmConfig, RolloutConfig
from temper.data.batch import Batch
from temper.rewards.placement import place_at_last_token


@dataclasses.dataclass
class ShapingState:
    """Mutable, checkpointed state of the shaping phase."""

    kl_ctrl: Any
    running: A.RunningMoments

    @classmethod
    def from_config(cls, cfg: AlgorithmConfig) -> ShapingState:
        k = cfg.kl_ctrl
        ctrl = A.make_kl_controller(k.type, k.kl_coef, k.target_kl, k.horizon)
        return cls(kl_ctrl=ctrl, running=A.RunningMoments())

    def state_dict(self) -> dict[str, Any]:
        return {"kl_ctrl": self.kl_ctrl.state_dict(), "running": self.running.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.running.load_state_dict(state["running"])


def compute_experience(
    batch: Batch, algo: AlgorithmConfig, rollout: RolloutConfig, state: ShapingState
) -> tuple[Batch, dict[str, float]]:
    """Add ``token_level_rewards``, ``advantages``, ``returns``; maybe drop samples.

    Needs ``scores`` (B,), ``response_mask``, object ``uid``; ``old_log_probs`` and
    ``ref_log_probs`` for KL in reward; ``values`` for value-based estimators.
    """
    mask = batch["response_mask"].float()
    scores = batch["scores"].float()
    uid = batch["uid"]
    lengths = mask.sum(-1)
    metrics: dict[str, float] = {"train/score_mean": scores.mean().item()}

    rewards = scores.clone()
    if algo.overlong_buffer.enable:
        ob = algo.overlong_buffer
        rewards = rewards + A.overlong_penalty(
            lengths, rollout.response_length, ob.len, ob.penalty_factor
        )
    if algo.add_len_reward:
        rewards = rewards + A.length_reward(scores, lengths, uid)
    mean_type, std_type = A.reward_norm_types(
        None if algo.reward_norm == "none" else algo.reward_norm,
        algo.reward_shift,
        algo.reward_scale,
    )
    if mean_type or std_type:
        rewards = A.normalize_rewards(
            rewards, mean_type=mean_type, std_type=std_type, group_index=uid, running=state.running
        )
    rewards, clipped = A.clip_with_fraction(rewards, algo.reward_clip)
    metrics["train/reward_clip_frac"] = clipped
    token_scores = place_at_last_token(rewards, mask)
    batch["token_level_scores"] = token_scores

    if algo.use_kl_in_reward:
        beta = float(state.kl_ctrl.value)
        token_rewards, _kl, current = A.apply_kl_penalty(
            token_scores,
            batch["old_log_probs"],
            batch["ref_log_probs"],
            mask,
            beta,
            algo.kl_penalty,
        )
        state.kl_ctrl.update(float(current), n_steps=len(batch))
        metrics["train/kl_in_reward"] = float(current)
        metrics["train/kl_coef"] = beta
    else:
        token_rewards = token_scores
    if algo.whiten_rewards:
        token_rewards = A.masked_whiten(token_rewards, mask) * mask
    batch["token_level_rewards"] = token_rewards
    metrics["train/reward_mean"] = (token_rewards * mask).sum(-1).mean().item()

    inputs = A.AdvantageInputs(
        token_level_rewards=token_rewards,
        response_mask=mask,
        group_index=uid,
        values=batch.get("values"),
        baseline_rewards=batch.get("baseline_scores"),
    )
    params = A.AdvantageParams(
        gamma=algo.gamma,
        lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        gae_whiten=algo.gae_whiten,
    )
    advantages, returns = A.compute_advantages(algo.adv_estimator, inputs, params)
    if algo.whiten_advantages:
        advantages = A.masked_whiten(advantages, mask) * mask
    advantages, adv_clipped = A.clip_with_fraction(advantages, algo.advantage_clip)
    batch["advantages"] = advantages
    batch["returns"] = returns
    valid = mask > 0
    if valid.any():
        metrics["train/advantage_mean"] = advantages[valid].mean().item()
        metrics["train/advantage_abs_max"] = advantages[valid].abs().max().item()
    metrics["train/advantage_clip_frac"] = adv_clipped

    batch, drop_metrics = _sample_masks(batch, algo)
    metrics.update(drop_metrics)
    return batch, metrics


def _sample_masks(batch: Batch, algo: AlgorithmConfig) -> tuple[Batch, dict[str, float]]:
    """Drop truncated responses from the loss and prompt groups without learning signal."""
    metrics: dict[str, float] = {}
    if algo.max_len_mask:
        truncated = torch.tensor([bool(t) for t in batch["truncated"]])
        batch["response_mask"] = batch["response_mask"] * (~truncated).unsqueeze(-1).to(
            batch["response_mask"].dtype
        )
        metrics["train/max_len_masked"] = truncated.float().mean().item()
    keep = torch.ones(len(batch), dtype=torch.bool)
    scores, uid = batch["scores"].float(), batch["uid"]
    if algo.difficulty_mask:
        keep &= A.filter_groups_by_mean(
            scores, uid, algo.difficulty_low_threshold, algo.difficulty_high_threshold
        )
    fg = algo.filter_groups
    if fg.enable:
        keep &= A.filter_groups_nonzero_std(scores, uid)
        if fg.mean_low is not None or fg.mean_high is not None:
            low = fg.mean_low if fg.mean_low is not None else -float("inf")
            high = fg.mean_high if fg.mean_high is not None else float("inf")
            keep &= A.filter_groups_by_mean(scores, uid, low, high)
    if algo.difficulty_mask or fg.enable:
        metrics["train/kept_samples_frac"] = keep.float().mean().item()
        if not keep.all():
            batch = batch.select(keep.nonzero().squeeze(-1))
    return batch, metrics
