"""The ROLL dialect for ROLL's (offline) distillation pipeline (``distill_pipeline``,
``roll/pipeline/distill``), translated into ``pipeline: distill``.

ROLL's ``DistillConfig`` is its ``BaseConfig`` (run identity, saving, trackers, devices)
plus ``student_pretrain`` / ``teacher_pretrain``, the row's columns (``question_key``,
``answer_key``), ``sequence_length``, ``max_grad_norm``, the divergence
(``kd_objective``, ``logits_topk``, ``distill_loss_weight``, ``kd_temperature``,
``teacher_temperature``, ``adaptive_kl_alpha``, ``skew_lambda``, ``distill_on_prompt``)
and three workers: ``student`` (a ``WorkerConfig`` read by the SFT pipeline's rows: the
walk sees it as ``actor_train``), ``teacher`` (the frozen model: read by the reference's
rows, its own strategy and devices) and ``validation`` (its ``data_args.file_name``: the
held-out rows). Messages name the file's own keys (``student``, ``teacher``).

What ROLL's distill pipeline does and its translation:

- a row's user turn is its ``question_key`` column, its response the ``answer_key``
  column; ROLL writes the user turn as ``"\\n" + question`` (its prompt part is empty),
  temper templates the question alone;
- the teacher keeps its ``logits_topk`` most likely tokens at every position (logits
  divided by ``kd_temperature × teacher_temperature``), the student's logits at those ids
  (divided by ``kd_temperature``) are compared with them (``kd.*``);
- the loss is ``(1 − distill_loss_weight)·NLL + distill_loss_weight·KD``, both
  token-means over the response tokens;
- a step is one batch of ``dp × gradient_accumulation_steps × per_device_train_batch_size``
  rows, shuffled, one optimizer step; ``num_train_epochs`` passes; the teacher's forward
  takes ``teacher.training_args.per_device_train_batch_size`` rows at a time;
- ``distill_on_prompt`` learns the prompt's tokens too (``sft.learn_prompt``).

A file whose student template is a vision-language one (``qwen2-vl``) is one of ROLL's VL
distillation pipeline (``distill_vlm_pipeline``), which differs in its rows and lengths:

- its rows are ``problem``, ``solution`` and ``image`` whatever ``question_key`` /
  ``answer_key`` say (``data.row_format: roll_distill_vl``: the image first, then the
  question in ROLL's answer-tag template; a file that names other columns is refused);
- images are resized within ROLL's bounds of that pipeline, 56·56 to 1024·1024 pixels;
- a sample is cut at ``prompt_length`` (default 1024), not ``sequence_length``.

Student and teacher both see the images (the trainer's VL forward), on any engine: a
``megatron_train``/``megatron_infer`` worker runs the Qwen2-VL family on the megatron
engine (:mod:`temper.training.megatron_vision`).
"""

from __future__ import annotations

import copy
import re
from typing import Any

from temper.config.dialects import Translation
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Map, Note, Refuse, Rule, Use
from temper.config.dialects.core.walk import KeyTable
from temper.config.dialects.roll import derive
from temper.config.dialects.roll import sft as roll_sft
from temper.config.dialects.roll.context import translation, walk_file
from temper.config.dialects.roll.derive import Ctx
from temper.config.dialects.roll.workers import worker_rows
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig

AS, REF = "actor_train", "reference"  # the workers the shared rows read
STUDENT, TEACHER = "student", "teacher"  # ROLL's names of them in a distill file
COLUMNS = "ROLL's distill pipeline reads a row's question_key and answer_key columns"
TOPK = "the teacher's top-k logits travel with the batch from its forward to the student's"

#: Defaults of ROLL's DistillConfig (and its BaseConfig) that differ from temper's,
#: applied where the file omits them.
DISTILL_DEFAULTS: dict[str, Any] = {
    "save_steps": 50,
    "eval_steps": 10,
    "question_key": "question",
    "answer_key": "answer",
    "max_grad_norm": 0,
}
#: Keys only ROLL's DistillConfig has.
DISTILL_KEYS = ("student", "student_pretrain", "teacher_pretrain", "kd_objective", "logits_topk")


