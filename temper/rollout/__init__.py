"""Generation engines behind one interface (``hf``, ``vllm``; ``sglang`` by name only).

``build_rollout_engine(rollout_cfg, model_cfg, module=...)`` picks the engine named
by ``rollout.engine`` (``auto``: vllm where installed, else hf);
``sampling_params_from_config`` turns ``rollout.*`` (or ``rollout.val.*``) into the
``SamplingParams`` every engine takes.
"""

from temper.rollout.base import RolloutEngine, SamplingParams
from temper.rollout.registry import (
    ROLLOUT_ENGINES,
    build_rollout_engine,
    register_rollout_engine,
    sampling_params_from_config,
)

__all__ = [
    "ROLLOUT_ENGINES",
    "RolloutEngine",
    "SamplingParams",
    "build_rollout_engine",
    "register_rollout_engine",
    "sampling_params_from_config",
]
