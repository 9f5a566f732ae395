"""Online DPO with a refreshed reference: the ``spin`` pipeline (verl's SPIN recipe).

A step (:func:`spin_step`):

1. at the start of step ``g`` with ``g % spin.ref_update_freq == 0`` the reference
   becomes the policy's current weights (:mod:`temper.pipelines.spin_reference`);
2. the RLVR producer draws ``data.train_batch_size`` prompts, generates ``rollout.n``
   responses each and scores them with the run's rewards;
3. rows ``2i`` and ``2i + 1`` of the samples (prompt by prompt, ``n`` responses each)
   form pair ``i``, the higher score chosen (a tie: the first sampled)
   (:func:`~temper.algorithms.preference.online_pairs`): with an even ``rollout.n`` each
   pair is two responses to one prompt; with ``rollout.n: 1`` — verl's ``run_spin.sh`` —
   two prompts' responses, which verl pairs the same way (``temper check`` says so);
4. the reference scores both responses and the actor takes the preference update
   ``spin.loss_type`` (β ``spin.beta``, ``spin.label_smoothing``) over mini-batches of
   whole pairs, as the ``dpo`` pipeline does (:meth:`temper.roles.actor.Actor.dpo_update`);
5. the rollout engine gets the new weights.

Metrics: the RL step's generation and reward metrics (``train/score_mean``: the run's
curve), ``train/loss``, ``train/rewards/{chosen,rejected,margin,accuracy}`` and
``train/logps/{chosen,rejected}`` (the DPO pipeline's), ``train/pairs``,
``train/ties`` (the fraction of pairs whose two responses scored the same: they teach
an arbitrary preference, as in verl) and ``spin/ref_refreshed`` (1 on a refresh step).
Validation is RLVR's (rewards of generations on ``data.val_files``). A checkpoint holds
the sampler, as RLVR's, and the refreshed reference.
"""

from __future__ import annotations

from typing import Any

import torch

from temper.algorithms.preference import PreferenceParams, online_pairs
from temper.config.errors import ConfigError
from temper.config.plan import REFERENCE, REFERENCE_ALWAYS, REWARD_MODEL, ROLLOUT
from temper.config.schema import TemperConfig
from temper.data import Batch
from temper.pipelines.dpo import check_preference_loss
from temper.pipelines.dumps import dump_generations
from temper.pipelines.preflight_data import check_prompt_data
from temper.pipelines.producer import ProducerContext
from temper.pipelines.record import Pipeline
from temper.pipelines.rl_step import response_metrics
from temper.pipelines.rlvr import RLVRProducer
from temper.pipelines.rlvr import check as check_rlvr
from temper.pipelines.run import Run
from temper.pipelines.spin_reference import ReferenceRefresh
from temper.pipelines.timing import Timer, throughput
from temper.pipelines.unread import refuse_unread


def preference_params(cfg: TemperConfig) -> PreferenceParams:
    """``spin.beta`` and ``spin.label_smoothing`` (checked by :func:`check`)."""
    return PreferenceParams(beta=cfg.spin.beta, label_smoothing=cfg.spin.label_smoothing)


