"""Asynchronous RL: the producer runs ahead of training by at most ``k`` policy versions.

With ``async_training.staleness`` = k > 0 the run's producer is wrapped in
:class:`RolloutAhead`, which the one loop calls like any producer. The schedule is fixed:

* batch s (1-based) is generated with the weights after ``v(s) = max(0, s − 1 − k)``
  updates (:func:`policy_version`), while the steps before it train; the trainer starts
  step s at version s − 1, so no sample is more than k versions old; k = 1 is
  one-step-off (step s trains on samples of version s − 2 while batch s + 1 generates);
* one worker thread runs the pipeline's producer, batch after batch in step order, and
  the weight pushes between them: at the start of step N, batch N + k is queued behind a
  copy of the trainer's weights (version N − 1, taken while the trainer is idle);
* every batch is produced under seeds drawn from ``(experiment.seed, s)`` alone
  (:func:`batch_seed`): the Hugging Face engine samples from torch's global generator,
  which the trainer's thread does not draw from;
* a checkpoint waits for the batches ahead and holds them (and the producer's position
  after them), so a resumed run trains on exactly the batches an uninterrupted one would
  — what is generated with which version depends on the step number, never on timing;
* validation runs on the worker too (one engine, one thread), with the trainer's current
  weights pushed first, after the batches queued before it.

Every wait has a deadline (``async_training.wait_timeout``) that ends the run with one
line naming the rollout and the batch; a producer that fails (a dead rollout worker, a
reward worker) fails the step that waits for its batch, with its own error.

Metrics: ``async/staleness_mean``/``async/staleness_max`` (trainer version − sample
version) and ``async/policy_version``; timings (``timing/``, as a step's phases are):
``rollout_wait_s`` (the trainer idle, waiting for its batch), ``trainer_busy_s`` (the
trainer busy since the previous batch was handed over), ``rollout_busy_s`` (the rollout
worker busy within that), ``rollout_idle_s`` (the worker idle between the two
hand-overs), and ``perf/rollout_overlap``: the overlap over the shorter of the two phases.
"""

from __future__ import annotations

import dataclasses
import pickle
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

import numpy as np
import torch

from temper.data.batch import Batch
from temper.pipelines.producer import Producer, Validation
from temper.pipelines.timing import Timer

T = TypeVar("T")

#: The object column holding the policy version each sample was generated with.
VERSION = "policy_version"


class RolloutAheadError(RuntimeError):
    """The rollout did not hand over a batch in time: one line naming what was waited for."""


def policy_version(step: int, staleness: int) -> int:
    """The weights batch ``step`` is generated with: ``v(s) = max(0, s − 1 − k)``
    updates (k = ``staleness``; k = 0 is the synchronous ``s − 1``)."""
    return max(0, step - 1 - staleness)


def batch_seed(seed: int, step: int) -> int:
    """The seed batch ``step`` is produced under: a function of the run's seed and the
    step alone (numpy's legacy seeding takes < 2**32)."""
    return (seed * 1_000_003 + step * 7_919) % (2**32)


def seed_globals(seed: int) -> None:
    """Seed every global RNG a producer may draw from (python, numpy, torch, CUDA)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class BusyLog:
    """The (start, end) spans a worker thread spent in calls, read by the trainer's thread."""

    def __init__(self) -> None:
        self._spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self._spans.append((start, end))

    def spans(self) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._spans)

    def within(self, start: float, end: float) -> float:
        """Seconds spent in calls within ``[start, end]`` (a call still running counts from
        its start, which the reader cannot see: it is not counted)."""
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.spans())


