"""Offline knowledge distillation: the ``distill`` pipeline (ROLL's distill pipeline).

A step draws ``data.train_batch_size`` samples of given responses, as an SFT step does
(:mod:`temper.pipelines.sft`: the same rows, templates, cuts, bad-row reports and
resumable sampler); the teacher (the one entry of ``distill.teachers``, a frozen model
built as the reference is) scores them in one forward — at every learnt token its
``kd.topk`` most likely tokens and their logits
(:meth:`~temper.roles.reference.Reference.compute_top_logits`) — and the student takes
one update on ``(1 − w)·NLL + w·KD`` (:meth:`temper.roles.actor.Actor.distill_update`;
``w = kd.loss_weight``, ``KD`` the divergence ``kd.objective`` of
:data:`~temper.algorithms.kd.KD_OBJECTIVES` at the learnt tokens, token-mean). No
rollout engine or critic is built.

Image rows (a vision-language student; ROLL's VL distill pipeline): the samples carry
their images' pixel inputs (:mod:`temper.data.sft`), and the teacher's forward and the
student's take them alike (:mod:`temper.training.vision`); the teacher must read the
student processor's images (:func:`check_distill_data`).

Metrics per step: ``train/loss`` (the mixed loss), ``train/distill_loss`` (the
divergence to the teacher — the run's curve), ``train/sft_loss`` (the NLL), each the
mini-batches' mean before their update. Validation is SFT's (``val/loss``: the student's
NLL of ``data.val_files``, what ROLL's distill validation reports). Checkpoints and exact
resume are the driver's: the sampler's position is the producer's state; the teacher is
frozen and holds none.
"""

from __future__ import annotations

from temper.algorithms.kd import KD_OBJECTIVES, KDParams
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.pipelines import sft
from temper.pipelines.preflight_data import check_sft_data
from temper.pipelines.record import Pipeline
from temper.pipelines.run import Run
from temper.pipelines.timing import Timer, throughput
from temper.pipelines.unread import refuse_unread
from temper.registry import UnknownNameError
from temper.roles.base import ReferenceRole


def kd_params(cfg: TemperConfig) -> KDParams:
    """The divergence's parameters from the ``kd`` section (checked by :func:`check`)."""
    kd = cfg.kd
    return KDParams(
        temperature=kd.temperature,
        teacher_temperature=kd.teacher_temperature,
        adaptive_alpha=kd.adaptive_alpha,
        skew_lambda=kd.skew_lambda,
    )


def teacher_of(run: Run) -> ReferenceRole:
    """The run's one teacher (``distill.teachers``; :func:`check` allows exactly one)."""
    teachers = run.roles.teachers
    if teachers is None or len(teachers.names) != 1:
        raise RuntimeError("an offline-distillation run builds its one teacher")
    return teachers.teachers[teachers.names[0]]


def distill_step(run: Run) -> dict[str, float]:
    """One distillation step: the next samples, the teacher's top-k logits on them, one
    update of the student (module docstring)."""
    t = Timer()
    cfg = run.cfg
    params = kd_params(cfg)
    scale = params.temperature * params.teacher_temperature
    with t("step"):
        batch, metrics = run.producer.produce(run.step, t)
        with t("teacher"):
            # the tokenizer's tokens only: a teacher's output layer may have padding rows
            # (ids no student of another size has), as ROLL cuts to the tokenizer's
            batch = teacher_of(run).compute_top_logits(
                batch, cfg.kd.topk, scale, vocab=len(run.tokenizer)
            )
        with t("train"):
            actor = run.roles.actor.distill_update(
                batch, cfg.kd.objective, params, cfg.kd.loss_weight
            )
    tokens = float(batch["attention_mask"].sum())
    return {
        **metrics,
        "train/loss": actor["actor/loss"],
        "train/distill_loss": actor["actor/distill_loss"],
        "train/sft_loss": actor["actor/sft_loss"],
        "train/target_tokens": float(batch["response_mask"].sum()),
        "perf/samples": float(len(batch)),
        **actor,
        **t.times,
        **throughput(tokens, t.times["timing/step_s"]),
    }


# ------------------------------------------------------------------------ the config

#: Sections an offline-distillation run reads nothing of: the SFT run's, less the
#: reference, whose engine, micro-batching and devices are the teacher's.
UNREAD_SECTIONS = {
    k: v.replace("an SFT run", "a distillation run")
    for k, v in sft.UNREAD_SECTIONS.items()
    if k != "reference"
}
#: Keys of read sections it reads nothing of: the SFT run's, with the teacher's devices
#: read, and on-policy distillation's settings (a signal on sampled tokens) unread.
RL_ONLY = {
    **{
        k: v.replace("an SFT run", "a distillation run")
        for k, v in sft.RL_ONLY.items()
        if k != "resources.reference"
    },
    "actor.sft_loss_coef": "the NLL's weight is 1 − kd.loss_weight",
    "reference.enable": "the reference section configures the teacher, which always runs",
    "distill.pure": "offline distillation has no advantage (on-policy distillation's key)",
    "distill.kl_penalty": "the divergence is kd.objective over the teacher's top-k tokens",
    "distill.log_prob_min_clamp": "the divergence is kd.objective over the teacher's top-k",
    "distill.loss_max_clamp": "the divergence is kd.objective over the teacher's top-k",
    "distill.direct_gradient": "the divergence is always a loss term here (kd.loss_weight)",
    "distill.topk": "the teacher's top-k is kd.topk",
}


