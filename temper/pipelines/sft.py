"""Supervised fine-tuning: the ``sft`` pipeline (verl's SFT trainers, ROLL's SFT pipeline).

A step draws ``data.train_batch_size`` samples from the resumable sampler
(:mod:`temper.data.sft` templates and cuts them: a prompt and its response, or a whole
conversation with every assistant turn to learn) and the actor takes one supervised
update on them (:meth:`temper.roles.actor.Actor.sft_update`): the NLL of the learnt
tokens, token-mean over each mini-batch with its global normalizers, through the same
engines, packing and token-budget micro-batches as RL. No rollout engine, reference or
critic is built (the record's ``uses`` is empty); LoRA is ``model.lora`` as in RL.

Validation is the token-mean NLL of ``data.val_files`` (``val/loss``, the headline) by
the actor's forward, every ``experiment.test_freq`` steps. Checkpoints and exact resume
are the driver's: the sampler's position is this producer's state. The run's curve is
``train/loss``.
"""

from __future__ import annotations

from typing import Any

from temper.config.errors import ConfigError
from temper.config.plan import StepShape
from temper.config.schema import TemperConfig
from temper.data import Batch, build_sampler
from temper.data.sft import SFTDataset, build_sft_datasets
from temper.pipelines.preflight_data import check_sft_data
from temper.pipelines.producer import ProducerContext, Validation
from temper.pipelines.record import Context, Pipeline
from temper.pipelines.run import Run
from temper.pipelines.timing import Timer, throughput
from temper.pipelines.unread import refuse_unread
from temper.roles.base import ActorRole


class DatasetProducer:
    """What a producer of fixed samples (no generation) shares: its only state is the
    sampler's position over the training rows; it dumps no generations and holds nothing
    outside this process."""

    sampler: Any
    total_steps: int

    def _draw_rows(self, cfg: TemperConfig, rows: int | None) -> None:
        """The resumable sampler over ``rows`` training rows (None: no training data) and
        the run's steps: ``experiment.max_steps``, else ``total_epochs`` passes."""
        self.sampler = build_sampler(cfg, rows) if rows is not None else None
        self.total_steps = 0
        if self.sampler is not None:
            epochs = cfg.experiment.total_epochs * self.sampler.batches_per_epoch
            self.total_steps = cfg.experiment.max_steps or epochs

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        """Nothing is generated (``experiment.rollout_data_dir`` is refused)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict() if self.sampler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.sampler is not None and state.get("sampler") is not None:
            self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        """Nothing held outside this process."""


class SFTProducer(DatasetProducer):
    """The step's supervised samples, and the validation loss (module docstring)."""

    headline = "val/loss"

    def __init__(self, ctx: ProducerContext) -> None:
        cfg = self.cfg = ctx.cfg
        if ctx.roles is None:
            raise RuntimeError("the SFT producer validates with the run's actor: give roles")
        self.actor: ActorRole = ctx.roles.actor
        train, self.val_data = build_sft_datasets(cfg, ctx.tokenizer)
        self.train_data: SFTDataset | None = train
        self._draw_rows(cfg, len(train) if train is not None else None)

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The next ``train_batch_size`` samples (their ``response_mask``: the tokens to
        learn) and the data's load-time counts."""
        if self.train_data is None or self.sampler is None:
            raise ConfigError("data.train_files", "no training data given", "set it")
        draw = self.sampler.next()
        batch = self.train_data.make_batch(draw.indices, draw.uids)
        return batch, {**self.train_data.metrics(), "train/epoch": float(draw.epoch)}

    def validate(self, step: int) -> Validation:
        """``val/loss``: Σ −log π over every learnt token of the validation samples / their
        number (whatever the batches), and ``val/target_tokens``."""
        if self.val_data is None:
            return Validation({})
        nll, tokens = 0.0, 0.0
        for batch in self.val_data.eval_batches(self.cfg.data.val_batch_size):
            log_probs = self.actor.compute_log_probs(batch)["old_log_probs"]
            mask = batch["response_mask"].to(log_probs.dtype)
            nll -= float((log_probs * mask).sum())
            tokens += float(mask.sum())
        return Validation({"val/loss": nll / max(tokens, 1.0), "val/target_tokens": tokens})


def sft_step(run: Run) -> dict[str, float]:
    """One supervised step: the next samples, one update of the actor on them.

    ``train/loss``: the step's mean token NLL (the mini-batches' mean); ``train/target_tokens``
    the tokens learnt; ``actor/*`` the update's (loss, grad norm, lr, packed fraction)."""
    t = Timer()
    with t("step"):
        batch, metrics = run.producer.produce(run.step, t)
        with t("train"):
            actor = run.roles.actor.sft_update(batch)
    targets = float(batch["response_mask"].sum())
    tokens = float(batch["attention_mask"].sum())
    return {
        **metrics,
        "train/loss": actor["actor/loss"],
        "train/target_tokens": targets,
        "perf/samples": float(len(batch)),
        **actor,
        **t.times,
        **throughput(tokens, t.times["timing/step_s"]),
    }


def samples_per_step(cfg: TemperConfig) -> StepShape:
    """A step learns from ``data.train_batch_size`` samples (no responses are drawn)."""
    n = cfg.data.train_batch_size
    return StepShape(samples=n, rows=(("samples per step", str(n), "data.train_batch_size"),))


def sequence(cfg: TemperConfig, notes: list[str]) -> Context:
    """A sample is at most ``sft.max_length`` tokens, prompt and response together."""
    return (cfg.sft.max_length, ("sft.max_length",), "a prompt and its response")


# ------------------------------------------------------------------------ the config