def pair_rows(batch: Batch) -> tuple[Batch, dict[str, float]]:
    """The step's samples as pairs (module doc, step 3): rows reordered chosen, rejected,
    pair by pair, with ``chosen`` (2P,) 1 on chosen rows; and ``train/ties``."""
    scores = batch["scores"].float()
    order = online_pairs(scores)
    pairs = batch.select(order)
    pairs["chosen"] = torch.tensor([1, 0], dtype=torch.long).repeat(len(order) // 2)
    ties = (scores[0::2] == scores[1::2]).float().mean().item()
    return pairs, {"train/ties": ties}


class SpinProducer(RLVRProducer):
    """RLVR's prompts, responses and rewards, formed into pairs; the reference refreshed
    at the start of the steps it is due (module doc)."""

    def __init__(self, ctx: ProducerContext) -> None:
        super().__init__(ctx)
        roles = ctx.roles
        if roles is None or roles.reference is None:
            raise RuntimeError("a spin run builds its reference: the plan turned it off")
        self.refresh = ReferenceRefresh(ctx.cfg, roles.actor, roles.reference, ctx.out_dir)

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        with timer("ref_refresh"):
            refreshed = self.refresh.maybe_refresh(step)
        batch, metrics = super().produce(step, timer)
        metrics.update(response_metrics(batch))
        pairs, pair_metrics = pair_rows(batch)
        return pairs, {**metrics, **pair_metrics, "spin/ref_refreshed": float(refreshed)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "reference": self.refresh.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.refresh.load_state_dict(state.get("reference", {"refreshed_at": 0}))


def spin_step(run: Run) -> dict[str, float]:
    """One online-DPO step (module doc); returns its metrics."""
    t = Timer()
    cfg, reference = run.cfg, run.roles.reference
    if reference is None:
        raise RuntimeError("a spin run builds its reference: the plan turned it off")
    with t("step"):
        batch, metrics = run.producer.produce(run.step, t)  # refresh, rollout, reward, pairs
        with t("ref"):
            batch = reference.compute_ref_log_probs(batch)
        if cfg.experiment.rollout_data_dir:
            rows = run.producer.dump_rows(batch, run.step)
            dump_generations(cfg.experiment.rollout_data_dir, run.step, rows)
        with t("train"):
            actor = run.roles.actor.dpo_update(batch, cfg.spin.loss_type, preference_params(cfg))
        with t("weight_sync"):
            run.sync_weights()
    tokens = float(batch["prompt_mask"].sum() + batch["response_mask"].sum())
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
        **actor,
        **t.times,
        **throughput(tokens, t.times["timing/step_s"]),
    }


# ------------------------------------------------------------------------ the config

#: Sections a spin run reads nothing of, and why.
UNREAD_SECTIONS = {
    "critic": "online DPO has no critic: its loss is spin.loss_type",
    "dpo": "the dpo section configures offline pairs; online DPO's loss is the spin section",
    "algorithm": "online DPO ranks responses by their reward and takes the spin.loss_type "
    "loss: no advantages, KL penalty or reward shaping",
}
NO_RL_LOSS = "online DPO holds the policy near the reference through spin.beta"
NO_RATIO = "online DPO's loss is spin.loss_type: there is no policy ratio to clip"
NO_RL = "online DPO's loss is spin.loss_type alone"
#: Keys of read sections a spin step reads nothing of, and why.
UNREAD_KEYS = {
    "actor.policy_loss": NO_RL,
    "actor.policy_loss_kwargs": NO_RL,
    "actor.clip_ratio": NO_RATIO,
    "actor.clip_ratio_low": NO_RATIO,
    "actor.clip_ratio_high": NO_RATIO,
    "actor.clip_ratio_c": NO_RATIO,
    "actor.entropy_coeff": NO_RL,
    "actor.sft_loss_coef": NO_RL,
    "actor.rl_loss_coef": NO_RL,
    "actor.l2_coef": NO_RL,
    "actor.loss_agg_mode": "a DPO loss is a mean over pairs of sequence log-prob sums",
    "actor.use_kl_loss": NO_RL_LOSS,
    "actor.kl_loss_coef": NO_RL_LOSS,
    "actor.kl_loss_type": NO_RL_LOSS,
    "experiment.critic_warmup": "online DPO has no critic to warm up: every step updates",
}


def check(cfg: TemperConfig) -> None:
    """What a spin run cannot honour; then RLVR's data and render checks."""
    refuse_unread(cfg, "spin", UNREAD_SECTIONS, UNREAD_KEYS)
    spin = cfg.spin
    if cfg.reference.enable is False:
        raise ConfigError(
            "reference.enable",
            "online DPO compares the policy with the reference",
            "remove reference.enable (a spin run always builds its reference)",
        )
    check_preference_loss("spin", spin.loss_type, spin.beta, spin.label_smoothing)
    if spin.ref_update_freq < 0:
        raise ConfigError(
            "spin.ref_update_freq",
            f"must be >= 0, got {spin.ref_update_freq}",
            "set it to the steps between refreshes, or 0 for a fixed reference",
        )
    _check_refresh(cfg)
    _check_pairs(cfg)
    check_rlvr(cfg)


def _check_refresh(cfg: TemperConfig) -> None:
    """A refreshed reference is an engine of its own, rebuilt from the actor's export."""
    if cfg.spin.ref_update_freq == 0:
        return
    if cfg.model.lora.rank > 0:
        raise ConfigError(
            "model.lora.rank",
            "with LoRA the reference is the actor's base weights (adapters off); making it "
            "the trained policy would need the adapters merged into that base",
            "train all weights (model.lora.rank 0), or set spin.ref_update_freq 0",
        )


def _check_pairs(cfg: TemperConfig) -> None:
    """Pairs are consecutive samples: an even number of them, mini-batches of whole pairs."""
    n, prompts = cfg.rollout.n, cfg.data.train_batch_size
    if (n * prompts) % 2:
        raise ConfigError(
            "rollout.n",
            f"{prompts} prompts × {n} responses is an odd number of samples: one would "
            "have no pair",
            "use an even rollout.n (2 compares two responses to one prompt) or an even "
            "data.train_batch_size",
        )
    mini = cfg.actor.mini_batch_size
    if mini is not None and mini % 2:
        raise ConfigError(
            "actor.mini_batch_size",
            f"counts samples, two per pair; {mini} would part a pair's chosen and rejected",
            f"set actor.mini_batch_size to an even number ({mini + 1})",
        )


def preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """RLVR's prompt data; and what a pair compares, when that is two prompts."""
    check_prompt_data(cfg, notes)
    if cfg.rollout.n % 2:
        notes.append(
            f"rollout.n is {cfg.rollout.n}: some pairs compare responses to two different "
            "prompts (verl's SPIN pairs consecutive samples the same way); an even "
            "rollout.n pairs two responses to one prompt"
        )


PIPELINE = Pipeline(
    build=SpinProducer,
    step=spin_step,
    uses=frozenset({ROLLOUT, REFERENCE, REFERENCE_ALWAYS, REWARD_MODEL}),
    check=check,
    preflight=preflight,
    sections=frozenset({"spin"}),
)
