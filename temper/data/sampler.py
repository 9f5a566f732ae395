"""Seeded, epoch-aware, exactly resumable sampling of prompt batches.

No iterator state hides in a DataLoader or an RNG object: every draw is a pure function
of ``(seed, epoch/pass, position)``, so :meth:`PromptSampler.state_dict` is a few
integers and a resumed run draws exactly the batches the uninterrupted run would have.

Two modes:

- **uniform** (``source_weights`` empty): epoch ``e`` visits the prompts in the
  permutation drawn from ``(seed, e)`` (dataset order when ``shuffle`` is off), in batches
  of ``batch_size``; with ``drop_last`` a short tail is skipped, else it is a short batch.
- **weighted** (ROLL ``domain_interleave_probs``): each slot of a batch picks a tag with
  probability ``source_weights[tag]`` (seeded per batch), then takes the next prompt of
  that tag's own shuffled stream; a tag's stream reshuffles when exhausted. Batches are
  always full. ``epoch`` is then the number of prompts drawn divided by the dataset size.

The sampler is infinite; ``epoch`` counts completed passes (it is the epoch the *next*
batch comes from), so a run of E epochs draws while ``sampler.epoch < E``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.data.errors import DataError

STATE_VERSION = 1


class Draw(NamedTuple):
    """One batch of prompts: dataset indices and their group ids (``f"{epoch}-{index}"``)."""

    indices: list[int]
    uids: list[str]
    epoch: int


def _permutation(n: int, seed: int, *stream: int) -> np.ndarray:
    return np.random.default_rng((seed, *stream)).permutation(n)


def _tag_stream(tag: str) -> int:
    """A stable (process-independent, unlike ``hash``) integer per tag."""
    return zlib.crc32(tag.encode("utf-8"))


class PromptSampler:
    """Infinite batches of prompt indices; see the module doc for the two modes."""

    def __init__(
        self,
        num_prompts: int,
        batch_size: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        tags: Sequence[str] | None = None,
        source_weights: Mapping[str, float] | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ConfigError("data.train_batch_size", f"must be positive, got {batch_size}")
        if num_prompts <= 0 or (drop_last and num_prompts < batch_size):
            raise DataError(
                "data.train_batch_size",
                f"the training set has {num_prompts} prompts, fewer than one batch of {batch_size}",
                "lower data.train_batch_size, add data, or set data.dataloader_drop_last=false",
            )
        self.num_prompts = num_prompts
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.weighted = bool(source_weights)
        self._epoch = 0
        self._cursor = 0
        self._batches_drawn = 0
        self._samples_drawn = 0
        self._order: np.ndarray | None = None
        self._order_epoch = -1
        self._pools: dict[str, np.ndarray] = {}
        self._tag_state: dict[str, list[int]] = {}
        self._tag_orders: dict[str, tuple[int, np.ndarray]] = {}
        if self.weighted:
            self._setup_weights(tags, dict(source_weights or {}))

    # ------------------------------------------------------------------ set-up

    def _setup_weights(self, tags: Sequence[str] | None, weights: dict[str, float]) -> None:
        if tags is None or len(tags) != self.num_prompts:
            raise ValueError("weighted sampling needs one tag per prompt")
        present = sorted(set(tags))
        unknown = sorted(set(weights) - set(present))
        if unknown:
            raise ConfigError(
                "data.source_weights",
                f"tag(s) {', '.join(unknown)} do not occur in the training data "
                f"(its tags: {', '.join(present)})",
                "use the tags of data.tag_key (default: the data source)",
            )
        missing = [t for t in present if t not in weights]
        if missing:
            raise ConfigError(
                "data.source_weights",
                f"tag(s) {', '.join(missing)} have prompts but no weight",
                "give every tag a weight (0 excludes it)",
            )
        if any(not math.isfinite(w) or w < 0 for w in weights.values()) or not any(
            w > 0 for w in weights.values()
        ):
            raise ConfigError("data.source_weights", "weights must be finite, >= 0, and not all 0")
        self._tags = [t for t in present if weights[t] > 0]
        total = sum(weights[t] for t in self._tags)
        self._probs = np.array([weights[t] / total for t in self._tags])
        array = np.asarray(tags, dtype=object)
        self._pools = {t: np.flatnonzero(array == t) for t in self._tags}
        self._tag_state = {t: [0, 0] for t in self._tags}

    # ------------------------------------------------------------------ queries

    @property
    def epoch(self) -> int:
        """Completed passes over the data (= the epoch of the next batch)."""
        if self.weighted:
            return self._samples_drawn // self.num_prompts
        return self._epoch

    @property
    def batches_drawn(self) -> int:
        return self._batches_drawn

    @property
    def batches_per_epoch(self) -> int:
        """Batches in one pass: ``N // B`` with drop_last (or weighted), else ``ceil(N / B)``."""
        if self.drop_last or self.weighted:
            return self.num_prompts // self.batch_size
        return math.ceil(self.num_prompts / self.batch_size)

    # ------------------------------------------------------------------ drawing

    def _epoch_order(self) -> np.ndarray:
        if self._order_epoch != self._epoch or self._order is None:
            if self.shuffle:
                self._order = _permutation(self.num_prompts, self.seed, self._epoch)
            else:
                self._order = np.arange(self.num_prompts)
            self._order_epoch = self._epoch
        return self._order

    def _draw_uniform(self) -> Draw:
        order = self._epoch_order()
        take = order[self._cursor : self._cursor + self.batch_size].tolist()
        epoch = self._epoch
        self._cursor += len(take)
        remaining = self.num_prompts - self._cursor
        if remaining == 0 or (self.drop_last and remaining < self.batch_size):
            self._epoch += 1
            self._cursor = 0
        return Draw(take, [f"{epoch}-{i}" for i in take], epoch)

    def _tag_order(self, tag: str, passes: int) -> np.ndarray:
        cached = self._tag_orders.get(tag)
        if cached is None or cached[0] != passes:
            size = len(self._pools[tag])
            order = (
                _permutation(size, self.seed, _tag_stream(tag), passes)
                if self.shuffle
                else np.arange(size)
            )
            cached = self._tag_orders[tag] = (passes, order)
        return cached[1]

    def _draw_weighted(self) -> Draw:
        rng = np.random.default_rng((self.seed, 0x7A65, self._batches_drawn))
        picks = rng.choice(len(self._tags), size=self.batch_size, p=self._probs)
        epoch = self.epoch
        indices: list[int] = []
        uids: list[str] = []
        for pick in picks.tolist():
            tag = self._tags[pick]
            pool = self._pools[tag]
            passes, cursor = self._tag_state[tag]
            index = int(pool[self._tag_order(tag, passes)[cursor]])
            indices.append(index)
            uids.append(f"{passes}-{index}")
            cursor += 1
            if cursor == len(pool):
                passes, cursor = passes + 1, 0
            self._tag_state[tag] = [passes, cursor]
        return Draw(indices, uids, epoch)

    def next(self) -> Draw:
        """The next batch (advancing the state)."""
        draw = self._draw_weighted() if self.weighted else self._draw_uniform()
        self._batches_drawn += 1
        self._samples_drawn += len(draw.indices)
        return draw

    def __iter__(self) -> Iterator[Draw]:
        return self

    def __next__(self) -> Draw:
        return self.next()

    # ------------------------------------------------------------------ resume

    def state_dict(self) -> dict[str, Any]:
        """Plain ints/strings (JSON-safe) that fully determine the next batches."""
        return {
            "version": STATE_VERSION,
            "mode": "weighted" if self.weighted else "uniform",
            "seed": self.seed,
            "num_prompts": self.num_prompts,
            "batch_size": self.batch_size,
            "epoch": self._epoch,
            "cursor": self._cursor,
            "batches_drawn": self._batches_drawn,
            "samples_drawn": self._samples_drawn,
            "tag_state": {t: list(s) for t, s in self._tag_state.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; the data, batch size, seed and mode must be the same."""
        mine = self.state_dict()
        for key in ("version", "mode", "seed", "num_prompts", "batch_size"):
            if state.get(key) != mine[key]:
                raise DataError(
                    "experiment.resume_mode",
                    f"the checkpoint's sampler has {key}={state.get(key)!r}, this run "
                    f"{mine[key]!r}: resuming would not continue the same data order",
                    "resume with the same data, data.train_batch_size, seed and "
                    "source_weights, or start a new run (resume_mode=disable)",
                )
        if set(state.get("tag_state", {})) != set(self._tag_state):
            raise DataError(
                "data.source_weights",
                "the checkpoint's sampler weighted other tags than this run",
                "resume with the same data.source_weights",
            )
        self._epoch = int(state["epoch"])
        self._cursor = int(state["cursor"])
        self._batches_drawn = int(state["batches_drawn"])
        self._samples_drawn = int(state["samples_drawn"])
        self._tag_state = {t: [int(p), int(c)] for t, (p, c) in state["tag_state"].items()}


def build_sampler(
    cfg: TemperConfig, num_prompts: int, tags: Sequence[str] | None = None
) -> PromptSampler:
    """The training sampler of a run (``tags``: one per prompt, needed for source_weights).

    With ``data.source_domains`` the weights name domains (ROLL's reward domains): each
    prompt samples as the domain that lists its tag; a tag no domain lists belongs to
    ``data.source_default_domain`` (ROLL: ``math_rule``), or is an error when that is unset.

    A draw is one generation round: ``data.gen_batch_size`` prompts when dynamic sampling
    sets it, else ``train_batch_size``."""
    data = cfg.data
    if data.source_domains and tags is not None:
        tags = domains_of(tags, data.source_domains, data.source_default_domain)
    return PromptSampler(
        num_prompts=num_prompts,
        batch_size=data.gen_batch_size or data.train_batch_size,
        seed=cfg.experiment.seed,
        shuffle=data.shuffle,
        drop_last=data.dataloader_drop_last,
        tags=tags,
        source_weights=data.source_weights,
    )


def domains_of(
    tags: Sequence[str], domains: Mapping[str, Sequence[str]], default: str | None
) -> list[str]:
    """The domain of every prompt, from its tag (see :func:`build_sampler`)."""
    owner: dict[str, str] = {}
    for domain, members in domains.items():
        for tag in members:
            owner.setdefault(str(tag), domain)
    orphans = sorted({t for t in tags if t not in owner})
    if orphans and default is None:
        raise ConfigError(
            "data.source_domains",
            f"tag(s) {', '.join(orphans)} have prompts but belong to no domain "
            f"(domains: {', '.join(sorted(domains))})",
            "list them in a domain, or set data.source_default_domain",
        )
    return [owner.get(t, default or t) for t in tags]


def next_prompt_batch(dataset: Any, sampler: PromptSampler) -> Batch:
    """Draw the next batch from ``sampler`` and build it from ``dataset`` (meta: epoch)."""
    draw = sampler.next()
    batch = dataset.make_batch(draw.indices, draw.uids)
    batch.meta["epoch"] = draw.epoch
    return batch
