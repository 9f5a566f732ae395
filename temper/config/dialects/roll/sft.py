"""The ROLL dialect for ROLL's SFT pipeline (``sft_pipeline``, ``sft_config.yaml``),
translated into ``pipeline: sft``.

ROLL's ``SFTConfig`` is its ``BaseConfig`` (run identity, saving, trackers, devices)
plus the columns of a row (``prompt_key``, ``query_key``, ``response_key``,
``system_key``), ``sequence_length``, ``pretrain``, ``max_grad_norm``, the training
worker ``sft_train`` and an optional ``validation`` worker whose ``data_args.file_name``
is the validation set. ``sft_train`` is a ``WorkerConfig`` like the RL pipelines'
``actor_train``, so its keys are read by the same rows and derivations (strategy
configs of fsdp2, megatron and deepspeed, ``device_mapping``, the batch arithmetic):
the walk sees it as ``actor_train``, and every key, note and error names ``sft_train``.

What ROLL's SFT pipeline does and its translation:

- a row's user turn is ``prompt + "\\n" + query`` (the query when the row has one), its
  system turn the ``system_key`` column, and the loss covers what follows the templated
  prompt — ROLL templates the response as the assistant turn, temper closes it with the
  tokenizer's EOS (the same tokens where the template ends a turn with EOS, as Qwen's);
- a step is one batch of ``dp × gradient_accumulation_steps × per_device_train_batch_size``
  rows, one optimizer step, in file order (ROLL's loader does not shuffle);
  ``num_train_epochs`` passes, unless ``max_steps`` > 0;
- ``eval_steps``: the validation loss every that many steps; ``sequence_length``: the
  longest sample (ROLL pads to it; a longer one fails the load here, naming the row).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from typing import Any

from temper.config.dialects import Translation
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Map, Note, Rule, Same, Use
from temper.config.dialects.core.walk import KeyTable
from temper.config.dialects.roll import derive
from temper.config.dialects.roll.context import translation, walk_file
from temper.config.dialects.roll.derive import Ctx
from temper.config.dialects.roll.devices import parse_device_mapping
from temper.config.dialects.roll.table import TOP
from temper.config.dialects.roll.transforms import nonpositive_none
from temper.config.dialects.roll.versions import ADDITIONS, OVERRIDES
from temper.config.dialects.roll.workers import worker_rows, worker_rules
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig
from temper.config.schema import MODEL_PARALLEL_DEGREES

WORKER = "sft_train"  # ROLL's training worker of the SFT pipeline
AS = "actor_train"  # the worker the shared rows and derivations read
NOT_READ = "ROLL's SFT pipeline does not read it"
NO_GENERATION = "the SFT pipeline generates nothing"
COLUMNS = "ROLL's SFT pipeline reads a row's columns from prompt_key / query_key / response_key"

#: Defaults of ROLL's SFT config (its BaseConfig, Hugging Face TrainingArguments) that
#: differ from temper's, applied where the file omits them.
SFT_DEFAULTS: dict[str, Any] = {"save_steps": 50, "eval_steps": 10}
EPOCHS = f"{AS}.training_args.num_train_epochs"


def is_sft(data: dict[str, Any]) -> bool:
    """A ROLL SFT pipeline config: it has the ``sft_train`` worker."""
    return WORKER in data


def _top() -> dict[str, Rule]:
    shared = (
        "hydra",
        "exp_name",
        "seed",
        "rpc_timeout",
        "logging_dir",
        "output_dir",
        "system_envs",
        "track_with",
        "tracker_kwargs",
        "num_gpus_per_node",
        "num_nodes",
        "save_steps",
        "logging_steps",
        "eval_steps",
        "resume_from_checkpoint",
        "checkpoint_config.type",
        "checkpoint_config.output_dir",
        "local_rank",
        "pretrain",
    )
    rules: dict[str, Rule] = {k: TOP[k] for k in shared}
    # BaseConfig keys of the RL pipelines an SFT file may carry: read by nothing there
    for key in (
        "rollout_batch_size",
        "val_batch_size",
        "prompt_length",
        "response_length",
        "generate_opt_level",
        "is_num_return_sequences_expand",
        "max_running_requests",
        "is_use_additional_prompts",
        "max_additional_running_prompts",
    ):
        rules[key] = Note(NOT_READ)
    rules |= {
        "max_steps": Map("experiment.max_steps", nonpositive_none),
        "max_ckpt_to_keep": Map("experiment.max_actor_ckpt_to_keep", lambda v, _ctx: v or None),
        "max_grad_norm": Map("actor.grad_clip"),
        "sequence_length": Map("sft.max_length"),
        "prompt_key": Map("data.prompt_key"),
        "query_key": Map("sft.query_key"),
        "response_key": Map("sft.response_key"),
        "system_key": Map("sft.system_key"),
        "global_template": Use("data.chat_template (named templates -> native)", derive.data_files),
    }
    return rules


def offline_worker(role: str, no_generation: str, columns: str) -> dict[str, Rule]:
    """Worker ``role``'s RL rows as an offline pipeline (SFT, DPO) reads them: its
    generation keys are noted (``no_generation``), and so are the data keys that name
    columns, which the pipeline's own keys name instead (``columns``)."""
    rules = worker_rows(role)
    for k, rule in list(rules.items()):
        if isinstance(rule, Use) and rule.by is derive.mini_batch:
            # the offline pipelines' batch arithmetic reads them (no rollout.n)
            rules[k] = Use(rule.what, global_batch)
        if k.startswith(f"{role}.generating_args."):
            rules[k] = Note(no_generation)
        elif k.startswith(f"{role}.data_args.") and k.rsplit(".", 1)[-1] not in (
            "file_name",
            "dataset_dir",
            "template",
            "preprocessing_num_workers",
        ):
            rules[k] = Note(columns)
    return rules


