"""Streaming asynchronous RL: prompt groups handed to training as they finish.

With ``async_training.mode: streaming`` (staleness k ≥ 1) the run's producer — a
:class:`~temper.pipelines.producer.GroupProducer` — is wrapped in :class:`StreamingRollout`:

* one worker thread draws prompt batches from the producer's sampler and generates them
  ``stream_chunk`` prompts at a time; every finished group (``rollout.n`` scored
  responses to one prompt) joins a FIFO of ready groups, tagged with the policy version
  the engine held when its chunk started (``policy_version``). The trainer's step takes
  the next ``train_batch_size`` groups — it never waits for the slowest group of a batch,
  only for enough finished ones;
* the trainer publishes a copy of its weights when it asks for a batch (it is between
  steps: version s − 1 at step s); the worker pushes the newest published copy before its
  next chunk;
* staleness (trainer version − group version) never exceeds k.
  ``max_off_policy_strategy: wait``: a chunk starts only when each of its groups will be
  trained at most k versions after its weights — with ``q`` groups queued ahead of it and
  the trainer's next batch at step ``s``, the chunk's last group is trained at step
  ``s + ⌊(q + c − 1) / B⌋``, so it needs version ``v ≥ s + ⌊(q + c − 1) / B⌋ − k − 1``
  (c ≤ B and k ≥ 1 make this hold whenever the trainer waits: no deadlock). ``drop``: the
  worker runs until ``(k + 1)·B`` groups are queued; a group past the bound when its turn
  comes is dropped (``async/dropped_groups``), its prompt not retried;
* the schedule depends on timing, so a resume is not bit-identical. It loses and
  duplicates no sample: a checkpoint holds the sampler's position after the last draw and
  the prompts of every group not yet trained (ready, in flight, or not started), which the
  resumed run generates first, in order;
* validation runs on the worker between chunks, after pushing the trainer's weights.

Every wait has the ``async_training.wait_timeout`` deadline of the fixed schedule
(:mod:`temper.pipelines.ahead`), and a failing worker fails the step that waits on it.
Metrics: those of the fixed schedule, plus ``async/dropped_groups`` and
``async/ready_groups`` (finished groups left queued after the step took its batch).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from temper.data.batch import Batch
from temper.data.padded import concat_padded
from temper.pipelines.ahead import (
    VERSION,
    BusyLog,
    RolloutAheadError,
    batch_seed,
    overlap_metrics,
    pack_batch,
    seed_globals,
    unpack_batch,
)
from temper.pipelines.dynamic_sampling import merge_round_metrics
from temper.pipelines.producer import GroupProducer, Validation
from temper.pipelines.stream_filter import StreamFilter
from temper.pipelines.stream_schedule import Strategy, may_start
from temper.pipelines.timing import Timer
from temper.rollout.partial import RESPONSE_VERSIONS, Segments


@dataclasses.dataclass
class Group:
    """One prompt's scored responses, the prompt row they came from, and the version of
    the weights that generated them."""

    prompt: Batch
    batch: Batch
    version: int


def unique_uids(groups: list[Batch]) -> list[Batch]:
    """Groups whose uid an earlier group of the batch holds (a prompt drawn again in a
    later epoch) renamed ``uid#k``: advantages group by uid."""
    seen: set[Any] = set()
    out = []
    for k, g in enumerate(groups):
        uid = g["uid"][0]
        if uid in seen:
            g = Batch(g.tensors, {**g.objects, "uid": [f"{uid}#{k}"] * len(g)}, dict(g.meta))
        seen.add(g["uid"][0])
        out.append(g)
    return out


def token_versions(batch: Batch, trainer_version: int) -> dict[str, float]:
    """Partial rollout's token metrics over the model's tokens (``response_mask``; a
    multi-turn sample's tool and env tokens are not sampled): ``async/token_staleness_mean``
    (trainer version − the version that sampled each token) and
    ``async/continued_token_fraction`` (the tokens sampled by newer weights than their
    response's first model token: later segments, or later turns after a push)."""
    mask = batch["response_mask"].bool()
    versions = batch[RESPONSE_VERSIONS]
    if not bool(mask.any()):
        return {}
    first = versions.gather(1, mask.long().argmax(dim=1, keepdim=True))
    newer = versions > first
    return {
        "async/token_staleness_mean": float((trainer_version - versions[mask]).float().mean()),
        "async/continued_token_fraction": float(newer[mask].float().mean()),
    }


