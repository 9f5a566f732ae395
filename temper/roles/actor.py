"""The actor: old log-probs before the update, and the PPO-style policy update.

The loss is assembled from the algorithms package (policy loss by registry name, KL,
entropy, SFT terms, aggregation) — never re-derived here. Every term is aggregated with
the **global** normalizers of its mini-batch, so summing micro-batch losses gives the
mini-batch loss whatever the micro-batch split (1×N equals N×1 accumulation).

``actor/entropy`` is always reported: the token mean of the update forward's entropy
(the engine computes it from the same logits, under ``no_grad`` when
``entropy_coeff`` is 0), averaged over optimizer steps like the other metrics — so a
run without old-log-prob recompute or entropy bonus still shows it.

Keys read by ``update``: ``prompt_ids``, ``prompt_mask``, ``response_ids``,
``response_mask``, ``advantages``, ``old_log_probs`` (or ``rollout_log_probs`` with
``recompute_old_log_prob: false``); ``ref_log_probs`` for the KL loss;
``rollout_log_probs`` for ``rollout_is`` and ``rollout_rs`` (whose rejected tokens
leave ``response_mask`` for the whole update: policy, KL, entropy and SFT terms and their
normalizers, after the advantages were computed); ``token_level_scores`` (or
``token_level_rewards``) for the SFT term's positive samples; ``scores`` (B, the task
score before any normalization) for a policy loss that takes ``sample_positive``
(``topr_score``: score > 0); ``sample_weights`` (B,),
when the shaping phase set them (ROLL's difficulty/length loss weights), multiply each
sample's policy-gradient loss, like the rollout IS weights do per token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.kd import KD_OBJECTIVES, KDParams
from temper.algorithms.kl import kl_estimator_needs_logits, kl_loss, kl_penalty
from temper.algorithms.masked import masked_mean
from temper.algorithms.objectives import actor_loss, entropy_loss, nll_loss, sft_loss
from temper.algorithms.policy_losses import (
    PolicyLossParams,
    compute_policy_loss,
    policy_loss_inputs,
)
from temper.algorithms.preference import (
    PREFERENCE_LOSSES,
    PreferenceParams,
    pair_metrics,
    sequence_log_probs,
)
from temper.algorithms.reward_model import (
    REWARD_MODEL_LOSSES,
    RewardLossParams,
    score_pair_metrics,
)
from temper.algorithms.rollout_correction import (
    RejectionFilter,
    batch_normalized,
    rollout_is_weights,
    rollout_rejection_mask,
)
from temper.config.errors import ConfigError
from temper.config.schema import ActorConfig
from temper.data.batch import Batch
from temper.roles.gkd_term import DirectDistill, direct_distill_loss, with_student_ids
from temper.roles.kd_loss import distill_loss_fn
from temper.roles.minibatch import (
    StepMetrics,
    mini_batches,
    pair_mini_batches,
    per_rank_mini_batch,
)
from temper.roles.pairs import PairObjective, pair_coefficients, pair_loss_fn, row_scalars
from temper.roles.reference import Reference
from temper.training.base import LossFn, TrainEngine
from temper.training.router_replay import OFF as REPLAY_OFF
from temper.training.router_replay import ROUTED_EXPERTS, ROUTER_REPLAY, RoutingUse

_POSITIVE = "_sft_positive"
_SCORE_POSITIVE = "_score_positive"  # (B,) task score > 0 (topr_score's positive set)
_TOKEN_WEIGHTS = "_token_weights"  # rollout IS weights × sample weights (B, R)


def policy_loss_params(cfg: ActorConfig) -> PolicyLossParams:
    """``PolicyLossParams`` from the actor section (clip ratios + ``policy_loss_kwargs``)."""
    known = {f.name for f in dataclasses.fields(PolicyLossParams)}
    for key in cfg.policy_loss_kwargs:
        if key not in known:
            raise ConfigError(
                f"actor.policy_loss_kwargs.{key}",
                "not a parameter of any policy loss",
                f"use one of: {', '.join(sorted(known))}",
            )
    try:
        return PolicyLossParams(
            clip_ratio=cfg.clip_ratio,
            clip_ratio_low=cfg.clip_ratio_low,
            clip_ratio_high=cfg.clip_ratio_high,
            clip_ratio_c=cfg.clip_ratio_c,
            **cfg.policy_loss_kwargs,
        )
    except ValueError as err:
        raise ConfigError("actor.clip_ratio_c", str(err), "use a value > 1 or null") from err


def rollout_correction_weights(
    cfg: ActorConfig,
    batch: Batch,
    global_sum: Callable[[list[float]], list[float]] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The truncated (or IcePop) rollout IS weights ``(B, T)`` of ``actor.rollout_is`` and
    their metrics, from the batch's old and rollout log-probs (the update's token
    weights; the optimal-token-baseline estimators read them too).

    ``rollout_is_batch_normalize`` divides by the weights' mean over the whole batch: with
    ``global_sum`` (a data-parallel engine's) its parts are summed over the ranks first,
    so each rank's share is normalized by the same mean as one rank holding all of it.
    """
    if "rollout_log_probs" not in batch:
        raise KeyError(f"actor.rollout_is={cfg.rollout_is} needs rollout_log_probs")
    mask = batch["response_mask"]
    weights, _, metrics = rollout_is_weights(
        batch["old_log_probs"],
        batch["rollout_log_probs"],
        mask,
        level=cfg.rollout_is,
        threshold=cfg.rollout_is_threshold,
        threshold_low=cfg.rollout_is_threshold_low,
        mode="truncate" if cfg.rollout_is_threshold_low is None else "icepop",
    )
    if cfg.rollout_is_batch_normalize:
        weights, mean = batch_normalized(weights, mask, cfg.rollout_is, global_sum)
        metrics["rollout_is_mean"] = metrics["rollout_is_mean"] / mean
    return weights, metrics


