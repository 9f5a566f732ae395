"""PRIME's implicit process reward model: a causal LM trained during RL.

Two engines: the trained PRM ``π_rm`` (``prime.prm``: its own strategy, batching and
optimizer) and a frozen ``π_ref`` (``prime.prm.ref_path``, by default the PRM's first
weights). The PRM's log-ratio ``q_t = log π_rm − log π_ref`` of each response token gives
the policy's implicit token rewards, and the cross-entropy of ``σ(β·Σ_t q_t)`` with the
outcome label (the task score, in [0, 1]) trains it (:mod:`temper.algorithms.prime`).

:func:`score_and_update` runs one step's PRM phase on the driver, over the role's three
calls (:class:`~temper.roles.base.PRMRole`: the reference's and the PRM's log-probs, the
update — in this process, or on the PRM's Ray worker group), in the order
``prime.prm.update`` names:
``before`` trains, then scores with the trained weights; ``after`` scores with the weights
the update starts from, then trains; ``none`` only scores. ``π_ref`` forwards once per
step, under ``no_grad``; the PRM forwards with temperature 1 (its own distribution, not
the rollout's sampling one).

Keys read: the model inputs, ``response_mask`` and ``scores`` (the outcome label).
Written: ``rm_scores`` (B, R), the implicit token rewards after ``prime.norm``.
"""

from __future__ import annotations

from typing import Any

import torch

from temper.algorithms.prime import (
    implicit_q,
    implicit_token_rewards,
    pairwise_accuracy,
    prime_batch_norm,
    prm_ce_loss,
    sign_accuracy,
)
from temper.config.schema import PrimeConfig, TemperConfig
from temper.data.batch import Batch
from temper.roles.base import PRMRole
from temper.roles.minibatch import StepMetrics, mini_batches, per_rank_mini_batch
from temper.training.base import LossFn, TrainEngine
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

REF = "prm_ref_log_probs"  # (B, R) π_ref's log-probs of the response tokens
LOGP = "prm_log_probs"  # (B, R) π_rm's log-probs of the response tokens
ACC = "prm_acc"  # (B,) the outcome label