class StreamingRollout:
    """A producer (:class:`~temper.pipelines.producer.Producer`) that streams ``inner``'s
    groups to training (module docstring). ``snapshot()``/``push(weights)`` as for
    :class:`~temper.pipelines.ahead.RolloutAhead`."""

    def __init__(
        self,
        inner: GroupProducer,
        snapshot: Callable[[], Any],
        push: Callable[[Any], None],
        *,
        staleness: int,
        batch_groups: int,
        chunk: int,
        strategy: Strategy,
        wait_timeout: float,
        seed: int,
        pad_token_id: int = 0,
        segment: int = 0,
        group_filter: StreamFilter | None = None,
        max_ahead: int = 0,
    ) -> None:
        if staleness < 1 or not 1 <= chunk <= batch_groups:
            raise ValueError(f"streaming needs staleness >= 1 and 1 <= chunk <= batch ({chunk})")
        self.inner, self.snapshot, self.push = inner, snapshot, push
        self.headline, self.total_steps = inner.headline, inner.total_steps
        self.staleness, self.batch_groups, self.chunk = staleness, batch_groups, chunk
        self.max_ahead = max_ahead  # groups queued or in flight at most (0: no cap)
        self.strategy, self.wait_timeout, self.seed = strategy, wait_timeout, seed
        self.pad_token_id, self.segment = pad_token_id, segment  # segment 0: no partial rollout
        self.filter = group_filter  # algorithm.filter_groups (stream_filter), under ``cond``
        self.cond = threading.Condition()
        # -- shared with the worker, under ``cond`` --
        self.todo: collections.deque[Batch] = collections.deque()  # chunks not started
        self.inflight: Batch | None = None  # the prompts of the chunk being generated
        self.ready: collections.deque[Group] = collections.deque()
        self.next_step: int | None = None  # the step whose batch the trainer takes next
        self.published: tuple[int, Any] | None = None  # weights the worker has not pushed
        self.published_version = 0  # the newest version the trainer published
        self.engine_version: int | None = 0  # what the engine holds (None: unknown)
        self.inner_state = inner.state_dict()  # the sampler's position after the last draw
        self.data_metrics: dict[str, float] = {}
        self.chunk_metrics: list[dict[str, float]] = []
        self.calls: collections.deque[tuple[Callable[[], Any], Future[Any]]] = collections.deque()
        self.error: BaseException | None = None
        self.stopping = False
        self.seeded = False
        # -- the trainer's --
        self.busy = BusyLog()
        self.handed_over: float | None = None
        self.thread = threading.Thread(target=self._loop, name="temper-stream", daemon=True)
        self.thread.start()

    # -- the producer protocol ---------------------------------------------------------

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The next ``train_batch_size`` fresh groups, for step ``step`` (trainer version
        ``step − 1``): publish the weights, then take groups as they finish."""
        trainer_version = step - 1
        weights = self.snapshot() if self._needs(trainer_version) else None
        asked = time.monotonic()
        taken: list[Group] = []
        fillers: list[Group] = []
        dropped = 0
        with timer("rollout_wait"), self.cond:
            self.next_step = step
            if weights is not None:
                self.published, self.published_version = (trainer_version, weights), trainer_version
            self.cond.notify_all()
            deadline = asked + self.wait_timeout
            while len(taken) < self.batch_groups:
                self._raise_failure()
                if self.ready:
                    group = self.ready.popleft()
                    if trainer_version - group.version > self.staleness:
                        dropped += 1
                    else:
                        taken.append(group)
                    self.cond.notify_all()  # a queued slot freed
                    continue
                if self.filter is not None and self._exhausted():
                    fillers = self.filter.fill(self.batch_groups - len(taken))
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RolloutAheadError(
                        f"rollout: the batch of step {step} was not ready within "
                        f"async_training.wait_timeout={self.wait_timeout:g}s ({len(taken)} of "
                        f"{self.batch_groups} groups finished; the rollout engine or a reward "
                        "call is stuck or too slow; raise the timeout for longer generations)"
                    )
                self.cond.wait(min(left, 1.0))
            self.next_step = step + 1
            filtered = (
                self.filter.take([g.batch for g in taken], [g.batch for g in fillers])
                if self.filter is not None
                else {}
            )
            rounds, self.chunk_metrics = self.chunk_metrics, []
            metrics = {**self.data_metrics, **(merge_round_metrics(rounds) if rounds else {})}
            metrics.update(filtered)
            left_ready = len(self.ready)
            self.cond.notify_all()
        got = time.monotonic()
        taken += fillers  # masked: trained on nothing (stream_filter)
        batch = concat_padded(unique_uids([g.batch for g in taken]), self.pad_token_id)
        stale = trainer_version - np.asarray(batch[VERSION], dtype=np.float64)
        metrics.update(
            {
                "async/policy_version": float(min(g.version for g in taken)),
                "async/staleness_mean": float(stale.mean()),
                "async/staleness_max": float(stale.max()),
                "async/dropped_groups": float(dropped),
                "async/ready_groups": float(left_ready),
            }
        )
        if RESPONSE_VERSIONS in batch:
            metrics.update(token_versions(batch, trainer_version))
        if self.handed_over is not None:
            metrics.update(overlap_metrics(self.busy, self.handed_over, asked, got))
        self.handed_over = got
        return batch, metrics

    def validate(self, step: int) -> Validation:
        """Validate the trainer's current weights (version ``step``), on the worker between
        chunks."""
        weights = self.snapshot()

        def run() -> Validation:
            self.push(weights)
            self.engine_version = step
            return self.inner.validate(step)

        future: Future[Validation] = Future()
        with self.cond:
            self.calls.append((run, future))
            self.cond.notify_all()
        deadline = time.monotonic() + self.wait_timeout
        while not future.done():
            with self.cond:
                self._raise_failure()
            if time.monotonic() > deadline:
                raise RolloutAheadError(
                    f"rollout: the validation at step {step} was not ready within "
                    f"async_training.wait_timeout={self.wait_timeout:g}s"
                )
            try:
                return future.result(timeout=1.0)
            except TimeoutError:
                continue
        return future.result()

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        return self.inner.dump_rows(batch, step)

    def state_dict(self) -> dict[str, Any]:
        """The sampler's position after the last draw and, in order, the prompts of every
        group not yet trained (ready, in flight, not started)."""
        with self.cond:
            pending = [g.prompt for g in self.ready]
            pending += [self.inflight] if self.inflight is not None else []
            pending += list(self.todo)
            return {"inner": self.inner_state, "pending": [pack_batch(p) for p in pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.cond:
            self.inner.load_state_dict(state["inner"])
            self.inner_state = state["inner"]
            self.todo = collections.deque(unpack_batch(p) for p in state["pending"])
            self.ready.clear()
            self.engine_version = None  # the trainer's resumed weights are pushed first
            self.published_version = -1

    def close(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=5.0)
        self.inner.close()

    # -- the worker ----------------------------------------------------------------------

    def _needs(self, version: int) -> bool:
        with self.cond:
            return version > self.published_version or self.engine_version is None

    def _raise_failure(self) -> None:
        if self.error is not None:
            raise self.error

    def _exhausted(self) -> bool:
        """Nothing left to generate for the batch: the filter's draws are spent."""
        assert self.filter is not None
        return not self.todo and self.inflight is None and not self.filter.may_draw()

    def _may_start(self) -> bool:
        if self.next_step is None:
            return False
        if not self.todo and self.filter is not None and not self.filter.may_draw():
            return False
        version = self.published[0] if self.published is not None else self.engine_version
        if version is None:
            return False
        size = len(self.todo[0]) if self.todo else self.chunk
        queued = len(self.ready) + (len(self.inflight) if self.inflight is not None else 0)
        return may_start(
            strategy=self.strategy,
            version=version,
            next_step=self.next_step,
            queued=queued,
            chunk=size,
            batch_groups=self.batch_groups,
            staleness=self.staleness,
            max_ahead=self.max_ahead,
        )

    def _loop(self) -> None:
        try:
            while True:
                with self.cond:
                    while not (self.stopping or self.calls or self._may_start()):
                        self.cond.wait()
                    if self.stopping:
                        return
                    if self.calls:
                        call, future = self.calls.popleft()
                    else:
                        call, future = None, None
                        weights, self.published = self.published, None
                        if not self.todo:  # _may_start: the trainer has asked (next_step)
                            step = self.next_step or 1
                            prompts, self.data_metrics = self.inner.draw_prompts(step)
                            if self.filter is not None:
                                self.filter.draws += 1
                            self.inner_state = self.inner.state_dict()
                            self.todo.extend(prompts.split(self.chunk))
                        self.inflight = self.todo.popleft()
                if call is not None and future is not None:
                    self._run_call(call, future)
                else:
                    self._generate(weights)
        except BaseException as err:  # handed to the trainer, which waits on the groups
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _run_call(self, call: Callable[[], Any], future: Future[Any]) -> None:
        start = time.monotonic()
        try:
            future.set_result(call())
        except BaseException as err:
            future.set_exception(err)
        finally:
            self.busy.add(start, time.monotonic())

    def _generate(self, weights: tuple[int, Any] | None) -> None:
        """Push ``weights`` (if any), generate the chunk in flight, queue its groups."""
        start = time.monotonic()
        if weights is not None:
            self.push(weights[1])
            self.engine_version = weights[0]
        if not self.seeded:  # the worker's first chunk: its own seeds, then its own draws
            seed_globals(batch_seed(self.seed, self.next_step or 0))
            self.seeded = True
        prompts, version = self.inflight, self.engine_version
        assert prompts is not None and version is not None
        timer = Timer()
        segments = Segments(self.segment, self._boundary, version) if self.segment else None
        batch, metrics = self.inner.generate_groups(prompts, timer, segments)
        batch[VERSION] = [version] * len(batch)
        rows: dict[Any, list[int]] = {}
        for i, uid in enumerate(batch["uid"]):
            rows.setdefault(uid, []).append(i)
        groups = [
            Group(prompts.select([i]), batch.select(rows[uid]), version)
            for i, uid in enumerate(prompts["uid"])
        ]
        with self.cond:
            self.ready.extend(groups if self.filter is None else self.filter.split(groups))
            self.inflight = None
            self.chunk_metrics.append({**metrics, **timer.times})
            self.cond.notify_all()
        self.busy.add(start, time.monotonic())

    def _boundary(self) -> int:
        """Between two segments of a partial rollout, or two turns of its multi-turn
        episodes: push the newest published weights, if any; the version the engine then
        holds."""
        with self.cond:
            weights, self.published = self.published, None
        if weights is not None:
            self.push(weights[1])
            self.engine_version = weights[0]
        assert self.engine_version is not None
        return self.engine_version