def offline_top(*drop: str) -> dict[str, Rule]:
    """The SFT table's top-level rows (its sections of settings included) less ``drop``,
    with the RL table's offload switches: the top level of ROLL's DPO and distill
    pipelines."""
    rules = {
        k: v
        for k, v in SFT_TABLE.rules.items()
        if "." not in k
        or k.startswith(("hydra.", "system_envs.", "tracker_kwargs.", "checkpoint_config."))
    }
    for key in drop:
        rules.pop(key, None)
    for key in ("is_offload_states", "is_offload_optimizer_states_in_train_step"):
        rules[key] = {**TOP, **ADDITIONS, **OVERRIDES}[key]
    return rules


def _worker() -> dict[str, Rule]:
    """``sft_train`` (read as ``actor_train``): the RL worker rows, with what SFT reads."""
    rules = offline_worker(AS, NO_GENERATION, COLUMNS)
    rules |= {
        EPOCHS: Map("experiment.total_epochs"),
        f"{AS}.training_args.max_steps": Note("ROLL sets it from the epochs (or max_steps)"),
        f"{AS}.training_args.gradient_accumulation_steps": Use(
            "data.train_batch_size = dp × gradient_accumulation_steps × per_device_train_batch_size",
            global_batch,
        ),
        f"{AS}.data_args.eval_file_name": Note(
            "ROLL's SFT pipeline validates on validation.data_args.file_name"
        ),
        f"{AS}.model_update_frequency": Note(NO_GENERATION),
        f"{AS}.use_dynamic_batching_in_infer": Note(
            "the validation forward follows the training micro-batching"
        ),
        f"{AS}.max_tokens_per_microbatch_in_infer": Note(
            "the validation forward follows the training micro-batching"
        ),
    }
    return rules


def validation_rules(by: str) -> dict[str, Rule]:
    """The ``validation`` worker of an offline pipeline: its rows' file and template are
    the training ones'; the rest is noted, the validation being computed ``by`` others."""
    rules: dict[str, Rule] = {k: Note(by) for k in worker_rules("validation")}
    rules["validation.data_args.file_name"] = Use(
        "data.val_files (joined with dataset_dir)", derive.data_files
    )
    rules["validation.data_args.template"] = Same(
        f"{AS}.data_args.template", "validation rows are templated like training rows"
    )
    return rules


