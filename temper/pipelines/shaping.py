"""From scored samples to advantages: the shaping phase of every pipeline's RL step.

The order follows verl's ``compute_advantage`` path with ROLL's keys slotted where ROLL
applies them. A sample's *score* (B,) is its task reward — a reward function's or
reward model's score in RLVR, an episode's return in the agentic pipeline.

1. sequence reward ← score + DAPO overlong penalty + length reward (``add_len_reward``)
2. agentic only: ``agentic.reward_normalization`` within its groups (batch, env group,
   tag, same first prompt)
3. ``reward_norm`` (batch / group / running, with ``reward_shift`` / ``reward_scale``) or
   ROLL's ``use_reward_scaling`` (÷ running std; with ``use_reward_norm`` also − running
   mean); then ``reward_clip``
4. placed on the last model token → ``token_level_scores``; agentic turn mode
   (``agentic.use_turn_rewards``) instead normalizes each turn's reward in its group and
   discounts per turn (see :func:`place_turn_rewards`)
5. − β·KL(rollout policy ‖ reference) per token with ``use_kl_in_reward`` (β from the KL
   controller, which is then updated with the observed KL); ``kl_penalty: full`` uses the
   exact KL over the vocabulary the actor computed (``full_kl``)
6. whiten rewards → advantages (registry ``adv_estimator``) → whiten / clip advantages
7. loss masks, ROLL's way — the samples stay, their ``response_mask`` is zeroed (so they
   add nothing to the loss or its token counts): dynamic sampling's padding groups
   (``sample_mask``), ``max_len_mask`` (cut at the length limit), ``difficulty_mask``
   (prompt groups whose mean score is outside the thresholds). A batch is never emptied.
8. loss weights (``difficulty_loss_weight``, ``length_loss_weight``) → ``sample_weights``
9. PF-PPO (``use_pf_ppo``): the batch resampled with replacement, weighted by score.

All math is in :mod:`temper.algorithms`; this module only composes it from config.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from temper import algorithms as A
from temper.config.schema import (
    ActorConfig,
    AgenticConfig,
    AlgorithmConfig,
    DistillConfig,
    TemperConfig,
)
from temper.data.batch import Batch
from temper.rewards.placement import place_at_last_token
from temper.roles.actor import rollout_correction_weights


@dataclasses.dataclass(frozen=True)
class ShapingSettings:
    """What the shaping phase reads from a config."""

    algo: AlgorithmConfig
    response_length: int  # the overlong buffer's limit (rollout.response_length)
    agentic: AgenticConfig | None = None  # pipeline agentic: its reward normalization
    seed: int = 0  # PF-PPO's resampling stream
    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)  # teachers
    # rollout correction: the optimal-token-baseline estimators weight paths by ρ̄²
    actor: ActorConfig = dataclasses.field(default_factory=ActorConfig)

    @classmethod
    def from_config(
        cls, cfg: TemperConfig, agentic: AgenticConfig | None = None
    ) -> ShapingSettings:
        """The shaping of ``cfg``; ``agentic``: the agentic pipeline's normalization and
        turn rewards (its record passes its section)."""
        return cls(
            algo=cfg.algorithm,
            response_length=cfg.rollout.response_length,
            agentic=agentic,
            seed=cfg.experiment.seed,
            distill=cfg.distill,
            actor=cfg.actor,
        )

    @property
    def turn_mode(self) -> bool:
        return self.agentic is not None and self.agentic.use_turn_rewards


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


def added_terms(batch: Batch, s: ShapingSettings) -> Tensor:
    """Score + overlong penalty + length reward ``(B,)``: verl's ``seq_reward`` (what
    ``filter_groups.metric: reward`` inspects), before any normalization."""
    algo, scores = s.algo, batch["scores"].float()
    lengths = batch["response_mask"].float().sum(-1)
    rewards = scores.clone()
    if algo.overlong_buffer.enable:
        ob = algo.overlong_buffer
        rewards = rewards + A.overlong_penalty(
            lengths, s.response_length, ob.len, ob.penalty_factor
        )
    if algo.add_len_reward:
        rewards = rewards + A.length_reward(scores, lengths, batch["uid"])
    return rewards


def _norm_types(algo: AlgorithmConfig) -> tuple[str | None, str | None]:
    """``(mean_type, std_type)`` of :func:`temper.algorithms.normalize_rewards`."""
    if algo.use_reward_scaling:  # ROLL: ÷ running std; use_reward_norm: − running mean too
        return ("running" if algo.use_reward_norm else None), "running"
    norm = None if algo.reward_norm == "none" else algo.reward_norm
    return A.reward_norm_types(norm, algo.reward_shift, algo.reward_scale)


def _groups(batch: Batch, grouping: str) -> list[Any] | None:
    """Agentic normalization groups: None (the whole batch) or one key per sample."""
    if grouping == "batch":
        return None
    key = {"state": "uid", "tag": "tag", "inductive": "start_key"}[grouping]
    return list(batch[key])


def sequence_rewards(batch: Batch, s: ShapingSettings, state: ShapingState) -> Tensor:
    """Steps 1-3 of the module docstring before clipping: ``(B,)``."""
    rewards = added_terms(batch, s)
    if s.agentic is not None:
        norm = s.agentic.reward_normalization
        groups = _groups(batch, norm.grouping)
        types = {"mean_type": norm.norm_mean_type, "std_type": norm.norm_std_type}
        rewards = A.grouped_reward_normalization(rewards, groups, norm.method, **types)
    mean_type, std_type = _norm_types(s.algo)
    if mean_type or std_type:
        rewards = A.normalize_rewards(
            rewards,
            mean_type=mean_type,
            std_type=std_type,
            group_index=batch["uid"],
            running=state.running,
        )
    return rewards


def place_sequence_rewards(rewards: Tensor, batch: Batch) -> Tensor:
    """``(B,) -> (B, R)``: on each sample's last model token (an episode's last turn)."""
    if "turn_ends" not in batch:
        return place_at_last_token(rewards, batch["response_mask"].float())
    scores = torch.zeros(batch["response_mask"].shape, dtype=torch.float32)
    for k, ends in enumerate(batch["turn_ends"]):
        if ends:
            scores[k, ends[-1]] = rewards[k]
    return scores


def place_turn_rewards(batch: Batch, agentic: AgenticConfig, gamma: float) -> Tensor:
    """Agentic turn mode: ``token_level_scores`` (B, R) from per-turn rewards.

    Each turn reward ``r_k`` is normalized within its group (all turns of the group's
    episodes), then discounted **per turn**, ``G_k = r_k + γ·G_{k+1}``, and
    ``G_k − G_{k+1}`` is placed on turn ``k``'s last model token. The estimator then runs
    with token-level ``γ = 1``, so every token of turn ``k`` has reward-to-go ``G_k``: the
    discount counts turns, not tokens (an observation's length must not change it).
    """
    norm = agentic.reward_normalization
    groups = _groups(batch, norm.grouping)
    scores = torch.zeros(batch["response_mask"].shape, dtype=torch.float32)
    flat = torch.tensor([r for rs in batch["turn_rewards"] for r in rs], dtype=torch.float32)
    flat_groups = None
    if groups is not None:
        flat_groups = [g for g, rs in zip(groups, batch["turn_rewards"]) for _ in rs]
    types = {"mean_type": norm.norm_mean_type, "std_type": norm.norm_std_type}
    normed = A.grouped_reward_normalization(flat, flat_groups, norm.method, **types).tolist()
    at = 0
    for k, ends in enumerate(batch["turn_ends"]):
        turn = normed[at : at + len(ends)]
        at += len(ends)
        following = 0.0
        for j in reversed(range(len(ends))):
            ret = turn[j] + gamma * following
            scores[k, ends[j]] = ret - following
            following = ret
    return scores


def compute_experience(
    batch: Batch, s: ShapingSettings, state: ShapingState, step: int = 0
) -> tuple[Batch, dict[str, float]]:
    """Add ``token_level_scores/rewards``, ``advantages``, ``returns`` (module docstring).

    Needs ``scores`` (B,), ``response_mask``, object ``uid``; ``old_log_probs`` and
    ``ref_log_probs`` (or ``full_kl``) for KL in reward; ``values`` for value-based
    estimators; ``reward_components`` (B, K) for GDPO; the step samples' keys
    (``step_rewards``, ``episode_index``, ``step_index``, ``anchor_index``) for GiGPO. ``step`` seeds PF-PPO's resampling.
    """
    algo = s.algo
    mask = batch["response_mask"].float()
    metrics: dict[str, float] = {"train/score_mean": batch["scores"].float().mean().item()}
    if s.turn_mode:
        assert s.agentic is not None
        token_scores = place_turn_rewards(batch, s.agentic, algo.gamma)
        token_scores, clipped = A.clip_with_fraction(token_scores, algo.reward_clip)
    else:
        rewards, clipped = A.clip_with_fraction(sequence_rewards(batch, s, state), algo.reward_clip)
        token_scores = place_sequence_rewards(rewards, batch)
    metrics["train/reward_clip_frac"] = clipped
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
            kl_matrix=batch["full_kl"] if A.kl_estimator_needs_logits(algo.kl_penalty) else None,
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
        group_index=batch["uid"],
        values=batch.get("values"),
        baseline_rewards=batch.get("baseline_scores"),
        reward_components=batch.get("reward_components"),
        old_log_probs=batch.get("old_log_probs"),
        sum_pi_squared=batch.get("sum_pi_squared"),
        rollout_is_weights=_path_is_weights(batch, s),
        step_rewards=batch.get("step_rewards"),
        episode_index=batch.get("episode_index"),
        step_index=batch.get("step_index"),
        anchor_index=batch.get("anchor_index"),
    )
    weights = algo.gdpo_reward_weights
    params = A.AdvantageParams(
        gamma=1.0 if s.turn_mode else algo.gamma,
        lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        gae_whiten=algo.gae_whiten,
        reward_weights=tuple(weights) if weights is not None else None,
        step_gamma=algo.gigpo_step_gamma,
        episode_weight=algo.gigpo_episode_weight,
        step_weight=algo.gigpo_step_weight,
        sppo_beta=algo.sppo_beta,
    )
    penalty = None
    if s.distill.teachers:  # on-policy distillation: −Σ c_i·KL_i per token
        penalty, distilled = distillation_signal(batch, s.distill, mask)
        metrics.update(distilled)
    # direct gradient (GKD): the divergence is the actor's loss term, never an advantage
    direct = penalty is not None and s.distill.direct_gradient
    if penalty is not None and s.distill.pure:  # the signal is the whole advantage
        advantages = torch.zeros_like(penalty) if direct else -penalty
        returns = advantages
    else:
        advantages, returns = A.compute_advantages(algo.adv_estimator, inputs, params)
        if penalty is not None and not direct:
            advantages = advantages - penalty
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

    metrics.update(_loss_masks(batch, algo))
    metrics.update(_loss_weights(batch, algo))
    if algo.use_pf_ppo:
        batch, pf = _pf_ppo(batch, algo, s.seed, step)
        metrics.update(pf)
    return batch, metrics


def _path_is_weights(batch: Batch, s: ShapingSettings) -> Tensor | None:
    """The rollout IS weights ρ̄ an estimator of Σπ² scales its path weights by (as verl
    computes them before the advantages): the update's own weights of ``actor.rollout_is``
    (:func:`rollout_correction_weights`), None when that is off or the estimator reads no
    Σπ²."""
    if s.actor.rollout_is == "none" or "sum_pi_squared" not in batch:
        return None
    return rollout_correction_weights(s.actor, batch)[0]


def distillation_signal(
    batch: Batch, distill: DistillConfig, mask: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """``(B, R)`` weighted divergence of the student's old log-probs from the teachers'
    (:func:`temper.algorithms.distill_penalty`) and its metrics: per teacher, the mean
    sampled reverse KL ``log π − log π_t`` over the tokens it scored."""
    names = list(distill.teachers)
    student, teacher = batch["old_log_probs"].float(), batch["teacher_log_probs"].float()
    routed = batch["teacher_routed"].bool()
    coefs = [distill.teachers[n].kl_coef for n in names]
    penalty = A.distill_penalty(
        student,
        teacher,
        routed,
        coefs,
        mask,
        distill.kl_penalty,
        log_prob_min=distill.log_prob_min_clamp,
        max_value=distill.loss_max_clamp,
    )
    metrics: dict[str, float] = {}
    total, count = 0.0, 0.0
    for t, name in enumerate(names):
        scored = mask * routed[:, t].unsqueeze(-1).float()
        n = float(scored.sum())
        kl = float(((student - teacher[:, t]) * scored).sum())
        metrics[f"distill/{name}/reverse_kl"] = kl / n if n else 0.0
        metrics[f"distill/{name}/samples"] = float(routed[:, t].sum())
        total, count = total + kl, count + n
    metrics["distill/reverse_kl"] = total / count if count else 0.0
    metrics["distill/penalty_mean"] = float((penalty * mask).sum() / mask.sum().clamp(min=1))
    return penalty, metrics


def _loss_masks(batch: Batch, algo: AlgorithmConfig) -> dict[str, float]:
    """Step 7: zero the ``response_mask`` of samples left out of the loss (ROLL's
    ``final_response_mask``); the batch keeps its size, so it is never empty."""
    n = len(batch)
    keep = (
        batch["sample_mask"].bool() if "sample_mask" in batch else torch.ones(n, dtype=torch.bool)
    )
    metrics: dict[str, float] = {}
    if algo.max_len_mask:
        truncated = torch.tensor([bool(t) for t in batch["truncated"]], dtype=torch.bool)
        keep &= ~truncated
        metrics["train/max_len_masked"] = truncated.float().mean().item()
    if algo.difficulty_mask:
        scores, uid = batch["scores"].float(), batch["uid"]
        inside = A.filter_groups_by_mean(
            scores, uid, algo.difficulty_low_threshold, algo.difficulty_high_threshold
        )
        single = A.group_stats(scores, uid).count <= 1  # ROLL: no mask without a group
        masked = ~(inside | single)
        keep &= ~masked
        metrics["train/difficulty_masked_frac"] = masked.float().mean().item()
    if not keep.all():
        m = batch["response_mask"]
        batch["response_mask"] = m * keep.unsqueeze(-1).to(m.dtype)
    if metrics or "sample_mask" in batch:
        metrics["train/loss_masked_frac"] = 1.0 - keep.float().mean().item()
    return metrics


def _loss_weights(batch: Batch, algo: AlgorithmConfig) -> dict[str, float]:
    """Step 8: ROLL's per-sample loss weights, computed once over the whole step (so the
    micro-batch split cannot change them) and multiplied into the policy loss.

    ``difficulty``: the failure rate of the sample's prompt group, ``1 − mean score``
    clipped to [0, 1] (ROLL reads a ``difficulty`` column that its data pipeline never
    fills; the group's observed failure rate is what the key promises)."""
    if not (algo.difficulty_loss_weight or algo.length_loss_weight):
        return {}
    scores = batch["scores"].float()
    difficulty = 1.0 - A.group_stats(scores, batch["uid"]).mean
    weights = A.sample_loss_weights(
        batch["response_mask"],
        difficulty=difficulty,
        difficulty_loss_weight=algo.difficulty_loss_weight,
        length_loss_weight=algo.length_loss_weight,
    )
    batch["sample_weights"] = weights
    return {
        "train/sample_weight_min": weights.min().item(),
        "train/sample_weight_max": weights.max().item(),
    }


def _pf_ppo(
    batch: Batch, algo: AlgorithmConfig, seed: int, step: int
) -> tuple[Batch, dict[str, float]]:
    """Step 9: PF-PPO (arXiv:2409.06957, verl ``use_pf_ppo``): draw the step's samples
    again with replacement, weighted by their score (``token_level_scores`` summed, as
    verl). verl resamples only under GAE; here every estimator does — the estimator has
    already run, resampling only changes which samples the update sees. The draw is
    seeded by ``(seed, step)``, so it repeats on resume."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    scores = batch["token_level_scores"].sum(-1)
    index = A.pf_ppo_resample_indices(
        scores, algo.pf_ppo.reweight_method, algo.pf_ppo.weight_pow, generator=gen
    )
    unique = len(set(index.tolist()))
    return batch.select(index), {"train/pf_ppo_unique_frac": unique / max(len(batch), 1)}
