"""RL on an implicit process reward model trained alongside: the ``prime`` pipeline
(verl's PRIME recipe, ``recipe/prime``).

A step (:func:`prime_step`):

1. the producer draws ``train_batch_size × prime.oversample_factor`` prompts, generates
   ``rollout.n`` responses each and scores them with the run's rewards (the outcome,
   ``train/score_mean`` over all drawn samples: verl's ``acc``);
2. it keeps ``train_batch_size`` groups, those passing ``prime.filter_accuracy`` (mean
   outcome within the bounds) and ``prime.filter_truncate`` (no response reaching
   ``response_length − 1``) first, each part in draw order
   (:func:`~temper.algorithms.prime.accuracy_filter_order`);
3. the actor's old log-probs (and the reference's, for ``actor.use_kl_loss``);
4. the implicit PRM (the run's ``prm`` role, :mod:`temper.roles.prm`) trains on the
   outcome and scores every response token, in the order ``prime.prm.update`` names;
5. advantages: RLOO per reward source, weighted by ``prime.reward_dpo_coef`` (implicit)
   and ``prime.reward_gt_coef`` (outcome), returns-to-go whitened over the batch
   (:func:`~temper.algorithms.prime.prime_advantages`);
6. the actor's PPO update, and the rollout engine gets the new weights.

The checkpoint holds the PRM as a trained role (``reward_model/``: a Hugging Face causal
LM; ``reward_model_train/``: its exact weights, optimizer and schedule), so a resumed
run continues bit for bit.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch

from temper.algorithms.prime import accuracy_filter_order, prime_advantages
from temper.config.errors import ConfigError
from temper.config.plan import PRM, REFERENCE, REWARD_MODEL, ROLLOUT
from temper.config.schema import TemperConfig
from temper.data import Batch, build_sampler
from temper.pipelines.dumps import dump_generations
from temper.pipelines.preflight_data import check_prompt_data
from temper.pipelines.producer import ProducerContext
from temper.pipelines.record import Pipeline
from temper.pipelines.rl_step import needs_actor_forward, response_metrics, rollout_mismatch
from temper.pipelines.rlvr import RLVRProducer
from temper.pipelines.rlvr import check as check_rlvr
from temper.pipelines.run import Run
from temper.pipelines.timing import Timer, throughput
from temper.pipelines.unread import is_set, refuse_unread
from temper.roles.prm import score_and_update


def prompts_per_draw(cfg: TemperConfig) -> int:
    """``train_batch_size × prime.oversample_factor`` (checked to be whole)."""
    return round(cfg.data.train_batch_size * cfg.prime.oversample_factor)


class PrimeProducer(RLVRProducer):
    """RLVR's prompts, responses and rewards, oversampled and filtered (module doc, steps
    1–2)."""

    def __init__(self, ctx: ProducerContext) -> None:
        super().__init__(ctx)
        cfg = ctx.cfg
        if self.train_data is not None:  # draws of train_batch_size × oversample_factor
            data = dataclasses.replace(cfg.data, gen_batch_size=prompts_per_draw(cfg))
            drawn = dataclasses.replace(cfg, data=data)
            self.sampler = build_sampler(drawn, len(self.train_data), self.train_data.tags)
            epochs = cfg.experiment.total_epochs * self.sampler.batches_per_epoch
            self.total_steps = cfg.experiment.max_steps or epochs

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        if self.train_data is None:
            raise ConfigError("data.train_files", "no training data given", "set it")
        self._at(step - 1)
        batch, metrics = self.generate_groups(self._draw(), timer)
        metrics.update(self.train_data.metrics())  # train/score_*: every drawn sample (acc)
        kept, filter_metrics = self.downsample(batch)
        return kept, {**metrics, **filter_metrics, **response_metrics(kept)}

    def downsample(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """The step's ``train_batch_size`` groups of ``batch`` (module doc, step 2)."""
        cfg, p = self.cfg, self.cfg.prime
        n = cfg.rollout.n
        order, passed = accuracy_filter_order(
            batch["scores"],
            batch["response_mask"].sum(-1),
            n,
            p.accuracy_lower_bound if p.filter_accuracy else None,
            p.accuracy_upper_bound if p.filter_accuracy else None,
            cfg.rollout.response_length if p.filter_truncate else None,
        )
        groups = order[: cfg.data.train_batch_size]
        rows = (groups.unsqueeze(-1) * n + torch.arange(n).unsqueeze(0)).reshape(-1)
        kept = batch.select(rows.tolist())
        return kept, {
            "prime/groups_passed": float(passed.float().mean()),
            "prime/kept_score_mean": float(kept["scores"].float().mean()),
        }


def prime_step(run: Run) -> dict[str, float]:
    """One PRIME step (module doc); returns its metrics."""
    cfg, roles, t = run.cfg, run.roles, Timer()
    producer = cast(PrimeProducer, run.producer)  # the record's producer
    if roles.prm is None:
        raise RuntimeError("a prime run builds its PRM: the plan turned it off")
    with t("step"):
        batch, metrics = producer.produce(run.step, t)
        tokens = batch["prompt_mask"].sum().item() + batch["response_mask"].sum().item()
        if needs_actor_forward(cfg, batch):
            with t("old_log_probs"):
                batch = roles.actor.compute_log_probs(batch)
            metrics.update(rollout_mismatch(batch))
        else:
            batch["old_log_probs"] = batch["rollout_log_probs"]
        if roles.reference is not None:
            with t("ref"):
                batch = roles.reference.compute_ref_log_probs(batch)
        with t("prm"):
            batch, prm_metrics = score_and_update(roles.prm, cfg.prime, batch, cfg.rollout.n)
        with t("adv"):
            p = cfg.prime
            advantages, returns = prime_advantages(
                batch["rm_scores"],
                batch["scores"],
                batch["response_mask"],
                cfg.rollout.n,
                p.reward_dpo_coef,
                p.reward_gt_coef,
            )
            batch["advantages"], batch["returns"] = advantages, returns
        if cfg.experiment.rollout_data_dir:
            dump_generations(
                cfg.experiment.rollout_data_dir, run.step, producer.dump_rows(batch, run.step)
            )
        with t("train"):
            actor = roles.actor.update(batch)
        with t("weight_sync"):
            run.sync_weights()
    mask = batch["response_mask"] > 0
    adv = {
        "train/advantages_mean": float(advantages[mask].mean()),
        "train/returns_mean": float(returns[mask].mean()),
    }
    seconds = t.times["timing/step_s"]
    return {**metrics, **prm_metrics, **adv, **actor, **t.times, **throughput(tokens, seconds)}