NO_GENERATION = "an SFT run learns given responses: it generates nothing"
NO_VIDEO = "supervised samples take images (data.image_key), not videos or audio"
#: Sections an SFT run reads nothing of, and why.
UNREAD_SECTIONS = {
    "rollout": NO_GENERATION,
    "reward": "an SFT run scores nothing: its targets are the data's responses",
    "algorithm": "an SFT run has no advantages, rewards or KL: its loss is the NLL",
    "critic": "an SFT run has no critic",
    "reference": "an SFT run has no reference (no KL term)",
}
#: Keys of read sections that only an RL step reads, and why.
RL_ONLY = {
    "actor.policy_loss": "the SFT loss is the NLL of the learnt tokens",
    "actor.clip_ratio": "there is no policy ratio to clip",
    "actor.clip_ratio_low": "there is no policy ratio to clip",
    "actor.clip_ratio_high": "there is no policy ratio to clip",
    "actor.clip_ratio_c": "there is no policy ratio to clip",
    "actor.policy_loss_kwargs": "the SFT loss is the NLL of the learnt tokens",
    "actor.entropy_coeff": "the SFT loss is the NLL alone",
    "actor.use_kl_loss": "an SFT run has no reference to take a KL to",
    "actor.kl_loss_coef": "an SFT run has no KL term",
    "actor.kl_loss_type": "an SFT run has no KL term",
    "actor.sft_loss_coef": "the whole SFT loss is the NLL (sft_loss_coef weighs it in RL)",
    "actor.rl_loss_coef": "an SFT run has no policy-gradient loss",
    "actor.l2_coef": "the SFT loss is the NLL alone",
    "actor.recompute_old_log_prob": NO_GENERATION,
    "actor.rollout_is": NO_GENERATION,
    "actor.rollout_is_threshold": NO_GENERATION,
    "actor.rollout_is_threshold_low": NO_GENERATION,
    "actor.rollout_is_batch_normalize": NO_GENERATION,
    "actor.rollout_rs": NO_GENERATION,
    "data.max_prompt_length": "a sample is bounded as a whole, by sft.max_length",
    "data.filter_overlong_prompts": "a sample is bounded as a whole, by sft.max_length",
    "data.gen_batch_size": NO_GENERATION,
    "data.ground_truth_key": "an SFT run scores nothing",
    "data.data_source_key": "an SFT run scores nothing",
    "data.tag_key": "an SFT run routes no rewards and weights no tags",
    "data.extra_info_key": "an SFT run scores nothing",
    "data.extra_info_columns": "an SFT run scores nothing",
    "data.source_weights": "SFT samples are drawn uniformly",
    "data.source_domains": "SFT samples are drawn uniformly",
    "data.source_default_domain": "SFT samples are drawn uniformly",
    "data.validation_shuffle": "the validation loss is over every sample; order changes nothing",
    "data.video_key": NO_VIDEO,
    "data.audio_key": NO_VIDEO,
    "data.video_folder": NO_VIDEO,
    "data.video_fps": NO_VIDEO,
    "data.video_max_frames": NO_VIDEO,
    "data.video_min_pixels": NO_VIDEO,
    "data.video_max_pixels": NO_VIDEO,
    "data.video_total_pixels": NO_VIDEO,
    "experiment.critic_warmup": "an SFT run has no critic",
    "experiment.max_critic_ckpt_to_keep": "an SFT run has no critic",
    "experiment.rollout_data_dir": NO_GENERATION,
    "experiment.validation_data_dir": "SFT validation generates nothing (its loss is logged)",
    "experiment.log_val_generations": "SFT validation generates nothing (its loss is logged)",
    "experiment.render_save_dir": "an SFT run plays no environments",
    "resources.actor_infer": NO_GENERATION,
    "resources.devices_per_infer_worker": NO_GENERATION,
    "resources.reference": "an SFT run has no reference",
    "resources.critic": "an SFT run has no critic",
    "resources.reward": "an SFT run has no reward model",
}


def check(cfg: TemperConfig) -> None:
    """Keys an SFT run would read nothing of are refused with why; then its own limits."""
    refuse_unread(cfg, "sft", UNREAD_SECTIONS, RL_ONLY)
    check_data(cfg)


def check_data(cfg: TemperConfig) -> None:
    """What a run on SFT rows (SFT, offline distillation) needs: training data, a
    positive ``sft.max_length``, a cut at one end, conversations under a chat template."""
    data = cfg.data
    if not data.train_files and not cfg.experiment.val_only:
        raise ConfigError(
            "data.train_files",
            "no training data given",
            "set data.train_files to a file or list of prompt/response rows or conversations",
        )
    if cfg.sft.max_length <= 0:
        raise ConfigError("sft.max_length", f"must be > 0, got {cfg.sft.max_length}", "set it")
    if data.truncation == "middle":
        raise ConfigError(
            "data.truncation",
            "middle cuts a prompt in two; an SFT sample is cut at one end, as verl's SFT "
            "datasets do",
            "use error, left or right",
        )
    if data.messages_key and data.chat_template == "raw":
        raise ConfigError(
            "data.chat_template",
            f"raw text has no turns, and data.messages_key ({data.messages_key}) holds "
            "conversations whose assistant turns are learnt",
            "use the tokenizer's template (native) or a Jinja template",
        )


PIPELINE = Pipeline(
    build=SFTProducer,
    step=sft_step,
    uses=frozenset(),
    curve="train/loss",
    check=check,
    preflight=check_sft_data,
    step_shape=samples_per_step,
    sections=frozenset({"sft"}),
    context=sequence,
)
