"""Streaming asynchronous RL (pipelines.streaming): groups handed to training as they
finish, the staleness bound under wait and drop, the checkpointed prompts of groups not yet
trained, deadlines, failures and validation on the worker."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
import torch

from temper.data.batch import Batch
from temper.pipelines.ahead import VERSION, RolloutAheadError
from temper.pipelines.producer import Validation
from temper.pipelines.stream_schedule import ahead_cap, chunk_size, may_start
from temper.pipelines.streaming import StreamingRollout, token_versions, unique_uids
from temper.pipelines.timing import Timer

N = 2  # responses per prompt


def test_chunk_size_defaults_to_a_quarter_of_the_batch():
    assert chunk_size(0, 8) == 2 and chunk_size(0, 3) == 1 and chunk_size(5, 8) == 5


def test_may_start_wait_bound_by_hand():
    # B = 4, k = 1: the trainer's next batch is step 3 (it is at version 2 once it asks).
    ask = dict(strategy="wait", next_step=3, batch_groups=4, staleness=1)
    # 2 queued + 2: the chunk's last group is the 4th -> step 3 -> needs v >= 3 - 1 - 1 = 1
    assert may_start(version=1, queued=2, chunk=2, **ask)
    assert not may_start(version=0, queued=2, chunk=2, **ask)
    # 3 queued + 2: the last group is the 5th -> trained at step 4 -> needs v >= 2
    assert not may_start(version=1, queued=3, chunk=2, **ask)
    assert may_start(version=2, queued=3, chunk=2, **ask)
    # k = 2 lets it start one version older
    assert may_start(version=1, queued=3, chunk=2, **{**ask, "staleness": 2})


def test_may_start_drop_bound_is_the_queue():
    ask = dict(strategy="drop", next_step=9, batch_groups=4, staleness=1, version=0)
    assert may_start(queued=6, chunk=2, **ask)  # 8 = (k + 1)·B
    assert not may_start(queued=7, chunk=2, **ask)


def test_may_start_ahead_cap_by_hand():
    """verl fully-async's (1 + t) cycles: B = 4, t = 0.25 -> at most 5 groups waiting, but
    never fewer than the trainer's next batch needs."""
    assert ahead_cap(1.25, 4) == 5 and ahead_cap(0.0, 4) == 0
    ask = dict(strategy="wait", next_step=3, batch_groups=4, staleness=3, version=2, max_ahead=5)
    assert may_start(queued=4, chunk=1, **ask)  # 5 waiting
    assert not may_start(queued=4, chunk=2, **ask)  # 6 > 5
    assert may_start(queued=3, chunk=2, **ask)  # the next batch is short: waived
    assert may_start(queued=4, chunk=2, **{**ask, "max_ahead": 0})  # no cap


def test_unique_uids_renames_a_prompt_drawn_again():
    g = [_group("a"), _group("b"), _group("a")]
    assert [x["uid"][0] for x in unique_uids(g)] == ["a", "b", "a#2"]


def _group(uid: str) -> Batch:
    return Batch.from_dict({"x": torch.zeros(N)}, {"uid": [uid] * N})


class Trainer:
    """Weights are the number of updates so far; the engine holds the last pushed."""

    def __init__(self) -> None:
        self.version = 0
        self.engine = 0

    def snapshot(self) -> int:
        return self.version

    def push(self, weights: int) -> None:
        self.engine = weights


