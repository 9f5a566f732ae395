"""Played episodes → a training ``Batch``: one sequence per trajectory, rewards, advantages.

Each trajectory becomes one row (see :mod:`temper.rollout.multiturn`): ``prompt_ids`` =
the first prompt (instruction + first observation), ``response_ids`` = everything
after it, ``response_mask`` 1 only on model tokens, ``rollout_log_probs`` 0 elsewhere,
``attention_mask`` 1 on every real token (observations are context the model attends
to, just not trained on).

Rewards (ROLL agentic). The env's turn rewards already hold the ``format_penalty`` of
invalid answers (the env manager adds it). Then:

* **trajectory mode** (default): the episode return ``Σ_k r_k`` is normalized (below)
  and placed on the trajectory's last model token; the advantage estimator sees it as an
  outcome reward (``algorithm.gamma`` acts per token as in RLVR).
* **turn mode** (``agentic.use_turn_rewards``): each turn reward ``r_k`` is normalized,
  then discounted **per turn**, ``G_k = r_k + γ·G_{k+1}`` with ``γ = algorithm.gamma``,
  and ``G_k − G_{k+1}`` is placed on turn ``k``'s last model token. The estimator runs
  with token-level ``γ = 1``, so every token of turn ``k`` has reward-to-go ``G_k``: the
  discount counts turns, not tokens (an observation's length must not change it).

Normalization (``agentic.reward_normalization``), within each group of ``grouping``:
``batch`` (the whole step), ``state`` (episodes of one env group: same seed and
config — ROLL's ``traj_group_id``), ``tag`` (episodes of one env tag), ``inductive``
(episodes whose first prompt is identical, i.e. the same start state found from the
text rather than the seed); by ``method``: ``identity`` (none), ``mean`` (subtract the
group mean), ``mean_std`` (z-score; 0 for a group of one or without spread),
``asym_clip`` (z-score clipped to [-1, 3]) — :func:`temper.algorithms.grouped_reward_normalization`.
In turn mode the group's turn rewards (all turns of all its episodes) form the group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from temper import algorithms as A
from temper.config.schema import AgenticConfig, AlgorithmConfig
from temper.data.batch import Batch
from temper.pipelines.experience import ShapingState
from temper.rollout.multiturn import Trajectory, trajectory_tensors


def trajectory_batch(trajs: Sequence[Trajectory], pad_token_id: int) -> Batch:
    """Rows of token tensors + per-episode objects (``uid``, ``tag``, return, success …)."""
    tensors = trajectory_tensors(trajs, pad_token_id)
    objects: dict[str, list[Any]] = {
        "uid": [str(t.meta.get("uid", k)) for k, t in enumerate(trajs)],
        "tag": [str(t.meta.get("tag", "")) for t in trajs],
        "episode_return": [t.episode_return for t in trajs],
        "success": [bool(t.infos[-1].get("success", False)) if t.infos else False for t in trajs],
        "num_turns": [t.num_turns for t in trajs],
        "invalid_actions": [sum(not i.get("format_ok", True) for i in t.infos) for t in trajs],
        "truncated": [t.stop_reason == "context" for t in trajs],
        "stop_reason": [t.stop_reason for t in trajs],
        "turn_rewards": [list(t.turn_rewards) for t in trajs],
        "turn_ends": [list(t.turn_ends) for t in trajs],
        "start_key": [(t.meta.get("tag", ""), tuple(t.prompt_ids)) for t in trajs],
    }
    return Batch.from_dict(tensors, objects)


def _group_index(batch: Batch, grouping: str) -> list[Any] | None:
    if grouping == "batch":
        return None
    key = {"state": "uid", "tag": "tag", "inductive": "start_key"}[grouping]
    return list(batch[key])


def place_rewards(batch: Batch, agentic: AgenticConfig, gamma: float) -> torch.Tensor:
    """``token_level_scores`` (B, R): normalized returns or discounted turn rewards."""
    norm = agentic.reward_normalization
    groups = _group_index(batch, norm.grouping)
    mask = batch["response_mask"]
    scores = torch.zeros(mask.shape, dtype=torch.float32)
    if not agentic.use_turn_rewards:
        returns = torch.tensor(batch["episode_return"], dtype=torch.float32)
        normed = A.grouped_reward_normalization(returns, groups, norm.method)
        for k, ends in enumerate(batch["turn_ends"]):
            if ends:
                scores[k, ends[-1]] = normed[k]
        return scores
    flat = torch.tensor([r for rs in batch["turn_rewards"] for r in rs], dtype=torch.float32)
    flat_groups = None
    if groups is not None:
        flat_groups = [g for g, rs in zip(groups, batch["turn_rewards"]) for _ in rs]
    normed = A.grouped_reward_normalization(flat, flat_groups, norm.method).tolist()
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


def agentic_experience(
    batch: Batch, algo: AlgorithmConfig, agentic: AgenticConfig, state: ShapingState
) -> tuple[Batch, dict[str, float]]:
    """Add ``token_level_scores/rewards``, ``advantages``, ``returns`` to a trajectory batch.

    The agentic sibling of :func:`temper.pipelines.experience.compute_experience`: same
    KL-in-reward, estimator, whitening and clipping; rewards placed per turn or per
    trajectory (module docstring). RLVR-only shaping (overlong buffer, length reward,
    ``reward_norm`` running moments, group filters) does not apply to episodes.
    """
    mask = batch["response_mask"].float()
    token_scores = place_rewards(batch, agentic, algo.gamma)
    token_scores, clipped = A.clip_with_fraction(token_scores, algo.reward_clip)
    batch["token_level_scores"] = token_scores
    metrics = {"train/reward_clip_frac": clipped}
    if algo.use_kl_in_reward:
        beta = float(state.kl_ctrl.value)
        token_rewards, _, current = A.apply_kl_penalty(
            token_scores,
            batch["old_log_probs"],
            batch["ref_log_probs"],
            mask,
            beta,
            algo.kl_penalty,
        )
        state.kl_ctrl.update(float(current), n_steps=len(batch))
        metrics.update({"train/kl_in_reward": float(current), "train/kl_coef": beta})
    else:
        token_rewards = token_scores
    if algo.whiten_rewards:
        token_rewards = A.masked_whiten(token_rewards, mask) * mask
    batch["token_level_rewards"] = token_rewards
    metrics["train/normalized_reward_mean"] = (token_rewards * mask).sum(-1).mean().item()
    inputs = A.AdvantageInputs(
        token_level_rewards=token_rewards,
        response_mask=mask,
        group_index=batch["uid"],
        values=batch.get("values"),
    )
    params = A.AdvantageParams(
        gamma=1.0 if agentic.use_turn_rewards else algo.gamma,
        lam=algo.lam,
        norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo,
        gae_whiten=algo.gae_whiten,
    )
    advantages, returns = A.compute_advantages(algo.adv_estimator, inputs, params)
    if algo.whiten_advantages:
        advantages = A.masked_whiten(advantages, mask) * mask
    advantages, adv_clipped = A.clip_with_fraction(advantages, algo.advantage_clip)
    batch["advantages"], batch["returns"] = advantages, returns
    valid = mask > 0
    if valid.any():
        metrics["train/advantage_mean"] = advantages[valid].mean().item()
        metrics["train/advantage_abs_max"] = advantages[valid].abs().max().item()
    metrics["train/advantage_clip_frac"] = adv_clipped
    return batch, metrics


def episode_metrics(batch: Batch, prefix: str) -> dict[str, float]:
    """Return, success (overall and per tag), turns and invalid-action rate of episodes.

    ``prefix`` ``train``: ``train/reward_mean``, ``train/success_rate``,
    ``env/<tag>/success_rate``, ``env/num_turns_mean``, ``env/invalid_action_rate``;
    ``val``: the same under ``val/`` (``val/env/<tag>/…``).
    """
    n = max(len(batch), 1)
    turns = sum(batch["num_turns"])
    env = "env" if prefix == "train" else f"{prefix}/env"
    returns = batch["episode_return"]
    out = {
        f"{prefix}/reward_mean": sum(returns) / n,
        f"{prefix}/success_rate": sum(batch["success"]) / n,
        f"{env}/num_turns_mean": turns / n,
        f"{env}/invalid_action_rate": sum(batch["invalid_actions"]) / max(turns, 1),
        f"{env}/context_stop_frac": sum(batch["truncated"]) / n,
    }
    for tag in sorted(set(batch["tag"])):
        rows = [k for k, t in enumerate(batch["tag"]) if t == tag]
        out[f"{env}/{tag}/success_rate"] = sum(batch["success"][k] for k in rows) / len(rows)
        out[f"{env}/{tag}/return_mean"] = sum(returns[k] for k in rows) / len(rows)
    return out


def trajectory_rows(
    batch: Batch, step: int, decode: Callable[[list[int]], str]
) -> list[dict[str, Any]]:
    """Dump rows (``rollout_data_dir`` / ``validation_data_dir``), one per episode.

    Besides the episode's return, success, turns and stop reason: ``prompt`` (the first
    prompt), ``response`` (everything after it) and ``segments`` — the response cut
    where ``response_mask`` changes, each ``{"trained": 0|1, "text": …}``: what the
    loss saw (the model's own turns) and what was only context (template scaffolding,
    observations, tool output). ``advantage``: mean over trained tokens, when present.
    """
    prompt_len = batch["prompt_ids"].shape[1]
    lengths = batch["attention_mask"][:, prompt_len:].sum(-1).tolist()
    adv = None
    if "advantages" in batch:
        m = batch["response_mask"].float()
        adv = ((batch["advantages"] * m).sum(-1) / m.sum(-1).clamp(min=1)).tolist()
    rows = []
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        ids = batch["response_ids"][i][: int(lengths[i])].tolist()
        mask = batch["response_mask"][i][: int(lengths[i])].tolist()
        segments: list[dict[str, Any]] = []
        start = 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or mask[k] != mask[start]:
                segments.append({"trained": int(mask[start]), "text": decode(ids[start:k])})
                start = k
        row: dict[str, Any] = {
            "step": step,
            "uid": batch["uid"][i],
            "tag": batch["tag"][i],
            "episode_return": float(batch["episode_return"][i]),
            "success": bool(batch["success"][i]),
            "num_turns": int(batch["num_turns"][i]),
            "stop_reason": batch["stop_reason"][i],
            "response_length": int(sum(mask)),
            "prompt": decode(prompt),
            "response": decode(ids),
            "segments": segments,
        }
        if adv is not None:
            row["advantage"] = adv[i]
        rows.append(row)
    return rows
