"""Rows of the ROLL key table for the worker sections (actor_train, actor_infer, …).

Most keys recur in every role with a role-specific fate, so they are generated here per
role; ``roll.table`` adds them to the table.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.apply import refusal
from temper.config.dialects.core.rules import Map, Note, Refuse, Rule, Same, Use
from temper.config.dialects.roll import derive, rewards
from temper.config.dialects.roll.transforms import (
    ATTN,
    DTYPES,
    GENERATING_ARGS,
    LR_SCHEDULERS,
    choice,
    uniform,
)
from temper.config.dialects.roll.versions import ADDITIONS, OVERRIDES

TRAIN_NOTE = "this role does not train"
GEN_NOTE = "this role does not generate"
JUDGE_USE = "reward.judge.* (LLMJudgeRewardWorker); noted for rule workers"
DATA_NOTE = "prompts are built once, from actor_train.data_args"
ROLL_FORCES_ONE = "ROLL uses one device per worker for this strategy"
RAY_ENV = "merged into resources.ray.system_envs"


def _model_args(role: str) -> dict[str, Rule]:
    path_use = Use("model.path (all policy roles share one model)", derive.model)
    if role == "actor_train":
        return {
            "model_args.dtype": Map("model.dtype", choice(DTYPES, "actor_train.model_args.dtype")),
            "model_args.disable_gradient_checkpointing": Map(
                "model.enable_gradient_checkpointing", lambda v, _ctx: not v
            ),
            "model_args.flash_attn": Map(
                "model.attn_implementation", choice(ATTN, "actor_train.model_args.flash_attn")
            ),
            "model_args.model_name_or_path": path_use,
            "model_args.trust_remote_code": Map("model.trust_remote_code"),
            "model_args.model_type": _model_type(role),
            "model_args.freeze_module_prefix": Map("actor.freeze_module_prefix", split_names),
        }
    rules: dict[str, Rule] = {
        "model_args.disable_gradient_checkpointing": Note("no backward pass in this role")
        if role != "critic"
        else Note("the critic follows model.enable_gradient_checkpointing"),
        "model_args.flash_attn": Note(
            "the attention kernel of a forward-only role does not "
            "change its results beyond float rounding"
        ),
        "model_args.model_type": _model_type(role),
        "model_args.trust_remote_code": Same(
            "actor_train.model_args.trust_remote_code", "all roles load the model the same way"
        ),
    }
    rules["model_args.freeze_module_prefix"] = (
        Map("critic.freeze_module_prefix", split_names)
        if role == "critic"
        else Note(f"{TRAIN_NOTE}: nothing to freeze")
    )
    if role == "actor_infer":
        rules["model_args.dtype"] = Map("rollout.dtype", choice(DTYPES, f"{role}.model_args.dtype"))
        rules["model_args.model_name_or_path"] = path_use
    elif role in ("reference", "critic"):
        rules["model_args.dtype"] = Same(
            "actor_train.model_args.dtype", f"the {role} runs in model.dtype"
        )
        rules["model_args.model_name_or_path"] = (
            path_use if role == "reference" else Map("critic.model_path")
        )
    return rules


def _model_type(role: str) -> Refuse:
    return Refuse(
        "temper loads the policy roles with AutoModelForCausalLM (critic: plus a value head)",
        f"remove {role}.model_args.model_type",
        ok=lambda v, _ctx: v is None,
    )


def _training_args(role: str) -> dict[str, Rule]:
    keys = (
        "learning_rate",
        "weight_decay",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "warmup_steps",
        "warmup_ratio",
        "num_train_epochs",
        "lr_scheduler_type",
        "max_grad_norm",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "max_steps",
        "seed",
    )
    if role not in ("actor_train", "critic"):
        return {f"training_args.{k}": Note(TRAIN_NOTE) for k in keys}
    dst = "actor" if role == "actor_train" else "critic"
    return {
        "training_args.learning_rate": Map(f"{dst}.optim.lr"),
        "training_args.weight_decay": Map(f"{dst}.optim.weight_decay"),
        "training_args.per_device_train_batch_size": Map(f"{dst}.micro_batch_size_per_device"),
        "training_args.gradient_accumulation_steps": Use(
            f"{dst}.mini_batch_size", derive.mini_batch
        ),
        "training_args.warmup_steps": Map(f"{dst}.optim.warmup_steps"),
        "training_args.warmup_ratio": Map(f"{dst}.optim.warmup_ratio"),
        "training_args.num_train_epochs": Note("ROLL derives the trainer's steps from max_steps"),
        "training_args.lr_scheduler_type": Map(
            f"{dst}.optim.lr_scheduler",
            choice(LR_SCHEDULERS, f"{role}.training_args.lr_scheduler_type"),
        ),
        "training_args.max_grad_norm": Map(f"{dst}.grad_clip"),
        "training_args.adam_beta1": Use(f"{dst}.optim.betas[0]", derive.mini_batch),
        "training_args.adam_beta2": Use(f"{dst}.optim.betas[1]", derive.mini_batch),
        "training_args.adam_epsilon": Map(f"{dst}.optim.eps"),
        "training_args.max_steps": Note("ROLL overwrites it from the pipeline max_steps"),
        "training_args.seed": Note("ROLL overwrites it with the pipeline seed"),
    }


def _data_args(role: str) -> dict[str, Rule]:
    keys = (
        "file_name",
        "prompt",
        "messages",
        "dataset_dir",
        "domain_interleave_probs",
        "interleave_probs",
        "preprocessing_num_workers",
        "tag",
        "response",
        "id",
        "eval_file_name",
        "dataset_type",
        "cache_path",
        *VISION_KEYS,
        *VIDEO_KEYS,
        "custom_data_kwargs_func",
    )
    template: Rule = Same("actor_train.data_args.template", DATA_NOTE)
    if role != "actor_train":
        rules: dict[str, Rule] = {f"data_args.{k}": Note(DATA_NOTE) for k in keys}
        rules["data_args.template"] = template
        return rules
    return {
        **_vision_data_args(),
        "data_args.template": Use(
            "data.chat_template (native; named templates -> native)", derive.data_files
        ),
        "data_args.file_name": Use("data.train_files (joined with dataset_dir)", derive.data_files),
        "data_args.dataset_dir": Use("data.train_files / data.val_files", derive.data_files),
        "data_args.eval_file_name": Use("data.val_files", derive.eval_files),
        "data_args.prompt": Map("data.prompt_key"),
        "data_args.messages": Map("data.messages_key"),
        "data_args.tag": Map("data.tag_key"),
        "data_args.response": Map("data.ground_truth_key"),
        "data_args.domain_interleave_probs": Map("data.source_weights"),
        "data_args.interleave_probs": Refuse(
            "per-file interleave probabilities are not supported (files are concatenated)",
            "remove interleave_probs; weight domains with domain_interleave_probs",
            ok=uniform,
            why="uniform over files, which is how temper concatenates them",
        ),
        "data_args.preprocessing_num_workers": Note("tokenization parallelism only"),
        "data_args.id": Note("temper numbers rows itself"),
        "data_args.dataset_type": Note("temper reads the format from the file extension"),
        "data_args.cache_path": Note("temper does not cache preprocessed datasets"),
    }


VISION_KEYS = ("image_max_pixels", "image_min_pixels", "image_folder")
VIDEO_KEYS = (
    "video_max_pixels",
    "video_min_pixels",
    "video_total_pixels",
    "video_fps",
    "video_max_frames",
    "video_resize_chunk_frames",
    "video_folder",
    "audio_folder",
)
#: The video keys that set how videos are read (the rest are memory or audio).
VIDEO_SAMPLING_KEYS = (
    "video_max_pixels",
    "video_min_pixels",
    "video_total_pixels",
    "video_fps",
    "video_max_frames",
    "video_folder",
)
NO_AUDIO = (
    "audio inputs are not supported (the Qwen-Omni audio encoder is not in temper's "
    "vision-language family; images and videos are)"
)


#: ROLL's custom data functions whose rows temper reads -> data.row_format.
DATA_FUNCTIONS = {"roll.datasets.vlm_dataset_utils.video_r1_get_data_kwargs": "video_r1"}


def _data_function(value: Any, _ctx: Any = None) -> str:
    """``data.row_format`` of a ROLL custom data function (None: rows as they are)."""
    if value is None:
        return "none"
    if value in DATA_FUNCTIONS:
        return DATA_FUNCTIONS[value]
    raise refusal(
        "actor_train.data_args.custom_data_kwargs_func",
        "a custom ROLL data function (Python that builds the prompts from its own columns, "
        "as ROLL's audio_test one does) cannot run here; of them temper reads the rows of "
        f"{', '.join(DATA_FUNCTIONS)}",
        value,
        "remove custom_data_kwargs_func and give rows a prompt with <video> (or <image>) "
        "marks and a 'videos' (or 'images') column",
    )


def split_names(value: object, _ctx: Any = None) -> list[str]:
    """ROLL's comma-separated list argument (``"a,b"`` or a list) as a list."""
    items = value if isinstance(value, (list, tuple)) else str(value or "").split(",")
    return [str(v).strip() for v in items if str(v).strip()]


