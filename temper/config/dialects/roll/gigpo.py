"""ROLL's env manager classes and its GiGPO keys, in temper's terms.

- ``custom_envs.<tag>.env_manager_cls``: ROLL builds each tag's envs with the class it
  names (``TrajEnvManager`` when absent). temper runs one env manager for the agentic
  section, ``agentic.env_manager``: ``TrajEnvManager`` is ``trajectory``,
  ``StepEnvManager`` is ``step``, ``StepConcatEnvManager`` is ``step_concat``,
  ``VLTrajEnvManager`` is ``vl_trajectory``, ``AgentNativeStepEnvManager`` is
  ``agent_native`` (its env words the messages: the tags' ``agent_system_template`` /
  ``agent_template`` are read by nothing, noted), ``ProxyEnvManager`` with
  ``agent_runner_cls: GEMRunner`` is ``gem_runner``; other classes and runners, and tags
  of one run that disagree, are refused.
- with ``StepEnvManager``, ``StepConcatEnvManager`` or ``AgentNativeStepEnvManager`` a sample is one step's prompt and answer within
  ``sequence_length``: ``data.max_prompt_length`` = ``sequence_length`` − the per-turn
  ``max_new_tokens`` bounds each step's prompt;
- ROLL env types that cannot run here are refused by name with the reason:
  ``webshop``, ``rock_tb_native_env``, ``openreward_env`` (:data:`UNAVAILABLE_ENVS`);
- ``sokoban_sandbox`` plays in temper's own sandbox (``reward.sandbox``,
  :mod:`temper.envs.sokoban_sandbox`): its ``env_config`` keys for ROLL's ROCK service
  (``base_url``, ``server_start_timeout``) are noted and dropped (:data:`ROCK_KEYS`);
- ``custom_envs.<tag>.history_length``: the step-wise manager's window →
  ``agentic.custom_envs.<tag>.history_length``; the trajectory manager keeps the whole
  episode and reads no window (noted).
- ``adv_estimator: step_reinforce`` (:func:`step_reinforce`) → ``reinforce`` over step
  samples scored by their return-to-go (``agentic.step_score``).
- ``adv_estimator: gigpo`` with ``step_reward_gamma``, ``episode_reward_weight``,
  ``step_reward_weight`` → ``algorithm.gigpo_*``. ROLL normalizes the episode scores with
  ``reward_normalization`` and the step returns with the same ``method`` in their anchor
  groups; temper's ``gigpo`` estimator does both normalizations itself, by mean or by
  mean and std (``algorithm.norm_adv_by_std_in_grpo``), so
  ``agentic.reward_normalization`` is left at ``identity`` and the method decides the
  estimator's. Settings whose two levels would differ are refused.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.apply import refusal
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.paths import MISSING
from temper.config.dialects.roll.derive import Ctx
from temper.config.dialects.roll.transforms import listify
from temper.config.errors import ConfigError

_PKG = "roll.pipeline.agentic.env_manager"
TRAJ = f"{_PKG}.traj_env_manager.TrajEnvManager"
STEP = f"{_PKG}.step_env_manager.StepEnvManager"
CONCAT = f"{_PKG}.step_concat_env_manager.StepConcatEnvManager"
VL = f"{_PKG}.vl_traj_env_manager.VLTrajEnvManager"
NATIVE = f"{_PKG}.agent_native_env_manager.AgentNativeStepEnvManager"
PROXY = f"{_PKG}.proxy_env_manager.ProxyEnvManager"
GEM_RUNNER = "roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner"
#: ROLL agent runners a ProxyEnvManager may drive that temper runs -> ``agentic.env_manager``
AGENT_RUNNERS = {GEM_RUNNER: "gem_runner"}
#: ROLL env manager classes temper runs -> ``agentic.env_manager``
ENV_MANAGER_CLASSES = {
    TRAJ: "trajectory",
    STEP: "step",
    CONCAT: "step_concat",
    VL: "vl_trajectory",
    NATIVE: "agent_native",
}
#: env managers whose samples are single env steps
STEP_KINDS = ("step", "step_concat", "agent_native")
#: ROLL's GiGPO keys -> temper's
GIGPO_KEYS = {
    "step_reward_gamma": "algorithm.gigpo_step_gamma",
    "episode_reward_weight": "algorithm.gigpo_episode_weight",
    "step_reward_weight": "algorithm.gigpo_step_weight",
}
#: ROLL env types temper has no environment for, and why it cannot have one here
UNAVAILABLE_ENVS = {
    "webshop": "WebShop's environment is a web shop server searching an index of about a "
    "million products (built with pyserini, which needs Java); neither the index nor the "
    "server ships with temper",
    "rock_tb_native_env": "ROLL's RockTBNativeEnv plays terminal-bench tasks inside "
    "containers that a ROCK sandbox service starts (docker images of the tasks); neither "
    "the service nor the images are reachable from temper",
    "openreward_env": "ROLL's OpenRewardEnv plays the tasks of the OpenReward service "
    "through its SDK and API (remote sessions and tools); the service is not reachable "
    "from temper",
}
#: env types ROLL plays through a ROCK sandbox service and temper in its own sandbox ->
#: their env_config keys that address the service
ROCK_KEYS = {"sokoban_sandbox": ("base_url", "server_start_timeout")}
_NORMALIZES = {
    "mean": ("group", None),
    "mean_std": ("group", "group"),
    "asym_clip": ("group", "group"),
}
_FIX_NORM = (
    "set reward_normalization: {grouping: traj_group_id, method: mean} (ROLL's gigpo "
    "examples), or method: mean_std"
)


@derivation(
    "custom_envs.*.env_manager_cls",
    "custom_envs.*.history_length",
    "custom_envs.*.agent_runner_cls",
    "custom_envs.*.agent_system_template",
    "custom_envs.*.agent_template",
    "sequence_length",
    "{mgr}.tags",
    mgr=("train_env_manager", "val_env_manager"),
    fields=(
        "agentic.custom_envs",
        "rollout.response_length",
    ),
)
def env_manager(ctx: Ctx) -> None:
    """``custom_envs.*.env_manager_cls`` → ``agentic.env_manager`` (module docstring)."""
    envs = ctx.get("custom_envs") or {}
    kinds: dict[str, str] = {}
    for tag, spec in envs.items():
        cls = spec.get("env_manager_cls") if isinstance(spec, dict) else None
        key = f"custom_envs.{tag}.env_manager_cls"
        if cls == PROXY:
            kinds[tag] = _agent_runner(tag, spec)
            continue
        if cls is not None and cls not in ENV_MANAGER_CLASSES:
            raise refusal(
                key,
                "a custom ROLL env manager class cannot run here (temper runs ROLL's "
                "TrajEnvManager, StepEnvManager, StepConcatEnvManager and VLTrajEnvManager)",
                cls,
                f"use {TRAJ}, {STEP} or {CONCAT}, or remove env_manager_cls",
            )
        kinds[tag] = ENV_MANAGER_CLASSES[cls] if cls is not None else "trajectory"
    used = [
        str(t)
        for mgr in ("train_env_manager", "val_env_manager")
        for t in listify(ctx.get(f"{mgr}.tags"))
        if t in kinds
    ]
    for tag in dict.fromkeys(used):
        env_type = envs[tag].get("env_type") if isinstance(envs[tag], dict) else None
        if env_type in UNAVAILABLE_ENVS:
            raise ConfigError(
                f"custom_envs.{tag}.env_type",
                f"unknown value '{env_type}': {UNAVAILABLE_ENVS[env_type]}",
                "use a tag of a built-in env type (sokoban plays the game in process; "
                "frozen_lake, countdown, bandit, the GEM ones), or register your own with "
                "temper.envs.register_env",
            )
    _rock_service(ctx, envs)
    chosen = {kinds[t] for t in used}
    if len(chosen) > 1:
        which = ", ".join(f"{t}: {kinds[t]}" for t in dict.fromkeys(used))
        raise ConfigError(
            f"custom_envs.{used[0]}.env_manager_cls",
            f"the env managers' tags use different env manager classes ({which}); temper "
            "runs one env manager for all tags of a run",
            f"give every tag the same env_manager_cls ({TRAJ} or {STEP})",
        )
    kind = chosen.pop() if chosen else "trajectory"
    named = [
        t for t in dict.fromkeys(used) if isinstance(envs[t], dict) and "env_manager_cls" in envs[t]
    ]
    if named:
        ctx.write("agentic.env_manager", kind, f"custom_envs.{named[0]}.env_manager_cls")
    seq, response = ctx.get("sequence_length"), ctx.native_get("rollout.response_length")
    if kind in STEP_KINDS and seq is not None and response is not None:
        # a step sample is one prompt and one answer inside sequence_length, as ROLL pads
        # it; ROLL's agentic pipeline reads no prompt_length (its RLVR bound)
        ctx.replace("data.max_prompt_length", seq - response, "sequence_length")
    if kind == "agent_native":
        _native_templates(ctx, envs)
    for tag, spec in envs.items():
        if not isinstance(spec, dict) or spec.get("history_length") is None:
            continue
        key = f"custom_envs.{tag}.history_length"
        if kind in STEP_KINDS:
            ctx.write(f"agentic.custom_envs.{tag}.history_length", spec["history_length"], key)
        else:
            ctx.inert("a window of past steps is read by ROLL's StepEnvManager only", key)


def _rock_service(ctx: Ctx, envs: dict[str, Any]) -> None:
    """The ROCK service keys of the tags temper plays in its own sandbox: noted, dropped."""
    for tag, spec in envs.items():
        keys = ROCK_KEYS.get(str(spec.get("env_type"))) if isinstance(spec, dict) else None
        native = f"agentic.custom_envs.{tag}.env_config"
        config = dict(ctx.native_get(native) or {})
        if not keys or not set(keys) & set(config):
            continue
        for name in keys:
            if config.pop(name, None) is not None:
                ctx.inert(
                    f"{spec['env_type']} plays in temper's own sandbox (reward.sandbox), not "
                    "in a ROCK service",
                    f"custom_envs.{tag}.env_config.{name}",
                )
        ctx.replace(native, config, f"custom_envs.{tag}.env_config")


def _native_templates(ctx: Ctx, envs: dict[str, Any]) -> None:
    """``AgentNativeStepEnvManager``'s envs word their own messages: the tags' templates
    are read by nothing (ROLL's native example fills them with placeholders)."""
    tags: dict[str, Any] = ctx.native_get("agentic.custom_envs") or {}
    for tag, spec in tags.items():
        if not isinstance(envs.get(tag), dict) or envs[tag].get("env_manager_cls") != NATIVE:
            continue
        for src, dst in (
            ("agent_system_template", "system_template"),
            ("agent_template", "turn_template"),
        ):
            dropped = ctx.out.drop(f"agentic.custom_envs.{tag}.{dst}")
            if isinstance(spec, dict) and dropped is not None and dropped.value is not None:
                ctx.inert(
                    "AgentNativeStepEnvManager's env writes the messages (env_config "
                    "system_template / observation_suffix)",
                    f"custom_envs.{tag}.{src}",
                )


def _agent_runner(tag: str, spec: dict[str, Any]) -> str:
    """A ``ProxyEnvManager`` tag's ``agent_runner_cls`` → ``agentic.env_manager``: its
    ``GEMRunner`` plays a local env (``gem_runner``); the ROCK runners drive agents in
    sandboxes that cannot start here."""
    runner = spec.get("agent_runner_cls")
    if runner in AGENT_RUNNERS:
        return AGENT_RUNNERS[runner]
    raise refusal(
        f"custom_envs.{tag}.agent_runner_cls",
        "a custom ROLL agent runner cannot run here; ProxyEnvManager runs with ROLL's "
        "GEMRunner only (its ROCK agent runners drive agents inside sandboxes a ROCK "
        "service starts, which temper cannot reach)",
        runner,
        f"use agent_runner_cls: {GEM_RUNNER}, or env_manager_cls {TRAJ}",
    )


@derivation(
    "adv_estimator",
    "step_reward_weight",
    "episode_reward_weight",
    "step_reward_gamma",
    "reward_normalization.{k}",
    k=("grouping", "method", "norm_mean_type", "norm_std_type"),
    fields=("agentic.reward_normalization.method",),
)
def gigpo(ctx: Ctx) -> None:
    """``adv_estimator: gigpo``'s keys and normalization (module docstring)."""
    if ctx.get("adv_estimator") == "step_reinforce":
        step_reinforce(ctx)
        return
    if ctx.get("adv_estimator") != "gigpo":
        for key in GIGPO_KEYS:
            if ctx.has(key):
                ctx.inert("read by the gigpo estimator only", key)
        return
    for key, dst in GIGPO_KEYS.items():
        if ctx.has(key):
            ctx.write(dst, ctx.get(key), key)
    grouping = ctx.get("reward_normalization.grouping", "batch")
    method = ctx.get("reward_normalization.method", "identity")
    if grouping not in ("traj_group_id", "state"):
        raise ConfigError(
            "reward_normalization.grouping",
            f"{grouping!r} with adv_estimator gigpo: temper's gigpo compares an episode's "
            "return with the other episodes of its env group (traj_group_id) only",
            _FIX_NORM,
        )
    step_types = _NORMALIZES.get(method)
    mean = ctx.get("reward_normalization.norm_mean_type", MISSING)
    std = ctx.get("reward_normalization.norm_std_type", MISSING)
    episode_types = (
        step_types[0] if step_types and mean is MISSING else mean,
        step_types[1] if step_types and std is MISSING else std,
    )
    if step_types is None or episode_types != step_types:
        raise ConfigError(
            "reward_normalization.method",
            f"{method!r} with adv_estimator gigpo: temper's gigpo normalizes episode "
            "returns and step returns in their groups the same way, by the group mean or "
            "by mean and std (ROLL takes the step level's from method alone)",
            _FIX_NORM,
        )
    by_std = step_types[1] == "group"
    ctx.write("algorithm.norm_adv_by_std_in_grpo", by_std, "reward_normalization.method")
    # the estimator normalizes both levels itself
    method_key = "agentic.reward_normalization.method"
    ctx.replace(method_key, "identity", ctx.out.source(method_key, "reward_normalization.method"))
    ctx.out.drop("agentic.reward_normalization.norm_mean_type")
    ctx.out.drop("agentic.reward_normalization.norm_std_type")
    ctx.remark(
        f"adv_estimator: gigpo: reward_normalization {method} (grouping {grouping}) is done "
        "by the gigpo estimator at both levels: algorithm.norm_adv_by_std_in_grpo="
        f"{str(by_std).lower()}, agentic.reward_normalization.method=identity"
    )


@derivation("step_reward_gamma", "episode_reward_weight", "step_reward_weight")
def step_reinforce(ctx: Ctx) -> None:
    """``adv_estimator: step_reinforce``: every step sample's score is its episode's
    discounted return from that step on (``step_reward_gamma``), normalized by
    ``reward_normalization`` as ROLL normalizes it, then the reinforce return →
    ``algorithm.adv_estimator: reinforce``, ``agentic.step_score: return_to_go``."""
    ctx.write("algorithm.adv_estimator", "reinforce", "adv_estimator")
    ctx.write("agentic.step_score", "return_to_go", "adv_estimator")
    if ctx.has("step_reward_gamma"):
        ctx.write("agentic.step_score_gamma", ctx.get("step_reward_gamma"), "step_reward_gamma")
    for key in ("episode_reward_weight", "step_reward_weight"):
        if ctx.has(key):
            ctx.inert("read by the gigpo estimator only", key)