def check(cfg: TemperConfig) -> None:
    """Keys a distillation run would read nothing of are refused with why; the SFT data's
    limits; one teacher; the ``kd`` section's values."""
    refuse_unread(cfg, "distill", UNREAD_SECTIONS, RL_ONLY)
    sft.check_data(cfg)
    if cfg.actor.ulysses_sequence_parallel_size > 1:
        raise ConfigError(
            "actor.ulysses_sequence_parallel_size",
            "offline distillation compares the student's logits with the teacher's top-k "
            "logits of whole sequences, which Ulysses does not split",
            "set it to 1",
        )
    teachers = cfg.distill.teachers
    if len(teachers) != 1:
        raise ConfigError(
            "distill.teachers",
            f"offline distillation learns from one teacher, {len(teachers)} are given",
            "give one teacher (distill.teachers.default.model_path)",
        )
    (teacher,) = teachers.values()
    name = next(iter(teachers))
    if not teacher.model_path:
        raise ConfigError(
            f"distill.teachers.{name}.model_path", "the teacher needs its model", "set it"
        )
    if teacher.tags or teacher.kl_coef != 1.0:
        raise ConfigError(
            f"distill.teachers.{name}",
            "tags and kl_coef route and weigh on-policy distillation's signal; offline "
            "distillation's teacher scores every sample and kd.loss_weight weighs it",
            "remove tags and kl_coef",
        )
    kd = cfg.kd
    try:
        KD_OBJECTIVES.get(kd.objective)
    except UnknownNameError as err:
        raise ConfigError("kd.objective", err.message, "use one of the names above") from err
    if kd.topk < 0:
        raise ConfigError("kd.topk", f"must be ≥ 0, got {kd.topk}", "use 0 (every token) or k")
    if not 0.0 <= kd.loss_weight <= 1.0:
        raise ConfigError(
            "kd.loss_weight", f"must be in [0, 1], got {kd.loss_weight}", "set it in [0, 1]"
        )
    try:
        kd_params(cfg)
    except ValueError as err:
        raise ConfigError(
            "kd.temperature",
            str(err),
            "use temperatures > 0, skew_lambda in (0, 1), adaptive_alpha in [0, 1]",
        ) from err


#: What a teacher must share with a vision-language student: the student's processor
#: makes the pixels and placeholders both models read.
VISION_FIELDS = ("patch_size", "spatial_merge_size", "temporal_patch_size")


def check_distill_data(cfg: TemperConfig, notes: list[str]) -> None:
    """``temper check``: the SFT data's files and columns; for a vision-language student,
    a teacher that reads the images of its rows (a vision tower with the student's image
    token and patch grid). Models that cannot be read here are the model checks'."""
    check_sft_data(cfg, notes)
    from transformers import AutoConfig

    (name, teacher) = next(iter(cfg.distill.teachers.items()))
    trust = cfg.model.trust_remote_code
    try:
        student_cfg = AutoConfig.from_pretrained(cfg.model.path, trust_remote_code=trust)
        teacher_cfg = AutoConfig.from_pretrained(teacher.model_path, trust_remote_code=trust)
    except (OSError, ValueError):
        return
    vision = getattr(student_cfg, "vision_config", None)
    if vision is None:
        return
    key = f"distill.teachers.{name}.model_path"
    fix = "distill a vision-language student from a teacher of its family (same processor)"
    theirs = getattr(teacher_cfg, "vision_config", None)
    if theirs is None:
        raise ConfigError(
            key,
            f"{teacher.model_path} has no vision tower; the student {cfg.model.path} is a "
            "vision-language model whose rows' images the teacher must see too",
            fix,
        )
    pairs = [(f, getattr(vision, f, None), getattr(theirs, f, None)) for f in VISION_FIELDS]
    image = "image_token_id"
    pairs.append((image, getattr(student_cfg, image, None), getattr(teacher_cfg, image, None)))
    for field, mine, other in pairs:
        if mine != other:
            raise ConfigError(
                key,
                f"the teacher's {field} is {other}, the student's {mine}: the student's "
                "processor makes the image inputs of both",
                fix,
            )


PIPELINE = Pipeline(
    build=sft.SFTProducer,
    step=distill_step,
    uses=frozenset(),
    curve="train/distill_loss",
    check=check,
    preflight=check_distill_data,
    step_shape=sft.samples_per_step,
    sections=frozenset({"sft", "kd", "distill"}),
    context=sft.sequence,
)