def _vision_data_args() -> dict[str, Rule]:
    """actor_train.data_args of ROLL's vision-language pipeline (images: column
    ``images``, ``<image>`` in the prompt; videos: column ``videos``, ``<video>``;
    temper.data.vision and temper.data.video)."""
    return {
        "data_args.image_max_pixels": Map("data.image_max_pixels"),
        "data_args.image_min_pixels": Map("data.image_min_pixels"),
        "data_args.image_folder": Map("data.image_folder"),
        "data_args.video_max_pixels": Map("data.video_max_pixels"),
        "data_args.video_min_pixels": Map("data.video_min_pixels"),
        "data_args.video_total_pixels": Map("data.video_total_pixels"),
        "data_args.video_fps": Map("data.video_fps"),
        "data_args.video_max_frames": Map("data.video_max_frames"),
        "data_args.video_folder": Map("data.video_folder"),
        "data_args.video_resize_chunk_frames": Note(
            "memory only: temper resizes a video's frames one at a time"
        ),
        "data_args.audio_folder": Refuse(
            NO_AUDIO, "remove audio_folder and the rows' audio", ok=lambda v, _ctx: v is None
        ),
        "data_args.custom_data_kwargs_func": Map("data.row_format", _data_function),
    }


def _generating_args(role: str) -> dict[str, Rule]:
    keys = GENERATING_ARGS
    if role == "actor_infer":
        return {
            "generating_args.max_new_tokens": Use("rollout.response_length", derive.lengths),
            "generating_args.temperature": Map("rollout.temperature"),
            "generating_args.top_p": Map("rollout.top_p"),
            "generating_args.top_k": Map("rollout.top_k"),
            "generating_args.do_sample": Map("rollout.do_sample"),
            "generating_args.repetition_penalty": Map("rollout.repetition_penalty"),
            "generating_args.num_beams": _beams(role),
            "generating_args.num_return_sequences": Use(
                "must equal num_return_sequences_in_group", derive.lengths
            ),
        }
    if role == "validation":
        return {
            "generating_args.max_new_tokens": Note(
                "ROLL recomputes it from the sequence lengths; validation uses "
                "rollout.response_length"
            ),
            "generating_args.temperature": Use("rollout.val.temperature / do_sample", derive.data),
            "generating_args.top_p": Map("rollout.val.top_p"),
            "generating_args.top_k": Map("rollout.val.top_k"),
            "generating_args.do_sample": Map("rollout.val.do_sample"),
            "generating_args.num_return_sequences": Map("rollout.val.n"),
            "generating_args.num_beams": _beams(role),
            "generating_args.repetition_penalty": Same(
                "actor_infer.generating_args.repetition_penalty", "one engine setting"
            ),
        }
    if role == "rewards.*":
        return {f"generating_args.{k}": Use(JUDGE_USE, rewards.rewards) for k in keys}
    if role == "reward":  # an agentic file's reward worker generates its envs' verdicts
        use = Use(
            "agentic: reward.judge.* (the envs' LLM judge); noted for a reward model",
            rewards.agentic_judge,
        )
        return {f"generating_args.{k}": use for k in keys}
    return {f"generating_args.{k}": Note(GEN_NOTE) for k in keys}