class Actor:
    """Policy role over a trainable causal-LM engine."""

    def __init__(
        self,
        cfg: ActorConfig,
        engine: TrainEngine,
        *,
        temperature: float = 1.0,
        seed: int = 0,
        distill: DirectDistill | None = None,
    ) -> None:
        self.cfg = cfg
        self.distill = distill  # on-policy distillation's direct-gradient term (GKD)
        self.engine = engine
        self.temperature = temperature if temperature > 0 else 1.0
        self.seed = seed
        self.params = policy_loss_params(cfg)
        self.updates = 0
        # LoRA on a Ray worker: the reference is this engine with its adapters off, served
        # from the actor's ranks (set by the worker; the local backend builds its own)
        self.base_reference: Reference | None = None

    def _temperature(self, batch: Batch) -> float:
        t = float(batch.meta.get("temperature", self.temperature) or 1.0)
        return t if t > 0 else 1.0

    # ------------------------------------------------------------------ inference

    def compute_log_probs(
        self, batch: Batch, *, with_entropy: bool = False, with_sum_pi_squared: bool = False
    ) -> Batch:
        """A copy of ``batch`` with ``old_log_probs`` (B, R) (and ``entropy``, and
        ``sum_pi_squared`` — Σ_v π_v² at each token — if asked)."""
        out = self.engine.forward(
            batch,
            with_entropy=with_entropy,
            temperature=self._temperature(batch),
            with_sum_pi_squared=with_sum_pi_squared,
            routing=self._routing(batch),
        )
        new = {"old_log_probs": out["log_probs"]}
        if ROUTED_EXPERTS in out:  # R2: the update's forwards replay this routing
            new[ROUTED_EXPERTS] = out[ROUTED_EXPERTS]
        if with_entropy:
            new["entropy"] = out["entropy"]
        if with_sum_pi_squared:
            new["sum_pi_squared"] = out["sum_pi_squared"]
        if "full_kl" in out:  # the engine compares with the reference (exact KL runs)
            new["full_kl"] = out["full_kl"]
        return batch.union(Batch.from_dict(new))

    def _routing(self, batch: Batch) -> RoutingUse | None:
        """What the old-log-prob forward does with MoE routing under
        ``actor.router_replay`` (:mod:`temper.training.router_replay`): R2 records it, R3
        replays the rollout's."""
        if self.cfg.router_replay == REPLAY_OFF:
            return None
        if ROUTER_REPLAY.get(self.cfg.router_replay).recorded_at == "old_log_prob":
            return "record"
        if ROUTED_EXPERTS not in batch:
            raise KeyError(
                f"actor.router_replay {self.cfg.router_replay} needs the rollout's routed_experts"
            )
        return "replay"

    # ------------------------------------------------------------------ update

    def set_total_steps(self, total_steps: int) -> None:
        """Total optimizer steps of the run, for the LR schedule."""
        self.engine.set_total_steps(total_steps)

    def _prepare(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """Fill in old log-probs, rollout IS weights and SFT positives on a copy."""
        cfg = self.cfg
        work = Batch(batch.tensors.clone(recurse=False), dict(batch.objects), dict(batch.meta))
        metrics: dict[str, float] = {}
        if "old_log_probs" not in work:
            if cfg.recompute_old_log_prob or "rollout_log_probs" not in work:
                raise KeyError("actor.update needs old_log_probs: call compute_log_probs first")
            work["old_log_probs"] = work["rollout_log_probs"]
        if cfg.use_kl_loss and "ref_log_probs" not in work:
            raise KeyError("actor.use_kl_loss needs ref_log_probs from the reference")
        if cfg.rollout_is != "none":
            weights, m = rollout_correction_weights(cfg, work, self.engine.global_sum)
            work[_TOKEN_WEIGHTS] = weights
            metrics.update({f"actor/{k}": float(v) for k, v in m.items()})
        if cfg.rollout_rs and not self._bypass_rs:  # the rejected tokens leave every term
            if "rollout_log_probs" not in work:
                raise KeyError("actor.rollout_rs needs rollout_log_probs")
            keep, m = rollout_rejection_mask(
                work["old_log_probs"],
                work["rollout_log_probs"],
                work["response_mask"],
                [RejectionFilter(f.stat, f.level, f.low, f.high) for f in cfg.rollout_rs],
            )
            work["response_mask"] = work["response_mask"] * keep
            metrics.update({f"actor/{k}": float(v) for k, v in m.items()})
        if "sample_weights" in work:  # per-sample loss weights: one token weight matrix
            per_sample = work["sample_weights"].unsqueeze(-1).to(work["response_mask"].dtype)
            base = work[_TOKEN_WEIGHTS] if _TOKEN_WEIGHTS in work else torch.ones_like(per_sample)
            work[_TOKEN_WEIGHTS] = base * per_sample.expand_as(work["response_mask"])
        if cfg.sft_loss_coef:
            key = "token_level_scores" if "token_level_scores" in work else "token_level_rewards"
            if key not in work:
                raise KeyError("actor.sft_loss_coef needs token_level_scores to pick positives")
            work[_POSITIVE] = (work[key].sum(dim=-1) > 0).float()
        if self.distill is not None:  # the student's logits at the teachers' top-k ids
            work = with_student_ids(work, self.distill)
        if "sample_positive" in policy_loss_inputs(cfg.policy_loss):  # the raw task score
            if "scores" not in work:
                raise KeyError(f"policy loss {cfg.policy_loss} needs the samples' scores")
            work[_SCORE_POSITIVE] = (work["scores"].float() > 0).float()
        return work, metrics

    def _loss_fn(self, mini: Batch, is_scale: float | None = None) -> LossFn:
        """The loss of one mini-batch's micro-batches, with the mini-batch's normalizers.

        Under data parallelism ``mini`` is this rank's share and the normalizers are
        summed over ranks by the engine (a collective), so every rank's loss is a partial
        sum of the whole mini-batch's loss.
        """
        cfg = self.cfg
        engine = self.engine
        full_mask = mini["response_mask"]
        agg = LossAggregator.from_normalizers(
            cfg.loss_agg_mode, engine.global_normalizers(full_mask)
        )
        n_tokens = max(agg.num_tokens, 1.0)
        n_samples = engine.global_sum([len(mini)])[0]
        temperature = self._temperature(mini)
        full_kl = kl_estimator_needs_logits(cfg.kl_loss_type)
        sft_agg = None
        if cfg.sft_loss_coef:
            positives = full_mask * mini[_POSITIVE].unsqueeze(-1).to(full_mask.dtype)
            sft_agg = LossAggregator.from_normalizers(
                cfg.loss_agg_mode, engine.global_normalizers(positives)
            )

        def loss_fn(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
            mask = mb["response_mask"]
            log_prob = out["log_probs"]
            # local means → partial sums (a device scalar: no wait for the device here)
            share = (mask > 0).sum() / n_tokens
            weights = mb[_TOKEN_WEIGHTS] if _TOKEN_WEIGHTS in mb else None  # noqa: SIM401
            if is_scale is not None:  # a constant of the mini-batch, as a token weight
                scale = torch.tensor(is_scale, dtype=log_prob.dtype)
                weights = scale if weights is None else weights * scale
            inputs = {"sample_positive": mb[_SCORE_POSITIVE]} if _SCORE_POSITIVE in mb else None
            pg, pg_m = compute_policy_loss(
                cfg.policy_loss,
                log_prob,
                mb["old_log_probs"],
                mb["advantages"],
                mask,
                self.params,
                agg,
                weights,
                inputs,
            )
            metrics: dict[str, Any] = {"pg_loss": pg.detach()}
            if is_scale is not None:
                metrics["reinforce_is_batch_mean"] = share / is_scale
            for k, v in pg_m.items():
                if k != "pg_loss":
                    metrics[k] = v.detach() * share
            ent = None
            if cfg.entropy_coeff:
                ent = entropy_loss(out["entropy"], mask, agg)
            if "entropy" in out:  # always from the engine's train forward (no_grad if unused)
                metrics["entropy"] = masked_mean(out["entropy"].detach(), mask) * share
            kl = None
            if "ref_log_probs" in mb:
                ref = mb["ref_log_probs"]
                full = out["full_kl"] if full_kl else None  # exact, per token, from logits
                if cfg.use_kl_loss:
                    kl, _ = kl_loss(log_prob, ref, mask, agg, cfg.kl_loss_type, kl_matrix=full)
                    metrics["kl_loss"] = kl.detach()
                est = full if full is not None else kl_penalty(log_prob, ref, cfg.kl_loss_type)
                metrics["kl"] = masked_mean(est.detach(), mask) * share
            sft = sft_loss(log_prob, mask, mb[_POSITIVE], sft_agg) if sft_agg else None
            gkd = None
            if self.distill is not None:
                gkd, gkd_m = direct_distill_loss(self.distill, mb, out, agg, temperature)
                metrics.update(gkd_m)
            total = actor_loss(
                pg,
                kl_loss=kl,
                kl_loss_coef=cfg.kl_loss_coef,
                entropy=ent,
                entropy_coef=cfg.entropy_coeff,
                sft_loss=sft,
                sft_loss_coef=cfg.sft_loss_coef,
                rl_loss_coef=cfg.rl_loss_coef,
                distill_loss=gkd,
            )
            if sft is not None:
                metrics["sft_loss"] = sft.detach()
            if cfg.l2_coef:
                # once per optimizer step: each micro-batch adds its share of the samples
                l2 = sum(p.pow(2).sum() for p in engine.trainable_parameters())
                total = total + cfg.l2_coef * l2 * (len(mb) / n_samples)
            return total, metrics

        return loss_fn

    @property
    def _bypass_rs(self) -> bool:
        """``rollout_rs`` without recomputed old log-probs (verl's bypass mode): the old
        log-probs are the rollout's, so rejection compares the current policy with the
        rollout's, before each mini-batch's update."""
        return bool(self.cfg.rollout_rs) and not self.cfg.recompute_old_log_prob

    def _against_current_policy(
        self, mini: Batch
    ) -> tuple[Batch, float | None, dict[str, torch.Tensor]]:
        """What compares the current policy with the rollout's over the whole mini-batch
        (the loss sees one micro-batch): with ``rollout_rs`` in bypass mode, the mini-batch
        with the rejected tokens out of its mask; with ``reinforce_is_batch_normalize``,
        ``1/mean`` of the ``reinforce_is`` weights (over the whole mini-batch, its parts
        summed over the data-parallel ranks); and the rejection's metrics. One no-grad
        forward of the mini-batch, the update's own policy: the update is then the same
        however the mini-batch is split (verl computes both within each micro-batch).
        Nothing (no forward) when neither is on."""
        p = self.params
        normalize = p.reinforce_is_batch_normalize and p.reinforce_is_level != "none"
        if not (normalize or self._bypass_rs):
            return mini, None, {}
        out = self.engine.forward(
            mini, temperature=self._temperature(mini), routing=self._routing(mini)
        )
        current, mask = out["log_probs"], mini["response_mask"]
        metrics: dict[str, torch.Tensor] = {}
        scale = None
        if normalize:
            weights, _, _ = rollout_is_weights(
                current,
                mini["old_log_probs"],
                mask,
                level=p.reinforce_is_level,
                threshold=p.reinforce_is_threshold,
                threshold_low=p.reinforce_is_threshold_low,
                mode="truncate" if p.reinforce_is_threshold_low is None else "icepop",
            )
            _, mean = batch_normalized(weights, mask, p.reinforce_is_level, self.engine.global_sum)
            scale = 1.0 / mean
        if self._bypass_rs:
            if "rollout_log_probs" not in mini:
                raise KeyError("actor.rollout_rs needs rollout_log_probs")
            keep, metrics = rollout_rejection_mask(
                current,
                mini["rollout_log_probs"],
                mask,
                [RejectionFilter(f.stat, f.level, f.low, f.high) for f in self.cfg.rollout_rs],
            )
            mini = Batch(mini.tensors.clone(recurse=False), dict(mini.objects), dict(mini.meta))
            mini["response_mask"] = mask * keep
        return mini, scale, metrics

    def update(self, batch: Batch) -> dict[str, float]:
        """PPO epochs over mini-batches of the step's batch; averaged ``actor/*`` metrics."""
        cfg = self.cfg
        work, extra = self._prepare(batch)
        temperature = self._temperature(batch)
        steps = StepMetrics()
        seed = self.seed * 1_000_003 + self.updates
        size = per_rank_mini_batch(cfg.mini_batch_size, self.engine.dp_size)
        rejected: list[dict[str, float]] = []
        for mini in mini_batches(work, size, cfg.ppo_epochs, shuffle=cfg.shuffle, seed=seed):
            mini, is_scale, rs = self._against_current_policy(mini)
            rejected.append({f"actor/{k}": float(v) for k, v in rs.items()})
            steps.add(
                self.engine.train_mini_batch(
                    mini,
                    self._loss_fn(mini, is_scale),
                    temperature=temperature,
                    with_entropy=bool(cfg.entropy_coeff),
                )
            )
        self.updates += 1
        for key in rejected[0] if rejected else ():  # this rank's mean over its mini-batches
            extra[key] = sum(r[key] for r in rejected) / len(rejected)
        return {**steps.result("actor"), **extra}

    def sft_update(self, batch: Batch) -> dict[str, float]:
        """A supervised update: the NLL of the target tokens (``response_mask``: a
        response, or every assistant turn) over the step's mini-batches, one optimizer
        step each (``ppo_epochs`` passes, ``shuffle`` as in :meth:`update`).

        Each mini-batch's loss is aggregated with its global normalizers
        (``loss_agg_mode``; token-mean: Σ −log π / the mini-batch's target tokens), so a
        micro-batch split, packing or data-parallel shards do not change it. Returns the
        averaged ``actor/*`` metrics; ``actor/loss`` is the mean mini-batch NLL.
        """
        return self._supervised(batch, self._nll_fn)

    def distill_update(
        self, batch: Batch, objective: str, params: KDParams, weight: float
    ) -> dict[str, float]:
        """An offline-distillation update: :meth:`sft_update`'s mini-batches and steps, the
        loss ``(1 − weight)·NLL + weight·KD`` (:mod:`temper.roles.kd_loss`; the batch
        carries the teacher's top-k ``kd_indices`` and ``kd_teacher_logits``). Returns the
        averaged ``actor/*`` metrics, with ``actor/sft_loss`` and ``actor/distill_loss``."""
        KD_OBJECTIVES.get(objective)  # an unknown name fails before any forward
        mode = self.cfg.loss_agg_mode
        return self._supervised(
            batch, lambda mini: distill_loss_fn(self.engine, mini, mode, objective, params, weight)
        )

    def _supervised(self, batch: Batch, make_loss: Callable[[Batch], LossFn]) -> dict[str, float]:
        """Mini-batches of given targets, one optimizer step each with ``make_loss(mini)``."""
        cfg = self.cfg
        temperature = self._temperature(batch)
        steps = StepMetrics()
        seed = self.seed * 1_000_003 + self.updates
        size = per_rank_mini_batch(cfg.mini_batch_size, self.engine.dp_size)
        for mini in mini_batches(batch, size, cfg.ppo_epochs, shuffle=cfg.shuffle, seed=seed):
            steps.add(self.engine.train_mini_batch(mini, make_loss(mini), temperature=temperature))
        self.updates += 1
        return steps.result("actor")

    def _nll_fn(self, mini: Batch) -> LossFn:
        """The NLL of one mini-batch's micro-batches, with the mini-batch's normalizers
        (summed over data-parallel ranks by the engine)."""
        normalizers = self.engine.global_normalizers(mini["response_mask"])
        agg = LossAggregator.from_normalizers(self.cfg.loss_agg_mode, normalizers)

        def loss_fn(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
            return nll_loss(out["log_probs"], mb["response_mask"], agg), {}

        return loss_fn

    def dpo_update(
        self, batch: Batch, loss_type: str = "sigmoid", params: PreferenceParams | None = None
    ) -> dict[str, float]:
        """A preference update on a batch of pairs (:mod:`temper.data.preference`: rows
        ``2i``/``2i + 1`` are pair ``i``'s chosen/rejected response; ``ref_log_probs`` from
        the reference): the mean over pairs of registered loss ``loss_type``
        (:data:`~temper.algorithms.preference.PREFERENCE_LOSSES`) of the sequence
        log-probs, over mini-batches of whole pairs (:meth:`_pair_update`).

        Returns the averaged ``actor/*`` metrics: ``loss`` (the mean pair loss),
        ``rewards/chosen`` / ``rewards/rejected`` / ``rewards/margin`` /
        ``rewards/accuracy``, ``logps/chosen`` / ``logps/rejected``
        (:func:`~temper.algorithms.preference.preference_loss`), each at the weights
        before its mini-batch's optimizer step.
        """
        params = params or PreferenceParams()
        loss = PREFERENCE_LOSSES.get(loss_type)  # an unknown name fails before any forward
        if "ref_log_probs" not in batch:
            raise KeyError("actor.dpo_update needs ref_log_probs from the reference")

        def objective(
            chosen: torch.Tensor, rejected: torch.Tensor, mini: Batch
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            ref = sequence_log_probs(mini["ref_log_probs"], mini["response_mask"]).double()
            parts = (chosen, rejected, ref[0::2], ref[1::2])
            return loss(*parts, params), pair_metrics(*parts, params)

        return self._pair_update(batch, "log_probs", objective)

    def compute_scores(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``scores`` (B,) of a scalar-head model (a reward model
        in training: the actor's engine is a value model): its ``values`` summed over
        ``response_mask``, the one slot whose value is the sequence's score
        (:func:`temper.data.preference.scored_pairs`)."""
        values = self.engine.forward(batch, with_values=True)["values"]
        scores = row_scalars(values, batch["response_mask"].to(values.device))
        return batch.union(Batch.from_dict({"scores": scores}))

    def reward_update(
        self, batch: Batch, loss_type: str = "bradley_terry", params: RewardLossParams | None = None
    ) -> dict[str, float]:
        """A reward-model update on a batch of pairs (rows ``2i``/``2i + 1``: pair ``i``'s
        chosen/rejected sequence, each scored at one ``response_mask`` slot): the mean over
        pairs of registered loss ``loss_type``
        (:data:`~temper.algorithms.reward_model.REWARD_MODEL_LOSSES`) of the scores, over
        mini-batches of whole pairs (:meth:`_pair_update`). Returns the averaged
        ``actor/*`` metrics: ``loss``, ``rewards/chosen`` / ``rewards/rejected`` /
        ``rewards/margin`` / ``rewards/accuracy``
        (:func:`~temper.algorithms.reward_model.score_pair_metrics`), each at the weights
        before its mini-batch's optimizer step."""
        params = params or RewardLossParams()
        loss = REWARD_MODEL_LOSSES.get(loss_type)  # an unknown name fails before any forward

        def objective(
            chosen: torch.Tensor, rejected: torch.Tensor, mini: Batch
        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return loss(chosen, rejected, params), score_pair_metrics(chosen, rejected)

        return self._pair_update(batch, "values", objective)

    def _pair_update(self, batch: Batch, key: str, objective: PairObjective) -> dict[str, float]:
        """Mini-batches of whole pairs (``mini_batch_size`` rows, two per pair), one
        optimizer step each, ``ppo_epochs`` passes, ``shuffle`` as in :meth:`update`; the
        gradient of each mini-batch's mean pair loss through :mod:`temper.roles.pairs`
        (a no-grad forward gives each row's scalar of output ``key``, then the
        micro-batches backpropagate their rows' coefficients). The no-grad forward runs in
        eval mode: with dropout the coefficient is the one of the model without it."""
        cfg = self.cfg
        temperature = self._temperature(batch)
        steps = StepMetrics()
        seed = self.seed * 1_000_003 + self.updates
        size = per_rank_mini_batch(cfg.mini_batch_size, self.engine.dp_size)
        pairs = size // 2 if size is not None else None
        values = key == "values"
        for mini in pair_mini_batches(batch, pairs, cfg.ppo_epochs, shuffle=cfg.shuffle, seed=seed):
            out = self.engine.forward(mini, temperature=temperature, with_values=values)
            n_pairs = self.engine.global_sum([len(mini) // 2])[0]
            scalars = row_scalars(out[key], mini["response_mask"])
            work = pair_coefficients(mini, scalars, objective, n_pairs)
            steps.add(
                self.engine.train_mini_batch(work, pair_loss_fn(work, key), temperature=temperature)
            )
        self.updates += 1
        return steps.result("actor")

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {"engine": self.engine.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        self.updates = int(state.get("updates", 0))
