"""Dynamic sampling on a stream: ``algorithm.filter_groups`` with ``async_training.mode:
streaming``.

The fixed schedule fills a batch over whole generation rounds
(:func:`~temper.pipelines.dynamic_sampling.fill_groups`). A stream has no rounds to
repeat: every group is filtered as its chunk finishes — a kept group joins the ready
queue, a filtered-out one is dropped (the last ``train_batch_size`` of them are kept
aside) — and the worker goes on drawing prompt batches until the trainer has its groups.

``max_num_gen_batches`` (> 0) bounds the prompt batches drawn for one batch, counted from
the step that took the previous batch. Once the bound is reached and enough filtered-out
groups are aside, the worker stops drawing; a trainer still short of groups then fills its
batch with the most recent filtered-out groups, their loss masked (``sample_mask`` 0), as
the fixed schedule does. Without enough of them aside the worker draws on (a batch is never
left short). ≤ 0: no bound, as verl.

Not in the checkpoint: the groups aside and the draw count (a resumed stream starts
counting afresh; the prompts of groups not yet trained are, see :mod:`streaming`).
"""

from __future__ import annotations

import collections
from typing import Any, Protocol, TypeVar

import torch

from temper.config.schema import FilterGroupsConfig
from temper.data.batch import Batch
from temper.pipelines.dynamic_sampling import group_keep
from temper.pipelines.shaping import ShapingSettings


class Scored(Protocol):
    """A finished group (:class:`~temper.pipelines.streaming.Group`)."""

    batch: Batch


G = TypeVar("G", bound=Scored)


class StreamFilter:
    """The filter's state on a stream (module docstring); the caller holds its lock."""

    def __init__(self, fg: FilterGroupsConfig, settings: ShapingSettings, batch_groups: int):
        self.fg, self.settings, self.batch_groups = fg, settings, batch_groups
        self.aside: collections.deque[Any] = collections.deque(maxlen=batch_groups)
        self.draws = 0  # prompt batches drawn since the previous batch was taken
        self.kept = self.dropped = 0

    def split(self, groups: list[G]) -> list[G]:
        """The groups that pass the filter; the others are counted and set aside."""
        out = []
        for g in groups:
            if bool(group_keep(g.batch, self.fg, self.settings)[0]):
                out.append(g)
                self.kept += 1
            else:
                self.aside.append(g)
                self.dropped += 1
        return out

    def may_draw(self) -> bool:
        """Whether the worker may draw another prompt batch for the coming batch."""
        limit = self.fg.max_num_gen_batches
        return limit <= 0 or self.draws < limit or len(self.aside) < self.batch_groups

    def fill(self, need: int) -> list[Any]:
        """``need`` filtered-out groups, most recent last, to be trained masked."""
        fillers = list(self.aside)[-need:] if need else []
        for _ in fillers:
            self.aside.pop()
        return fillers

    def take(self, taken: list[Batch], fillers: list[Batch]) -> dict[str, float]:
        """Mark a batch's groups (``sample_mask`` 1, fillers 0); its metrics; the count of
        draws restarts for the next batch."""
        for g in taken:
            g["sample_mask"] = torch.ones(len(g))
        for g in fillers:
            g["sample_mask"] = torch.zeros(len(g))
        metrics = {
            "dynamic_sampling/rounds": float(self.draws),
            "dynamic_sampling/groups_kept": float(self.kept),
            "dynamic_sampling/groups_dropped": float(self.dropped),
            "dynamic_sampling/groups_masked": float(len(fillers)),
            "dynamic_sampling/batch_full": float(not fillers),
        }
        self.draws = self.kept = self.dropped = 0
        return metrics
