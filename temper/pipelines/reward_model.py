"""Reward-model training: the ``reward_model`` pipeline (Bradley–Terry on preference pairs).

Neither verl nor ROLL trains reward models; OpenRLHF, NeMo-RL and TRL do. The trained
model is the policy's backbone with a scalar head (the critic's value model with a
bias-free head: plan part ``score_head``; engines declare whether theirs is the Hugging
Face one, ``hf_value_model``), and a sequence's score is the head's output at its last token. A step
draws ``data.train_batch_size`` preference pairs from the resumable sampler — the DPO
pipeline's data (:mod:`temper.data.preference`: a prompt, its chosen and its rejected
response, with its bad-row reporting), its columns and length under ``rm.*`` — laid out
to be scored at the last token (:func:`~temper.data.preference.scored_pairs`), and the
actor takes an update on the mean pair loss ``rm.loss_type``
(:data:`~temper.algorithms.reward_model.REWARD_MODEL_LOSSES`:
``−log σ(r_c − r_r)``, plus ``rm.center_rewards_coef·(r_c + r_r)²``) through the same
engines, packing and micro-batches as RL (:meth:`temper.roles.actor.Actor.reward_update`).
No rollout engine, reference or critic is built.

Metrics per step: ``train/loss``; ``train/rewards/{chosen,rejected,margin,accuracy}``
(the mean scores, their difference, the fraction of pairs ranked right), at the weights
before the step's update. Validation on ``data.val_files`` every
``experiment.test_freq`` steps: the same over every held-out pair (``val/accuracy``, the
headline; ``val/margin``, ``val/loss``, …). Checkpoints and exact resume are the
driver's. Every checkpoint's ``actor/`` and the run's ``final/actor`` are
``AutoModelForSequenceClassification`` directories (``num_labels=1``) that the
reward-model role (``reward.model.path``, :mod:`temper.rewards.model`) serves in an RL run.
"""

from __future__ import annotations

import torch

from temper.algorithms.reward_model import (
    REWARD_MODEL_LOSSES,
    RewardLossParams,
    score_pair_metrics,
)
from temper.config.errors import ConfigError
from temper.config.plan import SCORE_HEAD
from temper.config.schema import TemperConfig
from temper.data import Batch
from temper.data.preference import PairColumns, PairDataset, build_pair_datasets, scored_pairs
from temper.pipelines import dpo, sft
from temper.pipelines.preflight_data import check_rm_data
from temper.pipelines.preflight_models import check_model_path
from temper.pipelines.producer import ProducerContext, Validation
from temper.pipelines.record import Context, Pipeline
from temper.pipelines.run import Run
from temper.pipelines.timing import Timer, throughput
from temper.pipelines.unread import refuse_unread
from temper.registry import UnknownNameError
from temper.roles.base import ActorRole
from temper.training.registry import ENGINES


def loss_params(cfg: TemperConfig) -> RewardLossParams:
    """``rm.center_rewards_coef`` (checked by :func:`check`)."""
    return RewardLossParams(center_coef=cfg.rm.center_rewards_coef)


class RewardModelProducer(sft.DatasetProducer):
    """The step's pairs laid out for the score head, and the validation on held-out
    pairs (module doc)."""

    headline = "val/accuracy"

    def __init__(self, ctx: ProducerContext) -> None:
        cfg = self.cfg = ctx.cfg
        if ctx.roles is None:
            raise RuntimeError("the reward-model producer validates with the run's actor")
        self.actor: ActorRole = ctx.roles.actor
        self.params = loss_params(cfg)
        train, val = build_pair_datasets(cfg, ctx.tokenizer, PairColumns.of("rm", cfg.rm))
        self.train_data: PairDataset | None = scored_pairs(train) if train is not None else None
        self.val_data = scored_pairs(val) if val is not None else None
        self._draw_rows(cfg, len(train) if train is not None else None)

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The next ``train_batch_size`` pairs (``2 ×`` rows) and the data's counts."""
        if self.train_data is None or self.sampler is None:
            raise ConfigError("data.train_files", "no training data given", "set it")
        draw = self.sampler.next()
        batch = self.train_data.make_batch(draw.indices, draw.uids)
        return batch, {**self.train_data.metrics(), "train/epoch": float(draw.epoch)}

    def validate(self, step: int) -> Validation:
        """Over every held-out pair: ``val/loss`` (the mean pair loss), ``val/accuracy``
        (pairs scored chosen above rejected), ``val/margin``, ``val/rewards_chosen``,
        ``val/rewards_rejected`` (means), ``val/pairs``."""
        if self.val_data is None:
            return Validation({})
        loss_fn = REWARD_MODEL_LOSSES.get(self.cfg.rm.loss_type)
        sums: dict[str, float] = {}
        pairs = 0
        for batch in self.val_data.eval_batches(self.cfg.data.val_batch_size):
            scores = self.actor.compute_scores(batch)["scores"].double()
            chosen, rejected = scores[0::2], scores[1::2]
            with torch.no_grad():
                values = {"loss": loss_fn(chosen, rejected, self.params)}
            values.update(score_pair_metrics(chosen, rejected))
            for name, per_pair in values.items():
                sums[name] = sums.get(name, 0.0) + float(per_pair.sum())
            pairs += len(batch) // 2
        return dpo.pair_validation(sums, pairs)


