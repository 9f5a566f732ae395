"""ROLL's RLVR rollout pipeline (``RLVRRolloutPipeline``, ``start_rlvr_rollout_pipeline.py``)
as ``temper eval`` reads an RLVR file: temper's ``rlvr_rollout`` pipeline.

ROLL runs it on the ordinary RLVR file (its shell example names ``rlvr_config_8gpus``):
it builds ``actor_infer`` and the reward workers only, generates once over
``validation.data_args.file_name`` with ``validation.generating_args`` and scores with the
file's rewards. So the same file, read for ``temper eval``, is translated as for training
(every key mapped, noted or refused as there, but for the workers it does not build:
``UNBUILT``, whose refusals and agreements with other workers are not checked), then what
only training reads is dropped, each with a note saying why (:func:`drop_training_keys`). ROLL's own assertions are kept,
one refusal each (:func:`roll_assertions`): validation data set, a vLLM or SGLang engine
that loads the weights (``load_format`` not ``dummy``, ROLL's default when absent), vLLM's
``sleep_level`` 1.

``UNREAD`` and ``SECTIONS`` are also what the native pipeline refuses
(:mod:`temper.pipelines.rlvr_rollout`): one list of what the rollout does not read.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.roll.derive import Ctx
from temper.config.errors import ConfigError

PIPELINE = "rlvr_rollout"
TRAINS_NOTHING = "ROLL's RLVR rollout pipeline trains nothing"
#: Native sections the rollout reads nothing of, and why.
SECTIONS = {
    **{
        section: f"{TRAINS_NOTHING}: it builds actor_infer and the reward workers only"
        for section in ("actor", "critic", "reference", "algorithm", "distill", "async_training")
    },
    "generate": "the rollout's prompts are the validation set",
    "evaluate": "the rollout generates its responses; it reads none from files",
    "agentic": "an RLVR rollout scores prompts; environments are the agentic rollout's",
}
#: ROLL's workers the rollout builds none of: their keys are checked against nothing
#: (``Ctx.unread``), as a worker that never starts reads none of them.
UNBUILT = {
    worker: f"{TRAINS_NOTHING}: it builds actor_infer and the reward workers only"
    for worker in ("actor_train", "reference", "critic")
}
_TRAIN_DATA = "the rollout generates over validation.data_args.file_name only"
_SAMPLING = "the training prompts' sampling; the rollout generates each validation prompt once"
_TRAIN_SAMPLING = "training sampling; the rollout samples with validation.generating_args"
#: Native keys of read sections the rollout reads nothing of, and why.
UNREAD = {
    "data.train_files": _TRAIN_DATA,
    "data.train_max_samples": _TRAIN_DATA,
    **{
        f"data.{key}": _SAMPLING
        for key in (
            "train_batch_size",
            "gen_batch_size",
            "shuffle",
            "dataloader_drop_last",
            "source_weights",
            "source_domains",
            "source_default_domain",
        )
    },
    **{f"rollout.{key}": _TRAIN_SAMPLING for key in ("n", "temperature", "top_p", "top_k")},
    "rollout.do_sample": _TRAIN_SAMPLING,
    **{
        f"model.{key}": f"{TRAINS_NOTHING}: a training setting"
        for key in (
            "enable_gradient_checkpointing",
            "enable_activation_offload",
            "use_remove_padding",
            "use_liger",
            "use_fused_kernels",
        )
    },
    "rollout.model_update_frequency": f"{TRAINS_NOTHING}: no weights are synced",
    "rollout.update_weights_bucket_megabytes": f"{TRAINS_NOTHING}: no weights are synced",
    **{
        f"reward.{key}": "the limits of training steps' reward failures; a failed reward "
        "scores reward.failure_score and is counted"
        for key in ("max_failure_fraction", "max_failed_steps")
    },
}
#: The experiment and resources keys the rollout reads (as ``temper.cluster.generation``
#: places a generation's engines); the others are training's.
EXPERIMENT_READS = (
    "seed",
    "device",
    "output_dir",
    "trackers",
    "tracker_kwargs",
    "project_name",
    "experiment_name",
    "log_val_generations",
)
RESOURCE_READS = ("backend", "nnodes", "devices_per_node", "actor_infer", "ray")
#: The ROLL defaults (``roll.table.ROLL_DEFAULTS``) of keys the rollout reads.
DEFAULTS_READ = ("prompt_length", "val_batch_size")
#: ROLL logs this many generate examples of the rollout.
EXAMPLES = 10

INFER = "actor_infer.strategy_args"


def is_rlvr_rollout(command: str, given: dict[str, Any]) -> bool:
    """An RLVR file (no env managers) read by ``temper eval``."""
    return command == "eval" and "train_env_manager" not in given


def roll_assertions(given: dict[str, Any]) -> None:
    """What ``RLVRRolloutPipeline`` asserts before it builds anything, refused here in one
    line each, naming the key."""
    strategy = (given.get("actor_infer") or {}).get("strategy_args") or {}
    name = strategy.get("strategy_name")
    config = strategy.get("strategy_config") or {}
    load_format = config.get("load_format", "dummy")
    if name in ("vllm", "sglang") and load_format == "dummy":
        raise ConfigError(
            f"{INFER}.strategy_config.load_format",
            f"the rollout generates with the weights the {name} engine loads and syncs none: "
            f"'dummy' (ROLL's default when absent) loads random ones (ROLL's rollout pipeline "
            "refuses it too)",
            "set load_format: auto",
        )
    if name == "vllm" and config.get("sleep_level", 1) != 1:
        raise ConfigError(
            f"{INFER}.strategy_config.sleep_level",
            f"ROLL's rollout pipeline runs vLLM with sleep_level 1 (got {config['sleep_level']})",
            "set sleep_level: 1, or remove it",
        )
    validation = given.get("validation") or {}
    data_args = validation.get("data_args") if isinstance(validation, dict) else None
    if not data_args or not data_args.get("file_name"):
        raise ConfigError(
            "validation.data_args.file_name",
            "ROLL's RLVR rollout pipeline generates over the validation set, and none is given",
            "set validation.data_args.file_name (a jsonl of prompts with their tags)",
        )


def unread_reason(native: str) -> str | None:
    """Why the rollout reads nothing of native key ``native`` (None: it reads it)."""
    section, _, key = native.partition(".")
    if section in SECTIONS:
        return SECTIONS[section]
    if native in UNREAD:
        return UNREAD[native]
    top = key.split(".")[0]
    if section == "experiment" and top not in EXPERIMENT_READS:
        return f"{TRAINS_NOTHING}: no steps, checkpoints or training schedule"
    if section == "resources" and top not in RESOURCE_READS:
        return (
            "the devices of roles the rollout does not build; an LLM judge runs in the "
            "driver's process"
        )
    return None


def drop_training_keys(ctx: Ctx) -> None:
    """Drop what only training reads from the translation, noting each key of the file
    that set it as having no effect here, with why; ROLL logs ``EXAMPLES`` samples."""
    kept: set[str] = set()
    dropped: dict[str, str] = {}  # a key of the file -> why what it set is unread
    for native, src in ctx.out.sources().items():
        why = unread_reason(native)
        if why is None:
            kept.add(src)
        else:
            ctx.out.drop(native)
            dropped.setdefault(src, why)
    for src, why in dropped.items():
        # a key that also set something the rollout reads has effect; a derivation's
        # own default (a key the file lacks) is no key of the user's to note
        if src not in kept and ctx.has(src):
            ctx.inert(why, src)
    ctx.write("experiment.log_val_generations", EXAMPLES, "validation")
    ctx.remark(
        "temper eval on an RLVR file: ROLL's RLVR rollout pipeline (generate over the "
        "validation set, score, report val_correct per tag; no training), temper's "
        "rlvr_rollout pipeline"
    )