def overlap_metrics(
    busy: BusyLog, handed_over: float, asked: float, got: float
) -> dict[str, float]:
    """How the rollout worker and the trainer overlapped between two hand-overs: the
    trainer busy from ``handed_over`` (the previous batch given) to ``asked`` (it asked for
    the next), which it got at ``got`` (the module docstring's timings)."""
    train = max(0.0, asked - handed_over)
    overlap = busy.within(handed_over, asked)
    rollout = busy.within(handed_over, got)
    shorter = min(train, rollout)
    return {
        "timing/trainer_busy_s": train,
        "timing/rollout_busy_s": overlap,
        "timing/rollout_idle_s": max(0.0, (got - handed_over) - rollout),
        "perf/rollout_overlap": overlap / shorter if shorter > 0 else 0.0,
    }


class SerialWorker:
    """One daemon thread running submitted calls in order; each call's result or error
    lands in its ``Future``. A daemon, so a call stuck in an engine never keeps the
    process alive after the run has failed."""

    def __init__(self, name: str) -> None:
        self._calls: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self.busy = BusyLog()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((call, future))
        return future

    def _loop(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            if not future.set_running_or_notify_cancel():
                continue
            start = time.monotonic()
            try:
                future.set_result(call())
            except BaseException as err:  # handed to the thread that waits for it
                future.set_exception(err)
            finally:
                self.busy.add(start, time.monotonic())

    def close(self) -> None:
        self._calls.put(None)
        self._thread.join(timeout=5.0)


@dataclasses.dataclass
class Produced:
    """A batch the worker produced: its step, the version that generated it, the
    producer's metrics (its phase timings among them)."""

    step: int
    version: int
    batch: Batch
    metrics: dict[str, float]


class RolloutAhead:
    """A producer (:class:`~temper.pipelines.producer.Producer`) that runs ``inner`` up to
    ``staleness`` policy versions ahead of training (module docstring).

    ``snapshot()`` returns the trainer's current weights as a copy the trainer's next
    update does not change; ``push(weights)`` loads such a copy into the rollout engine.
    """

    def __init__(
        self,
        inner: Producer,
        snapshot: Callable[[], Any],
        push: Callable[[Any], None],
        *,
        staleness: int,
        wait_timeout: float,
        seed: int,
    ) -> None:
        self.inner, self.snapshot, self.push = inner, snapshot, push
        self.headline, self.total_steps = inner.headline, inner.total_steps
        self.staleness, self.wait_timeout, self.seed = staleness, wait_timeout, seed
        self.worker = SerialWorker("temper-rollout")
        self.pending: dict[int, Future[Produced]] = {}
        self.submitted = 0  # the last step whose batch is queued (or held)
        self.pushed = 0  # the version the engine holds once the queue has run
        self.handed_over: float | None = None  # when the trainer last got its batch

    # -- the producer protocol ---------------------------------------------------------

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Batch ``step``: queue the batches up to ``step + k`` (the newest with the
        trainer's current weights), then wait for this one."""
        trainer_version = step - 1
        for s in range(self.submitted + 1, min(step + self.staleness, self.total_steps) + 1):
            self._submit(s, trainer_version)
        asked = time.monotonic()
        with timer("rollout_wait"):
            produced = self._wait(self.pending.pop(step), f"the batch of step {step}")
        got = time.monotonic()
        metrics = dict(produced.metrics)
        metrics.update(self._overlap(asked, got))
        versions = np.asarray(produced.batch[VERSION], dtype=np.float64)
        stale = trainer_version - versions
        metrics.update(
            {
                "async/policy_version": float(produced.version),
                "async/staleness_mean": float(stale.mean()) if stale.size else 0.0,
                "async/staleness_max": float(stale.max()) if stale.size else 0.0,
            }
        )
        self.handed_over = got
        return produced.batch, metrics

    def validate(self, step: int) -> Validation:
        """Validate the trainer's current weights (version ``step``), on the worker after
        the batches queued before."""
        weights = self.snapshot()

        def run() -> Validation:
            self.push(weights)
            return self.inner.validate(step)

        self.pushed = max(self.pushed, step)
        return self._wait(self.worker.submit(run), f"the validation at step {step}")

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        return self.inner.dump_rows(batch, step)

    def state_dict(self) -> dict[str, Any]:
        """The batches ahead (waited for: a checkpoint holds them whole) and the inner
        producer's position after them."""
        ahead = [self._wait(f, f"the batch of step {s}") for s, f in sorted(self.pending.items())]
        return {
            "inner": self.inner.state_dict(),
            "submitted": self.submitted,
            "pushed": self.pushed,
            "ahead": [pack(p) for p in ahead],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.submitted, self.pushed = int(state["submitted"]), int(state["pushed"])
        self.pending = {}
        for packed in state["ahead"]:
            produced = unpack(packed)
            done: Future[Produced] = Future()
            done.set_result(produced)
            self.pending[produced.step] = done

    def close(self) -> None:
        """Stop the worker (batches queued but not started are cancelled: a run that
        failed does not go on generating for it), then close the inner producer."""
        for future in self.pending.values():
            future.cancel()
        try:
            self.worker.close()
        finally:
            self.inner.close()

    # -- the schedule ------------------------------------------------------------------

    def _submit(self, step: int, trainer_version: int) -> None:
        """Queue batch ``step``: a push of the trainer's weights first when the batch
        needs a newer version than the engine will hold."""
        version = policy_version(step, self.staleness)
        weights = None
        if version > self.pushed:
            assert version == trainer_version, (step, version, trainer_version)
            weights = self.snapshot()  # the trainer is between steps: its weights are v
            self.pushed = version
        self.pending[step] = self.worker.submit(lambda: self._produce(step, version, weights))
        self.submitted = step

    def _produce(self, step: int, version: int, weights: Any) -> Produced:
        """On the worker: push ``weights`` (if any), then produce batch ``step`` under its
        own seeds."""
        if weights is not None:
            self.push(weights)
        seed_globals(batch_seed(self.seed, step))
        timer = Timer()
        batch, metrics = self.inner.produce(step, timer)
        batch[VERSION] = [version] * len(batch)
        metrics.update(timer.times)
        return Produced(step, version, batch, metrics)

    def _wait(self, future: Future[T], what: str) -> T:
        try:
            return future.result(timeout=self.wait_timeout)
        except FutureTimeout:
            raise RolloutAheadError(
                f"rollout: {what} was not ready within async_training.wait_timeout="
                f"{self.wait_timeout:g}s (the rollout engine or a reward call is stuck or "
                "too slow; raise the timeout for longer generations)"
            ) from None

    def _overlap(self, asked: float, got: float) -> dict[str, float]:
        """Nothing before the first hand-over (see :func:`overlap_metrics`)."""
        if self.handed_over is None:
            return {}
        return overlap_metrics(self.worker.busy, self.handed_over, asked, got)


def pack_batch(b: Batch) -> dict[str, Any]:
    """A batch as a checkpoint holds it (``torch.load(weights_only=True)`` reads tensors,
    numbers and strings): its tensors as they are, its per-sample objects and meta pickled
    into a byte tensor — the run's own file, written by this process."""
    blob = pickle.dumps((b.objects, b.meta), protocol=pickle.HIGHEST_PROTOCOL)
    return {
        "tensors": b.tensors.to_dict(),
        "objects": torch.frombuffer(bytearray(blob), dtype=torch.uint8),
    }


def unpack_batch(packed: dict[str, Any]) -> Batch:
    """Inverse of :func:`pack_batch`."""
    objects, meta = pickle.loads(packed["objects"].numpy().tobytes())
    return Batch.from_dict(dict(packed["tensors"]), objects, meta)


def pack(p: Produced) -> dict[str, Any]:
    """A produced batch as a checkpoint holds it (:func:`pack_batch`), with its step,
    version and metrics."""
    return {"step": p.step, "version": p.version, "metrics": dict(p.metrics), **pack_batch(p.batch)}


def unpack(packed: dict[str, Any]) -> Produced:
    """Inverse of :func:`pack`."""
    batch = unpack_batch(packed)
    return Produced(int(packed["step"]), int(packed["version"]), batch, dict(packed["metrics"]))
