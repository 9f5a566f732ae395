"""The value transforms and name tables of the ROLL key table's rows (the rule kinds
are :mod:`core.rules`'): transforms take ``(value, ctx)``, and derivations call them with
the value alone."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from temper.config.dialects.core.apply import unsupported

# --------------------------------------------------------------------------- value transforms

TRAIN_STRATEGIES = {
    "deepspeed_train": "deepspeed",
    "megatron_train": "megatron",
    "fsdp2_train": "fsdp2",
    "hf_train": "torch",
    "torch": "torch",
}
INFER_STRATEGIES = {  # reference / reward model: a training engine run forward-only
    "megatron_infer": "megatron",
    "deepspeed_infer": "deepspeed",
    "fsdp2_infer": "fsdp2",
    "hf_infer": "torch",
    "megatron_train": "megatron",
    "deepspeed_train": "deepspeed",
    "fsdp2_train": "fsdp2",
}
ROLLOUT_ENGINES = {"vllm": "vllm", "sglang": "sglang", "hf_infer": "hf"}
#: ROLL's tracker names (``roll/utils/tracking.py``); its in-house ``ml_tracker`` is not
#: public, and ROLL has no mlflow tracker
TRACKERS = {
    "wandb": "wandb",
    "tensorboard": "tensorboard",
    "stdout": "console",
    "swanlab": "swanlab",
    "trackio": "trackio",
}
DTYPES = {
    "fp32": "fp32",
    "float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    None: "auto",
    "auto": "auto",
}
ATTN = {
    "fa2": "flash_attention_2",
    "flash_attention_2": "flash_attention_2",
    "sdpa": "sdpa",
    "eager": "eager",
    "disabled": "eager",
    "auto": "auto",
    None: "auto",
}
LR_SCHEDULERS = {
    "constant": "constant",
    "constant_with_warmup": "constant",
    "linear": "linear",
    "cosine": "cosine",
}
GROUPINGS = {
    "state": "state",
    "traj_group_id": "state",
    "batch": "batch",
    "tags": "tag",
    "tag": "tag",
    "inductive": "inductive",
}
# ROLL reward worker classes temper replaces -> temper reward function names.
REWARD_WORKERS = {
    "MathRuleRewardWorker": "math",
    "CrossThinkQARuleRewardWorker": "crossthinkqa",
    "CodeSandboxRewardWorker": "code",
    "GeneralRuleRewardWorker": "ifeval",
    "LLMJudgeRewardWorker": "llm_judge",
    "DetectionRewardWorker": "detection",
    "VideoR1RewardWorker": "video_r1",
}
# ROLL's per-domain reward keys (``rewards.<name>.<key>``) that a reward function may
# read as a keyword argument, and which of them each function reads; the others are
# noted as having no effect (ROLL's MathRuleRewardWorker reads format_pattern only to
# log it).
ROUTE_KWARGS = (
    "reward_type",
    "response_length_penalty_coef",
    "use_local",
    "code_url",
    "judge_prompt",
    "judge_model_type",
    "judge_model_name",
    "judge_api_url",
    "judge_api_key",
    "format_pattern",
)
# temper.rewards.functions.crossthinkqa.REWARD_TYPES (config imports nothing of rewards)
CROSSTHINKQA_REWARD_TYPES = ("loose", "soft", "strict")
FUNCTION_KWARGS = {
    "math": frozenset(),
    "crossthinkqa": frozenset({"reward_type", "response_length_penalty_coef"}),
    "code": frozenset(),
    "ifeval": frozenset(),
    "llm_judge": frozenset(),
    "detection": frozenset(),
}
# ROLL's DET_IOU_THRESHOLD values (temper.rewards.functions.detection.MATCH_THRESHOLDS and
# IOU_THRESHOLD_MODES; config imports nothing of rewards)
DET_IOU_THRESHOLDS = (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99)
DET_IOU_MODES = ("average", "dynamic")
# Worker classes whose behaviour is temper's own role logic for that role.
ROLE_WORKERS = {
    "actor_train": {
        "roll.pipeline.rlvr.actor_worker.ActorWorker",
        "roll.pipeline.agentic.agentic_actor_worker.ActorWorker",
        "roll.pipeline.base_worker.ActorWorker",
        # the policy-gradient workers: actor_train.pg_variant picks the loss (roll_pg)
        "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker",
        "roll.pipeline.agentic.agentic_actor_pg_worker.ActorWorker",
    },
    "actor_infer": {
        "roll.pipeline.base_worker.InferWorker",
        "roll.pipeline.base_worker.ActorWorker",
    },
    "reference": {
        "roll.pipeline.rlvr.actor_worker.ActorWorker",
        "roll.pipeline.base_worker.ActorWorker",
    },
    "critic": {"roll.pipeline.base_worker.CriticWorker"},
    "reward": {"roll.pipeline.base_worker.RewardWorker", "roll.pipeline.base_worker.InferWorker"},
    "env": {"roll.pipeline.agentic.environment_worker.EnvironmentWorker"},
}


def choice(table: Mapping[Any, str | None], key: str) -> Callable[..., Any]:
    """A transform through ``table`` that raises a ConfigError naming ``key``."""

    def fn(value: Any, _ctx: Any = None) -> Any:
        if value in table:
            return table[value]
        raise unsupported(key, value, sorted(str(k) for k in table if k is not None))

    return fn


def listify(value: Any, _ctx: Any = None) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def nonpositive_none(value: Any, _ctx: Any = None) -> Any:
    return None if value is not None and value <= 0 else value


def negative_none(value: Any, _ctx: Any = None) -> Any:
    return None if value is not None and value < 0 else value


def zero_none(value: Any, _ctx: Any = None) -> Any:
    return value or None


def str_values(value: Any, _ctx: Any = None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}


def uniform(value: Any, _ctx: Any = None) -> bool:
    if value is None:
        return True
    parts = [float(p) for p in str(value).split(",") if p.strip()]
    return len(set(parts)) <= 1


#: The keys of a ROLL worker's ``generating_args`` (its HF-style sampling settings).
GENERATING_ARGS = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "num_beams",
    "num_return_sequences",
    "do_sample",
    "repetition_penalty",
)
