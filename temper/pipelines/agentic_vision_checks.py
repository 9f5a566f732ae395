"""What the VL trajectory env manager (:mod:`temper.pipelines.agentic_vision`) cannot
honour (``check``) and what it needs of the model (``temper check``'s pre-flight)."""

from __future__ import annotations

from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.envs import resolve_tag

__all__ = ["check_vision_model", "check_vl_trajectory", "not_vision"]


def check_vision_model(cfg: TemperConfig) -> None:
    """``temper check``: the model is a vision-language model (its config has a vision
    tower); a model that cannot be read here is reported by the model's own checks."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(
            cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
        )
    except (OSError, ValueError):
        return
    if getattr(config, "vision_config", None) is None:
        raise not_vision(cfg.model.path)


def not_vision(path: str) -> ConfigError:
    return ConfigError(
        "model.path",
        f"{path} is not a vision-language model (its config has no vision_config); "
        "agentic.env_manager vl_trajectory shows each state as an image",
        "use a vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), or "
        "agentic.env_manager: trajectory for text observations",
    )


def check_vl_trajectory(cfg: TemperConfig) -> None:
    """The VL trajectory manager plays one conversation per episode and shows states as
    images: a window of past steps, step scores and tools are other managers' features;
    a partial rollout continues text-only turns."""
    if cfg.async_training.partial_rollout_segment:
        raise ConfigError(
            "async_training.partial_rollout_segment",
            "a partial rollout continues a turn by re-sending its prompt and tokens so far as "
            "token ids; the vl_trajectory env manager's turns also carry each state's image "
            "pixels, which the continuation does not carry (not built)",
            "set it to 0 (streaming still hands each env group over as it finishes)",
        )
    if cfg.agentic.step_score != "episode":
        raise ConfigError(
            "agentic.step_score",
            f"{cfg.agentic.step_score}: the vl_trajectory env manager makes one sample per "
            "episode, which has no step of its own to score from",
            "set agentic.step_score: episode",
        )
    if cfg.rollout.multi_turn.tool_config_path:
        raise ConfigError(
            "rollout.multi_turn.tool_config_path",
            "the vl_trajectory env manager's turns are env actions on images; it runs no tools",
            "remove it, or use agentic.env_manager: trajectory",
        )
    for tag, spec in cfg.agentic.custom_envs.items():
        key = f"agentic.custom_envs.{tag}"
        if spec.history_length is not None:
            raise ConfigError(
                f"{key}.history_length",
                "the vl_trajectory env manager shows the whole episode",
                "remove it",
            )
        if spec.turn_template or spec.turn_prompt:
            which = "turn_template" if spec.turn_template else "turn_prompt"
            raise ConfigError(
                f"{key}.{which}",
                "the vl_trajectory env manager writes each turn as pre_step_template, the "
                "state image and next_step_template",
                f"move its text into pre_step_template / next_step_template, remove {which}",
            )
        if any(tag in m.tags for m in (cfg.agentic.train_env_manager, cfg.agentic.val_env_manager)):
            _check_renders(tag, spec, key)
        if spec.tool_wrapper.tools:
            raise ConfigError(
                f"{key}.tool_wrapper",
                "the vl_trajectory env manager runs no tools",
                "remove tool_wrapper, or use agentic.env_manager: trajectory",
            )


def _check_renders(tag: str, spec: Any, key: str) -> None:
    """A played tag's env must draw its state as an image (its class's ``render_modes``)."""
    env_cls = resolve_tag(tag, spec).cls
    if "rgb_array" not in env_cls.render_modes and not env_cls.image_observations:
        raise ConfigError(
            f"{key}.env_type",
            f"env type '{spec.env_type}' renders no rgb_array image (only "
            f"{', '.join(env_cls.render_modes)}); the vl_trajectory env manager shows each "
            "state as an image",
            "use an env type with images (sokoban, frozen_lake), or agentic.env_manager: "
            "trajectory",
        )