class Prompts:
    """A group producer: prompt ``p<i>`` drawn in order, ``n`` responses each recording
    the engine's version; ``delay(i)`` seconds per chunk whose first prompt is ``i``."""

    headline = "val/reward_mean"

    def __init__(self, trainer: Trainer, batch: int, total: int, delay: Any = None) -> None:
        self.trainer, self.batch, self.total_steps = trainer, batch, total
        self.delay = delay or (lambda i: 0.0)
        self.drawn = 0
        self.closed = False

    def _prompts(self, ids: list[int]) -> Batch:
        prompt_ids = torch.tensor([[i, i] for i in ids])
        return Batch.from_dict(
            {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids)},
            {"uid": [f"p{i}" for i in ids]},
        )

    def draw_prompts(self, step: int) -> tuple[Batch, dict[str, float]]:
        ids = list(range(self.drawn, self.drawn + self.batch))
        self.drawn += self.batch
        return self._prompts(ids), {"data/num_prompts": 99.0}

    def generate_groups(
        self, prompts: Batch, timer: Timer, segments: Any = None
    ) -> tuple[Batch, dict[str, float]]:
        first = int(prompts["prompt_ids"][0, 0])
        with timer("rollout"):
            time.sleep(self.delay(first))
        out = prompts.repeat(N)
        width = 1 + first % 3  # groups end at different lengths
        out["response_ids"] = torch.full((len(out), width), self.trainer.engine)
        out["response_mask"] = torch.ones(len(out), width)
        if segments is not None:  # a partial rollout: one boundary after the first token
            later = segments.boundary()
            versions = torch.full((len(out), width), later)
            versions[:, 0] = segments.version
            out["response_versions"] = versions
        return out, {"train/score_mean": float(first)}

    def validate(self, step: int) -> Validation:
        return Validation({"val/reward_mean": float(self.trainer.engine)})

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.drawn = int(state["drawn"])

    def close(self) -> None:
        self.closed = True


def _stream(trainer: Trainer, inner: Prompts, **kw: Any) -> StreamingRollout:
    opts = dict(staleness=1, batch_groups=4, chunk=2, strategy="wait", wait_timeout=20.0, seed=1)
    return StreamingRollout(inner, trainer.snapshot, trainer.push, **{**opts, **kw})


def _train(stream: StreamingRollout, trainer: Trainer, steps: range, pause: Any = None):
    """The loop's calls: produce step s at version s - 1, train (``pause``), update."""
    batches, metrics = [], []
    for s in steps:
        trainer.version = s - 1
        batch, m = stream.produce(s, Timer())
        batches.append(batch)
        metrics.append(m)
        time.sleep(pause(s) if pause else 0.0)
        trainer.version = s
    return batches, metrics


