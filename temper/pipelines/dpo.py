"""Direct preference optimization: the ``dpo`` pipeline (ROLL's DPO pipeline).

A step draws ``data.train_batch_size`` preference pairs from the resumable sampler
(:mod:`temper.data.preference`: a prompt, its chosen and its rejected response, as two
rows), the frozen reference scores both responses (``ref_log_probs``: the reference
role, built by every DPO run — a copy of the initial model, or with LoRA the model
without its adapters), and the actor takes a preference update on the pairs
(:meth:`temper.roles.actor.Actor.dpo_update`): the mean pair loss ``dpo.loss_type``
(:data:`~temper.algorithms.preference.PREFERENCE_LOSSES`, β = ``dpo.beta``) of the
sequence log-probs, through the same engines, packing and micro-batches as RL. No
rollout engine or critic is built.

Metrics per step: ``train/loss``; ``train/rewards/{chosen,rejected,margin,accuracy}``
(the implicit rewards ``β·(log π − log π_ref)``, their difference, the fraction of pairs
ranked right) and ``train/logps/{chosen,rejected}``, each at the weights before the
step's update. Validation on ``data.val_files`` every ``experiment.test_freq`` steps:
the same over every held-out pair (``val/accuracy``, the headline; ``val/margin``,
``val/loss``, …). Checkpoints and exact resume are the driver's: the sampler's position
is this producer's state. The run's curve is ``train/rewards/margin``.
"""

from __future__ import annotations

import torch

from temper.algorithms.preference import (
    PREFERENCE_LOSSES,
    PreferenceParams,
    pair_metrics,
    sequence_log_probs,
)
from temper.config.errors import ConfigError
from temper.config.plan import REFERENCE, REFERENCE_ALWAYS, StepShape
from temper.config.schema import TemperConfig
from temper.data import Batch
from temper.data.preference import PairDataset, build_pair_datasets
from temper.pipelines import sft
from temper.pipelines.preflight_data import check_dpo_data
from temper.pipelines.producer import ProducerContext, Validation
from temper.pipelines.record import Context, Pipeline
from temper.pipelines.run import Run
from temper.pipelines.timing import Timer, throughput
from temper.pipelines.unread import refuse_unread
from temper.registry import UnknownNameError
from temper.roles.base import ActorRole, ReferenceRole


def preference_params(cfg: TemperConfig) -> PreferenceParams:
    """``dpo.beta`` and ``dpo.label_smoothing`` (checked by :func:`check`)."""
    return PreferenceParams(beta=cfg.dpo.beta, label_smoothing=cfg.dpo.label_smoothing)


class DPOProducer(sft.DatasetProducer):
    """The step's preference pairs, and the validation on held-out pairs (module doc)."""

    headline = "val/accuracy"

    def __init__(self, ctx: ProducerContext) -> None:
        cfg = self.cfg = ctx.cfg
        if ctx.roles is None or ctx.roles.reference is None:
            raise RuntimeError("the DPO producer validates with the run's actor and reference")
        self.actor: ActorRole = ctx.roles.actor
        self.reference: ReferenceRole = ctx.roles.reference
        self.params = preference_params(cfg)
        train, self.val_data = build_pair_datasets(cfg, ctx.tokenizer)
        self.train_data: PairDataset | None = train
        self._draw_rows(cfg, len(train) if train is not None else None)

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The next ``train_batch_size`` pairs (``2 ×`` rows) and the data's counts."""
        if self.train_data is None or self.sampler is None:
            raise ConfigError("data.train_files", "no training data given", "set it")
        draw = self.sampler.next()
        batch = self.train_data.make_batch(draw.indices, draw.uids)
        return batch, {**self.train_data.metrics(), "train/epoch": float(draw.epoch)}

    def validate(self, step: int) -> Validation:
        """Over every held-out pair: ``val/loss`` (the mean pair loss),
        ``val/accuracy`` (pairs whose implicit reward ranks chosen above rejected),
        ``val/margin``, ``val/rewards_chosen``, ``val/rewards_rejected``,
        ``val/logps_chosen``, ``val/logps_rejected`` (means), ``val/pairs``."""
        if self.val_data is None:
            return Validation({})
        sums: dict[str, float] = {}
        pairs = 0
        loss_fn = PREFERENCE_LOSSES.get(self.cfg.dpo.loss_type)
        for batch in self.val_data.eval_batches(self.cfg.data.val_batch_size):
            mask = batch["response_mask"]
            seq = sequence_log_probs(self.actor.compute_log_probs(batch)["old_log_probs"], mask)
            ref = sequence_log_probs(
                self.reference.compute_ref_log_probs(batch)["ref_log_probs"], mask
            )
            seq, ref = seq.double(), ref.double()
            parts = (seq[0::2], seq[1::2], ref[0::2], ref[1::2])
            with torch.no_grad():
                values = {"loss": loss_fn(*parts, self.params)}
            values.update(pair_metrics(*parts, self.params))
            for name, per_pair in values.items():
                sums[name] = sums.get(name, 0.0) + float(per_pair.sum())
            pairs += len(batch) // 2
        return pair_validation(sums, pairs)