def is_distill(data: dict[str, Any]) -> bool:
    """A ROLL distill pipeline config (an on-policy distillation file, which has a
    ``teacher`` too, has ``student_train``, not ``student``)."""
    return any(key in data for key in DISTILL_KEYS)


def _top() -> dict[str, Rule]:
    # less ROLL's SFT keys: its DistillConfig has none of these
    rules = roll_sft.offline_top(
        "prompt_key", "query_key", "response_key", "system_key", "pretrain"
    )
    rules |= {
        "student_pretrain": Use("model.path", models),
        "teacher_pretrain": Use("distill.teachers.default.model_path", models),
        "question_key": Map("data.prompt_key"),
        "answer_key": Map("sft.response_key"),
        "kd_objective": Map("kd.objective"),
        "logits_topk": Map("kd.topk"),
        "distill_loss_weight": Map("kd.loss_weight"),
        "kd_temperature": Map("kd.temperature"),
        "teacher_temperature": Map("kd.teacher_temperature"),
        "adaptive_kl_alpha": Map("kd.adaptive_alpha"),
        "skew_lambda": Map("kd.skew_lambda"),
        "distill_on_prompt": Map("sft.learn_prompt"),
        "logits_transfer_backend": Note(f"how ROLL moves logits between workers; {TOPK}"),
    }
    return rules


def _teacher() -> dict[str, Rule]:
    """``teacher`` (read as ``reference``): the RL reference's rows, with the forward's
    micro-batch ROLL's teacher reads."""
    rules = worker_rows(REF)
    rules |= {
        f"{REF}.training_args.per_device_train_batch_size": Map(
            "reference.log_prob_micro_batch_size_per_device"
        ),
        f"{REF}.infer_batch_size": Note(
            "ROLL's teacher forward takes training_args.per_device_train_batch_size rows"
        ),
        f"{REF}.model_args.model_name_or_path": Use("distill.teachers.default.model_path", models),
    }
    return rules


def _student() -> dict[str, Rule]:
    rules = {k: v for k, v in roll_sft.SFT_TABLE.rules.items() if k.startswith(f"{AS}.")}
    for key, rule in rules.items():
        if rule == Note(roll_sft.COLUMNS):
            rules[key] = Note(COLUMNS)
        elif isinstance(rule, Use) and rule.by is derive.model:
            rules[key] = Use(rule.what, models)  # the student's and teacher's models
    return rules


VL_COLUMNS = "ROLL's VL distillation reads a row's problem, solution and image columns"
#: ROLL's VL distillation pipeline: its own rows and length (module docstring).
#: ROLL's VL distillation's image bounds (its processor's min_pixels / max_pixels).
VL_MIN_PIXELS, VL_MAX_PIXELS = 56 * 56, 1024 * 1024


def translate_roll_distill(raw: RawConfig) -> Translation:
    """Translate a ROLL distill config (module docstring)."""
    given = copy.deepcopy(raw.data)
    for src, dst in ((STUDENT, AS), (TEACHER, REF)):
        if src in given:
            given[dst] = given.pop(src)
    vision = _is_vision(given)
    table = DISTILL_VL_TABLE if vision else DISTILL_TABLE
    defaults = {k: v for k, v in DISTILL_DEFAULTS.items() if not vision or not k.endswith("_key")}
    applied = {k: v for k, v in defaults.items() if k not in given}
    ctx = Ctx({**applied, **given})
    try:
        defs = walk_file(table, ctx, raw)
        if vision:
            vision_rows(ctx)
        ctx.write("pipeline", "distill", "student")
        models(ctx)
        derive.data_files(ctx)
        derive.strategies(ctx)
        derive.placement(ctx)
        roll_sft.global_batch(ctx)
        if not ctx.has(roll_sft.EPOCHS):
            ctx.write("experiment.total_epochs", 3, roll_sft.EPOCHS)
            ctx.remark(f"{roll_sft.EPOCHS}: the Hugging Face default 3 applies (the file omits it)")
        derive.experiment(ctx)
        derive.definitions(ctx, raw, defs)
    except ConfigError as err:
        raise roll_sft.renamed_error(err, _named) from err
    if not vision:
        ctx.remark(
            "question_key: the user turn is the question alone (ROLL writes '\\n' + question)"
        )
    ctx.remark(
        "kd_objective: compared where the two models predict the learnt tokens, the NLL's "
        "positions (ROLL masks the divergence by the unshifted labels)"
    )
    return translation(ctx, applied, table, _named)


