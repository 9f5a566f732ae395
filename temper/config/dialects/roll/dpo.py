"""The ROLL dialect for ROLL's DPO pipeline (``dpo_pipeline``, ``roll/pipeline/dpo``),
translated into ``pipeline: dpo``.

ROLL's ``DPOConfig`` is its ``BaseConfig`` (run identity, saving, trackers, devices) plus
``pretrain``, ``global_template``, ``max_grad_norm``, the loss (``ipo``, ``beta``,
``label_smoothing``), the pair's columns (``chosen_key``, ``rejected_key``), and three
workers: ``actor_train`` (a ``WorkerConfig`` read by the RL pipelines' rows and
derivations: strategies, ``device_mapping``), ``reference`` (the frozen model, its own
strategy and devices) and ``validation`` (whose ``data_args.file_name`` is the held-out
pairs). What ROLL's DPO pipeline does and its translation:

- a row's prompt is its ``instruction`` column (ROLL reads that name, no key sets it) as
  the user's turn; the chosen and rejected responses follow it as the assistant's turn —
  temper closes each with the tokenizer's EOS after the generation prompt, as SFT does;
- the loss is ``ipo`` (IPO) or the sigmoid DPO loss with ``label_smoothing`` (cDPO), on
  the sums of the responses' token log-probs, with ``beta``;
- a step is one batch of ``dp × gradient_accumulation_steps × per_device_train_batch_size``
  pairs, shuffled, one optimizer step; ``per_device_train_batch_size`` and
  ``infer_batch_size`` count pairs, each two sequences (ROLL doubles them), so temper's
  micro-batches hold twice as many rows; ``max_steps`` (ROLL requires it),
  ``num_train_epochs`` passes at most;
- ``eval_steps``: the held-out accuracy and margin every that many steps;
  ``sequence_length``: the longest sequence (a prompt with one response).
"""

from __future__ import annotations

import copy
from typing import Any

from temper.config.dialects import Translation
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Map, Note, Rule, Use
from temper.config.dialects.core.walk import KeyTable
from temper.config.dialects.roll import derive
from temper.config.dialects.roll import sft as roll_sft
from temper.config.dialects.roll.context import translation, walk_file
from temper.config.dialects.roll.derive import Ctx
from temper.config.dialects.roll.transforms import nonpositive_none
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig

AS = "actor_train"
REF = "reference"
NO_GENERATION = "the DPO pipeline generates nothing"
COLUMNS = "ROLL's DPO pipeline reads a row's instruction, chosen_key and rejected_key columns"
PAIRS = "counts pairs, two sequences each: temper's micro-batch is twice as many rows"
PROMPT_COLUMN = "instruction"  # ROLL's encode_function reads it by this name

#: Defaults of ROLL's DPO config (its BaseConfig) that differ from temper's.
DPO_DEFAULTS: dict[str, Any] = {"save_steps": 50, "eval_steps": 10}
EPOCHS = f"{AS}.training_args.num_train_epochs"
DPO_KEYS = ("ipo", "beta", "label_smoothing", "chosen_key", "rejected_key")


def is_dpo(data: dict[str, Any]) -> bool:
    """A ROLL DPO pipeline config: a key only ROLL's ``DPOConfig`` has."""
    return any(key in data for key in DPO_KEYS)


def _top() -> dict[str, Rule]:
    # less ROLL's SFT columns: DPO has none of these
    rules = roll_sft.offline_top("prompt_key", "query_key", "response_key", "system_key")
    rules |= {
        "max_steps": Map("experiment.max_steps", nonpositive_none),
        "sequence_length": Map("dpo.max_length"),
        "ipo": Map("dpo.loss_type", lambda v, _ctx: "ipo" if v else "sigmoid"),
        "beta": Map("dpo.beta"),
        "label_smoothing": Map("dpo.label_smoothing"),
        "chosen_key": Map("dpo.chosen_key"),
        "rejected_key": Map("dpo.rejected_key"),
    }
    return rules


def _worker(role: str) -> dict[str, Rule]:
    """A worker's RL rows, with what DPO reads (``actor_train`` trains, ``reference``
    scores)."""
    rules = roll_sft.offline_worker(role, NO_GENERATION, COLUMNS)
    rules[f"{role}.infer_batch_size"] = Use(
        f"the {role} forward's micro-batch: {PAIRS}", pair_micro_batches
    )
    if role == AS:
        rules |= {
            EPOCHS: Map("experiment.total_epochs"),
            f"{AS}.training_args.per_device_train_batch_size": Use(
                f"actor.micro_batch_size_per_device: {PAIRS}",
                pair_micro_batches,
            ),
            f"{AS}.training_args.max_steps": Note("ROLL sets it from max_steps"),
            f"{AS}.training_args.gradient_accumulation_steps": Use(
                "data.train_batch_size = dp × gradient_accumulation_steps × "
                "per_device_train_batch_size pairs",
                roll_sft.global_batch,
            ),
            f"{AS}.data_args.eval_file_name": Note(
                "ROLL's DPO pipeline validates on validation.data_args.file_name"
            ),
            f"{AS}.model_update_frequency": Note(NO_GENERATION),
        }
    return rules


def translate_roll_dpo(raw: RawConfig) -> Translation:
    """Translate a ROLL DPO config (module docstring)."""
    given = copy.deepcopy(raw.data)
    applied = {k: v for k, v in DPO_DEFAULTS.items() if k not in given}
    ctx = Ctx({**applied, **given})
    defs = walk_file(DPO_TABLE, ctx, raw)
    ctx.write("pipeline", "dpo", "chosen_key")
    ctx.write("data.prompt_key", PROMPT_COLUMN, "chosen_key")
    ctx.remark(f"the prompt is each row's '{PROMPT_COLUMN}' column, as ROLL's DPO reads it")
    derive.model(ctx)
    derive.data_files(ctx)
    derive.strategies(ctx)
    derive.placement(ctx)
    roll_sft.global_batch(ctx)
    pair_micro_batches(ctx)
    if not ctx.get("max_steps"):
        raise ConfigError(
            "max_steps",
            "ROLL's DPO pipeline requires max_steps > 0 (it asserts it)",
            "set max_steps",
        )
    if not ctx.has(EPOCHS):
        ctx.write("experiment.total_epochs", 3, EPOCHS)
        ctx.remark(f"{EPOCHS}: the Hugging Face default 3 applies (the file omits it)")
    derive.experiment(ctx)
    derive.definitions(ctx, raw, defs)
    return translation(ctx, applied, DPO_TABLE)


@derivation(
    "actor_train.training_args.per_device_train_batch_size",
    "{role}.infer_batch_size",
    role=("actor_train", "reference"),
)
def pair_micro_batches(ctx: Ctx) -> None:
    """ROLL's per-device batches count pairs; temper's micro-batches count sequences."""
    for src, dst in (
        (f"{AS}.training_args.per_device_train_batch_size", "actor.micro_batch_size_per_device"),
        (f"{AS}.infer_batch_size", "actor.log_prob_micro_batch_size_per_device"),
        (f"{REF}.infer_batch_size", "reference.log_prob_micro_batch_size_per_device"),
    ):
        value = ctx.get(src)
        if value:
            ctx.write(dst, 2 * int(value), src)


DPO_TABLE = KeyTable(
    {
        **_top(),
        **_worker(AS),
        **_worker(REF),
        **roll_sft.validation_rules(
            "held-out pairs are scored by the actor_train and reference workers"
        ),
    }
)
