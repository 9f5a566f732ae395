"""PRIME's implicit process reward model: a causal LM trained during RL.

Two engines: the trained PRM ``π_rm`` (``prime.prm``: its own strategy, batching and
optimizer) and a frozen ``π_ref`` (``prime.prm.ref_path``, by default the PRM's first
weights). The PRM's log-ratio ``q_t = log π_rm − log π_ref`` of each response token gives
the policy's implicit token rewards, and the cross-entropy of ``σ(β·Σ_t q_t)`` with the
outcome label (the task score, in [0, 1]) trains it (:mod:`temper.algorithms.prime`).

``score_and_update`` runs one step's PRM phase in the order ``prime.prm.update`` names:
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
from temper.config.schema import PrimeConfig
from temper.data.batch import Batch
from temper.roles.minibatch import StepMetrics, mini_batches, per_rank_mini_batch
from temper.training.base import LossFn, TrainEngine

REF = "prm_ref_log_probs"  # (B, R) π_ref's log-probs of the response tokens
ACC = "prm_acc"  # (B,) the outcome label


class ImplicitPRM:
    """The implicit PRM role: ``score_and_update`` per step; checkpointed as a trained
    role (``engine``, ``updates``)."""

    def __init__(
        self,
        cfg: PrimeConfig,
        engine: TrainEngine,
        ref_engine: TrainEngine,
        n: int,
        *,
        mini_batch_size: int | None,
        seed: int = 0,
    ) -> None:
        self.cfg = cfg
        self.engine = engine
        self.ref_engine = ref_engine
        self.n = n
        self.mini_batch_size = mini_batch_size
        self.seed = seed
        self.updates = 0

    def set_total_steps(self, total_steps: int) -> None:
        self.engine.set_total_steps(total_steps)

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

    def _forward(self, engine: TrainEngine, batch: Batch) -> torch.Tensor:
        with torch.no_grad():
            return engine.forward(batch, temperature=1.0)["log_probs"].float()

    def rewards(self, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``(B, R)`` implicit token rewards of ``q`` after ``prime.granularity`` and
        ``prime.norm``."""
        scores = implicit_token_rewards(q, mask, self.cfg.prm.beta_train, self.cfg.granularity)
        return prime_batch_norm(scores) if self.cfg.norm == "batch_norm" else scores

    def score_and_update(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        """A copy of ``batch`` with ``rm_scores``; the PRM phase's metrics (module doc)."""
        mode = self.cfg.prm.update
        acc = batch["scores"].float()
        if bool(((acc < 0) | (acc > 1)).any()):
            raise ValueError(
                "PRIME trains its PRM on the task score as a probability of correctness: "
                f"scores must lie in [0, 1], got {acc.min().item():g}..{acc.max().item():g}"
            )
        mask = batch["response_mask"]
        work = batch.union(
            Batch.from_dict({REF: self._forward(self.ref_engine, batch), ACC: acc})
        )
        metrics: dict[str, float] = {}
        if mode == "before":
            metrics.update(self.update(work))
        q = implicit_q(self._forward(self.engine, work), work[REF], mask)
        rm_scores = self.rewards(q, mask)
        if mode == "after":
            metrics.update(self.update(work))
        seq = rm_scores.sum(-1)
        metrics.update(
            {
                "reward_model/reward": seq.mean().item(),
                "reward_model/raw_reward": q.sum(-1).mean().item(),
                "reward_model/dpo_acc": pairwise_accuracy(seq, acc, self.n).item(),
                "reward_model/dpo_acc_abs": sign_accuracy(seq, acc).item(),
            }
        )
        return batch.union(Batch.from_dict({"rm_scores": rm_scores})), metrics

    def state_dict(self) -> dict[str, Any]:
        return {"engine": self.engine.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        self.updates = int(state.get("updates", 0))
