"""The critic: values for GAE, and the clipped value-loss update.

``update`` reads ``values`` (the values before the update, from ``compute_values``),
``returns`` and ``response_mask`` besides the model inputs. The value loss is the
algorithms package's clipped loss, aggregated with the mini-batch's global normalizers.
"""

from __future__ import annotations

from typing import Any

import torch

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.value_loss import value_loss
from temper.config.schema import CriticConfig
from temper.data.batch import Batch
from temper.roles.minibatch import StepMetrics, mini_batches, per_rank_mini_batch
from temper.training.base import LossFn, TrainEngine


class Critic:
    """Value-model role over a trainable ``kind='value'`` engine."""

    def __init__(self, cfg: CriticConfig, engine: TrainEngine, *, seed: int = 0) -> None:
        self.cfg = cfg
        self.engine = engine
        self.seed = seed
        self.updates = 0

    def compute_values(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``values`` (B, R), 0 on masked tokens."""
        out = self.engine.forward(batch, with_values=True)
        return batch.union(Batch.from_dict({"values": out["values"]}))

    def set_total_steps(self, total_steps: int) -> None:
        self.engine.set_total_steps(total_steps)

    def _loss_fn(self, mini: Batch) -> LossFn:
        # global (all data-parallel ranks) denominators: see Actor._loss_fn
        normalizers = self.engine.global_normalizers(mini["response_mask"])
        agg = LossAggregator.from_normalizers(self.cfg.loss_agg_mode, normalizers)
        n_tokens = max(agg.num_tokens, 1.0)
        clip = self.cfg.cliprange_value

        def loss_fn(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
            mask = mb["response_mask"]
            loss, m = value_loss(out["values"], mb["returns"], mb["values"], mask, agg, clip)
            share = (mask > 0).sum() / n_tokens  # a device scalar: no wait for the device
            return loss, {
                "value_loss": loss.detach(),
                "vf_clipfrac": m["vf_clipfrac"] * share,
                "vpred_mean": m["vpred_mean"] * share,
            }

        return loss_fn

    def update(self, batch: Batch) -> dict[str, float]:
        """Epochs × mini-batches of value-loss steps; averaged ``critic/*`` metrics."""
        for key in ("values", "returns"):
            if key not in batch:
                raise KeyError(f"critic.update needs '{key}' (compute_values, then advantages)")
        cfg = self.cfg
        steps = StepMetrics()
        seed = self.seed * 1_000_003 + self.updates
        size = per_rank_mini_batch(cfg.mini_batch_size, self.engine.dp_size)
        for mini in mini_batches(batch, size, cfg.ppo_epochs, shuffle=cfg.shuffle, seed=seed):
            steps.add(self.engine.train_mini_batch(mini, self._loss_fn(mini)))
        self.updates += 1
        return steps.result("critic")

    def state_dict(self) -> dict[str, Any]:
        return {"engine": self.engine.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        self.updates = int(state.get("updates", 0))