@derivation(
    "student_pretrain",
    "teacher_pretrain",
    "{role}.model_args.model_name_or_path",
    role=("actor_train", "reference"),
)
def models(ctx: Ctx) -> None:
    """The student's and the teacher's weights: each worker's ``model_name_or_path``, but
    both ``*_pretrain`` when either worker omits its own (ROLL's rule)."""
    student = ctx.get(f"{AS}.model_args.model_name_or_path")
    teacher = ctx.get(f"{REF}.model_args.model_name_or_path")
    if student is None or teacher is None:
        student, teacher = ctx.get("student_pretrain"), ctx.get("teacher_pretrain")
    if not student or not teacher:
        missing = "student_pretrain" if not student else "teacher_pretrain"
        raise ConfigError(
            missing, "offline distillation needs a student and a teacher model", f"set {missing}"
        )
    ctx.write("model.path", student, "student_pretrain")
    ctx.write("distill.teachers", {"default": {"model_path": teacher}}, "teacher_pretrain")


def _is_vision(given: dict[str, Any]) -> bool:
    """A file of ROLL's VL distillation pipeline: its student's template is a
    vision-language one (``qwen2-vl``)."""
    args = (given.get(AS) or {}).get("data_args") or {}
    template = str(args.get("template") or "") if isinstance(args, dict) else ""
    return "vl" in template.lower().replace("-", "_").split("_")


@derivation("prompt_length", "distill_on_prompt", fields=("sft.max_length",))
def vision_rows(ctx: Ctx) -> None:
    """ROLL's VL distillation rows, image bounds and length (module docstring)."""
    src = f"{AS}.data_args.template"
    ctx.write("data.row_format", "roll_distill_vl", src)
    ctx.write("data.prompt_key", "problem", src)
    ctx.write("sft.response_key", "solution", src)
    ctx.write("data.image_min_pixels", VL_MIN_PIXELS, src)
    ctx.write("data.image_max_pixels", VL_MAX_PIXELS, src)
    if not ctx.has("prompt_length"):
        ctx.write("sft.max_length", 1024, "prompt_length")
    ctx.remark(
        f"{_named(src)}: a file of ROLL's VL distillation: rows problem/solution/image "
        f"(data.row_format=roll_distill_vl), images of {VL_MIN_PIXELS} to {VL_MAX_PIXELS} "
        f"pixels, samples cut at prompt_length={ctx.native_get('sft.max_length')}"
    )
    ctx.remark(
        "distill_on_prompt: image placeholder tokens are context, never learnt (ROLL's VL "
        "labels include them; their positions predict a placeholder the pixels fill)"
    )
    if not ctx.get("distill_on_prompt"):
        ctx.remark(
            "distill_on_prompt: false learns the response only; ROLL's VL pipeline learns "
            "every token whatever it says"
        )


_STUDENT = re.compile(rf"\b{AS}\b")
_TEACHER = re.compile(
    rf"\b{REF}\.(?=(model_args|strategy_args|training_args|data_args|generating_args|"
    r"device_mapping|infer_batch_size|use_sequence_packing|worker_cls|world_size|"
    r"system_envs|name)\b)"
)


def _named(text: str) -> str:
    """The file's key names: ``student``/``teacher`` where the shared rows say
    ``actor_train``/``reference.<worker key>`` (native ``reference.*`` keys stay)."""
    return _TEACHER.sub(f"{TEACHER}.", _STUDENT.sub(STUDENT, text))


DISTILL_TABLE = KeyTable(
    {
        **_top(),
        **_student(),
        **_teacher(),
        **{k: v for k, v in roll_sft.SFT_TABLE.rules.items() if k.startswith("validation.")},
    }
)

DISTILL_VL_TABLE = KeyTable(
    {
        **DISTILL_TABLE.rules,
        **{
            key: Refuse(
                VL_COLUMNS, f"remove {key}; name the columns problem, solution, image", ok=(None,)
            )
            for key in ("question_key", "answer_key")
        },
        "prompt_length": Map("sft.max_length"),
        "sequence_length": Note("ROLL's VL distillation cuts a sample at prompt_length"),
    }
)
