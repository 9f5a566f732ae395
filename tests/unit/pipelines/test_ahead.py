"""The rollout ahead of training (pipelines.ahead): the fixed schedule, the weight pushes
between batches, staleness never above k, deadlines, failures, and the checkpointed batches."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from temper.data.batch import Batch
from temper.pipelines.ahead import (
    VERSION,
    RolloutAhead,
    RolloutAheadError,
    SerialWorker,
    batch_seed,
    pack,
    policy_version,
    unpack,
)
from temper.pipelines.producer import Validation
from temper.pipelines.timing import Timer


def test_policy_version_is_the_weights_after_s_minus_1_minus_k_updates():
    assert [policy_version(s, 0) for s in range(1, 6)] == [0, 1, 2, 3, 4]  # synchronous
    assert [policy_version(s, 1) for s in range(1, 6)] == [0, 0, 1, 2, 3]  # one-step-off
    assert [policy_version(s, 2) for s in range(1, 6)] == [0, 0, 0, 1, 2]


def test_batch_seed_depends_on_the_seed_and_step_only():
    assert batch_seed(1, 3) == batch_seed(1, 3)
    assert len({batch_seed(1, s) for s in range(1, 100)}) == 99
    assert batch_seed(1, 3) != batch_seed(2, 3)
    assert all(0 <= batch_seed(2**31, s) < 2**32 for s in range(5))


class Trainer:
    """Weights are the number of updates so far; the engine holds the last pushed."""

    def __init__(self) -> None:
        self.version = 0
        self.engine = 0
        self.pushes: list[int] = []

    def snapshot(self) -> int:
        return self.version

    def push(self, weights: int) -> None:
        self.engine = weights
        self.pushes.append(weights)


class Counting:
    """A producer whose batch records the engine's version when it was generated and the
    torch draw it made (the seeds are the batch's)."""

    headline = "val/reward_mean"

    def __init__(self, trainer: Trainer, total: int, delay: float = 0.0) -> None:
        self.trainer, self.total_steps, self.delay = trainer, total, delay
        self.made: list[int] = []
        self.closed = False

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        with timer("rollout"):
            time.sleep(self.delay)
            self.made.append(step)
            draw = torch.rand(()).item()
        tensors = {"engine": torch.full((2,), self.trainer.engine), "draw": torch.full((2,), draw)}
        return Batch.from_dict(tensors, {"uid": ["a", "a"]}), {"train/score_mean": float(step)}

    def validate(self, step: int) -> Validation:
        return Validation({"val/reward_mean": float(self.trainer.engine)})

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"made": list(self.made)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.made = list(state["made"])

    def close(self) -> None:
        self.closed = True


def _run(k: int, steps: int, validate_at: tuple[int, ...] = ()) -> tuple[list[Batch], Trainer]:
    trainer = Trainer()
    inner = Counting(trainer, steps, delay=0.01)
    ahead = RolloutAhead(
        inner, trainer.snapshot, trainer.push, staleness=k, wait_timeout=10.0, seed=3
    )
    batches = []
    try:
        for step in range(1, steps + 1):
            batch, metrics = ahead.produce(step, Timer())
            assert metrics["async/staleness_max"] <= k
            batches.append(batch)
            trainer.version += 1  # the update
            if step in validate_at:
                assert ahead.validate(step).metrics["val/reward_mean"] == step
    finally:
        ahead.close()
    assert inner.closed
    return batches, trainer


@pytest.mark.parametrize("k", [1, 2, 3])
def test_each_batch_is_generated_with_its_scheduled_version(k):
    batches, trainer = _run(k, 7)
    for step, batch in enumerate(batches, start=1):
        assert batch[VERSION] == [policy_version(step, k)] * 2
        assert batch["engine"].tolist() == [policy_version(step, k)] * 2  # what it really held
        assert (step - 1) - policy_version(step, k) <= k  # staleness bound, recorded
    assert trainer.pushes == sorted(set(trainer.pushes))  # each version pushed once, in order


def test_validation_sees_the_current_weights_and_changes_no_batch():
    plain, _ = _run(1, 6)
    validated, _ = _run(1, 6, validate_at=(2, 4))
    assert [b[VERSION] for b in plain] == [b[VERSION] for b in validated]
    assert [b["draw"].tolist() for b in plain] == [b["draw"].tolist() for b in validated]


def test_batches_ahead_survive_a_checkpoint_and_the_resumed_run_matches():
    full, _ = _run(2, 6)
    trainer = Trainer()
    inner = Counting(trainer, 6)
    first = RolloutAhead(
        inner, trainer.snapshot, trainer.push, staleness=2, wait_timeout=10.0, seed=3
    )
    for step in (1, 2, 3):
        first.produce(step, Timer())
        trainer.version += 1
    state = first.state_dict()  # waits for batches 4 and 5 (queued at steps 2 and 3)
    first.close()
    assert [p["step"] for p in state["ahead"]] == [4, 5]
    assert state["inner"]["made"] == [1, 2, 3, 4, 5]

    trainer2 = Trainer()
    trainer2.version, trainer2.engine = 3, 3  # the resumed actor, pushed at load
    second = RolloutAhead(
        Counting(trainer2, 6),
        trainer2.snapshot,
        trainer2.push,
        staleness=2,
        wait_timeout=10.0,
        seed=3,
    )
    second.load_state_dict(state)
    resumed = []
    for step in (4, 5, 6):
        resumed.append(second.produce(step, Timer())[0])
        trainer2.version += 1
    second.close()
    for a, b in zip(full[3:], resumed):
        assert a[VERSION] == b[VERSION]
        assert torch.equal(a["engine"], b["engine"]) and torch.equal(a["draw"], b["draw"])


def test_pack_round_trips_tensors_objects_and_meta():
    from temper.pipelines.ahead import Produced

    batch = Batch.from_dict(
        {"x": torch.arange(6).reshape(3, 2)},
        {"uid": ["a", "b", "c"], "extra": [{"k": 1}, None, (2, "t")]},
        {"temperature": 0.7},
    )
    back = unpack(pack(Produced(4, 2, batch, {"m": 1.5})))
    assert (back.step, back.version, back.metrics) == (4, 2, {"m": 1.5})
    assert torch.equal(back.batch["x"], batch["x"])
    assert back.batch.objects == batch.objects and back.batch.meta == batch.meta


def test_a_failing_producer_fails_the_step_that_waits_for_its_batch():
    trainer = Trainer()

    class Broken(Counting):
        def produce(self, step, timer):
            if step == 2:
                raise RuntimeError("rollout worker 0 died")
            return super().produce(step, timer)

    ahead = RolloutAhead(
        Broken(trainer, 4), trainer.snapshot, trainer.push, staleness=1, wait_timeout=10.0, seed=1
    )
    ahead.produce(1, Timer())  # batch 2 is made (and fails) meanwhile
    with pytest.raises(RuntimeError, match="rollout worker 0 died"):
        ahead.produce(2, Timer())
    ahead.close()


def test_a_stuck_rollout_ends_in_one_line_at_the_deadline():
    trainer = Trainer()
    release = threading.Event()

    class Stuck(Counting):
        def produce(self, step, timer):
            release.wait(5.0)
            return super().produce(step, timer)

    ahead = RolloutAhead(
        Stuck(trainer, 3), trainer.snapshot, trainer.push, staleness=1, wait_timeout=0.2, seed=1
    )
    start = time.monotonic()
    with pytest.raises(RolloutAheadError) as err:
        ahead.produce(1, Timer())
    assert time.monotonic() - start < 2.0
    assert "\n" not in str(err.value)
    assert "the batch of step 1" in str(err.value) and "wait_timeout=0.2s" in str(err.value)
    release.set()
    ahead.close()


def test_serial_worker_runs_calls_in_order_and_counts_busy_time():
    worker = SerialWorker("test")
    order: list[int] = []
    futures = [worker.submit(lambda i=i: (time.sleep(0.02), order.append(i))) for i in range(3)]
    for f in futures:
        f.result(timeout=5)
    assert order == [0, 1, 2]
    spans = worker.busy.spans()
    start, end = spans[0][0], spans[-1][1]
    assert worker.busy.within(start, end) == pytest.approx(sum(b - a for a, b in spans))
    worker.close()


def _cfg(**sections: Any) -> dict:
    cfg: dict = {
        "model": {"path": "m"},
        "data": {"train_files": ["task:arithmetic?n=8"], "train_batch_size": 2},
        "rollout": {"n": 2},
        "actor": {"mini_batch_size": 4},
        "async_training": {"staleness": 1},
    }
    for name, values in sections.items():
        cfg[name] = {**cfg.get(name, {}), **values}
    return cfg


def test_check_explains_the_schedule_and_refuses_what_it_cannot_resume():
    from temper.config.derive import explain
    from temper.config.errors import ConfigError
    from temper.pipelines.catalog import build_config, plan

    cfg = build_config(_cfg())
    rows = {name: (value, how) for name, value, how in explain(cfg, plan(cfg))}
    assert rows["schedule"][0] == "one-step-off"
    assert "max(0, s - 2) updates" in rows["schedule"][1]
    with pytest.raises(ConfigError, match="rollout.model_update_frequency"):
        build_config(_cfg(rollout={"model_update_frequency": 2}))
    with pytest.raises(ConfigError, match="async_training"):  # no rollout to run ahead
        build_config({**_cfg(actor={"mini_batch_size": 2}), "pipeline": "sft"})
    with pytest.raises(ConfigError, match="async_training.staleness"):
        build_config(_cfg(async_training={"staleness": -1}))


def test_check_says_when_the_trainer_shares_the_rollouts_random_generator():
    from temper.config.derive import explain
    from temper.pipelines.catalog import build_config, plan

    def schedule(**sections: Any) -> str:
        cfg = build_config(_cfg(**sections))
        return {n: how for n, _, how in explain(cfg, plan(cfg))}["schedule"]

    assert "not bit-reproducible" not in schedule()
    lora = {"lora": {"rank": 4, "dropout": 0.1}}
    assert "not bit-reproducible" in schedule(model={"path": "m", **lora})
    assert "not bit-reproducible" not in schedule(
        model={"path": "m", **lora}, rollout={"engine": "vllm", "n": 2}
    )