def reward_model_step(run: Run) -> dict[str, float]:
    """One reward-model step: the next pairs, one update of the scorer on them.

    ``train/loss`` and ``train/rewards/*`` are the update's (``actor/*``, the
    mini-batches' means); ``train/pairs`` the pairs learnt from."""
    t = Timer()
    cfg = run.cfg
    with t("step"):
        batch, metrics = run.producer.produce(run.step, t)
        with t("train"):
            actor = run.roles.actor.reward_update(batch, cfg.rm.loss_type, loss_params(cfg))
    tokens = float(batch["attention_mask"].sum())
    scores = {
        f"train/{k[len('actor/') :]}": v for k, v in actor.items() if k.startswith("actor/rewards/")
    }
    return {
        **metrics,
        "train/loss": actor["actor/loss"],
        **scores,
        "train/pairs": float(len(batch) // 2),
        "perf/samples": float(len(batch)),
        **actor,
        **t.times,
        **throughput(tokens, t.times["timing/step_s"]),
    }


def sequence(cfg: TemperConfig, notes: list[str]) -> Context:
    """A sequence is at most ``rm.max_length`` tokens, the prompt with one response, plus
    the slot its score is read at."""
    return (cfg.rm.max_length + 1, ("rm.max_length",), "a prompt, its response and its score slot")


# ------------------------------------------------------------------------ the config

NO_GENERATION = "a reward-model run learns from given pairs: it generates nothing"
#: Sections a reward-model run reads nothing of, and why.
UNREAD_SECTIONS = {
    "rollout": NO_GENERATION,
    "reward": "a reward-model run scores with the model it trains: its labels are the pairs",
    "algorithm": "a reward-model run has no advantages, rewards or KL: its loss is rm.loss_type",
    "critic": "a reward-model run has no critic (the model it trains is a scorer already)",
    "reference": "a reward-model run has no reference (its loss compares two scores)",
}
#: Keys of read sections a reward-model step reads nothing of, and why: the DPO
#: pipeline's list (the keys only an RL step reads), less what differs.
RL_ONLY = {
    **{
        key: why.replace("a DPO run", "a reward-model run")
        .replace("the DPO loss is dpo.loss_type", "the loss is rm.loss_type")
        .replace("dpo.max_length", "rm.max_length")
        .replace("the DPO loss", "the reward-model loss")
        for key, why in dpo.RL_ONLY.items()
    },
    "actor.sft_loss_coef": "the reward-model loss is rm.loss_type alone",
    "actor.use_kl_loss": "a reward-model run has no reference to take a KL to",
    "actor.kl_loss_coef": "a reward-model run has no KL term",
    "actor.kl_loss_type": "a reward-model run has no KL term",
    "actor.loss_agg_mode": "a reward-model loss is a mean over pairs of one score each",
    "actor.entropy_coeff": "a scorer has no token distribution to take an entropy of",
    "actor.entropy_chunk_size": "a scorer has no token distribution to take an entropy of",
    "actor.use_torch_compile": "it compiles the entropy kernel, which a scorer does not run",
}


def check(cfg: TemperConfig) -> None:
    """Keys a reward-model run would read nothing of are refused with why; then its own
    limits."""
    refuse_unread(cfg, "reward_model", UNREAD_SECTIONS, RL_ONLY)
    rm = cfg.rm
    strategy = cfg.actor.strategy
    if strategy in ENGINES and not ENGINES.get(strategy).hf_value_model:
        able = [n for n in ENGINES.names() if ENGINES.get(n).hf_value_model]
        raise ConfigError(
            "actor.strategy",
            f"the {strategy} engine builds its own network, which is not saved as a "
            "sequence-classification model",
            f"use one of {', '.join(able)} for pipeline reward_model",
        )
    if cfg.resources.backend != "local":
        raise ConfigError(
            "resources.backend",
            "reward-model training runs on the local backend (one process) only",
            "set resources.backend: local",
        )
    if cfg.model.lora.rank > 0:
        raise ConfigError(
            "model.lora.rank",
            "a reward model is saved as one sequence-classification model; merging LoRA "
            "adapters into it is not built",
            "remove model.lora (train the whole model)",
        )
    try:
        REWARD_MODEL_LOSSES.get(rm.loss_type)
    except UnknownNameError as err:
        raise ConfigError("rm.loss_type", err.message, "use one of the names above") from err
    try:
        loss_params(cfg)
    except ValueError as err:
        raise ConfigError("rm.center_rewards_coef", str(err), "use a value >= 0") from err
    dpo.check_pairs(
        cfg, "rm", rm.max_length, "a reward-model sequence is cut at one end, as a DPO one"
    )


def preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """The pairs' columns (:func:`~temper.pipelines.preflight_data.check_rm_data`), and a model
    whose architecture ``transformers`` has a sequence-classification class for (the
    form the trained model is saved in) — read from its ``config.json``, not loaded."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as CLASSIFIERS,
    )

    check_rm_data(cfg, notes)
    config = check_model_path(cfg.model.path, "model.path", notes) or {}
    model_type = config.get("model_type")
    if isinstance(model_type, str) and not config.get("auto_map") and model_type not in CLASSIFIERS:
        raise ConfigError(
            "model.path",
            f"transformers has no sequence-classification class for model_type "
            f"'{model_type}', the form a reward model is saved in",
            "train the reward model from a text model (llama, qwen2, mistral, …)",
        )


PIPELINE = Pipeline(
    build=RewardModelProducer,
    step=reward_model_step,
    uses=frozenset({SCORE_HEAD}),
    curve="train/loss",
    check=check,
    preflight=preflight,
    step_shape=dpo.rows_per_step,
    sections=frozenset({"rm"}),
    context=sequence,
)