# ------------------------------------------------------------------------ the config

NO_ALGORITHM = (
    "PRIME's advantages are the RLOO of the implicit and outcome rewards "
    "(prime.reward_dpo_coef, prime.reward_gt_coef): no estimator choice, KL penalty or "
    "reward shaping"
)
UNREAD_SECTIONS = {
    "critic": "PRIME has no critic: its baselines are leave-one-out",
    "algorithm": NO_ALGORITHM,
}
ONE_PASS = "the PRM takes one pass over a step's samples, in order (verl's update_rm)"
UNREAD_KEYS = {
    "experiment.critic_warmup": "PRIME has no critic to warm up",
    "prime.prm.ppo_epochs": ONE_PASS,
    "prime.prm.shuffle": ONE_PASS,
    "prime.prm.checkpoint_contents": "a checkpoint always holds the whole PRM (weights, "
    "optimizer, schedule) and its Hugging Face export",
    "data.gen_batch_size": "PRIME draws train_batch_size × prime.oversample_factor prompts",
}


def check(cfg: TemperConfig) -> None:
    """What a PRIME run cannot honour; then RLVR's data and render checks."""
    refuse_unread(cfg, "prime", UNREAD_SECTIONS, UNREAD_KEYS)
    p = cfg.prime
    if cfg.rollout.n < 2:
        raise ConfigError(
            "rollout.n",
            f"PRIME's leave-one-out baselines need 2 or more responses per prompt, got {cfg.rollout.n}",
            "set rollout.n to 2 or more (verl's recipe uses 4)",
        )
    if (
        p.oversample_factor < 1
        or abs(cfg.data.train_batch_size * p.oversample_factor - prompts_per_draw(cfg)) > 1e-6
    ):
        raise ConfigError(
            "prime.oversample_factor",
            f"draws train_batch_size × factor prompts ({cfg.data.train_batch_size} × "
            f"{p.oversample_factor}): must be a whole number ≥ train_batch_size",
            "use a factor ≥ 1 that makes the product whole",
        )
    if p.filter_accuracy and not 0 <= p.accuracy_lower_bound <= p.accuracy_upper_bound <= 1:
        raise ConfigError(
            "prime.accuracy_lower_bound",
            f"the bounds [{p.accuracy_lower_bound}, {p.accuracy_upper_bound}] are not an "
            "interval within [0, 1]",
            "set 0 ≤ accuracy_lower_bound ≤ accuracy_upper_bound ≤ 1",
        )
    for bound in ("accuracy_lower_bound", "accuracy_upper_bound"):
        if not p.filter_accuracy and is_set(cfg, f"prime.{bound}"):
            raise ConfigError(
                f"prime.{bound}",
                "bounds the accuracy filter, which prime.filter_accuracy leaves off",
                f"set prime.filter_accuracy: true, or remove prime.{bound}",
            )
    _check_prm_batches(cfg)
    if p.prm.beta_train <= 0:
        raise ConfigError(
            "prime.prm.beta_train", f"must be > 0, got {p.prm.beta_train}", "use e.g. 0.05"
        )
    if cfg.model.lora.rank > 0:
        raise ConfigError(
            "model.lora.rank",
            "the implicit PRM trains all its weights; LoRA would apply to both it and the policy",
            "train all weights (model.lora.rank 0)",
        )
    check_rlvr(cfg)


def _check_prm_batches(cfg: TemperConfig) -> None:
    """The PRM's mini-batches: within the step's samples, whole micro-batches (as verl
    asserts); a rank's share is checked when the Ray workers start."""
    prm = cfg.prime.prm
    samples = cfg.data.train_batch_size * cfg.rollout.n
    mini = prm.mini_batch_size or cfg.actor.mini_batch_size or samples
    key = "prime.prm.mini_batch_size" if prm.mini_batch_size else "actor.mini_batch_size"
    if mini > samples:
        raise ConfigError(
            key,
            f"the PRM's mini-batch of {mini} samples exceeds a step's {samples}",
            f"set prime.prm.mini_batch_size to at most {samples}",
        )
    micro = prm.micro_batch_size_per_device
    if not prm.use_dynamic_bsz and mini % micro:
        raise ConfigError(
            key,
            f"the PRM's mini-batch of {mini} samples is not a whole number of micro-batches "
            f"of {micro} (prime.prm.micro_batch_size_per_device)",
            "make the mini-batch a multiple of the micro-batch",
        )


PIPELINE = Pipeline(
    build=PrimeProducer,
    step=prime_step,
    uses=frozenset({ROLLOUT, REFERENCE, PRM, REWARD_MODEL}),
    check=check,
    preflight=check_prompt_data,
    sections=frozenset({"prime"}),
)