def _beams(role: str) -> Refuse:
    return Refuse(
        "beam search is not RL sampling",
        f"set {role}.generating_args.num_beams: 1",
        ok=lambda v, _ctx: v in (None, 1),
    )


def _placement(role: str) -> dict[str, Rule]:
    res = {
        "actor_train": "actor_train",
        "actor_infer": "actor_infer",
        "reference": "reference",
        "critic": "critic",
        "reward": "reward",
    }.get(role)
    rules: dict[str, Rule] = {
        "strategy_args.strategy_name": Use("the role's engine", derive.strategies),
        "strategy_args.strategy_config": Use("the engine's settings", derive.strategies),
        "device_mapping": Use(f"resources.{res or 'reward'}", derive.placement),
        "world_size": Use("checked against device_mapping", derive.placement),
        "num_gpus_per_worker": Note(ROLL_FORCES_ONE),
        "model_update_frequency": Note("weights sync from actor_train to actor_infer only"),
        "infer_batch_size": Note("forward micro-batch of a role temper does not run separately"),
        "system_envs": Use(RAY_ENV, derive.placement),
        "worker_cls": Use("checked: ROLL's own role classes only", derive.placement),
        "name": Note("ROLL's role name; temper names roles itself"),
        "use_dynamic_batching_in_train": Note(TRAIN_NOTE),
        "max_tokens_per_microbatch_in_train": Note(TRAIN_NOTE),
    }
    if role == "actor_train":
        rules.update(
            {
                "infer_batch_size": Map("actor.log_prob_micro_batch_size_per_device"),
                "model_update_frequency": Map("rollout.model_update_frequency"),
                "use_dynamic_batching_in_train": Map("actor.use_dynamic_bsz"),
                "max_tokens_per_microbatch_in_train": Map("actor.max_token_len_per_device"),
            }
        )
    elif role == "critic":
        rules.update(
            {
                "infer_batch_size": Map("critic.log_prob_micro_batch_size_per_device"),
                "use_dynamic_batching_in_train": Map("critic.use_dynamic_bsz"),
                "max_tokens_per_microbatch_in_train": Map("critic.max_token_len_per_device"),
            }
        )
    elif role == "actor_infer":
        rules.update(
            {
                "infer_batch_size": Map("rollout.infer_batch_size"),
                "num_gpus_per_worker": Map("resources.devices_per_infer_worker"),
                "model_update_frequency": Map("rollout.model_update_frequency"),
            }
        )
    elif role == "reference":
        rules["infer_batch_size"] = Map("reference.log_prob_micro_batch_size_per_device")
    elif role == "reward":
        rules["infer_batch_size"] = Map("reward.model.micro_batch_size_per_device")
    elif role == "rewards.*":
        rules.update(
            {
                "infer_batch_size": Note("rule rewards score one response per call"),
                "world_size": Use("reward.num_workers", rewards.rewards),
            }
        )
    elif role == "validation":
        for key in (
            "strategy_args.strategy_name",
            "strategy_args.strategy_config",
            "device_mapping",
            "world_size",
            "infer_batch_size",
            "system_envs",
            "worker_cls",
        ):
            rules[key] = Note("validation generates with the actor_infer engine")
    return rules


def worker_rules(role: str) -> dict[str, Rule]:
    rules = {
        **_model_args(role),
        **_training_args(role),
        **_data_args(role),
        **_generating_args(role),
        **_placement(role),
    }
    return {f"{role}.{k}": v for k, v in rules.items()}


def worker_rows(role: str) -> dict[str, Rule]:
    """Worker ``role``'s rows of the RL table (its version additions and overrides
    included): what ROLL's other pipelines start their workers' rows from."""
    rows = {**ADDITIONS, **worker_rules(role), **OVERRIDES}
    return {k: v for k, v in rows.items() if k.startswith(f"{role}.")}