def _uids(batch: Batch) -> list[str]:
    return list(dict.fromkeys(batch["uid"]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wait_trains_every_prompt_once_in_order_and_never_past_k(seed):
    rng = random.Random(seed)
    delays = {i: rng.uniform(0, 0.02) for i in range(200)}
    trainer = Trainer()
    inner = Prompts(trainer, 4, 8, delay=delays.get)
    stream = _stream(trainer, inner, staleness=1)
    try:
        batches, metrics = _train(
            stream, trainer, range(1, 9), pause=lambda s: rng.uniform(0, 0.03)
        )
    finally:
        stream.close()
    assert inner.closed
    flat = [u for b in batches for u in _uids(b)]
    assert flat == [f"p{i}" for i in range(32)]  # FIFO: none lost, none repeated
    for s, (batch, m) in enumerate(zip(batches, metrics), start=1):
        stale = (s - 1) - torch.tensor(batch[VERSION])
        assert int(stale.max()) <= 1 and m["async/staleness_max"] <= 1
        assert m["async/dropped_groups"] == 0
        # the version recorded is the engine's when the group was generated
        assert torch.equal(
            batch["response_ids"][:, 0].float(), torch.tensor(batch[VERSION]).float()
        )
        firsts = [int(u[1:]) for u in _uids(batch)[::2]]  # chunks of 2: their first prompts
        assert len(batch) == 4 * N
        assert batch["response_ids"].shape[1] == max(1 + f % 3 for f in firsts)  # the widest
    assert metrics[0]["data/num_prompts"] == 99.0


@pytest.mark.parametrize(("cap", "most"), [(0, 8), (5, 1)])
def test_max_ahead_stops_the_rollout_at_the_cap(cap, most):
    """A slow trainer, k = 2: uncapped, the rollout fills (k + 1)·B = 12 groups (8 left
    after a batch is taken); capped at 5 (max_ahead_batches 1.25), at most one."""
    trainer = Trainer()
    inner = Prompts(trainer, 4, 6)
    stream = _stream(trainer, inner, staleness=2, chunk=1, max_ahead=cap)
    try:
        _, metrics = _train(stream, trainer, range(1, 7), pause=lambda s: 0.15)
    finally:
        stream.close()
    left = [m["async/ready_groups"] for m in metrics]
    assert max(left) <= most
    if cap == 0:
        assert max(left) > 1  # the cap is what holds it


def test_groups_stream_past_a_slow_one_within_the_batch():
    """A chunk that takes long does not hold back the groups finished before it."""
    trainer = Trainer()
    inner = Prompts(trainer, 4, 2, delay=lambda i: 1.0 if i == 6 else 0.0)
    stream = _stream(trainer, inner, chunk=1, staleness=2)
    try:
        _train(stream, trainer, range(1, 2))
        t0 = time.monotonic()
        with stream.cond:  # wait until the fast chunks of batch 2 are ready
            while len(stream.ready) < 2 and time.monotonic() - t0 < 5:
                stream.cond.wait(0.05)
            ready = [g.prompt["uid"][0] for g in stream.ready]
        assert ready[:2] == ["p4", "p5"] and time.monotonic() - t0 < 0.9
    finally:
        stream.close()


def test_drop_keeps_the_bound_and_counts_the_dropped():
    """A fast rollout and a slow trainer: the queue fills with old groups, which are
    dropped when their turn comes more than k versions late."""
    trainer = Trainer()
    inner = Prompts(trainer, 4, 6)
    stream = _stream(trainer, inner, strategy="drop", staleness=1)
    try:
        batches, metrics = _train(stream, trainer, range(1, 7), pause=lambda s: 0.1)
    finally:
        stream.close()
    for s, batch in enumerate(batches, start=1):
        assert int(((s - 1) - torch.tensor(batch[VERSION])).max()) <= 1
    assert sum(m["async/dropped_groups"] for m in metrics) > 0
    flat = [u for b in batches for u in _uids(b)]
    assert len(flat) == len(set(flat)) == 24  # none trained twice


def test_checkpoint_regenerates_the_groups_not_yet_trained():
    trainer = Trainer()
    inner = Prompts(trainer, 4, 6, delay=lambda i: 0.005)
    stream = _stream(trainer, inner, staleness=2, chunk=1)
    try:
        first, _ = _train(stream, trainer, range(1, 4))
        time.sleep(0.05)  # let the worker run ahead: ready and in-flight groups
        state = stream.state_dict()
    finally:
        stream.close()
    assert inner.drawn > 12  # it drew past the trained prompts
    trainer2 = Trainer()
    trainer2.version = trainer2.engine = 3
    inner2 = Prompts(trainer2, 4, 6)
    resumed = _stream(trainer2, inner2, staleness=2, chunk=1)
    resumed.load_state_dict(state)
    try:
        rest, metrics = _train(resumed, trainer2, range(4, 7))
    finally:
        resumed.close()
    flat = [u for b in first + rest for u in _uids(b)]
    assert flat == [f"p{i}" for i in range(24)]
    assert metrics[0]["async/staleness_max"] == 0  # the resumed weights pushed first


def test_a_stuck_rollout_ends_in_one_line():
    trainer = Trainer()
    gate = threading.Event()
    inner = Prompts(trainer, 4, 2, delay=lambda i: float(gate.wait(3)) * 0)
    stream = _stream(trainer, inner, wait_timeout=0.3)
    try:
        with pytest.raises(RolloutAheadError, match="batch of step 1 was not ready") as err:
            stream.produce(1, Timer())
        assert "\n" not in str(err.value) and "0 of 4 groups" in str(err.value)
    finally:
        gate.set()
        stream.close()


def test_a_failing_rollout_fails_the_step_with_its_error():
    trainer = Trainer()
    inner = Prompts(trainer, 4, 2)

    def broken(prompts: Batch, timer: Timer, segments: Any) -> tuple[Batch, dict[str, float]]:
        raise RuntimeError("rollout rank 0: worker process died")

    inner.generate_groups = broken  # type: ignore[method-assign]
    stream = _stream(trainer, inner)
    try:
        with pytest.raises(RuntimeError, match="worker process died"):
            stream.produce(1, Timer())
    finally:
        stream.close()


def test_validation_runs_on_the_worker_with_the_trainers_weights():
    trainer = Trainer()
    inner = Prompts(trainer, 4, 4)
    stream = _stream(trainer, inner)
    try:
        assert stream.validate(0).metrics == {"val/reward_mean": 0.0}  # before any step
        _train(stream, trainer, range(1, 3))
        assert stream.validate(2).metrics == {"val/reward_mean": 2.0}
    finally:
        stream.close()


def _cfg(**async_training: Any) -> dict:
    return {
        "model": {"path": "m"},
        "data": {"train_files": ["task:arithmetic?n=8"], "train_batch_size": 4},
        "rollout": {"n": 2},
        "actor": {"mini_batch_size": 8},
        "async_training": {"staleness": 1, "mode": "streaming", **async_training},
    }


def test_check_explains_streaming_and_refuses_what_it_cannot_stream():
    from temper.config.derive import explain
    from temper.config.errors import ConfigError
    from temper.pipelines.catalog import build_config, plan

    cfg = build_config(_cfg(max_off_policy_strategy="drop"))
    rows = {name: (value, how) for name, value, how in explain(cfg, plan(cfg))}
    assert rows["schedule"][0] == "streaming, at most 1 version behind"
    assert "4 groups a step" in rows["schedule"][1] and "1 at a time" in rows["schedule"][1]
    assert "up to 8 groups" in rows["schedule"][1]
    with pytest.raises(ConfigError, match="async_training.mode.*staleness 0"):
        build_config(_cfg(staleness=0))
    with pytest.raises(ConfigError, match="async_training.stream_chunk.*more than the 4 a step"):
        build_config(_cfg(stream_chunk=5))
    filtered = build_config({**_cfg(), "algorithm": {"filter_groups": {"enable": True}}})
    assert filtered.algorithm.filter_groups.enable  # dynamic sampling streams (stream_filter)
    with pytest.raises(ConfigError, match="async_training.max_off_policy_strategy"):
        build_config(_cfg(max_off_policy_strategy="keep"))


def test_token_versions_by_hand():
    batch = Batch.from_dict(
        {
            "response_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
            "response_versions": torch.tensor([[2, 2, 3, 0], [3, 3, 0, 0]]),
        }
    )
    m = token_versions(batch, trainer_version=4)
    # staleness of the 5 tokens: 2, 2, 1 | 1, 1 -> 7 / 5; one token newer than its first
    assert m["async/token_staleness_mean"] == pytest.approx(7 / 5)
    assert m["async/continued_token_fraction"] == pytest.approx(1 / 5)


def test_partial_rollout_pushes_new_weights_into_a_chunk_in_flight():
    """A slow rollout (0.3 s a chunk) and a fast trainer: the trainer publishes while a
    chunk is generating, and the chunk's later tokens come from the newer weights."""
    trainer = Trainer()
    inner = Prompts(trainer, 4, 4, delay=lambda i: 0.3)
    original = inner.generate_groups

    def first_token_then_boundary(prompts: Batch, timer: Timer, segments: Any):
        time.sleep(0.3)  # the first segment
        return original(prompts, timer, segments)

    inner.delay = lambda i: 0.0
    inner.generate_groups = first_token_then_boundary  # type: ignore[method-assign]
    stream = _stream(trainer, inner, chunk=4, segment=1)
    try:
        _, metrics = _train(stream, trainer, range(1, 5), pause=lambda s: 0.05)
    finally:
        stream.close()
    assert any(m.get("async/continued_token_fraction", 0) > 0 for m in metrics)
    assert all(m["async/token_staleness_mean"] <= m["async/staleness_max"] <= 1 for m in metrics)


def test_agentic_streams_env_groups_in_a_partial_rollout_but_not_vl_ones():
    from temper.config.derive import explain
    from temper.config.errors import ConfigError
    from temper.pipelines.catalog import build_config, plan

    agentic = {
        "pipeline": "agentic",
        "model": {"path": "m"},
        "experiment": {"max_steps": 2},
        "actor": {"mini_batch_size": 6},
        "agentic": {
            "train_env_manager": {"num_env_groups": 3, "group_size": 2, "tags": ["T"]},
            "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
            "custom_envs": {"T": {"env_type": "frozen_lake"}},
        },
        "async_training": {"staleness": 1, "mode": "streaming"},
    }
    cfg = build_config(agentic)
    rows = {name: how for name, _, how in explain(cfg, plan(cfg))}
    assert "3 groups a step" in rows["schedule"]
    with pytest.raises(ConfigError, match="async_training.stream_chunk.*more than the 3"):
        build_config(
            {**agentic, "async_training": {**agentic["async_training"], "stream_chunk": 4}}
        )
    partial = {**agentic["async_training"], "partial_rollout_segment": 8}
    cfg = build_config({**agentic, "async_training": partial})
    assert cfg.async_training.partial_rollout_segment == 8  # env turns continue in segments
    vl = {**agentic, "agentic": {**agentic["agentic"], "env_manager": "vl_trajectory"}}
    build_config(vl)
    with pytest.raises(ConfigError, match="partial_rollout_segment.*image pixels"):
        build_config({**vl, "async_training": partial})


def test_fixed_mode_refuses_the_streaming_keys():
    from temper.config.errors import ConfigError
    from temper.pipelines.catalog import build_config

    for key, value in (("stream_chunk", 2), ("max_off_policy_strategy", "drop")):
        with pytest.raises(ConfigError, match=f"async_training.{key}.*streaming only"):
            build_config(_cfg(mode="fixed", **{key: value}))


# ------------------------------------------------------------ dynamic sampling on a stream


class Scored(Prompts):
    """Prompts whose groups score alike (no signal) when ``flat(i)``, else 0 and 1."""

    def __init__(self, *args: Any, flat: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.flat = flat

    def generate_groups(
        self, prompts: Batch, timer: Timer, segments: Any = None
    ) -> tuple[Batch, dict[str, float]]:
        out, metrics = super().generate_groups(prompts, timer, segments)
        ids = [int(u[1:]) for u in out["uid"]]
        out["scores"] = torch.tensor(
            [0.0 if self.flat(i) else float(k % 2) for k, i in enumerate(ids)]
        )
        return out, metrics


def _filtered(trainer: Trainer, inner: Prompts, max_rounds: int) -> StreamingRollout:
    from temper.config.schema import AlgorithmConfig, FilterGroupsConfig
    from temper.pipelines.shaping import ShapingSettings
    from temper.pipelines.stream_filter import StreamFilter

    fg = FilterGroupsConfig(enable=True, metric="score", max_num_gen_batches=max_rounds)
    settings = ShapingSettings(algo=AlgorithmConfig(), response_length=8)
    return _stream(trainer, inner, group_filter=StreamFilter(fg, settings, 4))


def test_filtered_groups_never_reach_training_and_the_stream_draws_on():
    """Even prompts score alike: every batch holds 4 odd prompts' groups, in order, with
    sample_mask 1, and the counts of kept and dropped groups."""
    trainer = Trainer()
    inner = Scored(trainer, 4, 4, flat=lambda i: i % 2 == 0)
    stream = _filtered(trainer, inner, max_rounds=0)
    try:
        batches, metrics = _train(stream, trainer, range(1, 4))
    finally:
        stream.close()
    flat = [u for b in batches for u in _uids(b)]
    assert flat == [f"p{i}" for i in range(1, 24, 2)]
    for batch in batches:
        assert torch.equal(batch["sample_mask"], torch.ones(len(batch)))
    assert sum(m["dynamic_sampling/groups_masked"] for m in metrics) == 0
    assert all(m["dynamic_sampling/batch_full"] == 1 for m in metrics)
    assert metrics[0]["dynamic_sampling/groups_dropped"] >= 4  # p0, p2, p4, p6 at least


def test_max_num_gen_batches_fills_the_batch_with_masked_groups():
    """No group has signal: after max_num_gen_batches draws the batch is the latest
    filtered-out groups, masked, and the worker stops drawing for it."""
    trainer = Trainer()
    inner = Scored(trainer, 4, 2, flat=lambda i: True)
    stream = _filtered(trainer, inner, max_rounds=2)
    try:
        batches, metrics = _train(stream, trainer, range(1, 3))
    finally:
        stream.close()
    for batch, m in zip(batches, metrics, strict=True):
        assert torch.equal(batch["sample_mask"], torch.zeros(len(batch)))
        assert len(batch) == 4 * N
        assert m["dynamic_sampling/groups_masked"] == 4 and m["dynamic_sampling/batch_full"] == 0
        assert m["dynamic_sampling/groups_kept"] == 0
        assert m["dynamic_sampling/rounds"] == 2  # the worker stopped drawing for it
    assert _uids(batches[0]) == [f"p{i}" for i in range(4, 8)]  # the second draw's