#: A pair metric's name under ``val/`` (the training names keep their ``rewards/`` and
#: ``logps/`` groups; validation's are flat).
VAL_NAMES = {
    "rewards/accuracy": "accuracy",
    "rewards/margin": "margin",
    "rewards/chosen": "rewards_chosen",
    "rewards/rejected": "rewards_rejected",
    "logps/chosen": "logps_chosen",
    "logps/rejected": "logps_rejected",
    "loss": "loss",
}


def pair_validation(sums: dict[str, float], pairs: int) -> Validation:
    """The held-out means of per-pair metric sums over ``pairs`` pairs (DPO and
    reward-model validation), and ``val/pairs``."""
    metrics = {f"val/{VAL_NAMES[k]}": v / max(pairs, 1) for k, v in sums.items()}
    return Validation({**metrics, "val/pairs": float(pairs)})


def dpo_step(run: Run) -> dict[str, float]:
    """One preference step: the next pairs, their reference log-probs, one update.

    ``train/loss`` and ``train/{rewards,logps}/*`` are the update's (``actor/*``, the
    mini-batches' means); ``train/pairs`` the pairs learnt from."""
    t = Timer()
    reference = run.roles.reference
    if reference is None:
        raise RuntimeError("a DPO run builds its reference: the plan turned it off")
    cfg = run.cfg
    with t("step"):
        batch, metrics = run.producer.produce(run.step, t)
        with t("ref"):
            batch = reference.compute_ref_log_probs(batch)
        with t("train"):
            actor = run.roles.actor.dpo_update(batch, cfg.dpo.loss_type, preference_params(cfg))
    tokens = float(batch["attention_mask"].sum())
    preference = {
        f"train/{k[len('actor/') :]}": v
        for k, v in actor.items()
        if k.startswith(("actor/rewards/", "actor/logps/"))
    }
    return {
        **metrics,
        "train/loss": actor["actor/loss"],
        **preference,
        "train/pairs": float(len(batch) // 2),
        "perf/samples": float(len(batch)),
        **actor,
        **t.times,
        **throughput(tokens, t.times["timing/step_s"]),
    }


def rows_per_step(cfg: TemperConfig) -> StepShape:
    """A step learns from ``data.train_batch_size`` pairs: twice as many sequences (the
    batch arithmetic's samples: ``actor.mini_batch_size`` counts them, two per pair)."""
    n = cfg.data.train_batch_size
    return StepShape(
        samples=2 * n,
        rows=(
            ("pairs per step", str(n), "data.train_batch_size"),
            ("sequences per step", str(2 * n), "chosen and rejected of each pair"),
        ),
    )


def sequence(cfg: TemperConfig, notes: list[str]) -> Context:
    """A sequence is at most ``dpo.max_length`` tokens, the prompt with one response."""
    return (cfg.dpo.max_length, ("dpo.max_length",), "a prompt and its response")


# ------------------------------------------------------------------------ the config

NO_GENERATION = "a DPO run learns from given pairs: it generates nothing"
#: Sections a DPO run reads nothing of, and why.
UNREAD_SECTIONS = {
    "rollout": NO_GENERATION,
    "reward": "a DPO run scores nothing: its preferences are the data's pairs",
    "algorithm": "a DPO run has no advantages, rewards or KL penalty: its loss is dpo.loss_type",
    "critic": "a DPO run has no critic",
}
#: Keys of read sections a DPO step reads nothing of, and why: the SFT pipeline's list
#: (keys only an RL step reads), less what differs.
RL_ONLY = {
    **{
        key: why.replace("an SFT run", "a DPO run").replace("the SFT loss", "the DPO loss")
        for key, why in sft.RL_ONLY.items()
        if key not in ("resources.reference", "data.max_prompt_length")
    },
    "actor.sft_loss_coef": "the DPO loss is dpo.loss_type alone",
    "actor.use_kl_loss": "the DPO loss holds the policy near the reference through dpo.beta",
    "actor.kl_loss_coef": "the DPO loss holds the policy near the reference through dpo.beta",
    "actor.kl_loss_type": "the DPO loss holds the policy near the reference through dpo.beta",
    "actor.loss_agg_mode": "a DPO loss is a mean over pairs of sequence log-prob sums",
    "data.max_prompt_length": "a sequence is bounded as a whole, by dpo.max_length",
    "data.filter_overlong_prompts": "a sequence is bounded as a whole, by dpo.max_length",
    "data.messages_key": "a pair's prompt is data.prompt_key (a string or a chat list)",
    "data.row_format": "a pair's columns are read as they are",
    **{
        f"data.{key}": "preference pairs here are text only"
        for key in ("image_key", "image_folder", "image_min_pixels", "image_max_pixels")
    },
}


def check(cfg: TemperConfig) -> None:
    """Keys a DPO run would read nothing of are refused with why; then its own limits."""
    refuse_unread(cfg, "dpo", UNREAD_SECTIONS, RL_ONLY)
    dpo = cfg.dpo
    if cfg.reference.enable is False:
        raise ConfigError(
            "reference.enable",
            "the DPO loss compares the policy with the frozen reference",
            "remove reference.enable (a DPO run always builds its reference)",
        )
    check_preference_loss("dpo", dpo.loss_type, dpo.beta, dpo.label_smoothing)
    check_pairs(cfg, "dpo", dpo.max_length, "a DPO sequence is cut at one end, as an SFT one")


def check_preference_loss(section: str, loss_type: str, beta: float, smoothing: float) -> None:
    """A preference pipeline's loss settings (``<section>.loss_type``, ``beta``,
    ``label_smoothing``): a registered loss, ``beta > 0``, smoothing only for sigmoid."""
    try:
        PREFERENCE_LOSSES.get(loss_type)
    except UnknownNameError as err:
        raise ConfigError(
            f"{section}.loss_type", err.message, "use one of the names above"
        ) from err
    try:
        PreferenceParams(beta=beta, label_smoothing=smoothing)
    except ValueError as err:
        raise ConfigError(
            f"{section}.beta", str(err), "use beta > 0, label_smoothing in [0, 0.5)"
        ) from err
    if smoothing and loss_type != "sigmoid":
        raise ConfigError(
            f"{section}.label_smoothing",
            f"label smoothing is a form of the sigmoid loss; {section}.loss_type is {loss_type}",
            f"remove {section}.label_smoothing, or use loss_type sigmoid",
        )


def check_pairs(cfg: TemperConfig, section: str, max_length: int, cut: str) -> None:
    """What a run on preference pairs (DPO, reward-model training) needs: training data,
    a positive ``<section>.max_length``, a cut at one end, and mini-batches that keep a
    pair's two rows together (``cut``: how this pipeline cuts a sequence)."""
    data = cfg.data
    if not data.train_files and not cfg.experiment.val_only:
        raise ConfigError(
            "data.train_files",
            "no training data given",
            "set data.train_files to a file or list of prompt/chosen/rejected rows",
        )
    if max_length <= 0:
        raise ConfigError(f"{section}.max_length", f"must be > 0, got {max_length}", "set it")
    if data.truncation == "middle":
        raise ConfigError(
            "data.truncation", f"middle cuts a prompt in two; {cut}", "use error, left or right"
        )
    mini = cfg.actor.mini_batch_size
    if mini is not None and mini % 2:
        raise ConfigError(
            "actor.mini_batch_size",
            f"counts sequences, two per pair; {mini} would part a pair's chosen and rejected",
            f"set actor.mini_batch_size to an even number ({mini + 1})",
        )


PIPELINE = Pipeline(
    build=DPOProducer,
    step=dpo_step,
    uses=frozenset({REFERENCE, REFERENCE_ALWAYS}),
    curve="train/rewards/margin",
    check=check,
    preflight=check_dpo_data,
    step_shape=rows_per_step,
    sections=frozenset({"dpo"}),
    context=sequence,
)
