"""Agentic trajectories as training rows, their metrics and their dump rows.

:func:`trajectory_batch` turns played episodes into a scored :class:`Batch` — the
token tensors (env tokens masked out of ``response_mask``), ``scores`` = each episode's
return, and per-episode objects: ``uid`` (the env group: same seed and config, ROLL's
``traj_group_id``), ``tag``, success, turns, per-turn rewards and where each turn ends.
How returns or turn rewards become token rewards and advantages is the shared shaping
phase (:mod:`temper.pipelines.shaping`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from temper.data.batch import Batch
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
        "tool_calls": [sum(bool(i.get("tool_call")) for i in t.infos) for t in trajs],
        "tool_successes": [
            sum(bool(i.get("tool_call")) and not i.get("tool_error") for i in t.infos)
            for t in trajs
        ],
        "env_errors": [sum(bool(i.get("env_error")) for i in t.infos) for t in trajs],
        "stop_reason": [t.stop_reason for t in trajs],
        "turn_rewards": [list(t.turn_rewards) for t in trajs],
        "turn_ends": [list(t.turn_ends) for t in trajs],
        "start_key": [(t.meta.get("tag", ""), tuple(t.prompt_ids)) for t in trajs],
    }
    returns = torch.tensor(objects["episode_return"], dtype=torch.float32)
    return Batch.from_dict({**tensors, "scores": returns}, objects)


def episode_metrics(batch: Batch, prefix: str) -> dict[str, float]:
    """Return, success (overall and per tag), turns and invalid-action rate of episodes.

    ``prefix`` ``train``: ``train/reward_mean`` (the mean return), ``train/success_rate``,
    ``env/<tag>/success_rate``, ``env/num_turns_mean``, ``env/invalid_action_rate``,
    ``env/tool_calls_mean`` and ``env/tool_success_rate`` (the share of calls that ran),
    ``env/env_errors`` (episodes a failed env run ended);
    ``val``: the same under ``val/`` (``val/env/<tag>/…``). In a training step the
    shaping phase's ``train/score_mean`` (the same mean return) and ``train/reward_mean``
    (after normalization and KL) take the place of the first.
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
    if "tool_calls" in batch:  # env tool wrappers (temper.envs.tool_wrapper)
        calls = sum(batch["tool_calls"])
        out[f"{env}/tool_calls_mean"] = calls / n
        out[f"{env}/tool_success_rate"] = sum(batch["tool_successes"]) / max(calls, 1)
    if "env_errors" in batch:  # sandboxed envs' failed runs (temper.envs.sokoban_sandbox)
        out[f"{env}/env_errors"] = float(sum(batch["env_errors"]))
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