class ImplicitPRM:
    """The implicit PRM role over its two engines (a :class:`~temper.roles.base.PRMRole`;
    checkpointed as a trained role: ``engine``, ``updates``)."""

    def __init__(
        self,
        cfg: PrimeConfig,
        engine: TrainEngine,
        ref_engine: TrainEngine,
        *,
        mini_batch_size: int | None,
        seed: int = 0,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.ref_engine = ref_engine
        self.mini_batch_size = mini_batch_size
        self.seed = seed
        self.updates = 0

    def set_total_steps(self, total_steps: int) -> None:
        self.engine.set_total_steps(total_steps)

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with :data:`REF`, π_ref's log-probs (temperature 1)."""
        with torch.no_grad():
            out = self.ref_engine.forward(batch, temperature=1.0)["log_probs"].float()
        return batch.union(Batch.from_dict({REF: out}))

    def compute_log_probs(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with :data:`LOGP`, π_rm's log-probs (temperature 1)."""
        with torch.no_grad():
            out = self.engine.forward(batch, temperature=1.0)["log_probs"].float()
        return batch.union(Batch.from_dict({LOGP: out}))

    def update(self, batch: Batch) -> dict[str, float]:
        """One pass of cross-entropy steps over mini-batches of ``batch`` (which carries
        :data:`REF` and :data:`ACC`); averaged ``reward_model/*`` metrics."""
        steps = StepMetrics()
        size = per_rank_mini_batch(self.mini_batch_size, self.engine.dp_size)
        seed = self.seed * 1_000_003 + self.updates
        for mini in mini_batches(batch, size, 1, shuffle=False, seed=seed):
            steps.add(self.engine.train_mini_batch(mini, self._loss_fn(mini)))
        self.updates += 1
        return steps.result("reward_model")

    def _loss_fn(self, mini: Batch) -> LossFn:
        # a micro-batch's share of the mini-batch mean: its BCE sum over all ranks' samples
        (total,) = self.engine.global_sum([float(len(mini))])
        beta = self.cfg.prm.beta_train

        def loss_fn(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
            mask = mb["response_mask"]
            q = implicit_q(out["log_probs"], mb[REF], mask)
            loss = prm_ce_loss(q, mb[ACC], mask, beta) * (len(mb) / total)
            return loss, {"dpo_loss": loss.detach()}

        return loss_fn


def implicit_rewards(cfg: PrimeConfig, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(B, R)`` implicit token rewards of ``q`` after ``prime.granularity`` and
    ``prime.norm`` (the norm is over the whole batch: computed on the driver)."""
    scores = implicit_token_rewards(q, mask, cfg.prm.beta_train, cfg.granularity)
    return prime_batch_norm(scores) if cfg.norm == "batch_norm" else scores


def score_and_update(
    prm: PRMRole, cfg: PrimeConfig, batch: Batch, n: int
) -> tuple[Batch, dict[str, float]]:
    """A copy of ``batch`` with ``rm_scores``; the PRM phase's metrics (module doc)."""
    mode = cfg.prm.update
    acc = batch["scores"].float()
    if bool(((acc < 0) | (acc > 1)).any()):
        raise ValueError(
            "PRIME trains its PRM on the task score as a probability of correctness: "
            f"scores must lie in [0, 1], got {acc.min().item():g}..{acc.max().item():g}"
        )
    mask = batch["response_mask"]
    work = prm.compute_ref_log_probs(batch.union(Batch.from_dict({ACC: acc})))
    metrics: dict[str, float] = {}
    if mode == "before":
        metrics.update(prm.update(work))
    q = implicit_q(prm.compute_log_probs(work)[LOGP], work[REF], mask)
    if mode == "after":
        metrics.update(prm.update(work))
    rm_scores = implicit_rewards(cfg, q, mask)
    seq = rm_scores.sum(-1)
    metrics.update(
        {
            "reward_model/reward": seq.mean().item(),
            "reward_model/raw_reward": q.sum(-1).mean().item(),
            "reward_model/dpo_acc": pairwise_accuracy(seq, acc, n).item(),
            "reward_model/dpo_acc_abs": sign_accuracy(seq, acc).item(),
        }
    )
    return batch.union(Batch.from_dict({"rm_scores": rm_scores})), metrics


def build_prm(cfg: TemperConfig, device: torch.device, strategy: str) -> ImplicitPRM:
    """The implicit PRM: its trained engine on ``strategy`` (``prime.prm.strategy``, as
    the backend runs it: :func:`temper.roles.builder.build_prm`) from
    ``prime.prm.model_path`` (the policy's by default) and its frozen reference from
    ``prime.prm.ref_path`` (the PRM's first weights by default)."""
    prm = cfg.prime.prm
    micro = MicroBatching(
        size=prm.log_prob_micro_batch_size_per_device or prm.micro_batch_size_per_device,
        max_tokens=(prm.log_prob_max_token_len_per_device or prm.max_token_len_per_device)
        if prm.use_dynamic_bsz
        else None,
    )

    def engine(path: str | None, trained: bool) -> TrainEngine:
        spec = EngineSpec(
            model=cfg.model,
            device=device,
            model_path=path,
            train=prm if trained else None,
            infer_micro=micro,
            seed=cfg.experiment.seed,
            total_steps=prm.optim.total_training_steps,
            role="prime.prm",
            fsdp=None if trained else prm.fsdp,
        )
        return build_engine(strategy, spec, key="prime.prm.strategy")

    return ImplicitPRM(
        cfg.prime,
        engine(prm.model_path, True),
        engine(prm.ref_path or prm.model_path, False),
        mini_batch_size=prm.mini_batch_size or cfg.actor.mini_batch_size,
        seed=cfg.experiment.seed,
    )


def prm_steps_per_rl_step(cfg: TemperConfig, samples: int) -> int:
    """The PRM's optimizer steps per RL step of ``samples`` samples: one per mini-batch
    (``prime.prm.mini_batch_size``, else the actor's; None: one), 0 with ``update: none``
    (the schedule then has one step, never taken)."""
    prm = cfg.prime.prm
    if prm.update == "none":
        return 0
    mini = prm.mini_batch_size or cfg.actor.mini_batch_size
    return -(-samples // mini) if mini else 1