def translate_roll_sft(raw: RawConfig) -> Translation:
    """Translate a ROLL SFT config (module docstring)."""
    given = {(AS if k == WORKER else k): v for k, v in copy.deepcopy(raw.data).items()}
    applied = {k: v for k, v in SFT_DEFAULTS.items() if k not in given}
    ctx = Ctx({**applied, **given})
    try:
        defs = walk_file(SFT_TABLE, ctx, raw)
        ctx.write("pipeline", "sft", WORKER)
        derive.model(ctx)
        derive.data_files(ctx)
        derive.strategies(ctx)
        derive.placement(ctx)
        global_batch(ctx)
        ctx.write("data.shuffle", False, WORKER)
        ctx.remark(f"{WORKER}: rows in file order, as ROLL's SFT loader reads them")
        if not ctx.has(EPOCHS):
            ctx.write("experiment.total_epochs", 3, EPOCHS)
            ctx.remark(f"{EPOCHS}: the Hugging Face default 3 applies (the file omits it)")
        derive.experiment(ctx)
        derive.definitions(ctx, raw, defs)
    except ConfigError as err:
        raise renamed_error(err, _named) from err
    return translation(ctx, applied, SFT_TABLE, _named)


def renamed_error(err: ConfigError, named: Callable[[str], str]) -> ConfigError:
    """``err`` in the file's own worker names (``named`` rewrites the shared rows')."""
    return ConfigError(named(err.key), named(err.reason), named(err.template), bound=err.bound)


@derivation(
    "actor_train.training_args.{arg}",
    "actor_train.device_mapping",
    "actor_train.strategy_args.strategy_name",
    "actor_train.strategy_args.strategy_config",
    "actor_train.model_args.ulysses_size",
    arg=(
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "adam_beta1",
        "adam_beta2",
    ),
)
def global_batch(ctx: Ctx) -> None:
    """A step is ROLL's global batch: ``dp × gradient_accumulation_steps ×
    per_device_train_batch_size`` rows (pairs in ROLL's DPO), one optimizer step (dp: the devices over TP × PP ×
    CP on megatron, over the Ulysses size otherwise); Adam's betas."""
    args = f"{AS}.training_args"
    per = ctx.get(f"{args}.per_device_train_batch_size")
    ga = ctx.get(f"{args}.gradient_accumulation_steps")
    if per is not None or ga is not None:
        devices = parse_device_mapping(ctx.get(f"{AS}.device_mapping")) or [0]
        if ctx.get(f"{AS}.strategy_args.strategy_name") == "megatron_train":
            cfg = ctx.get(f"{AS}.strategy_args.strategy_config") or {}
            split = math.prod(int(cfg.get(k) or 1) for k in MODEL_PARALLEL_DEGREES)
        else:
            split = int(ctx.get(f"{AS}.model_args.ulysses_size") or 1)
        dp = max(1, len(devices) // max(1, split))
        ctx.write(
            "data.train_batch_size",
            (per or 1) * (ga or 1) * dp,
            f"{args}.gradient_accumulation_steps",
        )
    betas = [ctx.get(f"{args}.adam_beta{i}") for i in (1, 2)]
    if any(b is not None for b in betas):
        ctx.write(
            "actor.optim.betas",
            [b if b is not None else d for b, d in zip(betas, (0.9, 0.999))],
            f"{args}.adam_beta1",
        )


_AS = re.compile(rf"\b{AS}\b")


def _named(text: str) -> str:
    """The user's key names: ``sft_train`` where the shared rows say ``actor_train``."""
    return _AS.sub(WORKER, text)


SFT_TABLE = KeyTable(
    {
        **_top(),
        **_worker(),
        **validation_rules("the validation loss is computed by the sft_train worker"),
    }
)
